// Package adstest is a control plane that serves whatever a test gives it: go-control-plane's
// ADS server over its snapshot cache, on loopback, with no check of what it serves (no
// consistency, no validation), as a hostile or broken control plane would. Every node that
// subscribes gets the same resources.
package adstest

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
)

// Server is the control plane. Its methods are safe for concurrent use.
type Server struct {
	// Addr is where it listens (127.0.0.1:port).
	Addr  string
	cache cachev3.SnapshotCache

	mu      sync.Mutex
	version int
	opens   int
	acks    map[string]string // type URL -> version last ACKed by any node
	nacks   []string          // error details, in order
}

// oneNode files every node under one key: each gets the same snapshot.
type oneNode struct{}

func (oneNode) ID(*corev3.Node) string { return "" }

// Start serves on a free loopback port until the test ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("adstest: listening: %v", err)
	}
	return Serve(tb, ln)
}

// Serve serves on ln (one a test opened in a network namespace of its own, say) until the
// test ends.
func Serve(tb testing.TB, ln net.Listener) *Server {
	tb.Helper()
	s := &Server{Addr: ln.Addr().String(), cache: cachev3.NewSnapshotCache(false, oneNode{}, nil), acks: map[string]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	xs := serverv3.NewServer(ctx, s.cache, serverv3.CallbackFuncs{
		StreamOpenFunc: func(context.Context, int64, string) error {
			s.mu.Lock()
			s.opens++
			s.mu.Unlock()
			return nil
		},
		StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			if r.GetErrorDetail() != nil {
				s.nacks = append(s.nacks, r.GetErrorDetail().GetMessage())
			} else if r.GetResponseNonce() != "" {
				s.acks[r.GetTypeUrl()] = r.GetVersionInfo()
			}
			return nil
		},
	})
	g := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, xs)
	go func() { _ = g.Serve(ln) }()
	tb.Cleanup(func() { g.Stop(); cancel() })
	return s
}

// Set serves clusters and assignments as a new version, which it returns (an
// assignment may be missing, or name no cluster: nothing is checked).
func (s *Server) Set(tb testing.TB, clusters []*clusterv3.Cluster, assignments []*endpointv3.ClusterLoadAssignment) string {
	tb.Helper()
	s.mu.Lock()
	s.version++
	v := fmt.Sprint(s.version)
	s.mu.Unlock()
	cs := make([]types.Resource, len(clusters))
	for i, c := range clusters {
		cs[i] = c
	}
	ls := make([]types.Resource, len(assignments))
	for i, l := range assignments {
		ls[i] = l
	}
	snap, err := cachev3.NewSnapshot(v, map[resource.Type][]types.Resource{resource.ClusterType: cs, resource.EndpointType: ls})
	if err != nil {
		tb.Fatalf("adstest: snapshot: %v", err)
	}
	if err := s.cache.SetSnapshot(context.Background(), "", snap); err != nil {
		tb.Fatalf("adstest: setting the snapshot: %v", err)
	}
	return v
}

// Acked is the version of typeURL a node last ACKed ("" before any).
func (s *Server) Acked(typeURL string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acks[typeURL]
}

// NACKs are the error details of every NACK received, in order.
func (s *Server) NACKs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.nacks...)
}

// Opens counts the streams opened so far.
func (s *Server) Opens() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opens
}
