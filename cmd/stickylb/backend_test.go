package main

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/stickylb/stickylb/internal/testkit/netnstest"
	"github.com/stickylb/stickylb/l4xdp/agent"
)

// TestBackendFlags: the agent's command line is checked before anything loads: an LB source
// is required (without one every tunnel packet would be refused), sources are addresses or
// prefixes, ports 1..65535; several of each, repeated or comma-separated.
func TestBackendFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--iface", "lo"}, "no LB source"},
		{[]string{"--iface", "lo", "--lb-source", "10.0.0.300"}, `"10.0.0.300" is neither an address nor a prefix`},
		{[]string{"--iface", "lo", "--lb-source", "10.0.0.1", "--tunnel-port", "0"}, `"0": want a port 1..65535`},
		{[]string{"--iface", "lo", "--lb-source", "::ffff:10.0.0.1"}, "write IPv4 as IPv4"},
		{[]string{"--lb-source", "10.0.0.1"}, "usage:\n  stickylb backend"},
		{[]string{"--iface", "lo", "--lb-source", "10.0.0.1", "--admin-host", "lb.example"}, "--admin-host goes with --metrics"},
	} {
		var stdout, stderr bytes.Buffer
		if code := backendCmd(tc.args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
	fl, err := parseBackendFlags([]string{"--iface", "eth1", "--lb-source", "10.0.0.1,10.0.1.0/24", "--lb-source", "fd00::/64",
		"--tunnel-port", "6080,7000", "--tunnel-port", "7001"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("10.0.1.0/24"), netip.MustParsePrefix("fd00::/64")}
	if got := fl.cfg.LBSources; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] ||
		len(fl.cfg.TunnelPorts) != 3 || fl.cfg.TunnelPorts[2] != 7001 {
		t.Errorf("parsed %+v", fl.cfg)
	}
	var stdout, stderr bytes.Buffer
	if code := backendCmd([]string{"stats", "--iface", "nosuch0", "--pin-root", t.TempDir()}, &stdout, &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "no stickylb backend agent pinned for nosuch0") {
		t.Errorf("stats of no agent: exit %d, %q", code, stderr.String())
	}
}

// TestBackendMetrics: an agent attached to a veth of a namespace of the test's own serves its
// counters by path, the host's addresses it knows, and status.json; detach removes it.
func TestBackendMetrics(t *testing.T) {
	kit := netnstest.New(t, "slbe")
	kit.AddNS("be")
	kit.Veth("be", "t0", "be", "t1")
	kit.In("be", "ip", "address", "add", "10.0.0.100/32", "dev", "lo")
	cfg := agent.Config{Iface: "t0", LBSources: []netip.Prefix{netip.MustParsePrefix("10.0.0.1/32")}, PinRoot: kit.BPFFS()}
	var a *agent.Agent
	kit.MustDo("be", func() (err error) {
		a, err = agent.Open(cfg, zaptest.NewLogger(t))
		return err
	})
	closed := false
	t.Cleanup(func() {
		if !closed {
			a.Close()
			kit.MustDo("be", func() error { return agent.Detach(cfg) })
		}
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(backendCollector{a})
	h := backendMetricsHandler(a, reg, zaptest.NewLogger(t))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, w := range []string{`stickylb_backend_packets_total{path="second_chance"} 0`, `stickylb_backend_packets_total{path="decap"} 0`,
		`stickylb_backend_bytes_total{path="refused"} 0`, "stickylb_backend_local_addresses ", "stickylb_build_info{"} {
		if !strings.Contains(rec.Body.String(), w) {
			t.Errorf("metrics lack %q:\n%s", w, rec.Body.String())
		}
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/status.json", nil))
	var st agent.Status
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || st.Iface != "t0" || st.TunnelPorts[0] != agent.DefaultTunnelPort ||
		st.LBSources[0] != "10.0.0.1/32" || st.LocalAddrs < 2 || len(st.Paths) != len(agent.Paths) {
		t.Fatalf("status.json %s (%v)", rec.Body.String(), err)
	}
	// Closed, the agent stays (its link pinned); detach removes it, and a second detach says
	// there is nothing.
	a.Close()
	closed = true
	var out bytes.Buffer
	kit.MustDo("be", func() error {
		if code := backendCmd([]string{"stats", "--iface", "t0", "--pin-root", cfg.PinRoot}, &out, &out); code != 0 || !strings.Contains(out.String(), `"decap"`) {
			t.Errorf("stats of the pinned agent: exit %d, %s", code, out.String())
		}
		if code := backendCmd([]string{"detach", "--iface", "t0", "--pin-root", cfg.PinRoot}, &out, &out); code != 0 {
			t.Errorf("detach: exit %d, %s", code, out.String())
		}
		if code := backendCmd([]string{"detach", "--iface", "t0", "--pin-root", cfg.PinRoot}, &out, &out); code != 1 {
			t.Errorf("second detach: exit %d, want 1", code)
		}
		return nil
	})
	if strings.Contains(kit.In("be", "bpftool", "net", "show", "dev", "t0"), "stickylb_backend") {
		t.Error("the program is still attached after detach")
	}
}

// TestXDPTunnelSourceFlag: --tunnel-source takes one address of each family at most, with
// --nat-source's rules, into the loader's configuration.
func TestXDPTunnelSourceFlag(t *testing.T) {
	p := write(t, "pools.yaml", xdpPools)
	var stderr bytes.Buffer
	if _, err := parseXDPFlags([]string{"--pools", p, "--iface", "lo", "--tunnel-source", "10.0.0.1,10.0.0.2"}, &stderr); err == nil ||
		!strings.Contains(stderr.String(), "--tunnel-source: tunnel sources: 2 IPv4 and 0 IPv6, at most one of each") {
		t.Errorf("two IPv4 sources: %v, %q", err, stderr.String())
	}
	stderr.Reset()
	if _, err := parseXDPFlags([]string{"--pools", p, "--iface", "lo", "--tunnel-source", "0.0.0.0"}, &stderr); err == nil {
		t.Error("an unspecified tunnel source was accepted")
	}
	fl, err := parseXDPFlags([]string{"--pools", p, "--iface", "lo", "--tunnel-source", "10.0.0.1", "--tunnel-source", "fd00::1"}, &stderr)
	if err != nil || len(fl.cfg.Tunnel.Sources) != 2 || fl.cfg.Tunnel.Sources[1] != netip.MustParseAddr("fd00::1") {
		t.Errorf("%+v, %v", fl.cfg.Tunnel, err)
	}
}
