package l4xdp

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/stickylb/stickylb/policies/pools"
)

// TestNATBadInput: what the loader refuses about NAT, each with a message that names the
// file and line and says what to do: a backend reached by NAT (forwarding: nat, or auto with
// another port than the VIP's) when no --nat-source of its family is given; sources and port
// ranges out of bounds.
func TestNATBadInput(t *testing.T) {
	const file = `services:
  - name: web
    protocol: tcp
    vip: 10.0.0.100:80
    forwarding: nat
    backends:
      - {address: 10.1.0.2:80}
  - name: api
    protocol: tcp
    vip: 10.0.0.101:80
    backends:
      - {address: 10.0.0.9:8080, mac: "02:00:00:00:00:09"}
      - {address: 10.0.0.8:80, mac: "02:00:00:00:00:08"}
`
	f, err := pools.Parse("pools.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		sources []netip.Addr
		want    []string
	}{
		{"no source", nil, []string{
			"pools.yaml:7: service web: backend 10.1.0.2:80: reached by NAT (the service's forwarding: nat)",
			"pools.yaml:12: service api: backend 10.0.0.9:8080: reached by NAT (its port differs from the vip's)",
			"--nat-source"}},
		{"only an IPv6 source", []netip.Addr{netip.MustParseAddr("fd00::1")}, []string{
			"pools.yaml:7: service web", "pools.yaml:12: service api", "no --nat-source of its family"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &Loader{cfg: Config{NAT: NAT{Sources: tc.sources}}}
			_, err := l.planNAT(f, f.Services)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\nwant it to say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "10.0.0.8:80") {
				t.Errorf("error %q names the DR backend (mac given, the VIP's port)", err)
			}
		})
	}
	t.Run("an IPv4 source", func(t *testing.T) {
		l := &Loader{cfg: Config{NAT: NAT{Sources: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}}}
		plan, err := l.planNAT(f, f.Services)
		if err != nil {
			t.Fatal(err)
		}
		var nat []string
		for _, s := range f.Services {
			for _, b := range s.Backends {
				if plan[b] {
					nat = append(nat, b.Address)
				}
			}
		}
		if strings.Join(nat, " ") != "10.1.0.2:80 10.0.0.9:8080" {
			t.Errorf("backends reached by NAT: %v, want 10.1.0.2:80 10.0.0.9:8080", nat)
		}
	})

	t.Run("a vip on a NAT source, on a port of the range", func(t *testing.T) {
		g, err := pools.Parse("pools.yaml", []byte("services:\n  - name: odd\n    protocol: tcp\n    vip: 10.0.0.1:61500\n    backends:\n      - {address: 10.0.0.9:61500, mac: \"02:00:00:00:00:09\"}\n"))
		if err != nil {
			t.Fatal(err)
		}
		l := &Loader{cfg: Config{NAT: NAT{Sources: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}}}
		if _, err := l.planNAT(g, g.Services); err == nil || !strings.Contains(err.Error(), "pools.yaml:2: service odd: vip 10.0.0.1:61500 is a --nat-source address on a port of the NAT range 61000-65535") {
			t.Errorf("error %v, want one naming the vip and the range", err)
		}
		l.cfg.NAT.PortLow, l.cfg.NAT.PortHigh = 62000, 63000
		if _, err := l.planNAT(g, g.Services); err != nil {
			t.Errorf("the vip's port outside the range refused: %v", err)
		}
	})

	for _, tc := range []struct {
		n    NAT
		want string
	}{
		{NAT{PortLow: 80, PortHigh: 90}, "1024 <= LOW <= HIGH"},
		{NAT{PortLow: 5000, PortHigh: 4000}, "1024 <= LOW <= HIGH"},
		{NAT{Sources: []netip.Addr{netip.MustParseAddr("0.0.0.0")}}, "unicast"},
		{NAT{Sources: []netip.Addr{netip.MustParseAddr("224.0.0.1")}}, "unicast"},
		{NAT{Sources: func() (a []netip.Addr) {
			for i := range 9 {
				a = append(a, netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}))
			}
			return a
		}()}, "at most 8"},
	} {
		if err := tc.n.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error saying %q", tc.n, err, tc.want)
		}
	}
	if err := (NAT{Sources: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}, PortLow: 1024, PortHigh: 1024}).Validate(); err != nil {
		t.Errorf("a valid configuration refused: %v", err)
	}
}

// TestReservedPortRanges: the arithmetic of the host's reserved ports: what the loader adds
// is what the list lacked, and what Detach takes back is exactly that.
func TestReservedPortRanges(t *testing.T) {
	cur := parseRanges("1000-2000,3000, 61500-61600\n")
	if got := formatRanges(cur); got != "1000-2000,3000,61500-61600" {
		t.Fatalf("parsed %q", got)
	}
	added := subtract([]portRange{{61000, 65535}}, cur)
	if got := formatRanges(added); got != "61000-61499,61601-65535" {
		t.Fatalf("added %q", got)
	}
	all := merge(append(cur, added...))
	if got := formatRanges(all); got != "1000-2000,3000,61000-65535" {
		t.Fatalf("merged %q", got)
	}
	if got := formatRanges(subtract(all, added)); got != formatRanges(cur) {
		t.Fatalf("released %q, want the list as it was, %q", got, formatRanges(cur))
	}
	if got := formatRanges(merge(parseRanges("5-6,1-4,8"))); got != "1-6,8" {
		t.Fatalf("adjacent ranges: %q", got)
	}
}

// TestNATHostSetup: a loader whose NAT source is an address of its host (here, of the test's
// namespace) reserves the NAT ports from the host's own and turns on forwarding on its
// interface; a restart adds nothing twice; Detach gives back exactly the ports it reserved
// (one the list held before stays).
func TestNATHostSetup(t *testing.T) {
	r := newLoaderRig(t)
	r.kit.In("lb", "ip", "addr", "add", "10.0.0.1/24", "dev", "v0")
	r.kit.In("lb", "sysctl", "-qw", "net.ipv4.ip_local_reserved_ports=62000")
	read := func(path string) string {
		var s string
		r.kit.MustDo("lb", func() error {
			b, err := os.ReadFile(path)
			s = strings.TrimSpace(string(b))
			return err
		})
		return s
	}
	cfg := Config{Iface: "v0", Mode: ModeGeneric, PinRoot: r.pin,
		NAT: NAT{Sources: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, PortLow: 61000, PortHigh: 61999}}
	open := func() *Loader {
		var l *Loader
		r.kit.MustDo("lb", func() (err error) {
			l, err = Open(cfg, zaptest.NewLogger(t))
			return err
		})
		return l
	}
	l := open()
	if got := read(reservedPortsSysctl); got != "61000-62000" {
		t.Errorf("reserved ports %q, want 61000-62000 (the NAT range joined with the 62000 held before)", got)
	}
	if got := read("/proc/sys/net/ipv4/conf/v0/forwarding"); got != "1" {
		t.Errorf("forwarding on v0: %q, want 1 (bpf_fib_lookup needs it)", got)
	}
	l.Close()
	l = open() // a restart: the range is already reserved
	l.Close()
	if got := read(reservedPortsSysctl); got != "61000-62000" {
		t.Errorf("after a restart, reserved ports %q", got)
	}
	r.kit.MustDo("lb", func() error { return Detach(cfg) })
	if got := read(reservedPortsSysctl); got != "62000" {
		t.Errorf("after detach, reserved ports %q, want 62000 (what was there before)", got)
	}
}
