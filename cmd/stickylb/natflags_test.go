package main

import (
	"bytes"
	"flag"
	"io"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/stickylb/stickylb/l4xdp"
)

// parseNAT parses args with the NAT flags alone, as xdpCmd registers them.
func parseNAT(args ...string) (l4xdp.NAT, error) {
	fs := flag.NewFlagSet("xdp", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var n natFlags
	n.register(fs)
	err := fs.Parse(args)
	return n.config(), err
}

// TestNATFlags: --nat-source takes IPv4 and IPv6, repeated or as a comma list, in the
// order given; --nat-ports a range; without them, no source and the default range.
func TestNATFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		sources []string
		lo, hi  uint16
	}{
		{nil, nil, l4xdp.DefaultNATPortLow, l4xdp.DefaultNATPortHigh},
		{[]string{"--nat-source", "192.0.2.10"}, []string{"192.0.2.10"}, l4xdp.DefaultNATPortLow, l4xdp.DefaultNATPortHigh},
		{[]string{"--nat-source", "192.0.2.10, 2001:db8::10", "--nat-source=198.51.100.7"}, []string{"192.0.2.10", "2001:db8::10", "198.51.100.7"}, l4xdp.DefaultNATPortLow, l4xdp.DefaultNATPortHigh},
		{[]string{"--nat-ports", "40000-40999", "--nat-source", "2001:db8::10"}, []string{"2001:db8::10"}, 40000, 40999},
		{[]string{"--nat-ports=1024-1024"}, nil, 1024, 1024},
		{[]string{"--nat-ports", "1024-65535"}, nil, 1024, 65535},
	} {
		n, err := parseNAT(tc.args...)
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		var want []netip.Addr
		for _, s := range tc.sources {
			want = append(want, netip.MustParseAddr(s))
		}
		if !slices.Equal(n.Sources, want) || n.PortLow != tc.lo || n.PortHigh != tc.hi {
			t.Errorf("%q: %+v, want sources %v ports %d-%d", tc.args, n, want, tc.lo, tc.hi)
		}
	}
}

// TestNATFlagErrors: each bad value is refused with a message that says what is wrong
// with it.
func TestNATFlagErrors(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{"--nat-source lb.example", `"lb.example" is not an IP address`},
		{"--nat-source 192.0.2.10,", `"" is not an IP address`},
		{"--nat-source 192.0.2.300", `"192.0.2.300" is not an IP address`},
		{"--nat-source 0.0.0.0", `"0.0.0.0": not a unicast address`},
		{"--nat-source ::", `"::": not a unicast address`},
		{"--nat-source 224.0.0.9", `"224.0.0.9": not a unicast address`},
		{"--nat-source 255.255.255.255", `"255.255.255.255": not a unicast address`},
		{"--nat-source 127.0.0.1", `"127.0.0.1": a loopback or link-local address`},
		{"--nat-source fe80::1", `"fe80::1": a loopback or link-local address`},
		{"--nat-source fe80::1%eth0", `"fe80::1%eth0": IPv6 zones are not supported`},
		{"--nat-source ::ffff:192.0.2.10", `"::ffff:192.0.2.10": write the IPv4 address as IPv4 (192.0.2.10)`},
		{"--nat-source 192.0.2.10 --nat-source 192.0.2.10", `"192.0.2.10" listed twice`},
		{"--nat-ports 80-90", `"80-90": LO 80 is under 1024`},
		{"--nat-ports 0-65535", `LO 0 is under 1024`},
		{"--nat-ports 5000-4000", `"5000-4000": LO 5000 is above HI 4000`},
		{"--nat-ports 61000", `"61000": want LO-HI`},
		{"--nat-ports 61000-70000", `"61000-70000": want LO-HI, two ports from 1024 to 65535`},
		{"--nat-ports -1-5", `want LO-HI`},
		{"--nat-ports 2000:3000", `want LO-HI`},
	} {
		_, err := parseNAT(strings.Fields(tc.args)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}

// TestXDPNATFlagErrors: both modes of `stickylb xdp` refuse a bad NAT flag as a command
// line error (exit 2) that names the flag, before touching an interface.
func TestXDPNATFlagErrors(t *testing.T) {
	p := write(t, "pools.yaml", xdpPools)
	for _, mode := range [][]string{{"--pools", p}, {"--xds", "127.0.0.1:1"}} {
		for _, tc := range []struct{ flag, value, want string }{
			{"--nat-source", "10.0.0.1,nope", `invalid value "10.0.0.1,nope" for flag -nat-source: "nope" is not an IP address`},
			{"--nat-ports", "100-200", `invalid value "100-200" for flag -nat-ports: "100-200": LO 100 is under 1024`},
		} {
			var stdout, stderr bytes.Buffer
			args := append(slices.Clone(mode), "--iface", "nosuchif0", tc.flag, tc.value)
			if code := xdpCmd(args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("%q: exit %d, stderr %q; want 2 and %q", args, code, stderr.String(), tc.want)
			}
		}
		// More sources of a family than the program holds.
		var stdout, stderr bytes.Buffer
		many := "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4,10.0.0.5,10.0.0.6,10.0.0.7,10.0.0.8,10.0.0.9"
		args := append(slices.Clone(mode), "--iface", "nosuchif0", "--nat-source", many)
		if code := xdpCmd(args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "9 IPv4 and 0 IPv6, at most 8 of each") {
			t.Errorf("nine IPv4 sources: exit %d, stderr %q; want 2 and the limit", code, stderr.String())
		}
		// Good NAT flags get as far as the interface.
		stdout.Reset()
		stderr.Reset()
		args = append(slices.Clone(mode), "--iface", "nosuchif0", "--nat-source", "192.0.2.10,2001:db8::10", "--nat-ports", "40000-49999")
		if code := xdpCmd(args, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), `interface "nosuchif0"`) {
			t.Errorf("%q: exit %d, stderr %q; want 1 and the interface named", args, code, stderr.String())
		}
	}
}
