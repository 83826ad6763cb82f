package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stickylb/stickylb/xds"
)

// TestXDSFlags: the defaults, TLS asked for by any of its three flags, a usage error (exit
// 2, the synopsis on stderr) without --pools, with an argument left over or a bad value,
// and -h (exit 0).
func TestXDSFlags(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseXDSFlags([]string{"--pools", "p.yaml"}, &stderr)
	if err != nil || o.pools != "p.yaml" || o.listen != "127.0.0.1:18000" || o.poll != time.Second || o.maxNodes != xds.DefaultMaxNodes || o.admin != "" || o.tls() {
		t.Fatalf("defaults: %+v, %v (%s)", o, err, stderr.String())
	}
	for _, flag := range []string{"--tls-cert", "--tls-key", "--client-ca"} {
		if o, err := parseXDSFlags([]string{"--pools", "p.yaml", flag, "f.pem"}, &stderr); err != nil || !o.tls() {
			t.Errorf("%s: tls %v, %v", flag, o.tls(), err)
		}
	}
	for _, args := range [][]string{{}, {"--pools", "p.yaml", "extra"}, {"--pools", "p.yaml", "--poll", "soon"}} {
		stderr.Reset()
		if _, err := parseXDSFlags(args, &stderr); parseError(err) != 2 || !strings.Contains(stderr.String(), xdsUsage) {
			t.Errorf("%q: %v, stderr %q", args, err, stderr.String())
		}
	}
	if code := xdsCmd(nil, &stderr); code != 2 {
		t.Fatalf("xds without --pools: exit %d, want 2", code)
	}
	if code := xdsCmd([]string{"-h"}, &stderr); code != 0 {
		t.Fatalf("xds -h: exit %d, want 0", code)
	}
}
