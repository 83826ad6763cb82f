package chash

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	_ "google.golang.org/grpc/balancer/ringhash" // registers ring_hash_experimental
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental/balancer/weight"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/stickylb/stickylb/internal/testkit/fanout"
)

// External truth for the ring: grpc-go's real ring_hash balancer, over real gRPC servers on
// loopback, must send every request to the backend our Ring predicts.

// grpcBackend is one real gRPC server that tells who it is in a response header.
type grpcBackend struct {
	addr string // "127.0.0.1:port", gRPC's default hash key (the endpoint's first address)
}

func startGRPCBackends(t *testing.T, n int) []grpcBackend {
	t.Helper()
	var out []grpcBackend
	for range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listening for a gRPC backend: %v", err)
		}
		addr := lis.Addr().String()
		srv := grpc.NewServer(grpc.UnaryInterceptor(
			func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				if err := grpc.SetHeader(ctx, metadata.Pairs("x-backend", addr)); err != nil {
					return nil, err
				}
				return h(ctx, req)
			}))
		healthpb.RegisterHealthServer(srv, health.NewServer())
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(lis) }()
		t.Cleanup(func() { srv.Stop(); <-done })
		out = append(out, grpcBackend{addr: addr})
	}
	return out
}

// ringConfig is one ring_hash_experimental configuration under test.
type ringConfig struct {
	name     string
	min, max uint64
	weights  []uint32 // by identity (sorted address) position; nil = unweighted
	order    func(n int) []int
	keys     int
	warm     bool // wait until every backend has answered before asserting
}

// observation is one RPC: its key and the backend that answered it.
type observation struct {
	key     string
	backend string
}

func TestRingMatchesGRPCRingHash(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 10 gRPC servers")
	}
	const n = 10
	backends := startGRPCBackends(t, n)
	sorted := make([]string, n)
	for i, b := range backends {
		sorted[i] = b.addr
	}
	slices.Sort(sorted)

	shuffled := func(n int) []int { return rand.New(rand.NewPCG(42, 43)).Perm(n) }
	reversed := func(n int) []int {
		p := make([]int, n)
		for i := range p {
			p[i] = n - 1 - i
		}
		return p
	}
	configs := []ringConfig{
		// Unequal weights; the lightest host gets a whole number of entries (scale ~ 1026).
		{name: "weighted", min: 1024, max: 4096, weights: []uint32{1, 2, 3, 5, 8, 1, 2, 3, 5, 8},
			order: shuffled, keys: 2000, warm: true},
		// Scale clamped by max: every host gets a fractional number of entries, so the
		// running sums (and the walk order) decide the counts.
		{name: "clamped", min: 3000, max: 3001, weights: []uint32{3, 1, 4, 1, 5, 9, 2, 6, 5, 3},
			order: shuffled, keys: 1000},
		// Five points for ten equal hosts: in identity order the hosts at even positions get
		// the points (targets 0.5, 1.0, 1.5, ... are exact); walked in reverse, the odd ones
		// do. A build that forgot gRPC's sort would disagree on every key.
		{name: "tiny", min: 5, max: 5, order: reversed, keys: 500},
	}

	obs := map[string][]observation{}
	for _, c := range configs {
		t.Run(c.name, func(t *testing.T) {
			hosts := make([]Host, n) // in the order given to gRPC
			eps := make([]resolver.Endpoint, n)
			for i, k := range c.order(n) {
				w := uint32(1)
				if c.weights != nil {
					w = c.weights[k]
				}
				hosts[i] = Host{ID: sorted[k], Weight: w}
				ep := resolver.Endpoint{Addresses: []resolver.Address{{Addr: sorted[k]}}}
				if c.weights != nil {
					ep = weight.Set(ep, weight.EndpointInfo{Weight: w})
				}
				eps[i] = ep
			}
			ring, err := NewRing(hosts, c.min, c.max)
			if err != nil {
				t.Fatal(err)
			}
			got := runGRPCRing(t, c, eps, len(hosts))
			obs[c.name] = got
			mismatch := 0
			for _, o := range got {
				if want := hosts[ring.Pick(KeyHash(o.key))].ID; o.backend != want {
					if mismatch < 10 {
						t.Errorf("key %q: gRPC sent it to %s, our ring predicts %s", o.key, o.backend, want)
					}
					mismatch++
				}
			}
			if mismatch > 0 {
				t.Errorf("%d of %d keys disagree with gRPC", mismatch, len(got))
			}
			t.Logf("%d keys, ring of %d points, all on the predicted backend: %v", len(got), ring.Size(), mismatch == 0)
		})
	}

	// The comparison must be able to fail: small changes to the algorithm have to disagree
	// with gRPC's observed choices on a share of keys no sampling luck can hide.
	//   - Another key format gives an unrelated ring: two weighted rings agree on about
	//     sum(share^2) ~ 15% of keys, so we require >= 50% disagreement.
	//   - A forgotten sort makes the tiny ring's host set disjoint from gRPC's: 100%; >= 50%.
	//   - Numbering entries from 1 replaces one point per host and adds one: 20 changed
	//     points of a ~1026-point ring, about 2% of keys. The moved share is a sum of 20
	//     exponential arcs, relative spread 1/sqrt(20); we require 0.2%, over 4 sigma below
	//     the mean (and with 2000 keys, 4 keys).
	for _, v := range []struct {
		name     string
		variant  ringVariant
		configs  []string
		minShare float64
	}{
		{`key "ID-i"`, ringVariant{sep: "-"}, []string{"weighted", "clamped"}, 0.5},
		{"entries from 1", ringVariant{firstIdx: 1}, []string{"weighted"}, 0.002},
		{"no sort", ringVariant{unsorted: true}, []string{"tiny"}, 0.5},
	} {
		for _, cname := range v.configs {
			var c ringConfig
			for _, cc := range configs {
				if cc.name == cname {
					c = cc
				}
			}
			o := obs[cname]
			if len(o) == 0 {
				t.Fatalf("no observations for %s", cname)
			}
			hosts := make([]Host, n)
			for i, k := range c.order(n) {
				w := uint32(1)
				if c.weights != nil {
					w = c.weights[k]
				}
				hosts[i] = Host{ID: sorted[k], Weight: w}
			}
			r, err := newRing(hosts, c.min, c.max, v.variant)
			if err != nil {
				t.Fatal(err)
			}
			dis := 0
			for _, ob := range o {
				if hosts[r.Pick(KeyHash(ob.key))].ID != ob.backend {
					dis++
				}
			}
			share := float64(dis) / float64(len(o))
			if share < v.minShare {
				t.Errorf("variant %q on %s disagrees with gRPC on only %.1f%% of keys (need %.1f%%); the comparison would not catch it",
					v.name, cname, 100*share, 100*v.minShare)
			} else {
				t.Logf("variant %q on %s: disagrees with gRPC on %.1f%% of keys", v.name, cname, 100*share)
			}
		}
	}
}

