package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func write(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestValidateExample(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"validate", "../../pools.example.yaml"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "ok (7 services") {
		t.Fatalf("output: %q", out.String())
	}
}

// TestValidateSaysWhatNeedsNAT: validate names the vip services with backends the file puts
// behind NAT, and the address family of --nat-source they need; a file without any says
// nothing of NAT.
func TestValidateSaysWhatNeedsNAT(t *testing.T) {
	p := write(t, "nat.yaml", `services:
  - name: edge
    protocol: tcp
    vip: 10.0.0.100:443
    backends:
      - {address: 10.0.6.1:443}
      - {address: 10.0.6.2:8443}
      - {address: 10.0.6.3:443, forwarding: nat}
  - name: dr
    protocol: tcp
    vip: 10.0.0.101:443
    forwarding: dr
    backends: [{address: 10.0.6.1:443}]
  - name: six
    protocol: udp
    vip: "[2001:db8::100]:53"
    forwarding: nat
    backends: [{address: "[2001:db8:1::1]:53"}]
`)
	var out, errb bytes.Buffer
	if code := run([]string{"validate", p}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	want := p + ": ok (3 services, 5 backends)\n" +
		"  edge: 2 of 3 backends forwarded by NAT (stickylb xdp needs --nat-source: IPv4)\n" +
		"  six: 1 of 1 backends forwarded by NAT (stickylb xdp needs --nat-source: IPv6)\n"
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	if code := run([]string{"validate", "../../pools.example.yaml"}, &out, &errb); code != 0 || strings.Contains(out.String(), "NAT") {
		t.Fatalf("the example (DR only): exit %d, output %q", code, out.String())
	}
}

// TestValidateWarnsOfRefusedEndpoints: validate warns, naming each, of the backends that
// nodes fed by the control plane would leave out (loopback, link-local, unspecified; of the
// services XDP and Caddy nodes are sent); the exit code stays 0 and -q keeps the warnings.
func TestValidateWarnsOfRefusedEndpoints(t *testing.T) {
	p := write(t, "loop.yaml", `services:
  - name: api
    protocol: http
    backends:
      - {address: 127.0.0.1:2019}
      - {address: 10.0.7.1:80}
  - name: edge
    protocol: tcp
    vip: 10.0.0.100:80
    backends:
      - {address: 169.254.169.254:80, mac: "02:00:00:00:00:01"}
  - name: envoy-only
    protocol: tcp
    listen: 0.0.0.0:9000
    backends:
      - {address: 127.0.0.1:9001}
`)
	for _, args := range [][]string{{"validate", p}, {"validate", "-q", p}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], p+":5:") || !strings.Contains(lines[0], "warning: service api: backend 127.0.0.1:2019") ||
			!strings.Contains(lines[0], "loopback") || !strings.HasPrefix(lines[1], p+":11:") || !strings.Contains(lines[1], "169.254.169.254:80") {
			t.Fatalf("%v: stderr\n%s\nwant a warning for 127.0.0.1:2019 (line 5) and 169.254.169.254:80 (line 11), none for envoy-only", args, errb.String())
		}
	}
}

func TestValidateReportsEveryError(t *testing.T) {
	p := write(t, "bad.yaml", `services:
  - name: web
    protocol: http
    balance: magelv
    backends:
      - {address: 10.0.0.1:80}
      - {address: 10.0.0.1:80}
  - name: web
    protocol: http
    backends: [{address: 10.0.0.2:80, weight: 0}]
`)
	var out, errb bytes.Buffer
	if code := run([]string{"validate", p}, &out, &errb); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
	want := []string{p + ":4:", p + ":7:", p + ":8:", p + ":10:"}
	if len(lines) < len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), errb.String())
	}
	for _, w := range want {
		if !strings.Contains(errb.String(), w) {
			t.Errorf("missing %s in:\n%s", w, errb.String())
		}
	}
	if code := run([]string{"validate"}, &out, &errb); code != 2 {
		t.Fatalf("no file: exit %d", code)
	}
	if code := run([]string{"validate", filepath.Join(t.TempDir(), "nope.yaml")}, &out, &errb); code != 1 {
		t.Fatalf("missing file: exit %d", code)
	}
}

