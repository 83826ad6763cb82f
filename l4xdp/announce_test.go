package l4xdp

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"
)

// TestServedBeforeVIPsLeave: the loader tells an announcer the VIP addresses it serves
// while the tables of a VIP that leaves are still installed (so the VIP is withdrawn while
// its packets are still forwarded), reads them back from the pinned maps, and says when it
// cannot forward.
func TestServedBeforeVIPsLeave(t *testing.T) {
	r := newLoaderRig(t)
	type call struct{ told, installed []netip.Addr }
	var calls []call
	var l *Loader
	cfg := Config{Iface: "v0", Mode: ModeGeneric, PinRoot: r.pin}
	cfg.Served = func(addrs []netip.Addr) {
		installed, err := l.ServedAddrs()
		if err != nil {
			t.Error(err)
		}
		calls = append(calls, call{addrs, installed})
	}
	if Running(cfg) {
		t.Fatal("a forwarder reported running before any was attached")
	}
	r.kit.MustDo("lb", func() (err error) {
		l, err = Open(cfg, zaptest.NewLogger(t))
		return err
	})
	r.detachAtEnd(l)
	r.apply(l, loaderPoolsB)
	r.apply(l, loaderPoolsA)
	a1, a2 := netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2")
	if len(calls) != 2 || !slices.Equal(calls[0].told, []netip.Addr{a1, a2}) || !slices.Equal(calls[1].told, []netip.Addr{a1}) {
		t.Fatalf("told %+v: want [10.9.0.1 10.9.0.2], then [10.9.0.1]", calls)
	}
	if !slices.Equal(calls[1].installed, []netip.Addr{a1, a2}) {
		t.Fatalf("10.9.0.2's tables were gone before the announcer was told: installed %v", calls[1].installed)
	}
	if got, err := l.ServedAddrs(); err != nil || !slices.Equal(got, []netip.Addr{a1}) {
		t.Fatalf("served after the edit: %v %v", got, err)
	}
	if !Running(cfg) {
		t.Fatal("the attached forwarder is not reported running")
	}
	r.kit.MustDo("lb", func() error {
		if err := l.Forwarding(); err != nil {
			t.Fatalf("attached and up: %v", err)
		}
		r.kit.In("lb", "ip", "link", "set", "v0", "down")
		if err := l.Forwarding(); err == nil || !strings.Contains(err.Error(), "down") {
			t.Fatalf("interface down: %v", err)
		}
		return nil
	})
}