// runGRPCRing dials the backends through grpc-go's ring hash with a manual resolver and
// sends one RPC per key, each carrying its key in the x-session header.
func runGRPCRing(t *testing.T, c ringConfig, eps []resolver.Endpoint, nHosts int) []observation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	r := manual.NewBuilderWithScheme("stickylb-chash-" + c.name)
	r.InitialState(resolver.State{Endpoints: eps})
	sc := fmt.Sprintf(`{"loadBalancingConfig":[{"ring_hash_experimental":{"requestHashHeader":"x-session","minRingSize":%d,"maxRingSize":%d}}]}`,
		c.min, c.max)
	cc, err := grpc.NewClient(r.Scheme()+":///backends", grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(sc))
	if err != nil {
		t.Fatalf("dialing through ring_hash: %v", err)
	}
	defer cc.Close()
	client := healthpb.NewHealthClient(cc)

	call := func(key string) (string, error) {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		defer rcancel()
		rctx = metadata.AppendToOutgoingContext(rctx, "x-session", key)
		var p peer.Peer
		var hdr metadata.MD
		if _, err := client.Check(rctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p), grpc.Header(&hdr)); err != nil {
			return "", fmt.Errorf("RPC with x-session %q: %w", key, err)
		}
		who := hdr.Get("x-backend")
		if len(who) != 1 || p.Addr == nil || who[0] != p.Addr.String() {
			return "", fmt.Errorf("RPC with x-session %q: peer %v but server says %v", key, p.Addr, who)
		}
		return who[0], nil
	}

	if c.warm {
		// gRPC's ring hash connects lazily: a pick that lands on an IDLE endpoint starts its
		// connection and waits. (It walks past an endpoint only in TRANSIENT_FAILURE, which
		// would show up below as a mismatch, not as a pass.) Wait, by condition, until every
		// backend has answered some key, so every endpoint is READY before we measure.
		seen := map[string]bool{}
		for i := 0; len(seen) < nHosts; i++ {
			if ctx.Err() != nil {
				t.Fatalf("after %d warm-up RPCs only %d of %d backends answered: %v", i, len(seen), nHosts, seen)
			}
			who, err := call(fmt.Sprintf("warm-%d", i))
			if err != nil {
				t.Fatal(err)
			}
			seen[who] = true
		}
	}

	out := make([]observation, c.keys)
	err = fanout.Each(c.keys, 4, func(i int) error {
		key := fmt.Sprintf("session-%s-%d", c.name, i)
		who, err := call(key)
		if err != nil {
			return err
		}
		out[i] = observation{key: key, backend: who}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
