package l4xdp

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap/zaptest"

	"github.com/stickylb/stickylb/internal/testkit/netnstest"
	"github.com/stickylb/stickylb/policies/pools"
)

// The loader's map bookkeeping across edits and a restart, on a veth in a namespace of the
// test's own (generic mode; MACs from the file, so nothing is resolved).

type loaderRig struct {
	t   *testing.T
	kit *netnstest.Kit
	pin string
}

func newLoaderRig(t *testing.T) *loaderRig {
	kit := netnstest.New(t, "slld")
	kit.AddNS("lb")
	kit.Veth("lb", "v0", "lb", "v1")
	return &loaderRig{t: t, kit: kit, pin: kit.BPFFS()}
}

func (r *loaderRig) open() *Loader { return r.openWith(Options{}) }

// detachAtEnd closes l and detaches the program when the test ends (a failed detach fails
// it), before the kit removes the namespace.
func (r *loaderRig) detachAtEnd(l *Loader) *Loader {
	r.t.Cleanup(func() {
		l.Close()
		if err := Detach(Config{Iface: "v0", PinRoot: r.pin}); err != nil {
			r.t.Error(err)
		}
	})
	return l
}

// healthPort listens on 127.0.0.1 until the test ends, for TCP health checks that dial
// from the test's namespace, and returns the listener and its port.
func healthPort(t *testing.T) (net.Listener, int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, ln.Addr().(*net.TCPAddr).Port
}

func (r *loaderRig) openWith(o Options) *Loader {
	r.t.Helper()
	var l *Loader
	r.kit.MustDo("lb", func() (err error) {
		l, err = Open(Config{Iface: "v0", Mode: ModeGeneric, PinRoot: r.pin, Tables: o}, zaptest.NewLogger(r.t))
		return err
	})
	return l
}

func (r *loaderRig) apply(l *Loader, yaml string) {
	r.t.Helper()
	f, err := pools.Parse("pools.yaml", []byte(yaml))
	if err != nil {
		r.t.Fatal(err)
	}
	if err := l.Apply(r.t.Context(), f); err != nil {
		r.t.Fatal(err)
	}
}

func slotsOf(t *testing.T, f *Tables) map[string]uint32 {
	t.Helper()
	ns, err := names(f.objs.BackendNames)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint32{}
	for slot, n := range ns {
		out[n] = slot
	}
	return out
}

func backendAt(t *testing.T, f *Tables, slot uint32) (net.HardwareAddr, uint32) {
	t.Helper()
	var b lbBackend
	if err := f.objs.Backends.Lookup(slot, &b); err != nil {
		t.Fatal(err)
	}
	return net.HardwareAddr(b.Mac[:]), b.Flags
}

const loaderPoolsA = `services:
  - name: a
    protocol: tcp
    vip: 10.9.0.1:80
    affinity: {mode: none}
    balance: maglev
    backends:
      - {address: 10.9.1.1:80, mac: "02:00:00:00:00:01"}
      - {address: 10.9.1.2:80, mac: "02:00:00:00:00:02"}
  - name: q
    protocol: udp
    vip: 10.9.0.1:443
    affinity: {mode: quic_cid}
    balance: maglev
    backends:
      - {address: 10.9.1.3:443, mac: "02:00:00:00:00:03", server_id: 7}
`

