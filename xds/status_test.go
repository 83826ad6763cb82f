package xds

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap/zaptest"

	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/policies/status"
)

// statusPools is a grpc service real grpc-go nodes route to, and a vip service for XDP nodes.
func statusPools(t *testing.T, bs []*grpcBackend) *pools.File {
	t.Helper()
	var b strings.Builder
	b.WriteString("services:\n  - name: api\n    protocol: grpc\n    affinity: {mode: header, header: {name: x-session}}\n    balance: ring_hash\n    hash: {min_ring_size: 1024, max_ring_size: 4096}\n    backends:\n")
	for i, be := range bs {
		fmt.Fprintf(&b, "      - {address: %q, weight: %d, zone: zone-a%s}\n", be.addr, i+1, map[bool]string{true: ", drain: true"}[i == 2])
	}
	b.WriteString("  - name: web\n    protocol: tcp\n    vip: 10.0.0.100:443\n    affinity: {mode: source_ip}\n    balance: maglev\n    hash: {table_size: 251}\n    backends:\n      - {address: 10.0.6.1:443, mac: \"02:00:00:00:06:01\", zone: zone-b}\n")
	f := poolstest.Parse(t, b.String())
	return f
}

// getStatus fetches the admin handler's status.json.
func getStatus(t *testing.T, base string) status.Snapshot {
	t.Helper()
	resp, err := http.Get(base + "/" + status.JSONPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var snap status.Snapshot
	if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil {
		t.Fatalf("decoding status.json: %v", err)
	}
	return snap
}

// TestFleetStatusJSON: the admin address's status.json lists every service with its
// backends as the checker sees them (verdict, its time and reason, draining), and the
// connected nodes (a real grpc-go xDS client and an XDP node) under their zones with the
// versions their streams have ACKed; the page itself is served at the root.
func TestFleetStatusJSON(t *testing.T) {
	bs := startGRPCBackends(t, 3)
	f := statusPools(t, bs)
	states := newStateView(map[string]health.State{bs[0].addr: health.Healthy, bs[2].addr: health.Healthy})
	s, addr := startXDSWithView(t, f, states.view)

	// bs[1] goes down: the checker's transition carries its time and reason.
	down := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	states.set(bs[1].addr, health.Unhealthy)
	s.RecordTransition("api", health.Transition{ID: bs[1].addr, Address: bs[1].addr, To: health.Unhealthy,
		From: health.Healthy, At: down, Reason: "tcp: connection refused"})
	if err := s.Refresh(); err != nil {
		t.Fatal(err)
	}

	cc := dialXDS(t, addr, "grpc-node-1", "zone-a", "api")
	callCtx, callCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer callCancel()
	if _, err := call(callCtx, cc, "k1"); err != nil {
		t.Fatalf("grpc node's call: %v", err)
	}
	x := startXDPNode(t, addr, "h1/xdp/eth0", fleetview.UserAgentXDP)

	h := httptest.NewServer(s.AdminHandler())
	defer h.Close()

	var snap status.Snapshot
	testwait.For(t, 5*time.Second, "both nodes ACK their views", func() (bool, string) {
		v, _, _ := x.last()
		snap = getStatus(t, h.URL)
		if v == nil || len(snap.Nodes) != 2 || snap.Nodes[1].Versions["endpoint"] == "" || snap.Nodes[0].Versions["endpoint"] == "" ||
			snap.Nodes[0].Versions["cluster"] == "" {
			return false, fmt.Sprintf("%+v", snap.Nodes)
		}
		// Every ACK in: the page's versions are then the ones the server's streams hold.
		for _, n := range snap.Nodes {
			if want := ackedOf(s, n.ID); fmt.Sprint(n.Versions) != fmt.Sprint(want) {
				return false, fmt.Sprintf("node %s versions %v, the server's stream ACKed %v", n.ID, n.Versions, want)
			}
		}
		return true, ""
	})
	if err := snap.Validate(); err != nil {
		t.Fatal(err)
	}
	if snap.Tier != status.TierXDS || snap.Actions.Drain || !strings.Contains(snap.Actions.DrainHint, "pools file") {
		t.Fatalf("tier %q, actions %+v: want xds, read-only with a hint", snap.Tier, snap.Actions)
	}
	// Nodes sorted by zone: "" (the XDP node has none) before zone-a.
	xn, gn := snap.Nodes[0], snap.Nodes[1]
	if xn.ID != "h1/xdp/eth0" || xn.Zone != "" || xn.Kind != "xdp" || xn.Group != "xdp" {
		t.Fatalf("XDP node: %+v", xn)
	}
	if gn.ID != "grpc-node-1" || gn.Zone != "zone-a" || gn.Kind != "grpc" || gn.Group != "envoy" {
		t.Fatalf("grpc node: %+v", gn)
	}
	s.mu.Lock()
	current := fmt.Sprint(s.version)
	s.mu.Unlock()
	if gn.Versions["cluster"] != current || gn.Connected == nil || time.Since(*gn.Connected) > time.Minute {
		t.Fatalf("grpc node ACKed cluster version %q (connected %v), the server is at version %s", gn.Versions["cluster"], gn.Connected, current)
	}

	if len(snap.Services) != 2 || snap.Services[0].Name != "api" || snap.Services[1].Name != "web" {
		t.Fatalf("services: %+v", snap.Services)
	}
	api := snap.Services[0]
	if len(api.Backends) != 3 || api.Panic.Active {
		t.Fatalf("api: %+v", api)
	}
	for i, b := range api.Backends {
		if b.ID != bs[i].addr || b.Zone != "zone-a" || b.Weight == nil || *b.Weight != float64(i+1) || b.Draining != (i == 2) {
			t.Fatalf("api backend %d: %+v", i, b)
		}
	}
	if b := api.Backends[1].Health; b.State != status.Unhealthy || b.Since == nil || !b.Since.Equal(down) || b.Reason != "tcp: connection refused" || b.LastCheck != nil {
		t.Fatalf("unhealthy backend's health: %+v, want unhealthy since %v (tcp: connection refused)", b, down)
	}
	if b := api.Backends[0].Health; b.State != status.Healthy || b.Reason != "" {
		t.Fatalf("healthy backend's health: %+v", b)
	}
	web := snap.Services[1]
	if web.VIP != "10.0.0.100:443" || len(web.Backends) != 1 || web.Backends[0].Health.State != status.Unknown || web.Backends[0].Zone != "zone-b" {
		t.Fatalf("web: %+v", web)
	}

	// The page at the root, the same self-contained one every tier serves.
	resp, err := http.Get(h.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || resp.Header.Get("Content-Security-Policy") == "" {
		t.Fatalf("page: %d %v", resp.StatusCode, resp.Header)
	}
	if resp, err := http.Get(h.URL + "/nothing"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("an unknown path answers %v %v, want 404", resp, err)
	}
}

// TestFleetStatusLastCheck: with the fleet checker wired in as `stickylb xds` wires it
// (WithProbes), every probed backend's last check is its checker's last probe and moves with
// the next one; a refused backend's reason is the probe's result. A backend of a service
// without a health_check has none (n/a).
func TestFleetStatusLastCheck(t *testing.T) {
	ln := loopback.Listen(t)
	loopback.AcceptAndClose(t, ln)
	up, refused := ln.Addr().String(), loopback.Refused(t)
	f := poolstest.Parse(t, fmt.Sprintf(`services:
  - name: web
    protocol: tcp
    vip: 10.0.0.100:443
    balance: maglev
    hash: {table_size: 251}
    health_check: {protocol: tcp, interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}
    backends:
      - {address: %q, mac: "02:00:00:00:06:01"}
      - {address: %q, mac: "02:00:00:00:06:02"}
  - name: plain
    protocol: tcp
    vip: 10.0.0.101:443
    balance: maglev
    hash: {table_size: 251}
    backends:
      - {address: 10.0.6.9:443, mac: "02:00:00:00:06:09"}
`, up, refused))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var s *Server
	mon := health.NewMonitor(func(svc string, tr health.Transition) {
		s.RecordTransition(svc, tr)
		_ = s.Refresh()
	})
	defer mon.Stop()
	s = NewServer(ctx, f, func(svc string, b *pools.Backend) health.State { return mon.View(svc, b.Identity()) },
		zaptest.NewLogger(t), WithProbes(mon.Lookup))
	if err := mon.Apply(ctx, pools.HealthServices(f.Services)); err != nil {
		t.Fatal(err)
	}
	// The first probe within interval/10, its result within the timeout; 2 s of slack.
	var snap *status.Snapshot
	testwait.For(t, 100*time.Millisecond+500*time.Millisecond+2*time.Second, "verdicts on both backends", func() (bool, string) {
		snap = s.Status()
		bs := snap.Services[0].Backends
		return bs[0].Health.State == status.Healthy && bs[1].Health.State == status.Unhealthy, fmt.Sprintf("%+v", bs)
	})
	web := snap.Services[0]
	for _, b := range web.Backends {
		ts, _ := mon.Lookup("web", b.ID)
		if b.Health.LastCheck == nil || b.Health.LastCheck.After(snap.Time) || b.Health.LastCheck.Before(ts.LastProbe.Add(-2*time.Second)) {
			t.Fatalf("backend %s: last check %v, the checker's last probe %v, snapshot at %v", b.ID, b.Health.LastCheck, ts.LastProbe, snap.Time)
		}
	}
	if r := web.Backends[1].Health.Reason; !strings.Contains(r, "refused") {
		t.Fatalf("refused backend's reason %q", r)
	}
	if h := snap.Services[1].Backends[0].Health; h.LastCheck != nil || h.State != status.Unknown {
		t.Fatalf("backend of a service without a health_check: %+v, want unknown and no last check", h)
	}
	first := *web.Backends[0].Health.LastCheck
	testwait.For(t, time.Second+500*time.Millisecond+2*time.Second, "the last check moves with the next probe", func() (bool, string) {
		h := s.Status().Services[0].Backends[0].Health
		return h.LastCheck != nil && h.LastCheck.After(first), fmt.Sprintf("%v, first %v", h.LastCheck, first)
	})
}
