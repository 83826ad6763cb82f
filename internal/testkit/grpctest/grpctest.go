// Package grpctest is the grpc-go side of the tests that put a real grpc-go client in front
// of stickylb: a server on loopback, one xDS client node with its own bootstrap, the call
// that tells which backend answered, grpc-go's weight-shuffling switch (a test runs itself
// again in the other mode), and what an xDS client reads of an EDS response.
package grpctest

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	xdsgrpc "google.golang.org/grpc/xds"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
)

const (
	// SessionHeader carries a call's session key: the pools files of these tests hash it.
	SessionHeader = "x-session"
	// BackendHeader is the response header in which the tests' backends name themselves.
	BackendHeader = "backend"
)

// Serve serves a new grpc.Server, with what register puts on it, on a loopback port until
// the test ends, and returns its address.
func Serve(tb testing.TB, register func(*grpc.Server), opts ...grpc.ServerOption) string {
	tb.Helper()
	g := grpc.NewServer(opts...)
	register(g)
	ln := loopback.Listen(tb)
	go g.Serve(ln)
	tb.Cleanup(g.Stop)
	return ln.Addr().String()
}

// DialXDS is one grpc-go node subscribed to the xDS server at xdsAddr (without TLS), with
// its own bootstrap (node id and zone) and resolver, dialing service. The connection is
// closed when the test ends.
func DialXDS(tb testing.TB, xdsAddr, nodeID, zone, service string) *grpc.ClientConn {
	tb.Helper()
	bootstrap := fmt.Sprintf(`{"xds_servers":[{"server_uri":%q,"channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],"node":{"id":%q,"locality":{"zone":%q}}}`, xdsAddr, nodeID, zone)
	rb, err := xdsgrpc.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		tb.Fatalf("grpctest: the xDS resolver: %v", err)
	}
	cc, err := grpc.NewClient("xds:///"+service, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(rb))
	if err != nil {
		tb.Fatalf("grpctest: dialing %s through xDS: %v", service, err)
	}
	tb.Cleanup(func() { cc.Close() })
	return cc
}

// Call sends one health Check carrying key in SessionHeader and returns the backend that
// answered, as it named itself in BackendHeader.
func Call(ctx context.Context, cc *grpc.ClientConn, key string) (string, error) {
	var hdr metadata.MD
	ctx = metadata.AppendToOutgoingContext(ctx, SessionHeader, key)
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr)); err != nil {
		return "", err
	}
	if v := hdr.Get(BackendHeader); len(v) == 1 {
		return v[0], nil
	}
	return "", fmt.Errorf("no %s header: %v", BackendHeader, hdr)
}
