package xds

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stickylb/stickylb/internal/testkit/grpctest"
	"github.com/stickylb/stickylb/policies/pools"
)

// bufXDS serves s over an in-memory listener and returns a dialer of fresh connections.
func bufXDS(t testing.TB, s *Server) func() *grpc.ClientConn {
	t.Helper()
	ln := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	s.Register(g)
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	return func() *grpc.ClientConn {
		cc, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
}

// tcpXDS serves s on loopback and returns a dialer of fresh connections.
func tcpXDS(t testing.TB, s *Server) func() *grpc.ClientConn {
	t.Helper()
	addr := grpctest.Serve(t, s.Register)
	return func() *grpc.ClientConn {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
}

// adsNode opens an ADS stream as node (id, zone), asks for clusters and waits for the first
// response. It returns the stream, the function that closes it, and the response's error
// (a refused stream's status).
func adsNode(ctx context.Context, cc *grpc.ClientConn, id, zone string) (discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient, context.CancelFunc, error) {
	sctx, cancel := context.WithCancel(ctx)
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(sctx)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	node := &corev3.Node{Id: id, Locality: &corev3.Locality{Zone: zone}}
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
		cancel()
		return nil, nil, err
	}
	if _, err := stream.Recv(); err != nil {
		cancel()
		return nil, nil, err
	}
	return stream, cancel, nil
}

func prewarmGoroutines(n int) {
	var wg sync.WaitGroup
	release := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Go(func() { <-release })
	}
	close(release)
	wg.Wait()
}

func heapAfterGC() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// settledHeap is the heap once the process has stopped tearing things down: gRPC closes a
// transport's goroutines and buffers after Close returns, so a reading taken while an
// earlier server's connections are still closing counts their memory (CI's race pass once
// read a base 4.4 MB high that was freed during the next measurement: a quiet server seemed
// to keep 4.3 MB, and 6.5 MB after the churn failed the 1.5x bound). It waits until the
// goroutine count and the heap stand still across two readings 50 ms apart, at most 5 s.
func settledHeap() uint64 {
	h, g := heapAfterGC(), runtime.NumGoroutine()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		h2, g2 := heapAfterGC(), runtime.NumGoroutine()
		if g2 == g && max(h, h2)-min(h, h2) < 64<<10 {
			return h2
		}
		h, g = h2, g2
	}
	return h
}

type nodeChurn struct {
	s        *Server
	retained uint64   // heap the server holds after the churn, its file included
	rounds   []uint64 // the same after each round of the churn
	absolute uint64   // the process's heap then
	freed    bool     // the transient nodes' state was released
}

// churn starts a server on f with 10 long-lived nodes (two named zones, one unknown), runs
// transient ADS streams with distinct ids over zones distinct zones through it and closes
// them, then measures what the server keeps.
func churn(ctx context.Context, t *testing.T, f *pools.File, transient, zones, rounds int) nodeChurn {
	base := settledHeap()
	// Every stream comes from 127.0.0.1: one identity, whose share is raised with the caps.
	s := NewServer(ctx, f, nil, zap.NewNop(), WithMaxNodes(50_000), WithMaxNodesPerIdentity(50_000), WithMaxStreams(50_000))
	dial := tcpXDS(t, s) // loopback: an in-memory pipe's buffers would count as the server's heap
	cc := dial()
	for i := 0; i < 10; i++ {
		_, _, err := adsNode(ctx, cc, fmt.Sprintf("steady-%d", i), []string{"zone-a", "zone-b", "zone-elsewhere"}[i%3])
		if err != nil {
			t.Fatal(err)
		}
	}
	out := nodeChurn{s: s, freed: true}
	for r := 0; r < max(rounds, 1); r++ {
		if !churnRound(ctx, t, s, dial, transient, zones) {
			out.freed = false
		}
		out.absolute = settledHeap()
		out.rounds = append(out.rounds, out.absolute-base)
		if p := os.Getenv("CHURN_HEAP"); p != "" && transient > 0 {
			fh, _ := os.Create(fmt.Sprintf("%s.%d", p, r))
			pprof.WriteHeapProfile(fh)
			fh.Close()
		}
	}
	out.retained = out.rounds[len(out.rounds)-1]
	return out
}

