package xds

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/pools"
)

func bigPools(b testing.TB, services, endpoints int, port int) *pools.File {
	var sb strings.Builder
	sb.WriteString("services:\n")
	for s := 0; s < services; s++ {
		fmt.Fprintf(&sb, "  - name: svc-%d\n    protocol: http\n    listen: 0.0.0.0:%d\n    affinity: {mode: header, header: {name: x-session}}\n    balance: maglev\n    cross_zone: false\n    backends:\n", s, 20000+s)
		for e := 0; e < endpoints; e++ {
			fmt.Fprintf(&sb, "      - {address: \"10.%d.%d.%d:%d\", weight: %d, zone: zone-%c}\n", s/250, s%250, e+1, port, 1+e%3, 'a'+rune(e%3))
		}
	}
	f := poolstest.Parse(b, sb.String())
	return f
}

// BenchmarkSnapshotBuild: translating and validating 1,000 services x 100 endpoints for
// one node (what every reload and health transition costs per node).
func BenchmarkSnapshotBuild(b *testing.B) {
	f := bigPools(b, 1000, 100, 8080)
	s := NewServer(context.Background(), f, nil, zap.NewNop())
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.build(f, Node{ID: "n", Zone: "zone-a"}, "v", nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPropagation: time from Update to the last of 100 subscribed ADS clients
// receiving the new cluster version.
func BenchmarkPropagation(b *testing.B) {
	f := bigPools(b, 10, 10, 8080)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := NewServer(ctx, f, nil, zap.NewNop())
	g := grpc.NewServer()
	s.Register(g)
	ln := listen(b)
	go g.Serve(ln)
	defer g.Stop()
	const clients = 100
	versions := make([]chan string, clients)
	for i := range versions {
		versions[i] = make(chan string, 16)
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err != nil {
			b.Fatal(err)
		}
		node := &corev3.Node{Id: fmt.Sprintf("bench-%d", i), Locality: &corev3.Locality{Zone: "zone-a"}}
		stream.Send(&discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType})
		go func(ch chan string) {
			for {
				resp, err := stream.Recv()
				if err != nil {
					return
				}
				stream.Send(&discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce})
				ch <- resp.VersionInfo
			}
		}(versions[i])
	}
	for _, ch := range versions { // initial snapshot
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			b.Fatal("no initial response")
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		next := bigPools(b, 10, 10, 8081+i%2)
		if err := s.Update(next); err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		for _, ch := range versions {
			wg.Go(func() {
				select {
				case <-ch:
				case <-time.After(30 * time.Second):
					b.Error("update not received")
				}
			})
		}
		wg.Wait()
	}
}
