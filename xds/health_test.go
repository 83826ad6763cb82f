package xds

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	"github.com/stickylb/stickylb/internal/testkit/grpctest"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// startMonitored serves src with the fleet health checker wired in, as `stickylb xds` does.
func startMonitored(t *testing.T, src string) (*Server, *health.Monitor, string) {
	t.Helper()
	f := poolstest.Parse(t, src)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var s *Server
	mon := health.NewMonitor(func(string, health.Transition) {
		s.Stats.HealthTransitions.Add(1)
		_ = s.Refresh()
	})
	t.Cleanup(mon.Stop)
	s = NewServer(ctx, f, func(svc string, b *pools.Backend) health.State { return mon.View(svc, b.Identity()) }, zaptest.NewLogger(t))
	if err := mon.Apply(ctx, pools.HealthServices(f.Services)); err != nil {
		t.Fatal(err)
	}
	return s, mon, grpctest.Serve(t, s.Register)
}

func callsTo(ctx context.Context, t *testing.T, cc *grpc.ClientConn, n int) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for i := 0; i < n; i++ {
		b, err := call(ctx, cc, fmt.Sprintf("z-%d", i))
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		counts[b]++
	}
	return counts
}

// TestCrossZoneOffHealthAndZoneShift: with cross_zone off a zone-a client stays on zone-a
// backends (least_request) until the health checker sees all of them down, then fails over
// to zone-b; a zone shift (drained_zones) moves it away from healthy zone-a backends too.
// Detection is bounded by interval x unhealthy_threshold + timeout (1s x 1 + 0.5s here),
// plus 3s of slack for the push and the client.
func TestCrossZoneOffHealthAndZoneShift(t *testing.T) {
	bs := startGRPCBackends(t, 3) // b1, b2 in zone-a; b3 in zone-b
	src := func(drained string) string {
		return fmt.Sprintf(`services:
  - name: api
    protocol: grpc
    balance: weighted_least_conn
    cross_zone: false
    drained_zones: [%s]
    health_check: {protocol: tcp, interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}
    backends:
      - {address: %q, zone: zone-a}
      - {address: %q, zone: zone-a}
      - {address: %q, zone: zone-b}
`, drained, bs[0].addr, bs[1].addr, bs[2].addr)
	}
	s, mon, addr := startMonitored(t, src(""))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Wait for the first verdicts so that the client starts on a settled view.
	waitHealthy := func(want health.State, idx ...int) {
		testwait.For(t, 5*time.Second, "health verdicts", func() (bool, string) {
			for _, i := range idx {
				if st := mon.View("api", s.currentFile().Services[0].Backends[i].Identity()); st != want {
					return false, fmt.Sprintf("backend %d: %v", i, st)
				}
			}
			return true, ""
		})
	}
	waitHealthy(health.Healthy, 0, 1, 2)
	cc := dialXDS(t, addr, "zone-a-client", "zone-a", "api")
	// least_request picks among READY subchannels only: until the client has connected to
	// both zone-a backends every call may go to the first one, so wait until both answered
	// (within 3s of the first call). Zone-b must never answer.
	seen := map[string]int{}
	testwait.For(t, 3*time.Second, "both zone-a backends reached, zone-b never", func() (bool, string) {
		for b, n := range callsTo(ctx, t, cc, 20) {
			seen[b] += n
		}
		if seen["b3"] != 0 {
			t.Fatalf("cross_zone off: a zone-a client reached %v", seen)
		}
		return seen["b1"] > 0 && seen["b2"] > 0, fmt.Sprint(seen)
	})
	bs[0].srv.Stop()
	waitHealthy(health.Unhealthy, 0)
	// gRPC has no retries by default: calls in flight on the killed backend may fail until
	// the new EDS arrives; after that every call succeeds, in zone-a.
	testwait.For(t, 3*time.Second, "b1 out of the client's view", func() (bool, string) {
		c := map[string]int{}
		for i := 0; i < 20; i++ {
			b, err := call(ctx, cc, "x")
			if err != nil {
				return false, err.Error()
			}
			c[b]++
		}
		return c["b2"] == 20, fmt.Sprint(c)
	})
	killed := time.Now()
	bs[1].srv.Stop()
	waitHealthy(health.Unhealthy, 1)
	took := testwait.For(t, 3*time.Second, "failover to zone-b", func() (bool, string) {
		c := map[string]int{}
		for i := 0; i < 10; i++ {
			b, err := call(ctx, cc, "f")
			if err != nil {
				return false, err.Error()
			}
			c[b]++
		}
		return c["b3"] == 10, fmt.Sprint(c)
	})
	t.Logf("zone-a down: client on zone-b %s after the last kill (%s after detection)", time.Since(killed).Round(time.Millisecond), took.Round(time.Millisecond))
	if s.Stats.HealthTransitions.Load() < 5 {
		t.Fatalf("health transitions %d", s.Stats.HealthTransitions.Load())
	}
}

func TestZoneShift(t *testing.T) {
	bs := startGRPCBackends(t, 3)
	src := func(drained string) string {
		return fmt.Sprintf("services:\n  - name: api\n    protocol: grpc\n    balance: weighted_least_conn\n    cross_zone: false\n    drained_zones: [%s]\n    backends:\n      - {address: %q, zone: zone-a}\n      - {address: %q, zone: zone-a}\n      - {address: %q, zone: zone-b}\n",
			drained, bs[0].addr, bs[1].addr, bs[2].addr)
	}
	f := poolstest.Parse(t, src(""))
	s, addr := startXDS(t, f)
	cc := dialXDS(t, addr, "shift-client", "zone-a", "api")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if c := callsTo(ctx, t, cc, 30); c["b3"] != 0 {
		t.Fatalf("before the shift: %v", c)
	}
	shifted := poolstest.Parse(t, src("zone-a"))
	if err := s.Update(shifted); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 2*time.Second, "zone shift away from zone-a", func() (bool, string) {
		c := callsTo(ctx, t, cc, 10)
		return c["b3"] == 10, fmt.Sprint(c)
	})
	if got, _ := json.Marshal(s.configDump()); !strings.Contains(string(got), "DRAINING") {
		t.Fatalf("drained zone not DRAINING in the config")
	}
}
