package xds

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/stickylb/stickylb/internal/testkit/grpctest"
	"github.com/stickylb/stickylb/internal/testkit/healthtest"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/pools"
)

// TestGRPCHashServiceAcrossZones: a ring_hash service spread over two zones of unequal
// weight (cross_zone on, so both zones share priority 0), served by our server to a real
// grpc-go client. Envoy places hosts on its ring by their endpoint weights alone (locality
// weights count only with locality_weighted_lb_config, which we never set), and so do
// Caddy's stickylb_xds and policies/chash; grpc-go multiplies them with locality weights
// (shuffling off: L x w; on: fixed-point w/S_locality x L/sum L). Every one of 10,000 keys
// must land where chash's ring over the endpoint weights says, in both grpc-go modes,
// with every backend healthy and after one turns unhealthy. A maglev service is checked
// the same way: gRPC has no Maglev and takes its ring fallback, which must be the ring of
// the same weights.
//
// The weights sum to a power of two (3+1+2 in zone-a, 2 in zone-b): grpc-go's default mode
// rounds each endpoint's share of its locality's weight sum to 31 fractional bits, which
// is exact only then (docs/pools.md tells the caveat for other weights).
func TestGRPCHashServiceAcrossZones(t *testing.T) {
	if testing.Short() {
		t.Skip("real grpc-go client and backends")
	}
	mode := grpctest.ShufflingEnv + " default (on)"
	if grpctest.ExactWeights(t) {
		mode = grpctest.ShufflingEnv + "=false"
	}
	const (
		keys = 10_000
		// slack for an xDS push to reach the client on a loaded machine.
		slack = 15 * time.Second
	)
	bs := startGRPCBackends(t, 4)
	weights := []uint32{3, 1, 2, 2}
	zone := []string{"zone-a", "zone-a", "zone-a", "zone-b"}
	var b strings.Builder
	b.WriteString("services:\n")
	for _, svc := range []string{"ring", "mag"} {
		balance := "ring_hash"
		if svc == "mag" {
			balance = "maglev"
		}
		fmt.Fprintf(&b, "  - name: %s\n    protocol: grpc\n    affinity: {mode: header, header: {name: x-session}}\n    balance: %s\n    cross_zone: true\n    backends:\n", svc, balance)
		for i, be := range bs {
			fmt.Fprintf(&b, "      - {address: %q, weight: %d, zone: %s}\n", be.addr, weights[i], zone[i])
		}
	}
	f := poolstest.Parse(t, b.String())
	var sw healthtest.Switch
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	srv := NewServer(ctx, f, sw.View, zaptest.NewLogger(t))
	xdsAddr := grpctest.Serve(t, srv.Register)
	name := map[string]string{}
	for _, be := range bs {
		name[be.addr] = be.name
	}

	type client struct {
		svc    *pools.Service
		phase  func(what string, live []int, settled func() (bool, string)) []string
		call   func(key string) (string, error)
		before []string
	}
	var clients []*client
	for _, svc := range f.Services {
		cc := dialXDS(t, xdsAddr, "grpc-"+svc.Name, "zone-a", svc.Name)
		c := &client{svc: svc, call: func(key string) (string, error) { return call(ctx, cc, key) }}
		// phase checks every key against the ring of live's endpoint weights, once the
		// client sees the current endpoints (settled says when), and returns the backends.
		c.phase = func(what string, live []int, settled func() (bool, string)) []string {
			t.Helper()
			hosts := make([]chash.Host, len(live))
			for i, k := range live {
				hosts[i] = chash.Host{ID: bs[k].addr, Weight: weights[k]}
			}
			ring, err := chash.NewRing(hosts, svc.Hash.MinRingSize, svc.Hash.MaxRingSize)
			if err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(slack); ; {
				ok, why := settled()
				if ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s %s: the client did not take the update within %s: %s", svc.Name, what, slack, why)
				}
				time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
			}
			got := make([]string, keys)
			counts, want := map[string]int{}, map[string]int{}
			off, first := 0, ""
			for i := range keys {
				key := fmt.Sprintf("z-%d", i)
				g, err := c.call(key)
				if err != nil {
					t.Fatalf("%s %s: %s: %v", svc.Name, what, key, err)
				}
				w := name[hosts[ring.Pick(chash.KeyHash(key))].ID]
				got[i] = g
				counts[g]++
				want[w]++
				if g != w {
					if off == 0 {
						first = fmt.Sprintf("%s went to %s, the ring says %s", key, g, w)
					}
					off++
				}
			}
			if off > 0 {
				t.Errorf("%s %s (%s): %d of %d keys off the ring of the endpoint weights (first: %s); per backend got %v, want %v",
					svc.Name, what, mode, off, keys, first, counts, want)
			} else {
				t.Logf("%s %s (%s): all %d keys where the ring says (%d points); per backend %v", svc.Name, what, mode, keys, ring.Size(), counts)
			}
			return got
		}
		clients = append(clients, c)
	}
	for _, c := range clients {
		c.before = c.phase("3:1:2 in zone-a, 2 in zone-b", []int{0, 1, 2, 3}, func() (bool, string) {
			_, err := c.call("z-0")
			return err == nil, fmt.Sprint(err)
		})
	}
	sw.Down(bs[1].addr) // zone-a's weight-1 backend
	if err := srv.Refresh(); err != nil {
		t.Fatal(err)
	}
	for _, c := range clients {
		// Settled when no key that was on the backend still goes there.
		var was []string
		for i, g := range c.before {
			if g == bs[1].name && len(was) < 50 {
				was = append(was, fmt.Sprintf("z-%d", i))
			}
		}
		c.phase("3:-:2 in zone-a (weight 1 unhealthy), 2 in zone-b", []int{0, 2, 3}, func() (bool, string) {
			for _, k := range was {
				if g, err := c.call(k); err != nil || g == bs[1].name {
					return false, fmt.Sprintf("%s on %s (%v)", k, g, err)
				}
			}
			return true, ""
		})
	}
}
