package sessions

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// model is the obvious implementation of the table's semantics: a map of
// entries with their last refresh, link time and segment, and each segment's
// recency list as a slice, oldest first. It has one shard and, because the
// fuzz clock moves at least one grain per operation, every hit relinks, so
// every sweep and eviction of the table is predictable.
type model struct {
	m     map[string]*modelEntry
	lists [2][]string // by segment, oldest first
	now   int64
	ttl   int64
	max   int
	stats Stats
}

type modelEntry struct {
	backend         string
	touched, linked int64
	seg             int
}

func (m *model) expired(e *modelEntry) bool { return m.now-e.touched >= m.ttl }

func (m *model) unlink(k string) {
	l := &m.lists[m.m[k].seg]
	*l = slices.DeleteFunc(*l, func(x string) bool { return x == k })
}

// pushHead links k at the newest end of segment seg, linked at (or at the newest's link
// time, were that later: the list stays sorted).
func (m *model) pushHead(k string, seg int, at int64) {
	e := m.m[k]
	e.seg, e.linked = seg, at
	if l := m.lists[seg]; len(l) > 0 {
		e.linked = max(at, m.m[l[len(l)-1]].linked)
	}
	m.lists[seg] = append(m.lists[seg], k)
	m.overflow()
}

// overflow pushes the protected segment's oldest back to probation's oldest end, its link
// time lowered to that end's, while the segment holds more than its share.
func (m *model) overflow() {
	for len(m.lists[protected]) > protectedCap(m.max) {
		k := m.lists[protected][0]
		m.lists[protected] = m.lists[protected][1:]
		e := m.m[k]
		if len(m.lists[probation]) > 0 {
			e.linked = min(e.linked, m.m[m.lists[probation][0]].linked)
		}
		e.seg = probation
		m.lists[probation] = append([]string{k}, m.lists[probation]...)
	}
}

func (m *model) remove(k string) {
	m.unlink(k)
	delete(m.m, k)
}

// removeExpired removes k, counted as expired.
func (m *model) removeExpired(k string) {
	m.remove(k)
	m.stats.Expired++
}

func (m *model) get(k string) (string, bool) {
	e, ok := m.m[k]
	if ok && m.expired(e) {
		m.removeExpired(k)
		ok = false
	}
	if !ok {
		m.stats.Misses++
		return "", false
	}
	m.stats.Hits++
	e.touched = m.now
	m.unlink(k)
	m.pushHead(k, protected, m.now) // seen again: promoted, or relinked
	return e.backend, true
}

// sweep removes expired entries off each segment's oldest end, probation's first, visiting
// at most limit entries in all (limit < 0: no limit) and stopping at the first linked after
// the cutoff.
func (m *model) sweepOld(limit int) int {
	removed, steps := 0, 0
	for seg := range m.lists {
		for _, k := range slices.Clone(m.lists[seg]) {
			e := m.m[k]
			if steps == limit || e.linked > m.now-m.ttl {
				break
			}
			steps++
			if m.expired(e) {
				m.removeExpired(k)
				removed++
			}
		}
	}
	return removed
}

// victim is what an insert into the full table evicts.
func (m *model) victim() string {
	for _, l := range m.lists {
		if len(l) > 0 && m.expired(m.m[l[0]]) {
			return l[0]
		}
	}
	if len(m.lists[probation]) > 0 {
		return m.lists[probation][0]
	}
	return m.lists[protected][0]
}

// insert adds k to segment seg, linked at, evicting as the table does when full.
func (m *model) insert(k, b string, touched, at int64, seg int) {
	if len(m.m) >= m.max {
		m.remove(m.victim())
		m.stats.Evicted++
	}
	m.m[k] = &modelEntry{backend: b, touched: touched}
	m.pushHead(k, seg, at)
}

func (m *model) put(k, b string) {
	if e, ok := m.m[k]; ok {
		seg := e.seg
		if m.expired(e) {
			m.stats.Expired++
			m.stats.Inserts++
			seg = probation // a new session
		} else {
			m.stats.Updates++
		}
		e.backend, e.touched = b, m.now
		m.unlink(k)
		m.pushHead(k, seg, m.now)
		return
	}
	m.sweepOld(sweepBatch)
	m.insert(k, b, m.now, m.now, probation)
	m.stats.Inserts++
}

func (m *model) del(k string) bool {
	e, ok := m.m[k]
	if !ok {
		return false
	}
	m.remove(k)
	if m.expired(e) {
		m.stats.Expired++
		return false
	}
	m.stats.Deleted++
	return true
}

// removeIf removes matching entries; live ones count as invalidated.
func (m *model) removeIf(match func(*modelEntry) bool) int {
	live := 0
	for k, e := range m.m {
		if !match(e) {
			continue
		}
		m.remove(k)
		if m.expired(e) {
			m.stats.Expired++
		} else {
			m.stats.Invalidated++
			live++
		}
	}
	return live
}

func (m *model) sweep() int {
	n := 0
	for k, e := range m.m {
		if m.expired(e) {
			m.removeExpired(k)
			n++
		}
	}
	return n
}

