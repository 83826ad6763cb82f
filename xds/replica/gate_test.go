package replica

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
)

// The gate refuses xDS streams only: while it is closed, an ADS stream gets UNAVAILABLE
// and the gRPC health service's Watch (a stream too) still reports NOT_SERVING, which is
// what an Envoy bootstrap health-checking the replicas needs to see.
func TestGateRefusesXDSStreamsOnly(t *testing.T) {
	r := offline(t, zap.NewNop())
	g := grpc.NewServer(grpc.ChainStreamInterceptor(r.Gate().StreamInterceptor()))
	r.Server().Register(g)
	hs := grpchealth.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	ln := loopback.Listen(t)
	go g.Serve(ln)
	defer g.Stop()
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	w, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := w.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health Watch while the gate is closed: %v %v, want NOT_SERVING", resp, err)
	}
	ads, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = ads.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "n"}, TypeUrl: resource.ClusterType}) // io.EOF once refused
	if _, err := ads.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("ADS while the gate is closed: %v, want UNAVAILABLE", err)
	}
}
