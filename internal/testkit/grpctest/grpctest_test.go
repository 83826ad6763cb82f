package grpctest

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

// TestCallReadsTheBackendHeader: Call returns the name a backend puts in BackendHeader,
// sends the key in SessionHeader, and fails when a backend names nobody.
func TestCallReadsTheBackendHeader(t *testing.T) {
	serve := func(name string) *grpc.ClientConn {
		addr := Serve(t, func(g *grpc.Server) { healthpb.RegisterHealthServer(g, health.NewServer()) },
			grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				md, _ := metadata.FromIncomingContext(ctx)
				if name != "" {
					grpc.SetHeader(ctx, metadata.Pairs(BackendHeader, name+"/"+md.Get(SessionHeader)[0]))
				}
				return h(ctx, req)
			}))
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if got, err := Call(ctx, serve("b1"), "k-1"); err != nil || got != "b1/k-1" {
		t.Errorf("Call = %q, %v; want b1/k-1", got, err)
	}
	if got, err := Call(ctx, serve(""), "k-1"); err == nil {
		t.Errorf("Call = %q with no backend header, want an error", got)
	}
}
