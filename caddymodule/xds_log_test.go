package caddymodule

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/stickylb/stickylb/adsclient"
	"github.com/stickylb/stickylb/internal/testkit/testcert"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// TestXDSSourceLogsKeysOnce: every line of a stickylb_xds subscription, its own (a saved
// view it ignores) and its ADS client's (a control plane that refuses the connection), names
// the server and the node once each.
func TestXDSSourceLogsKeysOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	path := filepath.Join(t.TempDir(), "view.json")
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	cfg := adsclient.Config{Server: closed, NodeID: "n1/caddy", Backoff: adsclient.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}}
	s, err := startXDSSub(cfg, t.Name(), path, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destruct()
	testwait.For(t, 10*time.Second, "the client's and the source's lines", func() (bool, string) {
		return logs.FilterMessageSnippet("reconnecting").Len() > 0 && logs.FilterMessageSnippet("ignoring the saved xDS view").Len() > 0,
			fmt.Sprint(logs.All())
	})
	for _, e := range logs.All() {
		seen := map[string]int{}
		for _, f := range e.Context {
			seen[f.Key]++
		}
		for k, n := range seen {
			if n > 1 {
				t.Errorf("%q carries %s %d times: %v", e.Message, k, n, e.Context)
			}
		}
		if m := e.ContextMap(); m["xds_server"] != closed || m["node"] != "n1/caddy" {
			t.Errorf("%q: server %v, node %v", e.Message, m["xds_server"], m["node"])
		}
	}
	if n := logs.FilterLevelExact(zap.WarnLevel).FilterMessageSnippet("no TLS").Len(); n != 1 {
		t.Errorf("a stream without TLS: %d warnings saying so, want 1", n)
	}
}

// TestXDSSourceTLSNoWarning: a source with TLS says nothing of it.
func TestXDSSourceTLSNoWarning(t *testing.T) {
	dir := t.TempDir()
	caFile := testcert.NewCA(t, "test CA").WriteCA(filepath.Join(dir, "ca.pem"))
	core, logs := observer.New(zap.InfoLevel)
	cfg := adsclient.Config{Server: "127.0.0.1:1", NodeID: "n1/caddy", TLS: adsclient.TLS{CAFile: caFile}}
	s, err := startXDSSub(cfg, t.Name(), filepath.Join(dir, "view.json"), zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destruct()
	if n := logs.FilterMessageSnippet("no TLS").Len(); n != 0 {
		t.Errorf("a stream with TLS: %d warnings of none", n)
	}
}
