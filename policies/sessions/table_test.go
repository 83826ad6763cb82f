package sessions

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

func TestNewRejectsInvalidConfig(t *testing.T) {
	for _, cfg := range []Config{
		{TTL: 0, MaxEntries: 10},
		{TTL: -time.Second, MaxEntries: 10},
		{TTL: time.Minute, MaxEntries: 0},
		{TTL: time.Minute, MaxEntries: -1},
		{TTL: time.Minute, MaxEntries: MaxEntriesLimit + 1},
	} {
		tab, err := New("bad", cfg)
		if err == nil || !errors.Is(err, ErrInvalidConfig) || tab != nil {
			t.Errorf("New(%+v) = %v, %v; want nil, ErrInvalidConfig", cfg, tab, err)
		} else if !strings.Contains(err.Error(), `"bad"`) {
			t.Errorf("error %q does not name the table", err)
		}
	}
	if _, err := New("ok", Config{TTL: time.Nanosecond, MaxEntries: MaxEntriesLimit}); err != nil {
		t.Errorf("largest config rejected: %v", err)
	}
}

func TestPutGetOverwrite(t *testing.T) {
	tab, _ := newTestTable(t, time.Minute, 100)
	if tab.Name() != "test" {
		t.Fatalf("Name() = %q", tab.Name())
	}
	mustMiss(t, tab, "a")
	tab.Put("a", "10.0.0.1:80")
	tab.Put("b", "10.0.0.2:80")
	mustGet(t, tab, "a", "10.0.0.1:80")
	mustGet(t, tab, "b", "10.0.0.2:80")
	tab.Put("a", "10.0.0.2:80") // re-pin
	mustGet(t, tab, "a", "10.0.0.2:80")
	if tab.Len() != 2 {
		t.Fatalf("Len() = %d, want 2", tab.Len())
	}
	tab.Put("", "10.0.0.3:80") // the empty key is a key like any other
	mustGet(t, tab, "", "10.0.0.3:80")
	checkInvariants(t, tab, true)
}

func TestSlidingTTLRefresh(t *testing.T) {
	const ttl = 10 * time.Minute
	tab, clk := newTestTable(t, ttl, 100)
	tab.Put("s", "b1")
	tab.Put("idle", "b1")
	// Hit "s" just before it would expire, for ten TTLs: each hit slides it.
	for i := 0; i < 10; i++ {
		clk.Advance(ttl - time.Second)
		mustGet(t, tab, "s", "b1")
	}
	mustMiss(t, tab, "idle")
	// Now leave it idle for exactly one TTL.
	clk.Advance(ttl)
	mustMiss(t, tab, "s")
	if s := tab.Stats(); s.Hits != 10 || s.Misses != 2 || s.Expired != 2 || s.Entries != 0 {
		t.Fatalf("stats %+v; want 10 hits, 2 misses, 2 expired, 0 entries", s)
	}
}

func TestSlidingTTLRefreshWithinGrain(t *testing.T) {
	// Hits closer together than the grain take the read-lock fast path; they
	// must slide the expiry all the same.
	const ttl = 64 * time.Millisecond // grain 1ms
	tab, clk := newTestTable(t, ttl, 100)
	tab.Put("s", "b1")
	for i := 0; i < 1000; i++ { // 1000 * 100µs = 1.5 TTLs of steady use
		clk.Advance(100 * time.Microsecond)
		mustGet(t, tab, "s", "b1")
	}
	clk.Advance(ttl - time.Nanosecond)
	mustGet(t, tab, "s", "b1")
	clk.Advance(ttl)
	mustMiss(t, tab, "s")
}

func TestExpiryBoundaryExact(t *testing.T) {
	const ttl = time.Minute
	tab, clk := newTestTable(t, ttl, 10)
	tab.Put("a", "b")
	tab.Put("c", "b")
	clk.Advance(ttl - time.Nanosecond)
	mustGet(t, tab, "a", "b") // idle TTL-1ns: alive
	clk.Advance(time.Nanosecond)
	mustMiss(t, tab, "c") // idle exactly TTL: expired
	mustGet(t, tab, "a", "b")
}

