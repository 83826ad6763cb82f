package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
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

	"github.com/stickylb/stickylb/internal/testkit/testcert"
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
	ca := testcert.NewCA(t, "test ca")
	caFile = ca.WriteCA(filepath.Join(dir, "ca.pem"))
	certFile, keyFile = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server.key")
	ca.WriteLeaf(ca.Issue(testcert.Leaf{Server: true, IPs: []net.IP{net.ParseIP("127.0.0.1")}}), certFile, keyFile)
	// The DNS name covers node ids tls-node and tls-node/...
	client = ca.Issue(testcert.Leaf{DNS: []string{"tls-node"}})
	return caFile, certFile, keyFile, client, ca.Pool
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
