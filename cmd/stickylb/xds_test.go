package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

func TestXDSInvalidFileAtStart(t *testing.T) {
	p := write(t, "bad.yaml", "services:\n  - name: a\n    protocol: ftp\n    backends: [{address: 10.0.0.1:80, weight: 0}]\n")
	var errb bytes.Buffer
	code := serveXDS(context.Background(), xdsOptions{pools: p, listen: "127.0.0.1:0"}, zaptest.NewLogger(t), &errb, nil)
	if code != 1 || !strings.Contains(errb.String(), p+":3:") || !strings.Contains(errb.String(), p+":4:") {
		t.Fatalf("exit %d:\n%s", code, errb.String())
	}
}

// pki writes a CA, a server certificate for 127.0.0.1 and a client certificate.
func pki(t *testing.T) (caFile, certFile, keyFile string, client tls.Certificate, pool *x509.CertPool) {
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, server bool) ([]byte, *ecdsa.PrivateKey) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "node"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
		if server {
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		} else {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
			tmpl.DNSNames = []string{"tls-node"} // covers node ids tls-node and tls-node/...
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	pemFile := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600)
		return p
	}
	caFile = pemFile("ca.pem", "CERTIFICATE", caDER)
	sDER, sKey := issue(2, true)
	certFile = pemFile("server.pem", "CERTIFICATE", sDER)
	kb, _ := x509.MarshalECPrivateKey(sKey)
	keyFile = pemFile("server.key", "EC PRIVATE KEY", kb)
	cDER, cKey := issue(3, false)
	client = tls.Certificate{Certificate: [][]byte{cDER}, PrivateKey: cKey}
	pool = x509.NewCertPool()
	pool.AddCert(ca)
	return
}

func TestXDSMutualTLS(t *testing.T) {
	caFile, certFile, keyFile, clientCert, pool := pki(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrs := make(chan string, 1)
	done := make(chan int, 1)
	go func() {
		done <- serveXDS(ctx, xdsOptions{pools: "../../pools.example.yaml", listen: "127.0.0.1:0", tlsCert: certFile, tlsKey: keyFile, clientCA: caFile, poll: time.Second},
			zaptest.NewLogger(t), os.Stderr, func(g, _ string) { addrs <- g })
	}()
	var addr string
	select {
	case addr = <-addrs:
	case code := <-done:
		t.Fatalf("exited %d", code)
	case <-time.After(10 * time.Second):
		t.Fatal("not serving")
	}
	fetch := func(certs []tls.Certificate, id string) error {
		creds := credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: certs, ServerName: "127.0.0.1"})
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(cctx)
		if err != nil {
			return err
		}
		if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: id, Locality: &corev3.Locality{Zone: "zone-a"}}, TypeUrl: resource.ClusterType}); err != nil {
			return err
		}
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		if len(resp.Resources) != 7 {
			t.Errorf("%d clusters, want 7 (every service of pools.example.yaml)", len(resp.Resources))
		}
		return nil
	}
	if err := fetch([]tls.Certificate{clientCert}, "tls-node/caddy"); err != nil {
		t.Fatalf("with a client certificate: %v", err)
	}
	if err := fetch([]tls.Certificate{clientCert}, "other-host/caddy"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a node id the certificate does not cover: %v, want PermissionDenied", err)
	}
	if err := fetch(nil, "tls-node/caddy"); err == nil {
		t.Fatal("served a client without a certificate")
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d", code)
	}
}