func TestLazyExpiryOnGet(t *testing.T) {
	tab, clk := newTestTable(t, time.Minute, 10)
	for i := 0; i < 5; i++ {
		tab.Put(fmt.Sprint(i), "b")
	}
	clk.Advance(time.Hour)
	// Nothing removes them until they are looked at.
	if n := tab.Len(); n != 5 {
		t.Fatalf("Len() = %d before any Get, want 5 (expiry is lazy)", n)
	}
	mustMiss(t, tab, "0")
	mustMiss(t, tab, "1")
	if n, s := tab.Len(), tab.Stats(); n != 3 || s.Expired != 2 {
		t.Fatalf("after two Gets: Len=%d Expired=%d, want 3 and 2", n, s.Expired)
	}
	if n := tab.Sweep(); n != 3 {
		t.Fatalf("Sweep() = %d, want 3", n)
	}
	if tab.Len() != 0 {
		t.Fatalf("Len() = %d after Sweep", tab.Len())
	}
	checkConservation(t, tab.Stats())
}

func TestEvictsLeastRecentlyRefreshed(t *testing.T) {
	tab, clk := newTestTable(t, time.Hour, 4) // grain 1s
	for _, k := range []string{"a", "b", "c", "d"} {
		tab.Put(k, "x")
		clk.Advance(2 * time.Second)
	}
	mustGet(t, tab, "a", "x") // a is now the freshest; b the stalest
	clk.Advance(2 * time.Second)
	tab.Put("e", "x")
	mustMiss(t, tab, "b")
	for _, k := range []string{"c", "d", "a", "e"} { // refreshed in this order, a grain+ apart
		clk.Advance(2 * time.Second)
		mustGet(t, tab, k, "x")
	}
	tab.Put("f", "x") // c is now the stalest
	mustMiss(t, tab, "c")
	s := tab.Stats()
	if s.Evicted != 2 || s.Entries != 4 || s.Expired != 0 {
		t.Fatalf("stats %+v; want 2 evicted, 4 entries, 0 expired", s)
	}
	checkInvariants(t, tab, true)
}

func TestSweepExpiredBeforeEvicting(t *testing.T) {
	const ttl = time.Hour
	tab, clk := newTestTable(t, ttl, 4)
	tab.Put("old1", "x")
	tab.Put("old2", "x")
	clk.Advance(ttl / 2)
	tab.Put("live1", "x")
	tab.Put("live2", "x")
	clk.Advance(ttl/2 + time.Second) // old* expired, live* have half a TTL left
	tab.Put("new", "x")
	s := tab.Stats()
	if s.Evicted != 0 || s.Expired != 2 {
		t.Fatalf("stats %+v; want the insert to sweep 2 expired and evict none", s)
	}
	for _, k := range []string{"live1", "live2", "new"} {
		mustGet(t, tab, k, "x")
	}
	// Full of live entries: the next inserts must evict, stalest first.
	tab.Put("new2", "x")
	tab.Put("new3", "x")
	if s := tab.Stats(); s.Evicted != 1 || s.Entries != 4 {
		t.Fatalf("stats %+v; want 1 eviction and 4 entries", s)
	}
	checkConservation(t, tab.Stats())
}

func TestHitWithinGrainDoesNotRelink(t *testing.T) {
	const ttl = 64 * time.Second // grain 1s
	tab, clk := newTestTable(t, ttl, 4)
	tab.Put("a", "x")
	clk.Advance(time.Second)
	tab.Put("b", "x")
	clk.Advance(time.Second)
	mustGet(t, tab, "a", "x") // seen again: both move to the protected segment
	clk.Advance(time.Second)
	mustGet(t, tab, "b", "x")
	clk.Advance(500 * time.Millisecond)
	mustGet(t, tab, "b", "x") // within b's grain: time moves, position stays
	d := &tab.set.Load().shards[0].d
	if d.lists[protected].head != d.find("b", hashOf(tab, "b")) {
		t.Fatalf("b should still be the head")
	}
	mustGet(t, tab, "a", "x") // a was linked 1.5s ago: relinked to the head
	if d.lists[protected].head != d.find("a", hashOf(tab, "a")) {
		t.Fatalf("a hit after more than the grain was not relinked")
	}
	checkInvariants(t, tab, true)
}

func hashOf(tab *Table, key string) uint64 {
	return maphash.String(tab.seed, tableKey(key))
}

