package sessions

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// model is the obvious implementation of the table's semantics: a map with
// last-refresh times, sorted on demand. It has one shard and, because the
// fuzz clock moves at least one grain per operation, exact recency order, so
// every sweep and eviction of the table is predictable.
type model struct {
	m     map[string]*modelEntry
	now   int64
	ttl   int64
	max   int
	stats Stats
}

type modelEntry struct {
	backend string
	touched int64
}

func (m *model) expired(e *modelEntry) bool { return m.now-e.touched >= m.ttl }

// byAge returns keys oldest first.
func (m *model) byAge() []string {
	keys := make([]string, 0, len(m.m))
	for k := range m.m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return int(m.m[a].touched - m.m[b].touched) })
	return keys
}

func (m *model) get(k string) (string, bool) {
	e, ok := m.m[k]
	if ok && m.expired(e) {
		delete(m.m, k)
		m.stats.Expired++
		ok = false
	}
	if !ok {
		m.stats.Misses++
		return "", false
	}
	m.stats.Hits++
	e.touched = m.now
	return e.backend, true
}

func (m *model) put(k, b string) {
	if e, ok := m.m[k]; ok {
		if m.expired(e) {
			m.stats.Expired++
			m.stats.Inserts++
		} else {
			m.stats.Updates++
		}
		e.backend, e.touched = b, m.now
		return
	}
	swept := 0
	for _, old := range m.byAge() {
		if swept == sweepBatch || !m.expired(m.m[old]) {
			break
		}
		delete(m.m, old)
		m.stats.Expired++
		swept++
	}
	if len(m.m) >= m.max {
		delete(m.m, m.byAge()[0])
		m.stats.Evicted++
	}
	m.m[k] = &modelEntry{backend: b, touched: m.now}
	m.stats.Inserts++
}

func (m *model) del(k string) bool {
	e, ok := m.m[k]
	if !ok {
		return false
	}
	delete(m.m, k)
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
		delete(m.m, k)
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
			delete(m.m, k)
			m.stats.Expired++
			n++
		}
	}
	return n
}

func (m *model) reconfigure(ttl time.Duration, maxEntries int) {
	m.ttl = int64(ttl)
	if maxEntries < m.max {
		for _, k := range m.byAge() {
			if m.expired(m.m[k]) {
				delete(m.m, k)
				m.stats.Expired++
			}
		}
		keys := m.byAge()
		for _, k := range keys[:max(0, len(keys)-maxEntries)] {
			delete(m.m, k)
			m.stats.Evicted++
		}
	}
	m.max = maxEntries
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
	f.Fuzz(func(t *testing.T, data []byte) {
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
			want.Entries, want.Capacity = len(m.m), m.max
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
	})
}
