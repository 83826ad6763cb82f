package main

import (
	"bytes"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stickylb/stickylb/l4bgp"
)

// TestBGPFlagErrors: every invalid --bgp-* value exits 2 with the flag named, before
// anything is attached (the interface is lo: nothing is loaded on it).
func TestBGPFlagErrors(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(pw, []byte("\n"), 0o600)
	ok := []string{"--bgp-asn", "65001", "--bgp-peer", "192.0.2.1@65000"}
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--bgp-asn", "0", "--bgp-peer", "192.0.2.1@65000"}, "bgp-asn"},
		{[]string{"--bgp-asn", "4294967295", "--bgp-peer", "192.0.2.1@65000"}, "bgp-asn"},
		{[]string{"--bgp-asn", "65001"}, "bgp-peer"},
		{[]string{"--bgp-peer", "192.0.2.1@65000"}, "bgp-asn"},
		{[]string{"--bgp-asn", "65001", "--bgp-peer", "192.0.2.1"}, "bgp-peer"},
		{[]string{"--bgp-asn", "65001", "--bgp-peer", "192.0.2.1@65000,192.0.2.1@65002"}, "bgp-peer"},
		{[]string{"--bgp-asn", "65001", "--bgp-peer", "fe80::1%eth0@65000"}, "bgp-peer"},
		{append(ok, "--bgp-hold", "2s"), "bgp-hold"},
		{append(ok, "--bgp-hold", "0"), "bgp-hold"},
		{append(ok, "--bgp-hold", "3500ms"), "bgp-hold"},
		{append(ok, "--bgp-router-id", "2001:db8::1"), "bgp-router-id"},
		{append(ok, "--bgp-next-hop", "192.0.2.7,192.0.2.8"), "bgp-next-hop"},
		{append(ok, "--bgp-next-hop", "nonsense"), "bgp-next-hop"},
		{append(ok, "--bgp-community", "65536:1"), "bgp-community"},
		{append(ok, "--bgp-community", "65001"), "bgp-community"},
		{append(ok, "--bgp-password-file", filepath.Join(t.TempDir(), "missing")), "bgp-password-file"},
		{append(ok, "--bgp-password-file", pw), "bgp-password-file"},
		{append(ok, "--bgp-restart-time", "60s"), "bgp-restart-time"},
		{append(ok, "--bgp-graceful-restart", "--bgp-restart-time", "5000s"), "bgp-restart-time"},
		{append(ok, "--drain-time", "-1s"), "drain-time"},
		{[]string{"--drain-time", "5s"}, "drain-time"},
		{[]string{"--bgp-graceful-restart"}, "bgp-graceful-restart"},
	} {
		var stderr bytes.Buffer
		args := append([]string{"xdp", "--pools", "../../pools.example.yaml", "--iface", "lo"}, tc.args...)
		if code := run(args, &bytes.Buffer{}, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.flag) {
			t.Errorf("%v: exit %d, %q: want 2 naming %s", tc.args, code, stderr.String(), tc.flag)
		}
	}
}

// TestBGPConfig: the router id and the next hops come from the interface unless given; the
// password file loses one trailing newline; communities repeat.
func TestBGPConfig(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pw, []byte("s3cret \n"), 0o600)
	var b bgpFlags
	fs := flag.NewFlagSet("xdp", flag.ContinueOnError)
	b.register(fs)
	if err := fs.Parse([]string{"--bgp-asn", "1.10", "--bgp-peer", "127.0.0.2@65000,[::1]@65000", "--bgp-password-file", pw,
		"--bgp-community", "65001:1", "--bgp-community", "65001:2", "--bgp-next-hop", "::1"}); err != nil {
		t.Fatal(err)
	}
	if err := b.check(fs); err != nil {
		t.Fatal(err)
	}
	c, err := b.config("lo")
	if err != nil {
		t.Fatal(err)
	}
	want := l4bgp.Config{ASN: 1<<16 | 10, RouterID: netip.MustParseAddr("127.0.0.1"), NextHop4: netip.MustParseAddr("127.0.0.1"),
		NextHop6: netip.MustParseAddr("::1"), Password: "s3cret ", Hold: l4bgp.DefaultHold, RestartTime: l4bgp.DefaultRestartTime,
		Communities: []uint32{65001<<16 | 1, 65001<<16 | 2}}
	if c.ASN != want.ASN || c.RouterID != want.RouterID || c.NextHop4 != want.NextHop4 || c.NextHop6 != want.NextHop6 ||
		c.Password != want.Password || c.Hold != 9*time.Second || !slices.Equal(c.Communities, want.Communities) || len(c.Peers) != 2 {
		t.Fatalf("config %+v\nwant %+v", c, want)
	}
}