// TestEvictionOrderWithinGrain drives random traffic with a clock that
// moves in steps smaller than the grain (so most hits take the fast path)
// and checks the documented precision on every eviction: the evicted entry
// was in probation, pushed back there by the protected segment or refreshed no
// more than one grain after probation's stalest; or, probation empty, the
// same of the protected segment; and no entry had expired more than a grain
// before.
func TestEvictionOrderWithinGrain(t *testing.T) {
	const ttl = 64 * time.Second
	const grain = time.Second
	tab, clk := newTestTable(t, ttl, 64)
	rng := rand.New(rand.NewPCG(1, 2))
	next := 0
	evictions, pushedBack, protectedEvictions := 0, 0, 0
	for step := 0; step < 20000; step++ {
		clk.Advance(time.Duration(rng.IntN(400)) * time.Millisecond)
		if rng.IntN(3) > 0 {
			tab.Get(sid(uint64(rng.IntN(next + 1))))
			continue
		}
		before := snapshot(tab)
		evicted := tab.Stats().Evicted
		key := sid(uint64(next))
		next++
		tab.Put(key, "x")
		if tab.Stats().Evicted == evicted {
			continue
		}
		evictions++
		after := snapshot(tab)
		now := tab.clock()
		var gone []string
		oldest := [2]int64{math.MaxInt64, math.MaxInt64}
		for k, e := range before {
			if e.touched-e.linked < int64(grain) { // not pushed back
				oldest[e.seg] = min(oldest[e.seg], e.touched)
			}
			if _, ok := after[k]; !ok {
				gone = append(gone, k)
			}
			if now-e.touched >= int64(ttl+grain) {
				t.Fatalf("step %d: evicted although %q expired %v ago", step, k, time.Duration(now-e.touched)-ttl)
			}
		}
		if len(gone) != 1 {
			t.Fatalf("step %d: one eviction removed %d keys", step, len(gone))
		}
		e := before[gone[0]]
		switch {
		case e.seg == protected && oldest[probation] != math.MaxInt64:
			t.Fatalf("step %d: evicted a protected entry while probation held entries", step)
		case e.seg == protected:
			protectedEvictions++
		case e.touched-e.linked >= int64(grain):
			pushedBack++
			continue
		}
		if lag := e.touched - oldest[e.seg]; lag > int64(grain) {
			t.Fatalf("step %d: evicted an entry refreshed %v after its segment's stalest (grain %v)", step, time.Duration(lag), grain)
		}
	}
	if evictions < 1000 || pushedBack == 0 {
		t.Fatalf("%d evictions, %d of entries pushed back: the test did not exercise eviction", evictions, pushedBack)
	}
	t.Logf("%d evictions: %d of entries the protected segment pushed back, %d from the protected segment", evictions, pushedBack, protectedEvictions)
	checkInvariants(t, tab, true)
}

// held is what snapshot keeps of an entry.
type held struct {
	touched, linked int64
	seg             int
}

// snapshot maps each held key to its last refresh, link time and segment (white-box).
func snapshot(tab *Table) map[string]held {
	out := map[string]held{}
	set := tab.set.Load()
	for i := range set.shards {
		d := &set.shards[i].d
		for _, l := range d.lists {
			for j := l.head; j != noEntry; j = d.entries[j].older {
				e := &d.entries[j]
				out[string(d.keyBytes(j))] = held{e.touched.Load(), e.linked, e.seg()}
			}
		}
	}
	return out
}

// TestFloodNeverExceedsBound floods a table with distinct keys from parallel
// goroutines while a watcher checks the bound, table-wide and per shard.
func TestFloodNeverExceedsBound(t *testing.T) {
	const maxEntries = 5000
	const workers, perWorker = 8, 10000
	tab, _ := newTestTable(t, time.Hour, maxEntries) // frozen clock: nothing expires
	if n := len(tab.set.Load().shards); n < 2 {
		t.Fatalf("want several shards for this test, got %d", n)
	}
	done := make(chan struct{})
	watcherErr := make(chan error, 1)
	go func() {
		var err error
		checks := 0
		for {
			select {
			case <-done:
				if err == nil && checks == 0 {
					err = errors.New("watcher never ran")
				}
				watcherErr <- err
				return
			default:
			}
			if n := tab.Len(); n > maxEntries && err == nil {
				err = fmt.Errorf("Len() = %d > %d", n, maxEntries)
			}
			set := tab.set.Load()
			for i := range set.shards {
				sh := &set.shards[i]
				sh.mu.RLock()
				if sh.d.n > sh.d.cap && err == nil {
					err = fmt.Errorf("shard %d holds %d > its cap %d", i, sh.d.n, sh.d.cap)
				}
				sh.mu.RUnlock()
			}
			checks++
			runtime.Gosched()
		}
	}()
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for i := 0; i < perWorker; i++ {
				tab.Put(sid(uint64(w*perWorker+i)), fmt.Sprintf("b%d", i%4))
			}
		})
	}
	wg.Wait()
	close(done)
	if err := <-watcherErr; err != nil {
		t.Fatal(err)
	}
	s := tab.Stats()
	if s.Entries != maxEntries || s.Inserts != workers*perWorker || s.Evicted != workers*perWorker-maxEntries {
		t.Fatalf("stats %+v; want %d entries, %d inserts, %d evicted", s, maxEntries, workers*perWorker, workers*perWorker-maxEntries)
	}
	checkConservation(t, s)
	checkInvariants(t, tab, true)
}

