package xds

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// testCA issues real certificates for the identity tests.
type testCA struct {
	t    *testing.T
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
	pool *x509.CertPool
	n    int64
}

func newTestCA(t *testing.T) *testCA {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(c)
	return &testCA{t: t, key: key, cert: c, pool: pool, n: 1}
}

// issue returns a certificate with the given DNS and URI SANs (a server certificate when
// ip is set).
func (ca *testCA) issue(ip net.IP, dns []string, uris ...string) tls.Certificate {
	ca.n++
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(ca.n), Subject: pkix.Name{CommonName: "node"}, DNSNames: dns,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			ca.t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	if ip != nil {
		tmpl.IPAddresses, tmpl.ExtKeyUsage = []net.IP{ip}, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		ca.t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// mtlsXDS serves s with mutual TLS and returns a dialer presenting a given certificate.
func mtlsXDS(t *testing.T, s *Server, ca *testCA) func(tls.Certificate) *grpc.ClientConn {
	srv := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{ca.issue(net.ParseIP("127.0.0.1"), nil)},
		ClientCAs: ca.pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	g := grpc.NewServer(grpc.Creds(srv))
	s.Register(g)
	ln := listen(t)
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	return func(c tls.Certificate) *grpc.ClientConn {
		creds := credentials.NewTLS(&tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{c}, ServerName: "127.0.0.1"})
		cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(creds))
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
	ca := newTestCA(t)
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zaptest.NewLogger(t), WithNodeIdentity())
	dial := mtlsXDS(t, s, ca)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	host1 := dial(ca.issue(nil, []string{"host1.example"}))
	spiffe := dial(ca.issue(nil, nil, "spiffe://fleet.example/edge-7"))
	wildcard := dial(ca.issue(nil, []string{"*.example"}))
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
		ca := newTestCA(t)
		s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zaptest.NewLogger(t), WithNodeIdentity())
		dial := mtlsXDS(t, s, ca)
		byDNS := ca.issue(nil, []string{"host1"})
		bySPIFFE := ca.issue(nil, nil, "spiffe://fleet.example/host1/caddy") // also covers the id
		_, closeFirst, err := adsNode(ctx, dial(byDNS), "host1/caddy", "zone-a")
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := adsNode(ctx, dial(bySPIFFE), "host1/caddy", "zone-a"); status.Code(err) != codes.AlreadyExists {
			t.Fatalf("another certificate for a live node: %v, want AlreadyExists", err)
		}
		if _, _, err := adsNode(ctx, dial(ca.issue(nil, []string{"host1"})), "host1/caddy", "zone-a"); err != nil {
			t.Fatalf("a renewed certificate with the same SANs: %v", err)
		}
		closeFirst()
		_ = s
	})
	t.Run("plaintext", func(t *testing.T) {
		s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zaptest.NewLogger(t))
		g := grpc.NewServer()
		s.Register(g)
		ln := listen(t)
		go g.Serve(ln)
		t.Cleanup(g.Stop)
		from := func(ip string) *grpc.ClientConn {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
			cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cc.Close() })
			return cc
		}
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