// churnRound opens transient streams with distinct ids over zones zones through s, closes
// them, and reports whether the server's node list is back to the 10 long-lived nodes.
func churnRound(ctx context.Context, t *testing.T, s *Server, dial func() *grpc.ClientConn, transient, zones int) bool {
	conns := make([]*grpc.ClientConn, 16)
	for i := range conns {
		conns[i] = dial()
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		cancels []context.CancelFunc
		errs    []error
	)
	// The transient streams' parent is dropped after the churn: a context keeps the table
	// of its children as large as it ever grew, and that is the test's memory, not the
	// server's.
	tctx, tcancel := context.WithCancel(ctx)
	defer tcancel()
	work := make(chan int)
	for w := 0; w < 64; w++ {
		wg.Go(func() {
			for i := range work {
				_, c, err := adsNode(tctx, conns[i%len(conns)], fmt.Sprintf("transient-%d", i), fmt.Sprintf("z-%d", i%zones))
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					cancels = append(cancels, c)
				}
				mu.Unlock()
			}
		})
	}
	opened := time.Now()
	for i := 0; i < transient; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d transient streams failed, first: %v", len(errs), transient, errs[0])
	}
	if transient > 0 {
		t.Logf("%d streams in %d zones open (%d goroutines) after %s", transient, zones, runtime.NumGoroutine(), time.Since(opened).Round(time.Millisecond))
	}
	for _, c := range cancels {
		c()
	}
	tcancel()
	tctx, cancels = nil, nil
	for _, c := range conns {
		c.Close()
	}
	// The server learns of each close asynchronously; it has until the deadline.
	deadline := time.Now().Add(20 * time.Second)
	for len(s.Nodes()) != 10 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// TestNodeChurnLeavesNoState: transient streams with distinct node ids and zones, once
// closed, leave the server's memory within 1.5x (plus the peak's map tables, see below), and
// its reload time within 2x, of a server that only had the 10 long-lived nodes; a second
// churn as large keeps no more than the first. 20,000 streams in 5,000 zones (500 in 100 under
// -short), 20 services x 200 endpoints (the bulk in EDS, which the transient streams do not
// ask for: the churn is about node state, not about sending 20,000 copies). The reloads of the two servers alternate, so that
// the load of a shared machine weighs on both alike; each figure is the fastest of 15.
func TestNodeChurnLeavesNoState(t *testing.T) {
	transient, zones := 20_000, 5_000
	if testing.Short() {
		transient, zones = 500, 100
	}
	f, g := bigPools(t, 20, 200, 8080), bigPools(t, 20, 200, 8081)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	churn(ctx, t, f, 50, 10, 1) // warm-up: one-time initialisations must not count as either server's
	// The runtime keeps a descriptor for every goroutine that ever ran at once (3 per open
	// stream here, client and server): spawn that many first, so that neither figure
	// counts the runtime's goroutine cache.
	prewarmGoroutines(4 * transient)
	quiet := churn(ctx, t, f, 0, 1, 1)
	busy := churn(ctx, t, f, transient, zones, 2)
	// Each pair of reloads (quiet, then busy) runs back to back, so a burst of load on the
	// shared machine mostly weighs on both; the figure compared is the median of the pairs'
	// ratios, which one burst cannot move. The views a reload builds are counted too: that
	// figure does not depend on the machine at all.
	reload := [2]time.Duration{time.Hour, time.Hour}
	var ratios []float64
	var builds [2]uint64
	var quietTook time.Duration // the pair's first reload
	for i := 0; i < 30; i++ {
		next := g
		if i/2%2 == 1 {
			next = f
		}
		s := []*Server{quiet.s, busy.s}[i%2]
		before := s.Stats.Builds.Load()
		start := time.Now()
		if err := s.Update(next); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		builds[i%2] = s.Stats.Builds.Load() - before
		reload[i%2] = min(reload[i%2], took)
		if i%2 == 0 {
			quietTook = took
		} else {
			ratios = append(ratios, float64(took)/float64(quietTook))
		}
	}
	slices.Sort(ratios)
	ratio := ratios[len(ratios)/2]
	t.Logf("10 nodes only: %.1f MB retained (process heap %.1f MB), reload %s (%d views built); after %d transient nodes: %.1f MB, after as many again %.1f MB (process heap %.1f MB), reload %s (%d views built), median ratio %.2f, state freed %v",
		float64(quiet.retained)/1e6, float64(quiet.absolute)/1e6, reload[0], builds[0], transient, float64(busy.rounds[0])/1e6, float64(busy.rounds[1])/1e6, float64(busy.absolute)/1e6, reload[1], builds[1], ratio, busy.freed)
	if builds[1] > builds[0] {
		t.Errorf("a reload after the churn built %d views, a quiet server's %d", builds[1], builds[0])
	}
	if !busy.freed {
		t.Errorf("the closed streams' nodes are still listed")
	}
	// go-control-plane's snapshot caches keep two maps keyed by stream, and a Go map keeps the
	// table of its peak size: about 100 bytes per stream of the most that were ever open at
	// once (bounded by --max-streams), reused by the next burst. Beyond that allowance nothing
	// may stay, and a second churn as large must not add to the first.
	allowance := 128 * float64(transient)
	if float64(busy.rounds[0]) > 1.5*float64(quiet.retained)+allowance {
		t.Errorf("retained %.1f MB after the churn, more than 1.5x the %.1f MB of a quiet server plus %.1f MB for the peak's map tables",
			float64(busy.rounds[0])/1e6, float64(quiet.retained)/1e6, allowance/1e6)
	}
	if grew := float64(busy.rounds[1]) - float64(busy.rounds[0]); grew > max(0.1*float64(busy.rounds[0]), 512<<10) {
		t.Errorf("a second churn of %d streams kept %.1f MB more than the first (%.1f MB, then %.1f MB)",
			transient, grew/1e6, float64(busy.rounds[0])/1e6, float64(busy.rounds[1])/1e6)
	}
	if ratio > 2 {
		t.Errorf("a reload after the churn took %.2fx the time of the quiet server's beside it (median of %d pairs; fastest %s vs %s), more than 2x", ratio, len(ratios), reload[1], reload[0])
	}
}

