package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stickylb/stickylb/internal/testkit/netnstest"
)

// lan is the network every XDP test of this package builds in namespaces: namespace "br"
// holds bridge br0, and each host has a namespace whose eth0 is a port of it. Backends
// (hosts named b…) hold the VIP on lo with arp_ignore/arp_announce, so only the LB answers
// for it; clients route the VIP through their LB.
type lan struct {
	prefix string              // the kit's name prefix: distinct per test, so tests can share a machine
	hosts  []string            // the hosts' namespaces, made in this order
	v4     func(string) string // a host's IPv4 address (a /24 on eth0)
	v6     func(string) string // a host's IPv6 address (a /64 on eth0); nil: IPv4 only
	via    map[string]string   // each client and the LB it reaches the VIP through
}

// newLAN builds l and mounts the test's bpffs.
func newLAN(t *testing.T, l lan) *topo {
	kit := netnstest.New(t, l.prefix)
	tp := &topo{t: t, root: t, kit: kit}
	kit.AddNS("br")
	tp.in("br", "ip", "link", "add", "br0", "type", "bridge")
	tp.in("br", "ip", "link", "set", "br0", "up")
	if l.v6 != nil {
		tp.in("br", "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
	}
	for _, h := range l.hosts {
		kit.AddNS(h)
		kit.Veth("br", "v"+h, h, "eth0") // the bridge's side is named for the host
		tp.in("br", "ip", "link", "set", "v"+h, "master", "br0")
		tp.in(h, "ip", "addr", "add", l.v4(h)+"/24", "dev", "eth0")
		if l.v6 != nil {
			tp.in(h, "ip", "addr", "add", l.v6(h)+"/64", "dev", "eth0", "nodad")
		}
		if strings.HasPrefix(h, "b") {
			tp.in(h, "ip", "addr", "add", vip4+"/32", "dev", "lo")
			if l.v6 != nil {
				tp.in(h, "ip", "addr", "add", vip6+"/128", "dev", "lo", "nodad")
			}
			tp.in(h, "sysctl", "-qw", "net.ipv4.conf.all.arp_ignore=1", "net.ipv4.conf.all.arp_announce=2",
				"net.ipv4.conf.eth0.arp_ignore=1", "net.ipv4.conf.eth0.arp_announce=2")
		}
	}
	// A client's frames carry partial checksums, which an XDP forwarder passes on unfilled:
	// TX checksum offload off.
	for _, h := range l.hosts {
		lb, ok := l.via[h]
		if !ok {
			continue
		}
		tp.in(h, "ip", "route", "add", vip4+"/32", "via", l.v4(lb))
		if l.v6 != nil {
			tp.in(h, "ip", "-6", "route", "add", vip6+"/128", "via", l.v6(lb))
		}
		tp.in(h, "ethtool", "-K", "eth0", "tx", "off")
	}
	tp.pinFS = kit.BPFFS()
	return tp
}

// startXDPTest begins an end-to-end test of the XDP tier: skipped under -short; else the
// topology that network builds, the stickylb binary, and a path for the test's pools file.
func startXDPTest(t *testing.T, network func(*testing.T) *topo) (tp *topo, bin, poolsFile string) {
	if testing.Short() {
		t.Skip("end to end in namespaces: skipped under -short")
	}
	tp = network(t)
	return tp, buildStickylb(t), filepath.Join(t.TempDir(), "pools.yaml")
}

// passPeer attaches `stickylb xdp pass` to the bridge's side of lb's veth: a veth delivers
// what the LB's program sends back out (XDP_TX) only when its peer runs XDP too.
func (tp *topo) passPeer(bin, lb string) {
	tp.t.Helper()
	tp.in("br", bin, "xdp", "pass", "--iface", "v"+lb, "--pin-root", tp.pinFS)
}

// readyNodes readies the XDP nodes lbs of a fleet test: passPeer for each, and each its pin
// root, pinRoot, under the test's bpffs.
func (tp *topo) readyNodes(bin string, lbs ...string) {
	tp.t.Helper()
	for _, lb := range lbs {
		tp.passPeer(bin, lb)
		if err := os.MkdirAll(tp.pinRoot(lb), 0o700); err != nil {
			tp.t.Fatal(err)
		}
	}
}

// pinRoot is node lb's pin root in a fleet test.
func (tp *topo) pinRoot(lb string) string { return filepath.Join(tp.pinFS, lb) }
