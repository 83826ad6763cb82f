package adsclient

import (
	"context"
	"crypto/tls"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/stickylb/stickylb/internal/testkit/testcert"
)

// TestTLSAndMTLS: the client reaches a TLS server whose certificate its CA signed (checked
// against ServerName), and a server demanding client certificates when it presents one; it
// is refused, and keeps retrying, with the wrong CA, the wrong server name, or no client
// certificate where one is required. A refusal is checked after two attempts failed for
// the expected reason, and the server must have received no request.
func TestTLSAndMTLS(t *testing.T) {
	dir := t.TempDir()
	ca, other := testcert.NewCA(t, "ca"), testcert.NewCA(t, "other-ca")
	caFile, otherFile := ca.WriteCA(filepath.Join(dir, "ca.pem")), other.WriteCA(filepath.Join(dir, "other-ca.pem"))
	const serverName = "xds.test"
	srvCert, srvKey := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	ca.WriteLeaf(ca.Issue(testcert.Leaf{Name: "server", Server: true, DNS: []string{serverName}}), srvCert, srvKey)
	cliCert, cliKey := filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	ca.WriteLeaf(ca.Issue(testcert.Leaf{Name: "client"}), cliCert, cliKey)
	pair, err := tls.LoadX509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := ca.Pool

	for _, tc := range []struct {
		name       string
		mtls       bool
		cfg        TLS
		refusedFor string // "" when the client must get through
	}{
		{name: "tls", cfg: TLS{CAFile: caFile, ServerName: serverName}},
		{name: "tls wrong CA", cfg: TLS{CAFile: otherFile, ServerName: serverName}, refusedFor: "certificate signed by unknown authority"},
		{name: "tls wrong name", cfg: TLS{CAFile: caFile}, refusedFor: "doesn't contain any IP SANs"},
		{name: "mtls", mtls: true, cfg: TLS{CAFile: caFile, ServerName: serverName, CertFile: cliCert, KeyFile: cliKey}},
		{name: "mtls without a client certificate", mtls: true, cfg: TLS{CAFile: caFile, ServerName: serverName}, refusedFor: "certificate required"},
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
				testwait.For(t, wait, "ACK over TLS", func() (bool, string) {
					return srv.acked("n", cds, "1") && srv.acked("n", eds, "1"), fmt.Sprint(srv.requests())
				})
				return
			}
			testwait.For(t, wait, "two refused attempts", func() (bool, string) {
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
