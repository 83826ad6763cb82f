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
	if err != nil || o.pools != "p.yaml" || o.listen != "127.0.0.1:18000" || o.poll != time.Second || o.maxNodes != xds.DefaultMaxNodes || o.admin != "" || o.tls() ||
		o.maxNodesPerIdentity != xds.DefaultMaxNodesPerIdentity || o.maxStreams != xds.DefaultMaxStreams || o.maxStreamsPerNode != xds.DefaultMaxStreamsPerNode ||
		o.maxStreamsPerConn != xds.DefaultMaxStreamsPerConn || o.firstRequest != xds.DefaultFirstRequestTimeout {
		t.Fatalf("defaults: %+v, %v (%s)", o, err, stderr.String())
	}
	for _, flag := range []string{"--tls-cert", "--tls-key", "--client-ca"} {
		if o, err := parseXDSFlags([]string{"--pools", "p.yaml", flag, "f.pem"}, &stderr); err != nil || !o.tls() {
			t.Errorf("%s: tls %v, %v", flag, o.tls(), err)
		}
	}
	if o, err := parseXDSFlags([]string{"--pools", "p.yaml", "--admin", ":18001", "--admin-host", "lb1.example, ops.example", "--admin-host", "10.0.0.5"}, &stderr); err != nil ||
		strings.Join(o.adminHosts, " ") != "lb1.example ops.example 10.0.0.5" {
		t.Errorf("--admin-host: %q, %v", o.adminHosts, err)
	}
	for _, args := range [][]string{{"--pools", "p.yaml", "--admin-host", "lb1.example"}, {"--pools", "p.yaml", "--admin", ":18001", "--admin-host", "http://lb1.example"}} {
		stderr.Reset()
		if _, err := parseXDSFlags(args, &stderr); parseError(err) != 2 || !strings.Contains(stderr.String(), "--admin-host") {
			t.Errorf("%q: %v, stderr %q", args, err, stderr.String())
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