// TestEvictionStartsNearCapacity measures the cost of the exact per-shard
// bound: how full the table is when the first shard fills. With 64 shards
// of 16384 and uniformly (seeded) hashed keys, a shard's count after T
// inserts is Binomial(T, 1/64); at T = 0.96 * 2^20 its mean is 15729 and sd
// 124.4, so reaching 16384 is 5.2 sd away: p < 64 * 1e-7 over all shards.
func TestEvictionStartsNearCapacity(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("1M inserts; skipped in -short and under -race")
	}
	const maxEntries = 1 << 20
	tab, _ := newTestTable(t, time.Hour, maxEntries)
	i := 0
	for ; ; i++ {
		tab.Put(sid(uint64(i)), "x")
		if i%256 == 0 && tab.Stats().Evicted > 0 {
			break
		}
		if i > 2*maxEntries {
			t.Fatal("no eviction after 2*MaxEntries inserts")
		}
	}
	s := tab.Stats()
	fill := float64(s.Entries) / maxEntries
	t.Logf("first eviction at %d of %d entries (%.2f%% full)", s.Entries, maxEntries, 100*fill)
	if fill < 0.96 {
		t.Fatalf("eviction started at %.2f%% full; want >= 96%%", 100*fill)
	}
	// Keep flooding: the table tops up towards the bound but never passes it.
	for j := 0; j < maxEntries/2; j++ {
		tab.Put(sid(uint64(i+1+j)), "x")
	}
	if n := tab.Len(); n > maxEntries || float64(n) < 0.98*maxEntries {
		t.Fatalf("after flood Len() = %d; want in [0.98, 1] * %d", n, maxEntries)
	}
}

func TestInvalidateBackend(t *testing.T) {
	tab, clk := newTestTable(t, time.Minute, 10000) // several shards
	for i := 0; i < 3000; i++ {
		tab.Put(sid(uint64(i)), fmt.Sprintf("b%d", i%3))
	}
	// 100 of b0's sessions expire first: they are counted as expired, not invalidated.
	clk.Advance(30 * time.Second)
	for i := 0; i < 3000; i++ {
		if i%3 == 0 && i >= 300 {
			tab.Get(sid(uint64(i)))
		} else if i%3 != 0 {
			tab.Get(sid(uint64(i)))
		}
	}
	clk.Advance(31 * time.Second)
	before := tab.Stats()
	if n := tab.InvalidateBackend("b0"); n != 900 {
		t.Fatalf("InvalidateBackend(b0) = %d, want 900", n)
	}
	if n := tab.InvalidateBackend("b0"); n != 0 {
		t.Fatalf("second InvalidateBackend(b0) = %d, want 0", n)
	}
	if n := tab.InvalidateBackend("nobody"); n != 0 {
		t.Fatalf("InvalidateBackend(unknown) = %d", n)
	}
	s := tab.Stats()
	if s.Invalidated-before.Invalidated != 900 || s.Expired-before.Expired != 100 || s.Entries != 2000 {
		t.Fatalf("stats %+v; want +900 invalidated, +100 expired, 2000 entries", s)
	}
	for i := 0; i < 30; i++ {
		if i%3 == 0 {
			mustMiss(t, tab, sid(uint64(i)))
		} else {
			mustGet(t, tab, sid(uint64(i)), fmt.Sprintf("b%d", i%3))
		}
	}
	checkConservation(t, tab.Stats())
	checkInvariants(t, tab, true)
	// The backend's interned id is gone from every shard.
	set := tab.set.Load()
	for i := range set.shards {
		if _, ok := set.shards[i].d.ids["b0"]; ok {
			t.Fatalf("shard %d still interns b0", i)
		}
	}
}

