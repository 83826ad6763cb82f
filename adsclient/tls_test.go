package adsclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// pki is a test CA with its files.
type pki struct {
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	caFile string
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func newCA(t *testing.T, dir, name string) *pki {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{cert: cert, key: key, caFile: filepath.Join(dir, name+".pem")}
	writePEM(t, p.caFile, "CERTIFICATE", der)
	return p
}

// issue signs a leaf for dnsName (server) or a client certificate, and writes its files.
func (p *pki) issue(t *testing.T, dir, name, dnsName string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	if dnsName != "" {
		tmpl.DNSNames = []string{dnsName}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	return certFile, keyFile
}

// TestTLSAndMTLS: the client reaches a TLS server whose certificate its CA signed (checked
// against ServerName), and a server demanding client certificates when it presents one; it
// is refused, and keeps retrying, with the wrong CA, the wrong server name, or no client
// certificate where one is required. A refusal is checked after two attempts failed for
// the expected reason, and the server must have received no request.
func TestTLSAndMTLS(t *testing.T) {
	dir := t.TempDir()
	ca, other := newCA(t, dir, "ca"), newCA(t, dir, "other-ca")
	const serverName = "xds.test"
	srvCert, srvKey := ca.issue(t, dir, "server", serverName, x509.ExtKeyUsageServerAuth)
	cliCert, cliKey := ca.issue(t, dir, "client", "", x509.ExtKeyUsageClientAuth)
	pair, err := tls.LoadX509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)

	for _, tc := range []struct {
		name       string
		mtls       bool
		cfg        TLS
		refusedFor string // "" when the client must get through
	}{
		{name: "tls", cfg: TLS{CAFile: ca.caFile, ServerName: serverName}},
		{name: "tls wrong CA", cfg: TLS{CAFile: other.caFile, ServerName: serverName}, refusedFor: "certificate signed by unknown authority"},
		{name: "tls wrong name", cfg: TLS{CAFile: ca.caFile}, refusedFor: "doesn't contain any IP SANs"},
		{name: "mtls", mtls: true, cfg: TLS{CAFile: ca.caFile, ServerName: serverName, CertFile: cliCert, KeyFile: cliKey}},
		{name: "mtls without a client certificate", mtls: true, cfg: TLS{CAFile: ca.caFile, ServerName: serverName}, refusedFor: "certificate required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
			if tc.mtls {
				scfg.ClientCAs, scfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
			}
			cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
			if err := cache.SetSnapshot(context.Background(), "n", snapshot(t, "1", 1, clusterv3.Cluster_ROUND_ROBIN)); err != nil {
				t.Fatal(err)
			}
			srv := startServer(t, "", cache, grpc.Creds(credentials.NewTLS(scfg)))
			c := newClient(t, Config{Server: srv.addr, NodeID: "n", TLS: tc.cfg}, newRecorder(), nil)
			if tc.refusedFor == "" {
				eventually(t, wait, "ACK over TLS", func() (bool, string) {
					return srv.acked("n", cds, "1") && srv.acked("n", eds, "1"), fmt.Sprint(srv.requests())
				})
				return
			}
			eventually(t, wait, "two refused attempts", func() (bool, string) {
				c.mu.Lock()
				defer c.mu.Unlock()
				return c.streamEnds >= 2 && c.lastErr != nil && strings.Contains(c.lastErr.Error(), tc.refusedFor),
					fmt.Sprint(c.streamEnds, c.lastErr)
			})
			if got := srv.requests(); len(got) != 0 {
				t.Errorf("server received %d requests over a refused connection", len(got))
			}
			if !c.LastUpdate().IsZero() {
				t.Error("an update was applied over a refused connection")
			}
		})
	}
}

// TestConfigErrors: a wrong file fails at New, not in the retry loop.
func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{
		{NodeID: "n"},
		{Server: "x:1"},
		{Server: "x:1", NodeID: "n", TLS: TLS{CAFile: "/nonexistent"}},
		{Server: "x:1", NodeID: "n", TLS: TLS{CertFile: "/nonexistent"}},
		{Server: "x:1", NodeID: "n", Backoff: Backoff{Initial: time.Second, Max: time.Millisecond}},
	} {
		if _, err := New(cfg, nil); err == nil {
			t.Errorf("New(%+v) accepted it", cfg)
		}
	}
}
