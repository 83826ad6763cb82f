package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/stickylb/stickylb/internal/testkit/testcert"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	lbstatus "github.com/stickylb/stickylb/policies/status"
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
	log, logs := observedLogger(t)
	addr, _, done := runXDS(ctx, t, xdsOptions{pools: "../../pools.example.yaml", listen: "127.0.0.1:0", tlsCert: certFile, tlsKey: keyFile, clientCA: caFile, poll: time.Second}, log)
	if !servingTLS(t, logs) {
		t.Fatal(`TLS xDS logged "tls": false`)
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

// runXDS runs serveXDS with o until ctx ends and returns its addresses once it serves, and
// where its exit status will come.
func runXDS(ctx context.Context, t *testing.T, o xdsOptions, log *zap.Logger) (grpcAddr, adminAddr string, done <-chan int) {
	t.Helper()
	type addrs struct{ grpc, admin string }
	ready := make(chan addrs, 1)
	exit := make(chan int, 1)
	go func() {
		exit <- serveXDS(ctx, o, log, os.Stderr, func(g, a string) { ready <- addrs{g, a} })
	}()
	select {
	case a := <-ready:
		return a.grpc, a.admin, exit
	case code := <-exit:
		t.Fatalf("exited %d", code)
	case <-time.After(10 * time.Second):
		t.Fatal("not serving")
	}
	return "", "", nil
}

// observedLogger is the commands' logger (newLogger) writing to logs instead of stderr.
func observedLogger(t *testing.T) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zap.InfoLevel)
	log, err := newLogger(zap.WrapCore(func(zapcore.Core) zapcore.Core { return core }))
	if err != nil {
		t.Fatal(err)
	}
	return log, logs
}

// servingTLS is the tls field of the "serving xDS" line.
func servingTLS(t *testing.T, logs *observer.ObservedLogs) bool {
	t.Helper()
	lines := logs.FilterMessage("serving xDS").All()
	if len(lines) != 1 {
		t.Fatalf("%d \"serving xDS\" lines", len(lines))
	}
	v, ok := lines[0].ContextMap()["tls"].(bool)
	if !ok {
		t.Fatalf("serving xDS without a tls field: %v", lines[0].ContextMap())
	}
	return v
}

// TestXDSStatusShowsRefusedEdit: `stickylb xds` serving plaintext logs "tls": false; an
// invalid edit of the pools file shows on the status page's JSON with its errors and when
// it was read, its log lines carry no Go stack, and the next good edit clears it.
func TestXDSStatusShowsRefusedEdit(t *testing.T) {
	src, err := os.ReadFile("../../pools.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := write(t, "pools.yaml", string(src))
	log, logs := observedLogger(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, admin, done := runXDS(ctx, t, xdsOptions{pools: p, listen: "127.0.0.1:0", admin: "127.0.0.1:0", poll: 20 * time.Millisecond}, log)
	if servingTLS(t, logs) {
		t.Fatal(`plaintext xDS logged "tls": true`)
	}
	config := func() *lbstatus.ConfigFile {
		resp, err := http.Get("http://" + admin + "/" + lbstatus.JSONPath)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var snap lbstatus.Snapshot
		if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil {
			t.Fatal(err)
		}
		return snap.Config
	}
	if c := config(); c == nil || c.Path != p || c.Refused != nil || c.Loaded.IsZero() {
		t.Fatalf("config before any edit: %+v", c)
	}
	edited := time.Now()
	if err := os.WriteFile(p, []byte("services:\n  - name: web\n    protocol: http\n    balance: magelv\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var c *lbstatus.ConfigFile
	testwait.For(t, 5*time.Second, "status.json shows the refused edit", func() (bool, string) {
		c = config()
		return c != nil && c.Refused != nil, fmt.Sprintf("%+v", c)
	})
	r := c.Refused
	if len(r.Errors) != 2 || !strings.HasPrefix(r.Errors[0], p+":2:5: service web: backends is required") ||
		!strings.HasPrefix(r.Errors[1], p+":4:14: balance \"magelv\"") || r.Time.Before(edited.Add(-time.Second)) || r.More != 0 {
		t.Fatalf("refused edit: %+v", r)
	}
	refusals := logs.FilterMessageSnippet("invalid pools file edit").All()
	if len(refusals) != 2 {
		t.Fatalf("%d log lines for the refused edit's 2 errors", len(refusals))
	}
	for _, e := range refusals {
		if e.Stack != "" || e.Level != zapcore.ErrorLevel {
			t.Fatalf("refused edit logged at %s with a stack:\n%s", e.Level, e.Stack)
		}
	}
	if err := os.WriteFile(p, append(src, "# fixed\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "a good edit clears the refusal", func() (bool, string) {
		c = config()
		return c != nil && c.Refused == nil && c.Loaded.After(edited), fmt.Sprintf("%+v", c)
	})
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestXDSLimitFlags: the flags that bound nodes and streams reach the server: a silent
// stream ends at --first-request-timeout, a second node id of one address is refused
// under --max-nodes-per-identity 1, and a connection carries --max-streams-per-conn
// streams at once.
func TestXDSLimitFlags(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o, err := parseXDSFlags([]string{"--pools", "../../pools.example.yaml", "--listen", "127.0.0.1:0", "--first-request-timeout", "300ms",
		"--max-nodes-per-identity", "1", "--max-streams-per-conn", "1"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	addr, _, done := runXDS(ctx, t, o, zaptest.NewLogger(t))
	dial := func() *grpc.ClientConn {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	silent, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(dial()).StreamAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := silent.Recv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a silent stream: %v, want DeadlineExceeded", err)
	}
	node := func(cc *grpc.ClientConn, id string) error {
		st, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(sctx)
		if err != nil {
			return err
		}
		if err := st.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: id}, TypeUrl: resource.ClusterType}); err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	cc := dial()
	if err := node(cc, "first"); err != nil {
		t.Fatal(err)
	}
	// The first node's stream is open: a second stream on its connection waits.
	waiting := make(chan error, 1)
	go func() { waiting <- node(cc, "second") }()
	select {
	case err := <-waiting:
		t.Fatalf("a second stream on a connection of --max-streams-per-conn 1 was answered: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := node(dial(), "second"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a second node id from one address: %v, want ResourceExhausted", err)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d", code)
	}
}