func TestFlush(t *testing.T) {
	tab, clk := newTestTable(t, time.Minute, 5000)
	for i := 0; i < 1000; i++ {
		tab.Put(sid(uint64(i)), "b")
	}
	clk.Advance(2 * time.Minute)
	for i := 1000; i < 1600; i++ {
		tab.Put(sid(uint64(i)), "b")
	}
	if n := tab.Flush(); n != 600 {
		t.Fatalf("Flush() = %d, want the 600 live entries", n)
	}
	s := tab.Stats()
	if s.Entries != 0 || tab.Len() != 0 {
		t.Fatalf("after Flush: %+v", s)
	}
	if s.Invalidated != 600 {
		t.Fatalf("Invalidated = %d, want the 600 live entries", s.Invalidated)
	}
	checkConservation(t, s)
	mustMiss(t, tab, sid(1500))
	tab.Put("again", "b")
	mustGet(t, tab, "again", "b")
	checkInvariants(t, tab, true)
	if n := tab.Flush(); n != 1 {
		t.Fatalf("Flush() = %d, want 1", n)
	}
}

func TestDelete(t *testing.T) {
	tab, clk := newTestTable(t, time.Minute, 10)
	tab.Put("a", "b")
	tab.Put("old", "b")
	clk.Advance(30 * time.Second)
	mustGet(t, tab, "a", "b")
	clk.Advance(31 * time.Second)
	if !tab.Delete("a") {
		t.Fatal("Delete(live) = false")
	}
	if tab.Delete("a") {
		t.Fatal("Delete(deleted) = true")
	}
	if tab.Delete("old") {
		t.Fatal("Delete(expired) = true")
	}
	tab.Put("c", "b")
	tab.Put("c", "") // empty backend: no mapping
	mustMiss(t, tab, "c")
	s := tab.Stats()
	if s.Deleted != 2 || s.Expired != 1 || s.Entries != 0 {
		t.Fatalf("stats %+v; want 2 deleted, 1 expired, 0 entries", s)
	}
	checkConservation(t, s)
}

func TestReconfigureShrinkKeepsNewest(t *testing.T) {
	for _, tc := range []struct {
		name          string
		from, to      int
		shardsChanged bool
	}{
		{"same shards", 1000, 600, false},
		{"fewer shards", 70000, 3000, true},
		{"to one entry", 5000, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const ttl = 10 * time.Hour
			tab, clk := newTestTable(t, ttl, tc.from)
			shardsBefore := len(tab.set.Load().shards)
			n := min(tc.from, 2*tc.to+500)
			for i := 0; i < n; i++ {
				tab.Put(sid(uint64(i)), "b")
				clk.Advance(2 * time.Second) // > grain: exact order
			}
			// 100 of the oldest expire; they must go first, as expired.
			// Key i was refreshed at 2i s; now is 2n s. Expire i < 100 exactly.
			clk.Advance(ttl - time.Duration(n-100)*2*time.Second - time.Second)
			before := tab.Stats()
			if err := tab.Reconfigure(Config{TTL: ttl, MaxEntries: tc.to}); err != nil {
				t.Fatal(err)
			}
			if got := len(tab.set.Load().shards) != shardsBefore; got != tc.shardsChanged {
				t.Fatalf("shard count changed = %v, want %v", got, tc.shardsChanged)
			}
			s := tab.Stats()
			if s.Entries > tc.to || s.Capacity != tc.to {
				t.Fatalf("after shrink: %+v", s)
			}
			if s.Expired-before.Expired != 100 {
				t.Fatalf("shrink expired %d, want 100", s.Expired-before.Expired)
			}
			if s.Hits != before.Hits || s.Inserts != before.Inserts {
				t.Fatalf("counters lost across the rebuild: before %+v after %+v", before, s)
			}
			checkConservation(t, s)
			checkInvariants(t, tab, true)
			// The survivors are the newest; allow per-shard slack at the margin.
			for i := n - 1; i >= n-max(1, s.Entries*9/10); i-- {
				mustGet(t, tab, sid(uint64(i)), "b")
			}
			for i := 0; i < 100; i++ {
				mustMiss(t, tab, sid(uint64(i)))
			}
		})
	}
}

