package main

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/stickylb/stickylb/internal/testkit/grpctest"
	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/xds"
)

// A control plane that starts publishes its first EDS only once its first probes have
// decided: a node that subscribes at once (as every node does when a restarted control
// plane comes back) is never told UNKNOWN, which it would route to, for a backend that
// is down; the live one is HEALTHY. It comes within the checks' first-verdict bound (the
// first probe's delay plus its timeout) plus 5 s of slack for a loaded machine.
func TestXDSFirstEDSHasNoStartupUnknown(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0") // the kernel completes handshakes: a live backend
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	down := loopback.Refused(t) // a dead backend
	hc := health.Config{Protocol: health.TCP, Interval: 2 * time.Second, Timeout: time.Second}
	p := write(t, "pools.yaml", fmt.Sprintf(`services:
  - name: web
    protocol: http
    listen: 0.0.0.0:10000
    health_check: {protocol: tcp, interval: %s, timeout: %s}
    backends:
      - {address: %s}
      - {address: %s}
`, hc.Interval, hc.Timeout, up.Addr(), down))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, _, done := runXDS(ctx, t, xdsOptions{pools: p, listen: "127.0.0.1:0", poll: time.Second}, zaptest.NewLogger(t))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	bound := hc.FirstVerdictWithin() + xds.FirstVerdictSlack
	rctx, rcancel := context.WithTimeout(ctx, bound+5*time.Second)
	defer rcancel()
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(rctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// A gRPC-like node (not "envoy"): served by name, so EDS alone can be asked for.
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "first-node", UserAgentName: "grpc-go"},
		TypeUrl: resource.EndpointType, ResourceNames: []string{"web"}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("no EDS within %s: %v", bound+5*time.Second, err)
	}
	t.Logf("first EDS %s after subscribing (bound %s)", time.Since(start).Round(time.Millisecond), bound)
	if len(resp.GetResources()) != 1 {
		t.Fatalf("%d load assignments, want 1", len(resp.GetResources()))
	}
	got := grpctest.EndpointStatuses(t, resp, func(e *endpointv3.LbEndpoint) string {
		sa := e.GetEndpoint().GetAddress().GetSocketAddress()
		return net.JoinHostPort(sa.GetAddress(), fmt.Sprint(sa.GetPortValue()))
	})
	if got[up.Addr().String()] != corev3.HealthStatus_HEALTHY || got[down] != corev3.HealthStatus_UNHEALTHY {
		t.Fatalf("first EDS: %v; want %s HEALTHY and %s UNHEALTHY (no startup UNKNOWN)", got, up.Addr(), down)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d", code)
	}
}
