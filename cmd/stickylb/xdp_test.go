package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/netnstest"
)

// The loader's start-up errors, each as a user meets it: a message that says what to fix and
// exit status 1.

const xdpPools = `services:
  - name: edge
    protocol: tcp
    vip: 10.200.100.1:80
    affinity: {mode: none}
    balance: maglev
    backends:
      - {address: 10.200.0.77:80}
`

func TestXDPMissingInterface(t *testing.T) {
	p := write(t, "pools.yaml", xdpPools)
	var stdout, stderr bytes.Buffer
	code := xdpCmd([]string{"--pools", p, "--iface", "nosuchif0"}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), `interface "nosuchif0"`) {
		t.Fatalf("exit %d, stderr %q; want 1 and the interface named", code, stderr.String())
	}
}

// buildBinary builds stickylb into a directory anyone may read (the permission test runs it
// as nobody).
func buildBinary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	bin := filepath.Join(dir, "stickylb")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func runBinary(t *testing.T, cmd *exec.Cmd) (int, string) {
	t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, out.String()
}

// Without root (as nobody: no CAP_BPF, no CAP_NET_ADMIN) the loader says so.
func TestXDPNoBPFPermission(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the loader as nobody (CI runs as root)")
	}
	bin := buildBinary(t)
	p := filepath.Join(filepath.Dir(bin), "pools.yaml")
	if err := os.WriteFile(p, []byte(xdpPools), 0o644); err != nil {
		t.Fatal(err)
	}
	pin := filepath.Join(filepath.Dir(bin), "pins")
	if err := os.Mkdir(pin, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(pin, 0o777)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "xdp", "--pools", p, "--iface", "lo", "--pin-root", pin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	code, out := runBinary(t, cmd)
	t.Logf("as nobody: %s", out)
	if code != 1 || !strings.Contains(out, "no BPF permission") {
		t.Fatalf("exit %d, output %q; want 1 and \"no BPF permission\"", code, out)
	}
}

// A backend whose MAC is neither in the pools file nor resolvable on the interface is named,
// with what to do about it. The interface is a veth in a namespace of the test's own whose
// peer has no address, so nothing ever answers ARP.
func TestXDPUnresolvableMAC(t *testing.T) {
	kit := netnstest.New(t, "slmac")
	kit.AddNS("lb")
	kit.Veth("lb", "d0", "lb", "d1") // d1 has no address: it answers no ARP
	kit.In("lb", "ip", "addr", "add", "10.200.0.1/24", "dev", "d0")
	pin := kit.BPFFS()
	p := write(t, "pools.yaml", xdpPools)
	// In this process, on a thread in the namespace: no binary to build.
	var out bytes.Buffer
	code := 0
	kit.MustDo("lb", func() error {
		code = xdpCmd([]string{"--pools", p, "--iface", "d0", "--mode", "generic", "--pin-root", pin}, &out, &out)
		return nil
	})
	if code != 1 || !strings.Contains(out.String(), "backend 10.200.0.77:80: no MAC in the neighbour table of d0; set mac: in the pools file") {
		t.Fatalf("exit %d, output %q; want 1 and the backend named", code, out.String())
	}
}

// The connection table's flags are checked before anything loads: a table of no entries, or
// a negative insert cap, is a usage error.
func TestXDPConnTableFlags(t *testing.T) {
	p := write(t, "pools.yaml", xdpPools)
	for _, args := range [][]string{{"--conn-table-size", "0"}, {"--conn-insert-cap", "-1"}} {
		var stdout, stderr bytes.Buffer
		code := xdpCmd(append([]string{"--pools", p, "--iface", "lo"}, args...), &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), "--conn-table-size N") {
			t.Errorf("%v: exit %d, stderr %q; want 2 and the usage", args, code, stderr.String())
		}
	}
}

// --xds and --pools exclude each other, the node flags (--zone aside: the pools mode uses it
// too) need --xds, and TLS files that
// cannot be read fail at start (not in a retry loop): a clear message and exit status 2.
func TestXDPXDSFlags(t *testing.T) {
	p := write(t, "pools.yaml", xdpPools)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--pools", p, "--xds", "127.0.0.1:18000", "--iface", "lo"}, "--pools and --xds exclude each other"},
		{[]string{"--pools", p, "--node-id", "h/xdp/lo", "--iface", "lo"}, "go with --xds"},
		{[]string{"--pools", p, "--allow-loopback", "--iface", "lo"}, "go with --xds"},
		{[]string{"--xds", "127.0.0.1:1", "--xds-ca", "/nonexistent/ca.pem", "--iface", "lo"}, "reading the CA file"},
		{[]string{"--xds", "127.0.0.1:1", "--xds-cert", "n.pem", "--iface", "lo"}, "certificate and key go together"},
		{[]string{"--pools", p, "--admin-host", "lb1.example", "--iface", "lo"}, "--admin-host goes with --metrics"},
		{[]string{"--pools", p, "--metrics", "127.0.0.1:9100", "--admin-host", "lb1.example:9100", "--iface", "lo"}, "want a DNS name or an IP address"},
	} {
		var stdout, stderr bytes.Buffer
		if code := xdpCmd(tc.args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}