func TestReconfigureGrow(t *testing.T) {
	for _, tc := range []struct {
		name        string
		from, to    int
		wantNoEvict bool // a single shard: no per-shard slack
	}{{"same shards", 1000, 2000 - 1, true}, {"more shards", 1000, 100000, false}} {
		t.Run(tc.name, func(t *testing.T) {
			tab, _ := newTestTable(t, time.Hour, tc.from)
			for i := 0; i < tc.from; i++ {
				tab.Put(sid(uint64(i)), "b")
			}
			if err := tab.Reconfigure(Config{TTL: time.Hour, MaxEntries: tc.to}); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < tc.from; i++ {
				mustGet(t, tab, sid(uint64(i)), "b")
			}
			for i := tc.from; i < tc.to; i++ {
				tab.Put(sid(uint64(i)), "b")
			}
			s := tab.Stats()
			if s.Evicted != 0 && tc.wantNoEvict {
				t.Fatalf("grown table evicted: %+v", s)
			}
			if s.Entries < tc.to*9/10 || s.Capacity != tc.to {
				t.Fatalf("grown table holds %+v", s)
			}
			checkInvariants(t, tab, true)
		})
	}
}

func TestReconfigureTTL(t *testing.T) {
	tab, clk := newTestTable(t, time.Hour, 100)
	tab.Put("a", "b")
	clk.Advance(10 * time.Minute)
	if err := tab.Reconfigure(Config{TTL: 5 * time.Minute, MaxEntries: 100}); err != nil {
		t.Fatal(err)
	}
	mustMiss(t, tab, "a") // idle 10m > the new TTL
	tab.Put("c", "b")
	clk.Advance(4 * time.Minute)
	mustGet(t, tab, "c", "b")
	if err := tab.Reconfigure(Config{TTL: time.Hour, MaxEntries: 100}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(30 * time.Minute)
	mustGet(t, tab, "c", "b")
	if got := tab.Config(); got.TTL != time.Hour || got.MaxEntries != 100 {
		t.Fatalf("Config() = %+v", got)
	}
}

func TestReconfigureInvalidChangesNothing(t *testing.T) {
	tab, _ := newTestTable(t, time.Hour, 100)
	tab.Put("a", "b")
	for _, cfg := range []Config{{TTL: 0, MaxEntries: 10}, {TTL: time.Second, MaxEntries: 0}} {
		err := tab.Reconfigure(cfg)
		if !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("Reconfigure(%+v) = %v", cfg, err)
		}
	}
	if got := tab.Config(); got.TTL != time.Hour || got.MaxEntries != 100 {
		t.Fatalf("config changed to %+v", got)
	}
	mustGet(t, tab, "a", "b")
}

func TestStatsExact(t *testing.T) {
	tab, clk := newTestTable(t, time.Minute, 3)
	tab.Put("a", "b1") // insert
	tab.Put("b", "b1") // insert
	tab.Put("a", "b2") // update (re-pin)
	tab.Get("a")       // hit
	tab.Get("zz")      // miss
	clk.Advance(2 * time.Second)
	tab.Put("c", "b1") // insert
	tab.Put("d", "b1") // insert, evicts b (stalest)
	tab.Get("b")       // miss
	tab.Delete("c")    // deleted
	clk.Advance(time.Hour)
	tab.Put("a", "b1")          // a expired: expired + insert
	tab.Get("d")                // expired + miss
	tab.Put("e", "b2")          // insert
	tab.InvalidateBackend("b2") // e: invalidated
	want := Stats{Entries: 1, Hits: 1, Misses: 3, Inserts: 6, Updates: 1, Expired: 2,
		Evicted: 1, Invalidated: 1, Deleted: 1, Capacity: 3}
	if got := tab.Stats(); got != want {
		t.Fatalf("Stats() =\n %+v\nwant\n %+v", got, want)
	}
	checkConservation(t, want)
}

