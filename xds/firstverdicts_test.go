package xds

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/stickylb/stickylb/internal/testkit/grpctest"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/health"
)

// WithFirstVerdicts: while the first verdicts are not in, a stream is admitted and sent
// nothing (no snapshot is set for it), and a reload is taken but not served; at the
// release the stream's first response is the current file with the verdicts read then.
func TestFirstVerdictsHold(t *testing.T) {
	src := func(extra string) string {
		return fmt.Sprintf(`services:
  - name: api
    protocol: grpc
    health_check: {protocol: tcp}
    backends:
      - {address: 10.0.7.1:80, hash_key: api-1}
      - {address: 10.0.7.2:80, hash_key: api-2}
%s`, extra)
	}
	states := newStateView(map[string]health.State{})
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := NewServer(ctx, poolstest.Parse(t, src("")), states.view, zaptest.NewLogger(t), WithFirstVerdicts(ready))
	cc, err := grpc.NewClient(grpctest.Serve(t, s.Register), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "n1", UserAgentName: "grpc-go"},
		TypeUrl: resource.EndpointType, ResourceNames: []string{"api"}}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "the stream admitted", func() (bool, string) { return len(s.Nodes()) == 1, fmt.Sprint(s.Nodes()) })
	noSnapshot := func(when string) {
		t.Helper()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, st := range s.streams {
			if st.acks.current != nil {
				t.Fatalf("%s: the stream was set version %s during the hold", when, st.acks.current.GetVersion(resource.EndpointType))
			}
		}
	}
	noSnapshot("admitted")
	if err := s.Refresh(); err != nil { // a transition during the hold
		t.Fatal(err)
	}
	// A reload during the hold: a third backend, published with the rest at the release.
	if err := s.Update(poolstest.Parse(t, src("      - {address: 10.0.7.3:80, hash_key: api-3}\n"))); err != nil {
		t.Fatal(err)
	}
	noSnapshot("after a refresh and a reload")

	states.set("api-1", health.Unhealthy)
	states.set("api-2", health.Healthy)
	close(ready)
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	got := grpctest.EndpointStatuses(t, resp, func(e *endpointv3.LbEndpoint) string { return e.GetEndpoint().GetHostname() })
	// api-3 was added by an edit and has no verdict: UNKNOWN, routable (HAProxy's rule).
	want := map[string]corev3.HealthStatus{"api-1": corev3.HealthStatus_UNHEALTHY, "api-2": corev3.HealthStatus_HEALTHY,
		"api-3": corev3.HealthStatus_UNKNOWN}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("first response: %v, want %v", got, want)
	}
}
