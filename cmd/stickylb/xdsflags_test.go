package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stickylb/stickylb/xds"
)

// TestXDSFlags: the defaults, TLS asked for by any of its three flags, and a usage error
// (exit 2 in xdsCmd) without --pools or with an argument left over.
func TestXDSFlags(t *testing.T) {
	var stderr bytes.Buffer
	o, ok := parseXDSFlags([]string{"--pools", "p.yaml"}, &stderr)
	if !ok || o.pools != "p.yaml" || o.listen != "127.0.0.1:18000" || o.poll != time.Second || o.maxNodes != xds.DefaultMaxNodes || o.admin != "" || o.tls() {
		t.Fatalf("defaults: %+v ok %v (%s)", o, ok, stderr.String())
	}
	for _, flag := range []string{"--tls-cert", "--tls-key", "--client-ca"} {
		if o, ok := parseXDSFlags([]string{"--pools", "p.yaml", flag, "f.pem"}, &stderr); !ok || !o.tls() {
			t.Errorf("%s: tls %v ok %v", flag, o.tls(), ok)
		}
	}
	for _, args := range [][]string{{}, {"--pools", "p.yaml", "extra"}, {"--pools", "p.yaml", "--poll", "soon"}} {
		stderr.Reset()
		if _, ok := parseXDSFlags(args, &stderr); ok || !strings.Contains(stderr.String(), "pools") {
			t.Errorf("%q: ok %v, stderr %q", args, ok, stderr.String())
		}
	}
	if code := xdsCmd(nil, &stderr); code != 2 {
		t.Fatalf("xds without --pools: exit %d, want 2", code)
	}
}