func TestLongKeysDigested(t *testing.T) {
	tab, _ := newTestTable(t, time.Hour, 100)
	long := strings.Repeat("k", 10000)
	tab.Put(long+"1", "b1")
	tab.Put(long+"2", "b2")
	tab.Put(long[:MaxKeyLen], "b3") // exactly the limit: stored as is
	mustGet(t, tab, long+"1", "b1")
	mustGet(t, tab, long+"2", "b2")
	mustGet(t, tab, long[:MaxKeyLen], "b3")
	mustMiss(t, tab, long)
	if !tab.Delete(long + "1") {
		t.Fatal("Delete(long key) = false")
	}
	d := &tab.set.Load().shards[0].d
	if len(d.arena) > 2*(2+MaxKeyLen)+64 {
		t.Fatalf("arena holds %d bytes for 2 entries: long keys stored in full", len(d.arena))
	}
	checkInvariants(t, tab, true)
}

func TestKeysAndBackendsCopied(t *testing.T) {
	tab, _ := newTestTable(t, time.Hour, 100)
	kb := []byte("session-0001")
	bb := []byte("10.0.0.1:80")
	tab.Put(unsafe.String(&kb[0], len(kb)), unsafe.String(&bb[0], len(bb)))
	copy(kb, "XXXXXXXXXXXX") // the caller reuses its buffers
	copy(bb, "YYYYYYYYYYY")
	mustGet(t, tab, "session-0001", "10.0.0.1:80")
}

func TestBackendIDsReused(t *testing.T) {
	tab, _ := newTestTable(t, time.Hour, 100)
	// Many reloads, each with new backends: ids must not accumulate.
	for gen := 0; gen < 50; gen++ {
		for i := 0; i < 10; i++ {
			tab.Put(fmt.Sprint(i), fmt.Sprintf("gen%d-b%d", gen, i%3))
		}
	}
	d := &tab.set.Load().shards[0].d
	if len(d.ids) != 3 || len(d.names) > 1+3+3 {
		t.Fatalf("%d interned backends, %d ids allocated; want 3 and a few", len(d.ids), len(d.names))
	}
	checkInvariants(t, tab, true)
}

func TestArenaBoundedUnderChurn(t *testing.T) {
	tab, _ := newTestTable(t, time.Hour, 1000)
	for i := 0; i < 200000; i++ { // 200 turnovers of the whole table
		tab.Put(sid(uint64(i)), "b")
	}
	d := &tab.set.Load().shards[0].d
	live := d.n * (2 + 32)
	if cap(d.arena) > live*16/10 || len(d.slots) > d.cap*4/3+1 || cap(d.entries) > d.cap {
		t.Fatalf("after churn: arena cap %d for %d live bytes, %d slots, %d entries (cap %d)",
			cap(d.arena), live, len(d.slots), cap(d.entries), d.cap)
	}
	checkInvariants(t, tab, true)
}

