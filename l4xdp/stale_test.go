package l4xdp

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"go.uber.org/zap/zaptest"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"github.com/stickylb/stickylb/policies/pools"
)

// staleRig is a loader on v0, whose peer v1 the test takes down and up (v0 then has no
// carrier), with 10.9.1.0/24 on v0 so that a backend without mac: is resolved from v0's
// neighbour table.
func staleRig(t *testing.T, cfg func(*Config)) (*loaderRig, *Loader) {
	t.Helper()
	r := newLoaderRig(t)
	r.kit.In("lb", "ip", "addr", "add", "10.9.1.100/24", "dev", "v0")
	c := Config{Iface: "v0", Mode: ModeGeneric, PinRoot: r.pin}
	if cfg != nil {
		cfg(&c)
	}
	var l *Loader
	r.kit.MustDo("lb", func() (err error) {
		l, err = Open(c, zaptest.NewLogger(t))
		return err
	})
	r.detachAtEnd(l)
	return r, l
}

// loaderPoolsB is loaderPoolsA with service b at 10.9.0.2:80.
const loaderPoolsB = loaderPoolsA + `  - name: b
    protocol: tcp
    vip: 10.9.0.2:80
    affinity: {mode: none}
    balance: maglev
    backends:
      - {address: 10.9.1.1:80, mac: "02:00:00:00:00:01"}
`

// withNeighbour is loaderPoolsB with backend 10.9.1.9:80 of service b, whose MAC comes from
// the neighbour table.
const withNeighbour = loaderPoolsB + "      - {address: 10.9.1.9:80}\n"

// TestStaleWhileAnEditIsMissed: an edit that fails because the node's link is down (a new
// backend's MAC cannot be resolved) leaves the node's tables behind the fleet's: Stale says
// so from then, also once the link is back (Forwarding alone would say the node can serve),
// until the loader's own retry, with no new edit and no health transition, installs the
// edit; then the hook hears the retry applied it.
func TestStaleWhileAnEditIsMissed(t *testing.T) {
	var retried atomic.Int32
	r, l := staleRig(t, func(c *Config) { c.RetryApplied = func() { retried.Add(1) } })
	r.apply(l, loaderPoolsA)
	if err := l.Stale(); err != nil {
		t.Fatalf("stale after a good apply: %v", err)
	}
	r.kit.In("lb", "ip", "link", "set", "v1", "down")
	f, err := pools.Parse("pools.yaml", []byte(withNeighbour))
	if err != nil {
		t.Fatal(err)
	}
	err = l.Apply(t.Context(), f)
	t.Logf("the apply with the link down: %v", err)
	if err == nil || !strings.Contains(err.Error(), "10.9.1.9") {
		t.Fatalf("an edit needing an unresolvable MAC with the link down: %v", err)
	}
	r.kit.In("lb", "ip", "link", "set", "v1", "up")
	testwait.For(t, 5*time.Second, "v0's carrier back", func() (bool, string) {
		var ferr error
		r.kit.MustDo("lb", func() error { ferr = l.Forwarding(); return nil })
		return ferr == nil, fmt.Sprint(ferr)
	})
	if err := l.Stale(); err == nil || !strings.Contains(err.Error(), "10.9.1.9") {
		t.Fatalf("link back, the edit not installed: Stale() = %v", err)
	}
	// The neighbour becomes known: the retry installs the edit.
	r.kit.In("lb", "ip", "neigh", "replace", "10.9.1.9", "lladdr", "02:00:00:00:00:09", "dev", "v0", "nud", "permanent")
	took := testwait.For(t, retryMax+2*time.Second, "the loader's retry installs the edit", func() (bool, string) {
		ts, err := PinnedTables(Config{Iface: "v0", PinRoot: r.pin})
		if err != nil {
			return false, err.Error()
		}
		return l.Stale() == nil && slices.Contains(ts["b"].Table, "b/10.9.1.9:80"), fmt.Sprintf("stale %v, tables %v", l.Stale(), ts)
	})
	t.Logf("the edit installed %s after its neighbour became known", took.Round(time.Millisecond))
	if retried.Load() != 1 {
		t.Fatalf("RetryApplied heard %d times, want 1", retried.Load())
	}
}

