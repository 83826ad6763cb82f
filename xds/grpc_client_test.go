package xds

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/stickylb/stickylb/internal/testkit/grpctest"
	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// grpcBackend answers health Checks, telling which backend served in a response header.
type grpcBackend struct {
	healthpb.UnimplementedHealthServer
	name, addr string
	srv        *grpc.Server
}

func (b *grpcBackend) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	grpc.SetHeader(ctx, metadata.Pairs(grpctest.BackendHeader, b.name))
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func startGRPCBackends(t *testing.T, n int) []*grpcBackend {
	var bs []*grpcBackend
	for i := 0; i < n; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		b := &grpcBackend{name: fmt.Sprintf("b%d", i+1), addr: ln.Addr().String(), srv: grpc.NewServer()}
		healthpb.RegisterHealthServer(b.srv, b)
		go b.srv.Serve(ln)
		t.Cleanup(b.srv.Stop)
		bs = append(bs, b)
	}
	return bs
}

// startXDS serves f on loopback and returns the server and its address.
func startXDS(t *testing.T, f *pools.File) (*Server, string) {
	t.Helper()
	return startXDSWithView(t, f, nil)
}

// startXDSWithView is startXDS with a health view.
func startXDSWithView(t *testing.T, f *pools.File, view HealthView) (*Server, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s := NewServer(ctx, f, view, zaptest.NewLogger(t))
	return s, grpctest.Serve(t, s.Register)
}

// stateView is a health view a test sets verdict by verdict, by backend identity (Unknown
// until set).
type stateView struct {
	mu     sync.Mutex
	states map[string]health.State
}

func newStateView(initial map[string]health.State) *stateView {
	return &stateView{states: initial}
}

func (v *stateView) view(_ string, b *pools.Backend) health.State {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.states[b.Identity()]
}

func (v *stateView) set(id string, st health.State) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.states[id] = st
}

// listen is a loopback listener, closed when the test ends.
func listen(t testing.TB) net.Listener {
	t.Helper()
	return loopback.Listen(t)
}

// dialXDS is one simulated node: its own bootstrap (node id and zone) and resolver.
func dialXDS(t *testing.T, xdsAddr, nodeID, zone, service string) *grpc.ClientConn {
	t.Helper()
	return grpctest.DialXDS(t, xdsAddr, nodeID, zone, service)
}

// call sends key and returns the backend that answered.
func call(ctx context.Context, cc *grpc.ClientConn, key string) (string, error) {
	return grpctest.Call(ctx, cc, key)
}

func grpcPools(t *testing.T, bs []*grpcBackend, weights []int, extra string) *pools.File {
	t.Helper()
	var b strings.Builder
	b.WriteString("services:\n  - name: api\n    protocol: grpc\n    affinity: {mode: header, header: {name: x-session}}\n    balance: ring_hash\n    hash: {min_ring_size: 1024, max_ring_size: 4096}\n" + extra + "    backends:\n")
	for i, be := range bs {
		fmt.Fprintf(&b, "      - {address: %q, weight: %d, zone: zone-a}\n", be.addr, weights[i])
	}
	f := poolstest.Parse(t, b.String())
	return f
}

// TestGRPCRingHashFollowsPolicies: a real grpc-go xDS client subscribed to our server keeps
// each x-session key on one backend, and on exactly the backend policies' ring predicts,
// with unequal weights. grpc-go's default weighted pick-first shuffling turns endpoint
// weights into rounded fractions, so the exact comparison runs with
// GRPC_EXPERIMENTAL_PF_WEIGHTED_SHUFFLING=false (grpc reads it at start: the test re-runs
// itself in a child process with it set).
func TestGRPCRingHashFollowsPolicies(t *testing.T) {
	if !grpctest.ExactWeights(t) {
		return // the child runs it with exact weights
	}
	bs := startGRPCBackends(t, 3)
	weights := []int{3, 1, 2}
	f := grpcPools(t, bs, weights, "")
	_, xdsAddr := startXDS(t, f)
	cc := dialXDS(t, xdsAddr, "grpc-a", "zone-a", "api")
	hosts := make([]chash.Host, len(bs))
	nameOf := map[string]string{}
	for i, b := range bs {
		hosts[i] = chash.Host{ID: b.addr, Weight: uint32(weights[i])}
		nameOf[b.addr] = b.name
	}
	ring, err := chash.NewRing(hosts, 1024, 4096)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	counts := map[string]int{}
	const keys = 300
	for i := 0; i < keys; i++ {
		key := fmt.Sprintf("session-%04d", i)
		want := bs[ring.Pick(chash.KeyHash(key))].name
		for j := 0; j < 3; j++ {
			got, err := call(ctx, cc, key)
			if err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			if got != want {
				t.Fatalf("%s went to %s; the policies ring says %s", key, got, want)
			}
		}
		counts[want]++
	}
	t.Logf("%d keys, all on the predicted backend, 3 calls each; per backend (weights 3:1:2): %v", keys, counts)
}