// TestConcurrentRace runs every operation from parallel goroutines,
// including reconfigurations that rebuild the shards, under a moving clock.
// Run with -race. Afterwards the table must be consistent and the counters
// must balance.
func TestConcurrentRace(t *testing.T) {
	tab, clk := newTestTable(t, 2*time.Second, 3000)
	backends := []string{"b0", "b1", "b2", "b3"}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	const iters = 20000
	for w := 0; w < 6; w++ {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; i < iters; i++ {
				k := sid(uint64(rng.IntN(4000)))
				switch r := rng.IntN(100); {
				case r < 60:
					if b, ok := tab.Get(k); ok && !slices.Contains(backends, b) {
						errs <- fmt.Errorf("Get returned unknown backend %q", b)
						return
					}
				case r < 90:
					tab.Put(k, backends[rng.IntN(len(backends))])
				case r < 98:
					tab.Delete(k)
				case r < 99 && i%50 == 0:
					tab.InvalidateBackend(backends[rng.IntN(len(backends))])
				default:
					_ = tab.Stats()
					_ = tab.Len()
				}
				if i%64 == 0 {
					clk.Advance(time.Duration(rng.IntN(50)) * time.Millisecond)
				}
			}
		})
	}
	workersDone := make(chan struct{})
	var rwg sync.WaitGroup
	rwg.Go(func() {
		rng := rand.New(rand.NewPCG(99, 7))
		sizes := []int{100, 1500, 3000, 5000, 70000, 2500}
		for i := 0; ; i++ { // until the (bounded) workers finish
			select {
			case <-workersDone:
				return
			default:
			}
			cfg := Config{TTL: time.Duration(1+rng.IntN(3)) * time.Second, MaxEntries: sizes[rng.IntN(len(sizes))]}
			if err := tab.Reconfigure(cfg); err != nil {
				errs <- err
				return
			}
			if i%100 == 99 {
				tab.Flush()
				tab.Sweep()
			}
			for j := 0; j < 50; j++ { // let traffic run between reloads
				runtime.Gosched()
			}
		}
	})
	wg.Wait()
	close(workersDone)
	rwg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s := tab.Stats()
	if s.Entries > s.Capacity {
		t.Fatalf("Entries %d > Capacity %d", s.Entries, s.Capacity)
	}
	checkConservation(t, s)
	checkInvariants(t, tab, false)
	t.Logf("stats after the storm: %+v", s)
	// Expiry and eviction depend on how the reloads interleave with the clock and the
	// workers (a CI run once ended the storm with Evicted 0: the table was never full at an
	// insert), so they are not required of the storm; the paths that the mix makes certain
	// are, and eviction is driven below.
	if s.Hits == 0 || s.Misses == 0 || s.Updates == 0 || s.Invalidated == 0 || s.Deleted == 0 {
		t.Fatalf("some path was not exercised: %+v", s)
	}
	// A full table still evicts after the storm.
	if err := tab.Reconfigure(Config{TTL: time.Minute, MaxEntries: 100}); err != nil {
		t.Fatal(err)
	}
	before := tab.Stats().Evicted
	for i := 0; i < 300; i++ {
		tab.Put(sid(uint64(100000+i)), "b0")
	}
	if st := tab.Stats(); st.Evicted == before || st.Entries > st.Capacity {
		t.Fatalf("300 inserts into a 100-entry table: evicted %d -> %d, entries %d of %d", before, st.Evicted, st.Entries, st.Capacity)
	}
	checkConservation(t, tab.Stats())
	// The table still expires after the storm.
	if err := tab.Reconfigure(Config{TTL: time.Second, MaxEntries: 100}); err != nil {
		t.Fatal(err)
	}
	tab.Put("after-storm", "b0")
	clk.Advance(2 * time.Second)
	if b, ok := tab.Get("after-storm"); ok {
		t.Fatalf("entry past its TTL still served: %q", b)
	}
	if got := tab.Stats().Expired; got <= s.Expired {
		t.Fatalf("Expired did not count the lapsed entry: %d -> %d", s.Expired, got)
	}
}

// Keys seen twice (a Get hit after their Put) survive a flood of ten times the table's size
// of keys seen once, which evict only one another.
func TestSeenTwiceSurvivesFloodOfSeenOnce(t *testing.T) {
	const maxEntries, kept, flood = 5000, 1000, 50_000
	tab, clk := newTestTable(t, time.Hour, maxEntries)
	for i := range kept {
		tab.Put(sid(uint64(i)), "owner")
	}
	clk.Advance(2 * time.Second)
	for i := range kept {
		mustGet(t, tab, sid(uint64(i)), "owner")
	}
	for i := range flood {
		clk.Advance(time.Millisecond)
		tab.Put(sid(uint64(kept+i)), "flood")
	}
	lost := 0
	for i := range kept {
		if _, ok := tab.Get(sid(uint64(i))); !ok {
			lost++
		}
	}
	s := tab.Stats()
	t.Logf("after %d keys seen once: %d of %d keys seen twice lost; %d evictions, %d protected", flood, lost, kept, s.Evicted, s.Protected)
	if lost != 0 {
		t.Fatalf("%d of %d keys seen twice evicted by keys seen once", lost, kept)
	}
	checkInvariants(t, tab, true)
	checkConservation(t, s)
}

// The protected segment holds four fifths of a shard: a promotion past that pushes its
// least recently refreshed entry back to probation, which the next insert evicts first.
func TestProtectedSegmentPushesBackOldest(t *testing.T) {
	tab, clk := newTestTable(t, time.Hour, 10) // one shard: 8 protected
	for i := range 10 {
		tab.Put(fmt.Sprint(i), "x")
		clk.Advance(2 * time.Second)
	}
	for i := range 9 { // 0..8 seen again; 0, the oldest, pushed back
		mustGet(t, tab, fmt.Sprint(i), "x")
		clk.Advance(2 * time.Second)
	}
	if s := tab.Stats(); s.Protected != 8 {
		t.Fatalf("%d protected, want 8", s.Protected)
	}
	tab.Put("new", "x") // full: evicts the entry pushed back, not 9 (seen once, newer)
	mustMiss(t, tab, "0")
	mustGet(t, tab, "9", "x")
	checkInvariants(t, tab, true)
}
