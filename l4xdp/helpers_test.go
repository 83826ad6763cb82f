package l4xdp

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/stickylb/stickylb/policies/chash"
)

// fnv1a is FNV-1a over b, the hash the program documents (hash_flow, the QUIC DCID hash),
// written here from its definition so the fixtures' expected backends do not come from the
// program.
func fnv1a(b []byte) uint32 {
	h := uint32(2166136261)
	for _, x := range b {
		h = (h ^ uint32(x)) * 16777619
	}
	return h
}

// flowHashInput returns the bytes the program hashes for a flow: the source address (16
// bytes, IPv4 mapped) for source_ip, else source, destination, ports (as they sit in the
// packet) and protocol.
func flowHashInput(src, dst netip.Addr, sport, dport uint16, proto uint8, srcOnly bool) []byte {
	s, d := src.As16(), dst.As16()
	b := append([]byte{}, s[:]...)
	if srcOnly {
		return b
	}
	b = append(b, d[:]...)
	b = binary.BigEndian.AppendUint16(b, sport)
	b = binary.BigEndian.AppendUint16(b, dport)
	return append(b, proto)
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