// TestMaxNodes: beyond the cap a new node id is refused with ResourceExhausted; another
// stream of a live node is not a new node; a closed node's place is free again.
func TestMaxNodes(t *testing.T) {
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zap.NewNop(), WithMaxNodes(2))
	cc := bufXDS(t, s)()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	_, closeA, err := adsNode(ctx, cc, "a", "zone-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := adsNode(ctx, cc, "b", "zone-b"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := adsNode(ctx, cc, "c", "zone-a"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a third node with max 2: %v, want ResourceExhausted", err)
	}
	_, closeA2, err := adsNode(ctx, cc, "a", "zone-a")
	if err != nil {
		t.Fatalf("a second stream of a live node: %v", err)
	}
	closeA()
	testwait.For(t, 5*time.Second, "node a's first stream closed", func() (bool, string) {
		return s.streamsOf("a") == 1, fmt.Sprint(s.streamsOf("a"))
	})
	if _, _, err := adsNode(ctx, cc, "c", "zone-a"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("node a still has a stream: %v, want ResourceExhausted", err)
	}
	closeA2()
	testwait.For(t, 5*time.Second, "node a gone", func() (bool, string) {
		return s.streamsOf("a") == 0, fmt.Sprint(s.streamsOf("a"))
	})
	if _, _, err := adsNode(ctx, cc, "c", "zone-a"); err != nil {
		t.Fatalf("a new node once a left: %v", err)
	}
	if got := s.Stats.Refused.Of(RefusedMaxNodes); got != 2 {
		t.Fatalf("%d streams counted as refused, want 2", got)
	}
}

// TestACKWhileBuilding: an ACK and a new stream of a known zone are handled while a reload
// is building (the build holds only the lock that orders builds).
func TestACKWhileBuilding(t *testing.T) {
	s := NewServer(t.Context(), bigPools(t, 2, 3, 8080), nil, zap.NewNop())
	s.testNode(t, "acker", "zone-a")
	building, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.mutateResources(func(*Resources) {
		once.Do(func() { close(building); <-release })
	})
	reloaded := make(chan error, 1)
	go func() { reloaded <- s.Update(bigPools(t, 2, 4, 8080)) }()
	<-building
	handled := make(chan struct{})
	go func() {
		s.mu.Lock()
		sid := s.nodeStreamsLocked("acker")[0].id
		s.mu.Unlock()
		s.request(sid, nil, resource.ClusterType, "1", "", false, "1")
		s.open(context.Background(), -99)
		s.request(-99, &corev3.Node{Id: "newcomer", Locality: &corev3.Locality{Zone: "zone-a"}}, resource.ClusterType, "", "", false, "")
		close(handled)
	}()
	select {
	case <-handled:
	case <-time.After(5 * time.Second):
		t.Error("an ACK and a new stream waited for the build")
	}
	close(release)
	if err := <-reloaded; err != nil {
		t.Fatal(err)
	}
	<-handled
	if v := s.ackedVersion("acker"); v != "1" {
		t.Fatalf("acked version %q", v)
	}
}