// applyIn applies yaml from the loader's namespace (netlink there), returning its error.
func (r *loaderRig) applyIn(l *Loader, yaml string) error {
	r.t.Helper()
	f, err := pools.Parse("pools.yaml", []byte(yaml))
	if err != nil {
		r.t.Fatal(err)
	}
	var aerr error
	r.kit.MustDo("lb", func() error { aerr = l.Apply(r.t.Context(), f); return nil })
	return aerr
}

// TestUnresolvedWithLinkUpNotStale: a backend no neighbour answers for while the node's link
// is up is what every node of a fleet sees (a wrong address, a backend not up yet): the
// edit is refused for now and retried, but the node is not stale (withdrawing every node
// would take the VIP down fleet-wide); once the backend answers, the retry installs it.
func TestUnresolvedWithLinkUpNotStale(t *testing.T) {
	var retried atomic.Int32
	r, l := staleRig(t, func(c *Config) { c.RetryApplied = func() { retried.Add(1) } })
	if err := r.applyIn(l, loaderPoolsA); err != nil {
		t.Fatal(err)
	}
	if err := r.applyIn(l, withNeighbour); err == nil {
		t.Fatal("an edit with an unresolvable backend applied")
	}
	if err := l.Stale(); err != nil {
		t.Fatalf("stale with the link up: %v", err)
	}
	r.kit.In("lb", "ip", "neigh", "replace", "10.9.1.9", "lladdr", "02:00:00:00:00:09", "dev", "v0", "nud", "permanent")
	testwait.For(t, retryMax+2*time.Second, "the retry installs the edit", func() (bool, string) {
		return retried.Load() == 1, fmt.Sprintf("retried %d", retried.Load())
	})
}

// TestInstalledMACKept: a backend installed with a MAC from the neighbour table keeps it
// when the kernel flushes the entry (a carrier loss does): an edit or a rebuild that keeps
// the backend applies with the link down, and the node's tables stay the fleet's.
func TestInstalledMACKept(t *testing.T) {
	r, l := staleRig(t, nil)
	r.kit.In("lb", "ip", "neigh", "replace", "10.9.1.9", "lladdr", "02:00:00:00:00:09", "dev", "v0", "nud", "reachable")
	if err := r.applyIn(l, withNeighbour); err != nil {
		t.Fatal(err)
	}
	r.kit.In("lb", "ip", "link", "set", "v1", "down")
	r.kit.In("lb", "ip", "neigh", "flush", "dev", "v0")
	// Service q leaves; b keeps 10.9.1.9.
	edit := withNeighbour[:strings.Index(withNeighbour, "  - name: q")] + withNeighbour[strings.Index(withNeighbour, "  - name: b"):]
	if err := r.applyIn(l, edit); err != nil {
		t.Fatalf("an edit keeping an installed backend, its neighbour flushed and the link down: %v", err)
	}
	if err := l.Stale(); err != nil {
		t.Fatalf("stale: %v", err)
	}
}

