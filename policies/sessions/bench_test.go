package sessions

import (
	"container/list"
	"runtime"
	"sync"
	"testing"
	"time"
)

// The peer a user would otherwise write: a map behind one mutex with a
// container/list LRU and a TTL stamp per entry (what HAProxy-style stick tables
// look like when hand-rolled in Go). Benchmarks run both arms in one run so
// the ratio is read from one `go test -bench` output.
type lruPeer struct {
	mu  sync.Mutex
	m   map[string]*list.Element
	l   *list.List
	max int
	ttl time.Duration
}

type lruEntry struct {
	key, backend string
	expires      time.Time
}

func newLRUPeer(max int, ttl time.Duration) *lruPeer {
	return &lruPeer{m: make(map[string]*list.Element, max), l: list.New(), max: max, ttl: ttl}
}

func (p *lruPeer) Get(k string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.m[k]
	if !ok {
		return "", false
	}
	en := e.Value.(*lruEntry)
	now := time.Now()
	if now.After(en.expires) {
		p.l.Remove(e)
		delete(p.m, k)
		return "", false
	}
	en.expires = now.Add(p.ttl)
	p.l.MoveToFront(e)
	return en.backend, true
}

func (p *lruPeer) Put(k, b string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.m[k]; ok {
		en := e.Value.(*lruEntry)
		en.backend, en.expires = b, time.Now().Add(p.ttl)
		p.l.MoveToFront(e)
		return
	}
	if p.l.Len() >= p.max {
		old := p.l.Back()
		p.l.Remove(old)
		delete(p.m, old.Value.(*lruEntry).key)
	}
	p.m[k] = p.l.PushFront(&lruEntry{key: k, backend: b, expires: time.Now().Add(p.ttl)})
}

type store interface {
	Get(string) (string, bool)
	Put(string, string)
}

const benchKeys = 100_000

// benchArms runs fn against both stores, each bounded to capacity entries.
// The table's bound is split across shards, so a shard can fill (and evict)
// slightly before the whole table does: hit benchmarks give both arms
// headroom, the eviction benchmark does not.
func benchArms(b *testing.B, capacity int, fn func(b *testing.B, s store)) {
	b.Run("impl=stickylb", func(b *testing.B) {
		tab, err := New("bench", Config{TTL: time.Hour, MaxEntries: capacity})
		if err != nil {
			b.Fatal(err)
		}
		fn(b, tab)
	})
	b.Run("impl=mutex-map-lru", func(b *testing.B) { fn(b, newLRUPeer(capacity, time.Hour)) })
}

func benchKeySet() []string {
	ks := make([]string, benchKeys)
	for i := range ks {
		ks[i] = sid(uint64(i))
	}
	return ks
}

var backendNames = []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80"}

// BenchmarkGetHit: a lookup that finds a live session (the hot path of every
// sticky request).
func BenchmarkGetHit(b *testing.B) {
	ks := benchKeySet()
	benchArms(b, 2*benchKeys, func(b *testing.B, s store) {
		for i, k := range ks {
			s.Put(k, backendNames[i%4])
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, ok := s.Get(ks[i%benchKeys]); !ok {
				b.Fatal("miss")
			}
		}
	})
}

// BenchmarkGetHitParallel: the same from every core at once.
func BenchmarkGetHitParallel(b *testing.B) {
	ks := benchKeySet()
	benchArms(b, 2*benchKeys, func(b *testing.B, s store) {
		for i, k := range ks {
			s.Put(k, backendNames[i%4])
		}
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				s.Get(ks[i%benchKeys])
				i += 7
			}
		})
	})
}

// BenchmarkPutFull: inserting new sessions into a full table, so each
// insert evicts.
func BenchmarkPutFull(b *testing.B) {
	ks := benchKeySet()
	extra := make([]string, benchKeys)
	for i := range extra {
		extra[i] = sid(uint64(i + benchKeys))
	}
	benchArms(b, benchKeys, func(b *testing.B, s store) {
		for i, k := range ks {
			s.Put(k, backendNames[i%4])
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if i%(2*benchKeys) < benchKeys {
				s.Put(extra[i%benchKeys], backendNames[i%4])
			} else {
				s.Put(ks[i%benchKeys], backendNames[i%4])
			}
		}
	})
}

// BenchmarkMemoryPerEntry reports the heap held per session (32-character
// keys, four backends) as bytes/entry: the figure that sizes max_sessions.
func BenchmarkMemoryPerEntry(b *testing.B) {
	ks := benchKeySet()
	measure := func(b *testing.B, mk func() store) {
		var per float64
		for i := 0; i < b.N; i++ {
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			s := mk()
			for j, k := range ks {
				s.Put(k, backendNames[j%4])
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			per = float64(after.HeapAlloc-before.HeapAlloc) / benchKeys
			runtime.KeepAlive(s)
		}
		b.ReportMetric(per, "bytes/entry")
	}
	b.Run("impl=stickylb", func(b *testing.B) {
		measure(b, func() store {
			tab, err := New("bench", Config{TTL: time.Hour, MaxEntries: benchKeys})
			if err != nil {
				b.Fatal(err)
			}
			return tab
		})
	})
	b.Run("impl=mutex-map-lru", func(b *testing.B) {
		measure(b, func() store { return newLRUPeer(benchKeys, time.Hour) })
	})
}