func TestLoaderEditsAndRestart(t *testing.T) {
	r := newLoaderRig(t)
	l := r.open()
	r.apply(l, loaderPoolsA)
	fw := l.Tables()
	slots := slotsOf(t, fw)
	y := slots["a/10.9.1.2:80"]
	if len(slots) != 3 {
		t.Fatalf("slots after the first apply: %v", slots)
	}
	// Traffic counted for y, then y leaves and w arrives in one edit: w takes y's slot, must
	// be alive there with its own MAC, and starts its counters from zero.
	counted := make([]lbCounter, ebpf.MustPossibleCPU())
	counted[0] = lbCounter{Packets: 5, Bytes: 500}
	if err := fw.objs.BackendStats.Put(y, counted); err != nil {
		t.Fatal(err)
	}
	genBefore := fw.slotGen(y)
	edited := strings.Replace(loaderPoolsA, `{address: 10.9.1.2:80, mac: "02:00:00:00:00:02"}`, `{address: 10.9.1.9:80, mac: "02:00:00:00:00:09"}`, 1)
	r.apply(l, edited)
	slots = slotsOf(t, fw)
	if w, ok := slots["a/10.9.1.9:80"]; !ok || w != y {
		t.Fatalf("slots after the edit: %v; want 10.9.1.9 in the freed slot %d", slots, y)
	}
	if _, ok := slots["a/10.9.1.2:80"]; ok {
		t.Fatalf("the removed backend is still named: %v", slots)
	}
	if mac, flags := backendAt(t, fw, y); mac.String() != "02:00:00:00:00:09" || flags&backendAlive == 0 {
		t.Fatalf("slot %d holds %s flags %d; want the newcomer, alive", y, mac, flags)
	}
	if g := fw.slotGen(y); g != genBefore+1 {
		t.Fatalf("slot %d's generation is %d after it changed hands, want %d: the old backend's flows would follow it", y, g, genBefore+1)
	}
	if st, err := fw.Stats(); err != nil || st.Backends["a/10.9.1.9:80"].Packets != 0 {
		t.Fatalf("the newcomer inherited counters: %+v %v", st.Backends, err)
	}
	// The VIP moves and q leaves: the old VIP key and q's server_id go. The backends are
	// listed the other way round, so a loader that assigned slots afresh would swap them.
	moved := `services:
  - name: a
    protocol: tcp
    vip: 10.9.0.2:80
    affinity: {mode: none}
    balance: maglev
    backends:
      - {address: 10.9.1.9:80, mac: "02:00:00:00:00:09"}
      - {address: 10.9.1.1:80, mac: "02:00:00:00:00:01"}
`
	r.apply(l, moved)
	keys := map[string]bool{}
	var k lbVipKey
	var meta lbVipMeta
	it := fw.objs.Vips.Iterate()
	for it.Next(&k, &meta) {
		keys[netip.AddrFrom16(k.Addr).Unmap().String()] = true
	}
	if len(keys) != 1 || !keys["10.9.0.2"] {
		t.Fatalf("VIPs after the move: %v; want only 10.9.0.2", keys)
	}
	var sk lbServerKey
	var sv uint32
	if fw.objs.ServerIds.Iterate().Next(&sk, &sv) {
		t.Fatalf("server_id %+v -> %d left behind by a removed service", sk, sv)
	}
	if st, _ := fw.Stats(); len(st.VIPs) != 1 {
		t.Fatalf("VIP names after q left: %v", st.VIPs)
	}
	// A restart adopts the maps and keeps every slot, whatever order a fresh loader would
	// have assigned.
	before := slotsOf(t, fw)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2 := r.detachAtEnd(r.open())
	r.apply(l2, moved)
	after := slotsOf(t, l2.Tables())
	for n, s := range before {
		if after[n] != s {
			t.Fatalf("slots before the restart %v, after %v", before, after)
		}
	}
}

