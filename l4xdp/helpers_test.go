package l4xdp

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

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

// flowHash is the program's hash of a flow (hash_flow), written here from its definition:
// the flow's key (source and destination, 16 bytes each, IPv4 mapped; the ports as they sit
// in the packet; the protocol; zero padding to 40 bytes) read as little-endian 64-bit
// words, the source's two for source_ip and all five otherwise, each folded in by xor,
// multiply and a fold of the high half, then a last multiply and fold.
func flowHash(src, dst netip.Addr, sport, dport uint16, proto uint8, srcOnly bool) uint32 {
	var k [40]byte
	s, d := src.As16(), dst.As16()
	copy(k[0:], s[:])
	copy(k[16:], d[:])
	binary.BigEndian.PutUint16(k[32:], sport)
	binary.BigEndian.PutUint16(k[34:], dport)
	k[36] = proto
	words := 5
	if srcOnly {
		words = 2
	}
	h := uint64(0x9e3779b97f4a7c15)
	for i := range words {
		h = (h ^ binary.LittleEndian.Uint64(k[8*i:])) * 0xbf58476d1ce4e5b9
		h ^= h >> 31
	}
	h *= 0x94d049bb133111eb
	return uint32(h ^ h>>32)
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
