package adsclient

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds"
)

const benchClients = 100

// ackWatch counts, per version, the (node, type) pairs that ACKed it, and says when all did.
type ackWatch struct {
	mu      sync.Mutex
	version string
	seen    map[string]bool
	want    int
	done    chan struct{}
}

// expect starts waiting for want ACKs of version.
func (a *ackWatch) expect(version string, want int) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.version, a.want, a.seen, a.done = version, want, map[string]bool{}, make(chan struct{})
	return a.done
}

func (a *ackWatch) see(node string, r *discoveryv3.DiscoveryRequest) {
	if r.GetResponseNonce() == "" || r.GetErrorDetail() != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done == nil || r.GetVersionInfo() != a.version {
		return
	}
	k := node + " " + r.GetTypeUrl()
	if a.seen[k] {
		return
	}
	a.seen[k] = true
	if len(a.seen) == a.want {
		close(a.done)
	}
}

// startClients starts benchClients clients of addr, each subscribing to CDS and EDS with
// handlers that accept; names nil subscribes to everything.
func startClients(b *testing.B, addr string, names ...string) {
	for i := range benchClients {
		c, err := New(Config{Server: addr, NodeID: fmt.Sprintf("node-%d", i), Zone: "zone-a"}, zap.NewNop())
		if err != nil {
			b.Fatal(err)
		}
		accept := func(string, map[string]proto.Message) error { return nil }
		for _, typeURL := range []string{cds, eds} {
			if err := c.Subscribe(typeURL, accept, names...); err != nil {
				b.Fatal(err)
			}
		}
		if err := c.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
	}
}

// propagate runs b.N updates, each timed from push to the last of the clients' ACKs of
// both types, and reports the median and 99th percentile in milliseconds. before, when set,
// runs untimed before each push.
func propagate(b *testing.B, acks *ackWatch, before func(), push func(version string)) {
	var took []time.Duration
	b.ResetTimer()
	for i := range b.N {
		version := strconv.Itoa(i + 2)
		done := acks.expect(version, 2*benchClients)
		if before != nil {
			b.StopTimer()
			before()
			b.StartTimer()
		}
		start := time.Now()
		push(version)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			b.Fatalf("update %s: not every client ACKed within 30s", version)
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	at := func(q float64) float64 { return float64(took[int(q*float64(len(took)-1))]) / 1e6 }
	b.ReportMetric(at(0.5), "p50-ms")
	b.ReportMetric(at(0.99), "p99-ms")
}

// BenchmarkPropagation100: one snapshot update of go-control-plane's server, pushed to 100
// clients subscribed to CDS and EDS by name, until the last client ACKed both. Run with
// -benchtime=50x for stable percentiles.
func BenchmarkPropagation100(b *testing.B) {
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	set := func(version string, port uint32) {
		snap := snapshot(b, version, port, clusterv3.Cluster_ROUND_ROBIN)
		for i := range benchClients {
			if err := cache.SetSnapshot(context.Background(), fmt.Sprintf("node-%d", i), snap); err != nil {
				b.Fatal(err)
			}
		}
	}
	set("1", 1)
	srv := startServer(b, "", cache)
	acks := &ackWatch{}
	srv.onRequest = acks.see
	done := acks.expect("1", 2*benchClients)
	startClients(b, srv.addr, "a", "b")
	<-done
	propagate(b, acks, nil, func(version string) {
		port, _ := strconv.Atoi(version)
		set(version, uint32(port))
	})
}

// benchPoll is how often BenchmarkPropagation100PoolsEdit's control plane looks at its pools
// file (`stickylb xds --poll`; the fleet's end-to-end test runs with it too): a figure
// includes the wait for the next look, up to one interval.
const benchPoll = 100 * time.Millisecond

// BenchmarkPropagation100PoolsEdit: the same through the project's own control plane, as
// `stickylb xds` runs it: one pools-file edit (every backend's port changes), timed from
// the write of the file (renamed into place, as editors and config maps do) through the
// control plane's next poll, the rebuild and the push, to the last of 100 clients,
// subscribed to every cluster and endpoint, ACKing both types. Run with -benchtime=50x for
// stable percentiles.
func BenchmarkPropagation100PoolsEdit(b *testing.B) {
	src := func(port int) []byte {
		var sb strings.Builder
		sb.WriteString("services:\n")
		for s := range 10 {
			fmt.Fprintf(&sb, "  - name: svc-%d\n    protocol: http\n    listen: 0.0.0.0:%d\n    balance: maglev\n    backends:\n", s, 20000+s)
			for e := range 10 {
				fmt.Fprintf(&sb, "      - {address: \"10.0.%d.%d:%d\", zone: zone-a}\n", s, e+1, port)
			}
		}
		return []byte(sb.String())
	}
	path := filepath.Join(b.TempDir(), "pools.yaml")
	write := func(port int) {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, src(port), 0o600); err != nil {
			b.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			b.Fatal(err)
		}
	}
	write(1)
	f, err := pools.Load(path)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	xs := xds.NewServer(ctx, f, nil, zap.NewNop())
	srv := &testServer{}
	acks := &ackWatch{}
	srv.onRequest = acks.see
	srv.serve(b, "", func(g *grpc.Server) { xs.Register(g) })
	done := acks.expect("1", 2*benchClients)
	startClients(b, srv.addr)
	<-done
	go xds.Watch(ctx, path, benchPoll, xs, zap.NewNop(), nil)
	// An edit lands at any point of the poll's cycle: without this, each one would follow
	// the last ACK of the one before at the same phase, and every figure would round up to
	// a whole number of polls.
	dephase := func() { time.Sleep(rand.N(benchPoll)) }
	propagate(b, acks, dephase, func(version string) {
		port, _ := strconv.Atoi(version)
		write(port)
	})
}