func pool(n int) string {
	var b strings.Builder
	b.WriteString("services:\n  - name: web\n    protocol: http\n    affinity: {mode: header, header: {name: x-session}}\n    balance: maglev\n    backends:\n")
	for i := 1; i <= n; i++ {
		b.WriteString("      - {address: 10.0.0." + string(rune('0'+i)) + ":80}\n")
	}
	return b.String()
}

func TestPlanJSON(t *testing.T) {
	oldP, nextP := write(t, "old.yaml", pool(3)), write(t, "next.yaml", pool(4))
	var out, errb bytes.Buffer
	if code := run([]string{"plan", "--pools", oldP, "--next", nextP, "--json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var got struct {
		Services []struct {
			Name      string  `json:"name"`
			Algorithm string  `json:"algorithm"`
			Moved     float64 `json:"moved"`
			Ideal     float64 `json:"ideal"`
			ModN      float64 `json:"mod_n"`
		} `json:"services"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v in %s", err, out.String())
	}
	if len(got.Services) != 1 {
		t.Fatalf("%s", out.String())
	}
	s := got.Services[0]
	if s.Name != "web" || s.Algorithm != "maglev" || s.Ideal != 0.25 || s.Moved < 0.24 || s.Moved > 0.27 || s.ModN < 0.73 || s.ModN > 0.77 {
		t.Fatalf("%+v", s)
	}
	out.Reset()
	if code := run([]string{"plan", "--pools", oldP, "--next", nextP}, &out, &errb); code != 0 || !strings.Contains(out.String(), "MOD-N") || !strings.Contains(out.String(), "web") {
		t.Fatalf("table: %d %s", code, out.String())
	}
	bad := write(t, "bad.yaml", "services: 3\n")
	if code := run([]string{"plan", "--pools", oldP, "--next", bad}, &out, &errb); code != 1 {
		t.Fatalf("invalid next: exit %d", code)
	}
}

// TestPlanExampleNext: README's plan command runs on the files the repository ships, and
// pools.next.yaml stays pools.example.yaml with one backend more: their lines, comments
// aside, differ by that backend alone, and plan sees one service changed, moving Maglev's
// share of a fourth backend.
func TestPlanExampleNext(t *testing.T) {
	lines := func(path string) []string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range strings.Split(string(b), "\n") {
			if l, _, _ = strings.Cut(l, "#"); strings.TrimSpace(l) != "" {
				out = append(out, strings.TrimRight(l, " "))
			}
		}
		return out
	}
	example, next := lines("../../pools.example.yaml"), lines("../../pools.next.yaml")
	const added = "      - {address: 10.0.6.4:8443, server_id: 4}"
	i := slices.Index(next, added)
	if i < 0 || !slices.Equal(slices.Delete(slices.Clone(next), i, i+1), example) {
		t.Fatalf("pools.next.yaml is not pools.example.yaml plus %q: change both together", added)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"plan", "--pools", "../../pools.example.yaml", "--next", "../../pools.next.yaml", "--json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var got struct {
		Services []struct {
			Name, Change string
			Moved, Ideal float64
		} `json:"services"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v in %s", err, out.String())
	}
	var changed []string
	for _, s := range got.Services {
		if s.Change != "unchanged" {
			changed = append(changed, s.Name)
			if s.Name != "quic" || s.Ideal != 0.25 || s.Moved < 0.24 || s.Moved > 0.26 {
				t.Errorf("%+v: want quic moving about its ideal 25%%", s)
			}
		}
	}
	if !slices.Equal(changed, []string{"quic"}) {
		t.Fatalf("changed services %v, want [quic]:\n%s", changed, out.String())
	}
}

func ringPool(weights ...int) string {
	var b strings.Builder
	b.WriteString("services:\n  - name: api\n    protocol: grpc\n    affinity: {mode: header, header: {name: x-session}}\n    balance: ring_hash\n    hash: {virtual_nodes: 160}\n    backends:\n")
	for i, w := range weights {
		fmt.Fprintf(&b, "      - {address: 10.0.%d.%d:80, weight: %d}\n", i/250, i%250+1, w)
	}
	return b.String()
}

// TestPlanVirtualNodes: the disruption table of a virtual_nodes ring on 3:1:2 -> 3:1:2:2,
// within 1.15x of the ideal, and the gRPC ring column once gRPC's cap bites.
func TestPlanVirtualNodes(t *testing.T) {
	oldP, nextP := write(t, "old.yaml", ringPool(3, 1, 2)), write(t, "next.yaml", ringPool(3, 1, 2, 2))
	var out, errb bytes.Buffer
	if code := run([]string{"plan", "--pools", oldP, "--next", nextP, "--json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var got struct {
		Services []struct {
			Moved, Ideal, ModN, Ring, Maglev float64
			RingPoints                       [2]int   `json:"ring_points"`
			GRPCRing                         *float64 `json:"grpc_ring"`
		} `json:"services"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || len(got.Services) != 1 {
		t.Fatalf("%v in %s", err, out.String())
	}
	s := got.Services[0]
	if s.Ideal != 0.25 || s.Moved > 1.15*0.25 || s.Moved < 0.23 || s.Ring != s.Moved || s.RingPoints != [2]int{960, 1280} || s.Maglev < 0.24 || s.GRPCRing != nil {
		t.Fatalf("%s", out.String())
	}
	out.Reset()
	if code := run([]string{"plan", "--pools", oldP, "--next", nextP}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	t.Logf("\n%s", out.String())
	for _, w := range []string{"MOD-N", "RING POINTS", "MAGLEV", "IDEAL", "960->1280"} {
		if !strings.Contains(out.String(), w) || strings.Contains(out.String(), "GRPC RING") {
			t.Fatalf("want %s (and no GRPC RING) in:\n%s", w, out.String())
		}
	}
	// 25 -> 26 equal backends: 4160 points, past gRPC's cap: a warning, and gRPC's ring.
	ws := func(n int) []int {
		w := make([]int, n)
		for i := range w {
			w[i] = 1
		}
		return w
	}
	oldP, nextP = write(t, "old.yaml", ringPool(ws(25)...)), write(t, "next.yaml", ringPool(ws(26)...))
	out.Reset()
	errb.Reset()
	if code := run([]string{"plan", "--pools", oldP, "--next", nextP}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	t.Logf("\n%s%s", errb.String(), out.String())
	if !strings.Contains(out.String(), "GRPC RING") || !strings.Contains(out.String(), "4000->4096") || !strings.Contains(errb.String(), nextP+":6:") || !strings.Contains(errb.String(), "gRPC caps rings at 4096") {
		t.Fatalf("stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
	}
}

// TestHelpShowsArguments: every subcommand's -h prints its synopsis, with every argument the
// command's line in the top-level usage names (FILE, OLD, ADDR, ...), then its flags, and
// exits 0.
func TestHelpShowsArguments(t *testing.T) {
	placeholder := regexp.MustCompile(`\b[A-Z]+\b`)
	for _, cmd := range [][]string{{"validate"}, {"plan"}, {"xds"}, {"xdp"}, {"xdp", "stats"}, {"xdp", "tables"}, {"xdp", "detach"}, {"xdp", "pass"}, {"xdp", "drain"}, {"xdp", "undrain"},
		{"pools"}, {"pools", "apply"}, {"pools", "get"}, {"ctl"}} {
		name := strings.Join(cmd, " ")
		var out, errb bytes.Buffer
		code := run(append(slices.Clone(cmd), "-h"), &out, &errb)
		help := errb.String()
		if code != 0 || !strings.HasPrefix(help, "usage:") || !strings.Contains(help, "stickylb "+name+" ") || !strings.Contains(help, "\nflags:\n  -") {
			t.Errorf("%s -h: exit %d, printed:\n%s", name, code, help)
			continue
		}
		for _, l := range strings.Split(usage, "\n") {
			if !strings.HasPrefix(strings.TrimSpace(l), "stickylb "+cmd[0]+" ") {
				continue
			}
			for _, arg := range placeholder.FindAllString(l, -1) {
				if !strings.Contains(help, arg) {
					t.Errorf("%s -h does not show %s (the usage says %q):\n%s", name, arg, strings.TrimSpace(l), help)
				}
			}
		}
	}
}

// TestPlanTunnel: a tunnel service's plan shows the rendezvous table's column, whose share
// is the one moved (3 -> 4 backends: about a quarter).
func TestPlanTunnel(t *testing.T) {
	pool := func(n int) string {
		var b strings.Builder
		b.WriteString("services:\n  - name: l4\n    protocol: tcp\n    vip: 10.9.9.9:80\n    forwarding: tunnel\n    backends:\n")
		for i := 1; i <= n; i++ {
			fmt.Fprintf(&b, "      - {address: 10.0.0.%d:80}\n", i)
		}
		return b.String()
	}
	oldP, nextP := write(t, "old.yaml", pool(3)), write(t, "next.yaml", pool(4))
	var out, errb bytes.Buffer
	if code := run([]string{"plan", "--pools", oldP, "--next", nextP}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	t.Logf("\n%s", out.String())
	lines := strings.Split(out.String(), "\n")
	if !strings.Contains(lines[0], "RENDEZVOUS") || !strings.Contains(lines[1], "25.0") || !strings.Contains(lines[1], "rendezvous") {
		t.Fatalf("want a RENDEZVOUS column of about 25%%:\n%s", out.String())
	}
}

// `stickylb version` and --version after any command print the same build, and stop there
// (xds --version serves nothing, whatever else the line holds).
func TestVersion(t *testing.T) {
	var want, errb bytes.Buffer
	if code := run([]string{"version"}, &want, &errb); code != 0 {
		t.Fatalf("version: exit %d: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSuffix(want.String(), "\n"), "\n")
	if len(lines) < 5 || !strings.HasPrefix(lines[0], "stickylb ") || !strings.Contains(want.String(), "  go        go1.") {
		t.Fatalf("version printed %q", want.String())
	}
	for _, args := range [][]string{{"--version"}, {"xds", "--version"}, {"xds", "--pools", "/nonexistent", "--version"},
		{"xdp", "stats", "--iface", "lo", "-version"}, {"validate", "--version"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 || out.String() != want.String() || errb.Len() != 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 0 and %q", args, code, out.String(), errb.String(), want.String())
		}
	}
	// After "--" it is an argument, not a request.
	var out, errb2 bytes.Buffer
	if code := run([]string{"validate", "--", "--version"}, &out, &errb2); code != 1 {
		t.Errorf("validate -- --version: exit %d (%s); want 1 (no such file)", code, errb2.String())
	}
	var js bytes.Buffer
	if code := run([]string{"version", "--json", "--version"}, &js, &errb); code != 0 {
		t.Fatalf("version --json: exit %d", code)
	}
	var in struct {
		Version   string `json:"version"`
		GoVersion string `json:"go_version"`
	}
	if err := json.Unmarshal(js.Bytes(), &in); err != nil || in.Version == "" || !strings.HasPrefix(in.GoVersion, "go1.") ||
		lines[0] != "stickylb "+in.Version {
		t.Errorf("version --json: %q (%v)", js.String(), err)
	}
}
