package xds

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/stickylb/stickylb/internal/testkit/testwait"

	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// TestEveryBackendDownFailsOpen: when the health checker sees every backend of a service
// down, a real grpc-go xDS client still reaches them (the control plane publishes them as
// UNKNOWN), and stickylb_panic{service} is 1; when they recover, it is 0 again. The
// backends keep serving gRPC throughout; only their health port goes away, so a call
// succeeds exactly when the client routes to them. Detection is bounded by
// interval x unhealthy_threshold + timeout (1s x 1 + 0.5s), plus 3s of slack for the push
// and the client.
func TestEveryBackendDownFailsOpen(t *testing.T) {
	bs := startGRPCBackends(t, 2)
	hp := listen(t) // the health port of both backends (all on 127.0.0.1)
	_, p, _ := strings.Cut(hp.Addr().String(), ":")
	src := fmt.Sprintf(`services:
  - name: api
    protocol: grpc
    balance: weighted_least_conn
    health_check: {protocol: tcp, port: %s, interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}
    backends:
      - {address: %q, zone: zone-a}
      - {address: %q, zone: zone-a}
`, p, bs[0].addr, bs[1].addr)
	s, mon, addr := startMonitored(t, src)
	admin := httptest.NewServer(s.AdminHandler())
	defer admin.Close()
	gauge := func() string {
		resp, err := http.Get(admin.URL + "/metrics")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "stickylb_panic{") {
				return l
			}
		}
		return "no stickylb_panic metric"
	}
	all := func(want health.State) {
		testwait.For(t, 5*time.Second, "health verdicts "+want.String(), func() (bool, string) {
			for i, b := range s.currentFile().Services[0].Backends {
				if st := mon.View("api", b.Identity()); st != want {
					return false, fmt.Sprintf("backend %d: %v", i, st)
				}
			}
			return true, ""
		})
	}
	all(health.Healthy)
	cc := dialXDS(t, addr, "fail-open-client", "zone-a", "api")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	routes := func() (bool, string) {
		c := map[string]int{}
		for i := 0; i < 20; i++ {
			b, err := call(ctx, cc, fmt.Sprintf("k-%d", i))
			if err != nil {
				return false, err.Error()
			}
			c[b]++
		}
		return true, fmt.Sprint(c)
	}
	// The monitor's view changes before its callback has republished, and a client that
	// has not yet applied the new endpoints still routes on the old ones: so each phase
	// waits for the gauge and for the client to ACK newer endpoints before it calls.
	published := func(what, want, since string) {
		testwait.For(t, 3*time.Second, what+": "+want, func() (bool, string) {
			g := gauge()
			return g == want, g
		})
		testwait.For(t, 3*time.Second, what+": the client ACKs newer endpoints", func() (bool, string) {
			v := ackedOf(s, "fail-open-client")["endpoint"]
			return v != "" && v != since, "endpoint version " + v
		})
	}
	testwait.For(t, 3*time.Second, "calls with every backend healthy", routes)
	if g := gauge(); g != `stickylb_panic{service="api"} 0` {
		t.Fatalf("healthy: %s", g)
	}
	before := ackedOf(s, "fail-open-client")["endpoint"]
	hp.Close() // every backend's health check now fails
	all(health.Unhealthy)
	published("every backend down", `stickylb_panic{service="api"} 1`, before)
	took := testwait.For(t, 3*time.Second, "calls with every backend down (fail open)", routes)
	t.Logf("every backend down: the client routes to them %s after it applied the panic view", took.Round(time.Millisecond))
	before = ackedOf(s, "fail-open-client")["endpoint"]
	back, err := net.Listen("tcp", hp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	all(health.Healthy)
	published("recovered", `stickylb_panic{service="api"} 0`, before)
	testwait.For(t, 3*time.Second, "calls after the recovery", routes)
}

// TestPanicStatuses: in panic the non-draining backends are published UNKNOWN; a draining
// one keeps its status (UNHEALTHY when down), so it gets no new sessions; a service with
// one backend unprobed (Unknown) is not in panic; one with every backend draining neither.
func TestPanicStatuses(t *testing.T) {
	f := poolstest.Parse(t, `services:
  - name: api
    protocol: grpc
    drained_zones: [zone-c]
    backends:
      - {address: "10.0.0.1:80", zone: zone-a}
      - {address: "10.0.0.2:80", zone: zone-b}
      - {address: "10.0.0.3:80", zone: zone-a, drain: true}
      - {address: "10.0.0.4:80", zone: zone-c}
`)
	down := func(string, *pools.Backend) health.State { return health.Unhealthy }
	statuses := func(view HealthView) map[string]corev3.HealthStatus {
		r, err := Translate(f, Node{Zone: "zone-a"}, view)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]corev3.HealthStatus{}
		for _, l := range r.Endpoints[0].(*endpointv3.ClusterLoadAssignment).Endpoints {
			for _, e := range l.LbEndpoints {
				out[e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress()] = e.HealthStatus
			}
		}
		return out
	}
	got := statuses(down)
	want := map[string]corev3.HealthStatus{"10.0.0.1": corev3.HealthStatus_UNKNOWN, "10.0.0.2": corev3.HealthStatus_UNKNOWN,
		"10.0.0.3": corev3.HealthStatus_UNHEALTHY, "10.0.0.4": corev3.HealthStatus_UNHEALTHY}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("every backend down: %v, want %v", got, want)
	}
	oneUnprobed := func(_ string, b *pools.Backend) health.State {
		if b.Address == "10.0.0.2:80" {
			return health.Unknown
		}
		return health.Unhealthy
	}
	if InPanic(f.Services[0], oneUnprobed) {
		t.Fatal("in panic with a backend not probed yet")
	}
	if got := statuses(oneUnprobed); got["10.0.0.1"] != corev3.HealthStatus_UNHEALTHY {
		t.Fatalf("out of panic, a down backend is published %v", got["10.0.0.1"])
	}
	for _, b := range f.Services[0].Backends {
		b.Drain = true
	}
	if InPanic(f.Services[0], down) {
		t.Fatal("in panic with every backend draining")
	}
}
