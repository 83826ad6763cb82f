package l4xdp

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/stickylb/stickylb/internal/testkit/flowhash"
	"github.com/stickylb/stickylb/policies/chash"
)

// fnv1a is FNV-1a over b, the QUIC connection ID's hash the program documents, written
// here from its definition so the fixtures' expected backends do not come from the program.
func fnv1a(b []byte) uint32 {
	h := uint32(2166136261)
	for _, x := range b {
		h = (h ^ uint32(x)) * 16777619
	}
	return h
}

// flowHash is the program's hash of a flow (hash_flow), written from its definition in
// internal/testkit/flowhash.
func flowHash(src, dst netip.Addr, sport, dport uint16, proto uint8, srcOnly bool) uint32 {
	return flowhash.Sum(src, dst, sport, dport, proto, srcOnly)
}

// maglevSlots is the Maglev table of 65,537 entries policies/chash builds over hosts, as
// backend slots: host i's entries hold slot i (the tests install backend i in slot i).
func maglevSlots(tb testing.TB, hosts ...chash.Host) []uint32 {
	tb.Helper()
	m, err := chash.NewMaglev(hosts, 65537)
	if err != nil {
		tb.Fatal(err)
	}
	table := make([]uint32, len(m.Table()))
	for i, h := range m.Table() {
		table[i] = uint32(h)
	}
	return table
}

// setInsertBudget starts a new second of every CPU's insert budget with used inserts spent
// (1<<40: above any cap).
func setInsertBudget(tb testing.TB, f *Tables, used uint64) {
	tb.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		tb.Fatal(err)
	}
	n, err := ebpf.PossibleCPU()
	if err != nil {
		tb.Fatal(err)
	}
	per := make([]lbInsertBudget, n)
	for i := range per {
		per[i] = lbInsertBudget{Window: uint64(ts.Nano()), Used: used}
	}
	if err := f.objs.InsertBudget.Put(uint32(0), per); err != nil {
		tb.Fatalf("writing the insert budget: %v", err)
	}
}

// pathCounts sums the per-CPU path counters' packets, by path name.
func pathCounts(t testing.TB, f *Tables) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for i := uint32(0); i < numPaths; i++ {
		c, err := sumCounter(f.objs.PathStats, i)
		if err != nil {
			t.Fatal(err)
		}
		out[pathNames[i]] = c.Packets
	}
	return out
}

// loadTestProgs loads the test-only object (floors, generator, sink), released at the end
// of the test.
func loadTestProgs(t testing.TB) *testprogsObjects {
	t.Helper()
	var o testprogsObjects
	if err := loadTestprogsObjects(&o, nil); err != nil {
		t.Fatalf("loading the test programs: %v", err)
	}
	t.Cleanup(func() { o.Close() })
	return &o
}