// The upgrade path: a loader that finds pinned maps it cannot adopt (an older layout, or a
// connection table of another size) starts those afresh, keeps the rest, and forwards.
func TestLoaderReplacesPinnedMapsThatDoNotFit(t *testing.T) {
	r := newLoaderRig(t)
	dir := filepath.Join(r.pin, "v0")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// The previous release's layout: 8-byte entries, 12-byte backends.
	for name, spec := range map[string]*ebpf.MapSpec{
		"conns":    {Type: ebpf.LRUHash, KeySize: 40, ValueSize: 8, MaxEntries: 1 << 20},
		"backends": {Type: ebpf.Array, KeySize: 4, ValueSize: 12, MaxEntries: MaxBackends},
	} {
		m, err := ebpf.NewMap(spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Pin(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
	l := r.openWith(Options{ConnTableSize: 4096})
	r.apply(l, loaderPoolsA)
	if info, err := l.Tables().objs.Conns.Info(); err != nil || info.ValueSize != 24 || info.MaxEntries != 4096 {
		t.Fatalf("connection table after the upgrade: %+v, %v; want 24-byte entries, 4096 of them", info, err)
	}
	slots := slotsOf(t, l.Tables())
	l.Close()
	// A larger table on the next start: replaced again; names, and so slots, kept.
	l2 := r.detachAtEnd(r.openWith(Options{ConnTableSize: 8192}))
	if info, err := l2.Tables().objs.Conns.Info(); err != nil || info.MaxEntries != 8192 {
		t.Fatalf("connection table after a resize: %+v, %v", info, err)
	}
	pinned, err := ebpf.LoadPinnedMap(filepath.Join(dir, "conns"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	if info, _ := pinned.Info(); info.MaxEntries != 8192 {
		t.Fatalf("the pinned connection table has %d entries, want the new 8192", info.MaxEntries)
	}
	r.apply(l2, loaderPoolsA)
	if after := slotsOf(t, l2.Tables()); len(after) != len(slots) {
		t.Fatalf("slots %v before, %v after", slots, after)
	}
	for n, s := range slots {
		if after := slotsOf(t, l2.Tables()); after[n] != s {
			t.Fatalf("slots %v before, %v after", slots, after)
		}
	}
}

// vipTable reads VIP id's flags and the backend slots its Maglev table holds.
func vipTable(t *testing.T, f *Tables, id uint32) (uint32, map[uint32]bool) {
	t.Helper()
	var k lbVipKey
	var meta lbVipMeta
	flags := uint32(0)
	it := f.objs.Vips.Iterate()
	for it.Next(&k, &meta) {
		if meta.Id == id {
			flags = meta.Flags
		}
	}
	var innerID ebpf.MapID
	if err := f.objs.Maglev.Lookup(id, &innerID); err != nil {
		t.Fatal(err)
	}
	inner, err := ebpf.NewMapFromID(innerID)
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	slots := map[uint32]bool{}
	for i := uint32(0); i < meta.TableSize; i++ {
		var s uint32
		if err := inner.Lookup(i, &s); err != nil {
			t.Fatal(err)
		}
		slots[s] = true
	}
	return flags, slots
}

// One backend down: out of the table, no panic. Every backend down: the table holds them
// all (fail open) and the VIP is in panic, so its UDP flows do not re-pick. The health
// checks probe this process's loopback (the checker dials from the test's namespace):
// 127.0.0.1 answers while the test listens, 127.0.0.2 never does.
func TestLoaderPanicWhenEveryBackendIsDown(t *testing.T) {
	ln, port := healthPort(t)
	r := newLoaderRig(t)
	l := r.detachAtEnd(r.open())
	r.apply(l, fmt.Sprintf(`services:
  - name: a
    protocol: udp
    vip: 10.9.0.1:53
    balance: maglev
    health_check: {protocol: tcp, port: %d, interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}
    backends:
      - {address: 127.0.0.1:53, mac: "02:00:00:00:00:01"}
      - {address: 127.0.0.2:53, mac: "02:00:00:00:00:02"}
`, port))
	slots := slotsOf(t, l.Tables())
	up, down := slots["a/127.0.0.1:53"], slots["a/127.0.0.2:53"]
	// The first probe comes within interval/10, its verdict within the timeout after.
	testwait.For(t, 100*time.Millisecond+500*time.Millisecond+2*time.Second, "one backend down", func() (bool, string) {
		flags, table := vipTable(t, l.Tables(), 1)
		return flags&FlagPanic == 0 && table[up] && !table[down], fmt.Sprintf("flags %d, slots %v", flags, table)
	})
	ln.Close()
	// unhealthy_threshold x interval + timeout, and 2 s of slack.
	testwait.For(t, 1*time.Second+500*time.Millisecond+2*time.Second, "every backend down: panic over both", func() (bool, string) {
		flags, table := vipTable(t, l.Tables(), 1)
		return flags&FlagPanic != 0 && table[up] && table[down], fmt.Sprintf("flags %d, slots %v", flags, table)
	})
}