// reconfigure: a shrink moves every live entry into a table of the new size, each
// segment's oldest first, probation's first, as inserts into that segment (linked as they
// were), which evict as the table does when full.
func (m *model) reconfigure(ttl time.Duration, maxEntries int) {
	m.ttl = int64(ttl)
	if maxEntries >= m.max {
		m.max = maxEntries
		return
	}
	old, lists := m.m, m.lists
	m.m, m.lists, m.max = map[string]*modelEntry{}, [2][]string{}, maxEntries
	for seg, l := range lists {
		for _, k := range l {
			e := old[k]
			if m.expired(e) {
				m.stats.Expired++
				continue
			}
			m.insert(k, e.backend, e.touched, e.linked, seg)
		}
	}
}

var fuzzLong = strings.Repeat("L", MaxKeyLen)

func fuzzKey(b byte) string {
	switch i := b % 16; i {
	case 14, 15: // over MaxKeyLen, differing only past it: digested, must stay distinct
		return fuzzLong + fmt.Sprint(i)
	default:
		return fmt.Sprintf("k%d", i)
	}
}

func fuzzBackend(b byte) string { return fmt.Sprintf("10.0.0.%d:80", b%4) }

var fuzzTTLs = []time.Duration{8 * time.Second, 64 * time.Second, 300 * time.Second}

// FuzzTableModel runs byte-coded operation sequences against a single-shard
// table and the model, comparing every result, Len and the full Stats after
// each operation, and checking the table's structural invariants.
func FuzzTableModel(f *testing.F) {
	f.Add([]byte{5, 0, 1, 2, 3, 2, 4, 2})
	f.Add([]byte{3, 0, 1, 0, 17, 0, 33, 0, 49, 2, 1, 2, 17, 255, 0, 4, 1})
	f.Add([]byte{2, 0, 14, 0, 15, 2, 14, 2, 15, 4, 14, 6, 1, 7, 2, 2, 15})
	f.Add([]byte{10, 0, 1, 0, 2, 0, 3, 0, 4, 7, 2, 0, 5, 6, 2, 0, 6, 7, 0, 0, 7, 5, 1})
	f.Add([]byte{1, 0, 1, 0, 2, 8, 3, 0, 3, 64, 3, 6, 64, 2, 3})
	f.Fuzz(runModel)
}

// TestTableModelRandom runs FuzzTableModel's check on pseudo-random sequences, so that the
// model's comparison covers more than the committed corpus in every test run.
func TestTableModelRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 3000 {
		data := make([]byte, 2+rng.IntN(400))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		runModel(t, data)
	}
}

// runModel runs a byte-coded operation sequence against a single-shard table and the model.
func runModel(t *testing.T, data []byte) {
	if len(data) == 0 {
		return
	}
	maxEntries := 1 + int(data[0])%40
	data = data[1:]
	clk := &fakeClock{}
	tab, err := New("fuzz", Config{TTL: fuzzTTLs[1], MaxEntries: maxEntries, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	m := &model{m: map[string]*modelEntry{}, ttl: int64(fuzzTTLs[1]), max: maxEntries}
	for len(data) >= 2 {
		op, arg := data[0], data[1]
		data = data[2:]
		// At least one second (the largest grain) per operation.
		step := time.Duration(1+op>>5) * time.Second
		clk.Advance(step)
		m.now += int64(step)
		switch op % 8 {
		case 0, 1:
			k, b := fuzzKey(arg), fuzzBackend(arg>>4)
			tab.Put(k, b)
			m.put(k, b)
		case 2, 3:
			k := fuzzKey(arg)
			gb, gok := tab.Get(k)
			wb, wok := m.get(k)
			if gb != wb || gok != wok {
				t.Fatalf("Get(%.20q) = %q, %v; model %q, %v", k, gb, gok, wb, wok)
			}
		case 4:
			k := fuzzKey(arg)
			if got, want := tab.Delete(k), m.del(k); got != want {
				t.Fatalf("Delete(%.20q) = %v; model %v", k, got, want)
			}
		case 5:
			b := fuzzBackend(arg)
			got := tab.InvalidateBackend(b)
			want := m.removeIf(func(e *modelEntry) bool { return e.backend == b })
			if got != want {
				t.Fatalf("InvalidateBackend(%q) = %d; model %d", b, got, want)
			}
		case 6:
			ttl, n := fuzzTTLs[int(arg>>6)%len(fuzzTTLs)], 1+int(arg)%40
			if err := tab.Reconfigure(Config{TTL: ttl, MaxEntries: n}); err != nil {
				t.Fatal(err)
			}
			m.reconfigure(ttl, n)
		case 7:
			switch arg % 4 {
			case 0:
				if got, want := tab.Flush(), m.removeIf(func(*modelEntry) bool { return true }); got != want {
					t.Fatalf("Flush() = %d; model %d", got, want)
				}
			case 1:
				if got, want := tab.Sweep(), m.sweep(); got != want {
					t.Fatalf("Sweep() = %d; model %d", got, want)
				}
			case 2:
				clk.Advance(time.Duration(m.ttl))
				m.now += m.ttl
			}
		}
		want := m.stats
		want.Entries, want.Capacity, want.Protected = len(m.m), m.max, len(m.lists[protected])
		if got := tab.Stats(); got != want {
			t.Fatalf("after op %d/%d: Stats()\n %+v\nmodel\n %+v", op, arg, got, want)
		}
		if tab.Len() != len(m.m) {
			t.Fatalf("Len() = %d; model %d", tab.Len(), len(m.m))
		}
		checkInvariants(t, tab, true)
		checkConservation(t, want)
	}
	for k, e := range m.m {
		if m.expired(e) {
			continue
		}
		mustGet(t, tab, k, e.backend)
	}
}