// TestFailedVIPNotServed: a VIP whose table could not be installed (its map write failed)
// is not told to the announcer, and the loader is stale (it serves less than the config)
// until its retry installs it.
func TestFailedVIPNotServed(t *testing.T) {
	var mu sync.Mutex
	var told [][]netip.Addr
	r, l := staleRig(t, func(c *Config) {
		c.Served = func(addrs []netip.Addr) { mu.Lock(); told = append(told, addrs); mu.Unlock() }
	})
	if err := r.applyIn(l, loaderPoolsA); err != nil {
		t.Fatal(err)
	}
	// Fill the VIP map with entries of no service, so that a new VIP finds no room.
	for i := 0; ; i++ {
		k := lbVipKey{Addr: netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)}).As16(), Port: 1, Proto: 6}
		if err := l.maps.objs.Vips.Update(k, lbVipMeta{Id: 1}, ebpf.UpdateNoExist); err != nil {
			break
		}
	}
	if err := r.applyIn(l, strings.Replace(withNeighbour, "{address: 10.9.1.9:80}", `{address: 10.9.1.9:80, mac: "02:00:00:00:00:09"}`, 1)); err == nil {
		t.Fatal("a VIP with no room in the map applied")
	}
	// Hold the retry (the apply pruned the entries of no service: it would find room) until
	// the stale state is checked.
	l.mu.Lock()
	retryAt := l.retryAt
	l.retryAt = l.now().Add(time.Hour)
	l.mu.Unlock()
	mu.Lock()
	last := told[len(told)-1]
	mu.Unlock()
	if slices.Contains(last, netip.MustParseAddr("10.9.0.2")) {
		t.Fatalf("told the announcer %v: 10.9.0.2's table is not installed", last)
	}
	if err := l.Stale(); err == nil {
		t.Fatal("not stale with a VIP of the config missing")
	}
	l.mu.Lock()
	l.retryAt = retryAt
	l.mu.Unlock()
	// The apply pruned the entries of no service: the retry finds room.
	testwait.For(t, retryMax+2*time.Second, "the retry installs 10.9.0.2", func() (bool, string) {
		stale := l.Stale() // not under mu: the loader calls Served, which takes mu, under its lock
		mu.Lock()
		defer mu.Unlock()
		return stale == nil && slices.Contains(told[len(told)-1], netip.MustParseAddr("10.9.0.2")), fmt.Sprint(stale, told[len(told)-1])
	})
}

// TestStaleAfterLinkBack: a node that probes its backends itself is stale from the moment
// Forwarding finds its link back until its checks have had the time to probe again (here
// healthy threshold 2 x interval 1 s + timeout 0.5 s + 0.25 s); its verdicts from while the
// link was down are not the fleet's.
func TestStaleAfterLinkBack(t *testing.T) {
	r, l := staleRig(t, nil)
	checked := strings.Replace(loaderPoolsA, "    affinity: {mode: none}\n",
		"    affinity: {mode: none}\n    health_check: {protocol: tcp, interval: 1s, timeout: 500ms, healthy_threshold: 2, unhealthy_threshold: 1}\n", 1)
	if err := r.applyIn(l, checked); err != nil {
		t.Fatal(err)
	}
	forwarding := func() (err error) {
		r.kit.MustDo("lb", func() error { err = l.Forwarding(); return nil })
		return err
	}
	if err := l.Stale(); err != nil {
		t.Fatalf("stale before any link loss: %v", err)
	}
	r.kit.In("lb", "ip", "link", "set", "v1", "down")
	testwait.For(t, 5*time.Second, "v0 without carrier", func() (bool, string) {
		err := forwarding()
		return errors.Is(err, ErrNotForwarding), fmt.Sprint(err)
	})
	r.kit.In("lb", "ip", "link", "set", "v1", "up")
	testwait.For(t, 5*time.Second, "v0's carrier back", func() (bool, string) {
		err := forwarding()
		return err == nil, fmt.Sprint(err)
	})
	back := time.Now()
	if err := l.Stale(); !errors.Is(err, ErrStale) || !strings.Contains(err.Error(), "came back") {
		t.Fatalf("just after the link came back: Stale() = %v", err)
	}
	const want = 2*time.Second + 500*time.Millisecond + 250*time.Millisecond
	took := testwait.For(t, want+2*time.Second, "the re-probing time over", func() (bool, string) {
		err := l.Stale()
		return err == nil, fmt.Sprint(err)
	})
	t.Logf("stale %s after the link came back (bound %s)", time.Since(back).Round(10*time.Millisecond), want)
	if took < want-100*time.Millisecond {
		t.Fatalf("current again %s after the link came back, before the checks could re-probe (%s)", took, want)
	}
}
