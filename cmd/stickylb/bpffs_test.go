package main

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stickylb/stickylb/internal/testkit/netnstest"
)

// Under `ip netns exec` (a mount namespace of its own, /sys remounted, so no bpffs at
// /sys/fs/bpf) the loader starts with the default pin root: it mounts a bpffs there, says
// so, and warns that the mount ends with the namespace.
func TestXDPMountsBPFFS(t *testing.T) {
	kit := netnstest.New(t, "slfs")
	kit.AddNS("lb")
	kit.Veth("lb", "d0", "lb", "d1")
	kit.In("lb", "ip", "addr", "add", "10.200.0.1/24", "dev", "d0")
	if got := kit.In("lb", "stat", "-f", "-c", "%t", "/sys/fs/bpf"); got == "cafe4a11" {
		t.Fatalf("a bpffs is already mounted at /sys/fs/bpf under ip netns exec: the test proves nothing")
	}
	bin := buildBinary(t)
	p := write(t, "pools.yaml", strings.Replace(xdpPools, "{address: 10.200.0.77:80}",
		"{address: 10.200.0.77:80, mac: \"02:00:00:00:00:77\"}", 1))
	proc := startXDPProc(t, kit, "lb", bin, "xdp", "--pools", p, "--iface", "d0", "--mode", "generic")
	cmd, logs := proc.cmd, proc.logs
	// ip netns exec execs the loader: its PID is the loader's, and its mountinfo shows the
	// mount namespace the loader runs in.
	mi, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	mounted := false
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		for i, x := range f {
			if x == "-" && len(f) > i+1 && len(f) > 4 && f[4] == "/sys/fs/bpf" && f[i+1] == "bpf" {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Errorf("no bpffs at /sys/fs/bpf in the loader's mount namespace:\n%s", mi)
	}
	for _, want := range []string{"no bpffs held the pin root: mounted one", "a mount namespace other than the host's"} {
		if !strings.Contains(logs(), want) {
			t.Errorf("the log does not say %q:\n%s", want, logs())
		}
	}
}
