package caddymodule

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/stickylb/stickylb/internal/testkit/grpctest"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/internal/testkit/testcert"
	"github.com/stickylb/stickylb/xds"
)

// TestXDSSourceMTLS: the source's ca, cert and key reach the ADS client: it gets its view
// from a control plane that demands client certificates.
func TestXDSSourceMTLS(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	dir := t.TempDir()
	ca := testcert.NewCA(t, "test CA")
	caFile := ca.WriteCA(filepath.Join(dir, "ca.pem"))
	pair := ca.Issue(testcert.Leaf{Name: "server", Server: true, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	cliCert, cliKey := filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	ca.WriteLeaf(ca.Issue(testcert.Leaf{Name: "client"}), cliCert, cliKey)
	f := poolstest.Parse(t, poolstest.CaddyFleet)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	srv := xds.NewServer(ctx, f, nil, zaptest.NewLogger(t))
	addr := grpctest.Serve(t, srv.Register, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair},
		ClientCAs: ca.Pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})))

	cctx, ccancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	x := &XDSUpstreams{Server: addr, Service: "api", NodeID: "tls/caddy", CA: caFile, Cert: cliCert, Key: cliKey}
	if err := x.Provision(cctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Cleanup(); ccancel() })
	testwait.For(t, 10*time.Second, "the view over mTLS", func() (bool, string) {
		ups, err := x.GetUpstreams(nil)
		return err == nil && len(ups) == 2 && ups[0].Dial == "10.0.7.1:80", fmt.Sprint(ups, err)
	})
}
