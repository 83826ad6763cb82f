package xds

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/stickylb/stickylb/internal/testkit/grpctest"
	"github.com/stickylb/stickylb/internal/testkit/testcert"
)

// mtlsXDS serves s with mutual TLS and returns a dialer presenting a given certificate.
func mtlsXDS(t *testing.T, s *Server, ca *testcert.CA) func(tls.Certificate) *grpc.ClientConn {
	srv := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{ca.Issue(testcert.Leaf{Server: true, IPs: []net.IP{net.ParseIP("127.0.0.1")}})},
		ClientCAs: ca.Pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	addr := grpctest.Serve(t, s.Register, grpc.Creds(srv))
	return func(c tls.Certificate) *grpc.ClientConn {
		creds := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{c}, ServerName: "127.0.0.1"})
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
}

// TestNodeIdentityFromCertificate: with mTLS and WithNodeIdentity a node id must be
// covered by the client certificate (URI SAN spiffe://TD/ID, or a DNS SAN naming the id's
// host part); anything else is refused with PermissionDenied.
func TestNodeIdentityFromCertificate(t *testing.T) {
	ca := testcert.NewCA(t, "test ca")
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zaptest.NewLogger(t), WithNodeIdentity())
	dial := mtlsXDS(t, s, ca)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	host1 := dial(ca.Issue(testcert.Leaf{DNS: []string{"host1.example"}}))
	spiffe := dial(ca.Issue(testcert.Leaf{URIs: []string{"spiffe://fleet.example/edge-7"}}))
	wildcard := dial(ca.Issue(testcert.Leaf{DNS: []string{"*.example"}}))
	for _, c := range []struct {
		name string
		cc   *grpc.ClientConn
		id   string
		want codes.Code
	}{
		{"DNS SAN covers the xdp node of its host", host1, "host1.example/xdp/eth0", codes.OK},
		{"and its caddy node", host1, "host1.example/caddy", codes.OK},
		{"DNS names compare without case", host1, "HOST1.example/caddy2", codes.OK},
		{"another host's node", host1, "host2.example/caddy", codes.PermissionDenied},
		{"a host that only starts like it", host1, "host1.example.evil/caddy", codes.PermissionDenied},
		{"SPIFFE URI SAN names the node id", spiffe, "edge-7", codes.OK},
		{"another id under the SPIFFE certificate", spiffe, "edge-8", codes.PermissionDenied},
		{"the SPIFFE path is not a host", spiffe, "edge-7/caddy", codes.PermissionDenied},
		{"a wildcard DNS SAN covers nothing", wildcard, "a.example/caddy", codes.PermissionDenied},
	} {
		_, _, err := adsNode(ctx, c.cc, c.id, "zone-a")
		if got := status.Code(err); got != c.want {
			t.Errorf("%s: node %q: %v, want %v", c.name, c.id, err, c.want)
		}
	}
}

// TestSecondStreamOfALiveNode: a second live stream under a node id is refused unless it
// comes from the same identity (the same certificate SANs; without TLS, the same IP).
func TestSecondStreamOfALiveNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	t.Run("mTLS", func(t *testing.T) {
		ca := testcert.NewCA(t, "test ca")
		s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zaptest.NewLogger(t), WithNodeIdentity())
		dial := mtlsXDS(t, s, ca)
		byDNS := ca.Issue(testcert.Leaf{DNS: []string{"host1"}})
		bySPIFFE := ca.Issue(testcert.Leaf{URIs: []string{"spiffe://fleet.example/host1/caddy"}}) // also covers the id
		_, closeFirst, err := adsNode(ctx, dial(byDNS), "host1/caddy", "zone-a")
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := adsNode(ctx, dial(bySPIFFE), "host1/caddy", "zone-a"); status.Code(err) != codes.AlreadyExists {
			t.Fatalf("another certificate for a live node: %v, want AlreadyExists", err)
		}
		if _, _, err := adsNode(ctx, dial(ca.Issue(testcert.Leaf{DNS: []string{"host1"}})), "host1/caddy", "zone-a"); err != nil {
			t.Fatalf("a renewed certificate with the same SANs: %v", err)
		}
		closeFirst()
		_ = s
	})
	t.Run("plaintext", func(t *testing.T) {
		s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zaptest.NewLogger(t))
		addr := grpctest.Serve(t, s.Register)
		from := func(ip string) *grpc.ClientConn { return fromAddr(t, addr, ip) }
		if _, _, err := adsNode(ctx, from("127.0.0.1"), "plain", "zone-a"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := adsNode(ctx, from("127.0.0.2"), "plain", "zone-a"); status.Code(err) != codes.AlreadyExists {
			t.Fatalf("the same id from another address: %v, want AlreadyExists", err)
		}
		if _, _, err := adsNode(ctx, from("127.0.0.1"), "plain", "zone-a"); err != nil {
			t.Fatalf("the same id from the same address (a per-type stream, a reconnect): %v", err)
		}
	})
}
