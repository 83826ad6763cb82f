package sessions

import (
	"fmt"
	"hash/maphash"
	"math"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a test clock safe for concurrent use.
type fakeClock struct{ ns atomic.Int64 }

var clockBase = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func (c *fakeClock) Now() time.Time          { return clockBase.Add(time.Duration(c.ns.Load())) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func newTestTable(tb testing.TB, ttl time.Duration, maxEntries int) (*Table, *fakeClock) {
	tb.Helper()
	c := &fakeClock{}
	tab, err := New("test", Config{TTL: ttl, MaxEntries: maxEntries, Now: c.Now})
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return tab, c
}

// sid is a realistic 32-character session id, distinct for distinct i.
func sid(i uint64) string {
	z := i + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	return fmt.Sprintf("%016x%016x", z, i)
}

// checkInvariants verifies every structural invariant of the table: bounds,
// recency lists (sorted by link time, doubly linked, counted), the slot index
// (every entry indexed once, under its hash, in its own shard), interning
// refcounts, free lists and arena accounting. strictGrain also checks
// touched-linked < grain, which holds unless the TTL was reconfigured.
func checkInvariants(tb testing.TB, tab *Table, strictGrain bool) {
	tb.Helper()
	set := tab.set.Load()
	sumCap := 0
	grain := tab.grain.Load()
	for si := range set.shards {
		sh := &set.shards[si]
		sh.mu.RLock()
		err := checkShard(set, sh, grain, strictGrain)
		sumCap += sh.d.cap
		sh.mu.RUnlock()
		if err != nil {
			tb.Fatalf("shard %d: %v", si, err)
		}
	}
	if want := int(tab.max.Load()); sumCap != want {
		tb.Fatalf("shard capacities sum to %d, MaxEntries is %d", sumCap, want)
	}
}

func checkShard(set *shardSet, sh *shard, grain int64, strictGrain bool) error {
	d := &sh.d
	if sh.retired {
		return fmt.Errorf("published shard is retired")
	}
	if d.n > d.cap {
		return fmt.Errorf("n=%d exceeds cap=%d", d.n, d.cap)
	}
	count := 0
	liveKeyBytes := 0
	refs := map[uint32]int32{}
	for seg, l := range d.lists {
		n, prev, last := 0, noEntry, int64(math.MinInt64)
		for j := l.tail; j != noEntry; j = d.entries[j].newer {
			e := &d.entries[j]
			if e.backend == 0 {
				return fmt.Errorf("free entry %d on the list", j)
			}
			if e.seg() != seg {
				return fmt.Errorf("entry %d of segment %d on segment %d's list", j, e.seg(), seg)
			}
			if e.older != prev {
				return fmt.Errorf("entry %d: older=%d, want %d", j, e.older, prev)
			}
			if e.linked < last {
				return fmt.Errorf("entry %d linked %d before its older neighbour (%d): list unsorted", j, e.linked, last)
			}
			if e.linked > e.touched.Load() {
				return fmt.Errorf("entry %d linked %d after its last refresh %d", j, e.linked, e.touched.Load())
			}
			// Entries pushed back to probation keep their refresh time under a lowered link.
			if strictGrain && seg == protected && e.touched.Load()-e.linked >= grain {
				return fmt.Errorf("entry %d: touched-linked=%d >= grain %d", j, e.touched.Load()-e.linked, grain)
			}
			last = e.linked
			refs[e.backend]++
			liveKeyBytes += 2 + len(d.keyBytes(j))
			n++
			prev = j
			if n > len(d.entries) {
				return fmt.Errorf("cycle in list")
			}
		}
		if prev != l.head {
			return fmt.Errorf("segment %d: head=%d, list ends at %d", seg, l.head, prev)
		}
		if seg == protected && n != d.nprot {
			return fmt.Errorf("protected list holds %d, nprot=%d", n, d.nprot)
		}
		count += n
	}
	if d.pcap != protectedCap(d.cap) || d.nprot > d.pcap {
		return fmt.Errorf("protected segment: %d entries, cap %d (want %d for a shard of %d)", d.nprot, d.pcap, protectedCap(d.cap), d.cap)
	}
	if count != d.n {
		return fmt.Errorf("lists hold %d, n=%d", count, d.n)
	}
	free := 0
	for j := d.freeEntry; j != noEntry; j = d.entries[j].older {
		if d.entries[j].backend != 0 {
			return fmt.Errorf("live entry %d on the free list", j)
		}
		if free++; free > len(d.entries) {
			return fmt.Errorf("cycle in free list")
		}
	}
	if free+d.n != len(d.entries) {
		return fmt.Errorf("free %d + n %d != %d entries", free, d.n, len(d.entries))
	}
	if len(d.entries) > d.cap && d.cap > 0 {
		return fmt.Errorf("entries slice %d longer than cap %d", len(d.entries), d.cap)
	}
	occupied := 0
	for _, s := range d.slots {
		if s == 0 {
			continue
		}
		occupied++
		idx := int32(s>>32) - 1
		if idx < 0 || int(idx) >= len(d.entries) || d.entries[idx].backend == 0 {
			return fmt.Errorf("slot points at bad entry %d", idx)
		}
		key := d.keyBytes(idx)
		h := maphash.Bytes(d.seed, key)
		if uint32(h) != uint32(s) {
			return fmt.Errorf("slot hash mismatch for entry %d", idx)
		}
		if got := d.find(string(key), h); got != idx {
			return fmt.Errorf("find(entry %d's key) = %d", idx, got)
		}
		if set.pick(h) != sh {
			return fmt.Errorf("entry %d lives in the wrong shard", idx)
		}
	}
	if occupied != d.n {
		return fmt.Errorf("%d slots occupied, n=%d", occupied, d.n)
	}
	if 4*d.n > 3*len(d.slots) && d.n > 0 {
		return fmt.Errorf("slot load %d/%d above 3/4", d.n, len(d.slots))
	}
	inUse := 0
	for id := 1; id < len(d.names); id++ {
		if d.refs[id] != refs[uint32(id)] {
			return fmt.Errorf("backend id %d (%q): refs=%d, entries=%d", id, d.names[id], d.refs[id], refs[uint32(id)])
		}
		if d.refs[id] > 0 {
			inUse++
			if d.ids[d.names[id]] != uint32(id) {
				return fmt.Errorf("backend %q not interned as %d", d.names[id], id)
			}
		} else if d.names[id] != "" {
			return fmt.Errorf("free backend id %d still named %q", id, d.names[id])
		}
	}
	if inUse != len(d.ids) {
		return fmt.Errorf("%d backend ids in use, %d interned names", inUse, len(d.ids))
	}
	if liveKeyBytes+d.garbage != len(d.arena) {
		return fmt.Errorf("arena: live %d + garbage %d != len %d", liveKeyBytes, d.garbage, len(d.arena))
	}
	return nil
}

// checkConservation checks that every inserted mapping is held or was
// removed by exactly one counted cause.
func checkConservation(tb testing.TB, s Stats) {
	tb.Helper()
	out := uint64(s.Entries) + s.Expired + s.Evicted + s.Invalidated + s.Deleted
	if s.Inserts != out {
		tb.Fatalf("Inserts=%d but Entries+Expired+Evicted+Invalidated+Deleted=%d (%+v)", s.Inserts, out, s)
	}
}

func mustGet(tb testing.TB, tab *Table, key, want string) {
	tb.Helper()
	got, ok := tab.Get(key)
	if !ok || got != want {
		tb.Fatalf("Get(%q) = %q, %v; want %q, true", key, got, ok, want)
	}
}

func mustMiss(tb testing.TB, tab *Table, key string) {
	tb.Helper()
	if got, ok := tab.Get(key); ok {
		tb.Fatalf("Get(%q) = %q, true; want a miss", key, got)
	}
}
