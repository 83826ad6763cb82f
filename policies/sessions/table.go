package sessions

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of a session table, for every tier that keeps one (Caddy's keyed policies, and
// the pools file's affinity.ttl and affinity.max_sessions).
const (
	// DefaultTTL is the session lifetime when none is configured.
	DefaultTTL = 30 * time.Minute
	// DefaultMaxEntries is max_sessions when none is configured: at about 80 bytes an entry
	// (more for long keys) a table stays near 10 MB.
	DefaultMaxEntries = 100_000
)

const (
	// MaxKeyLen is the longest key stored as given; longer keys are stored as
	// their SHA-256 digest (transparently: Get, Put and Delete digest the same
	// way), so a client cannot make one entry cost more than this.
	// It matches keys.DefaultMaxLen, whose extractors already digest longer
	// values, so keys from them are never digested twice.
	MaxKeyLen = 256

	// MaxEntriesLimit is the largest MaxEntries accepted. It keeps each
	// shard's indexes within 32 bits; at ~80 bytes an entry it is ~21 GB.
	MaxEntriesLimit = maxShards * maxShardCap

	maxShards   = 64
	maxShardCap = 1 << 22
	// minShardShare keeps shards large enough that seeded hashing spreads
	// keys evenly: with 1024+ entries a shard, the first shard fills when the
	// table is within a few percent of MaxEntries.
	minShardShare = 1024
	// sweepBatch bounds how many entries an insert inspects for expiry, so an
	// insert's latency stays O(1) however many entries expired at once.
	sweepBatch = 8
)

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("invalid session table config")

// Config configures a Table.
type Config struct {
	// TTL is how long a mapping lives after its last use (Get hit or Put).
	TTL time.Duration
	// MaxEntries bounds the number of mappings held (max_sessions).
	MaxEntries int
	// Now is the clock; nil means time.Now (monotonic, so wall-clock steps
	// neither expire nor extend sessions). Tests pass a fake clock. Read at
	// New only: Reconfigure keeps the table's clock.
	Now func() time.Time
}

func (c Config) validate() error {
	if c.TTL <= 0 {
		return fmt.Errorf("%w: ttl must be positive, got %v", ErrInvalidConfig, c.TTL)
	}
	if c.MaxEntries < 1 || c.MaxEntries > MaxEntriesLimit {
		return fmt.Errorf("%w: max_sessions must be in [1, %d], got %d", ErrInvalidConfig, MaxEntriesLimit, c.MaxEntries)
	}
	return nil
}

// grainFor is the position precision of a TTL: hits relink an entry (write
// lock) at most once per grain, and the eviction order is exact to within it.
func grainFor(ttl time.Duration) int64 {
	return max(1, int64(min(ttl/64, time.Second)))
}

// shardCount is the number of shards for a bound: a power of two, at most
// maxShards, with at least minShardShare entries per shard.
func shardCount(maxEntries int) int {
	n := 1
	for n*2 <= maxShards && maxEntries/(n*2) >= minShardShare {
		n *= 2
	}
	return n
}

// shardCap is shard i's share; the shares of n shards sum to maxEntries.
func shardCap(i, n, maxEntries int) int {
	c := maxEntries / n
	if i < maxEntries%n {
		c++
	}
	return c
}

type shardSet struct {
	shards []shard
	shift  uint // 64 - log2(len(shards)); the shard is the hash's top bits
}

func newShardSet(seed maphash.Seed, n, maxEntries int) *shardSet {
	s := &shardSet{shards: make([]shard, n), shift: 64}
	for 1<<(64-s.shift) < n {
		s.shift--
	}
	for i := range s.shards {
		s.shards[i].d = newShardData(seed, shardCap(i, n, maxEntries))
	}
	return s
}

// pick uses the hash's top bits (the slot index uses the low 32) so shard
// and slot are independent. A shift of 64 yields 0: one shard.
func (s *shardSet) pick(h uint64) *shard { return &s.shards[h>>s.shift] }

// Table is a bounded key -> backend map with a sliding TTL. It is safe for
// concurrent use. See the package documentation for its guarantees.
type Table struct {
	name  string
	now   func() time.Time // nil: time.Now, via time.Since(epoch)
	epoch time.Time
	seed  maphash.Seed

	ttl   atomic.Int64 // nanoseconds
	grain atomic.Int64 // nanoseconds
	max   atomic.Int64

	set    atomic.Pointer[shardSet]
	reconf sync.Mutex // serializes Reconfigure
}

// New creates a table. name identifies it in stats.
func New(name string, cfg Config) (*Table, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("creating session table %q: %w", name, err)
	}
	t := &Table{name: name, now: cfg.Now, seed: maphash.MakeSeed()}
	if t.now != nil {
		t.epoch = t.now()
	} else {
		t.epoch = time.Now()
	}
	t.ttl.Store(int64(cfg.TTL))
	t.grain.Store(grainFor(cfg.TTL))
	t.max.Store(int64(cfg.MaxEntries))
	t.set.Store(newShardSet(t.seed, shardCount(cfg.MaxEntries), cfg.MaxEntries))
	return t, nil
}

// Name returns the table's name.
func (t *Table) Name() string { return t.name }

// Config returns the table's current TTL and MaxEntries (Now is not
// returned: it is fixed at New).
func (t *Table) Config() Config {
	return Config{TTL: time.Duration(t.ttl.Load()), MaxEntries: int(t.max.Load())}
}

// clock is nanoseconds since the table's epoch.
func (t *Table) clock() int64 {
	if t.now == nil {
		return int64(time.Since(t.epoch))
	}
	return int64(t.now().Sub(t.epoch))
}

func tableKey(key string) string {
	if len(key) <= MaxKeyLen {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return string(sum[:])
}

// rlock read-locks key's shard, retrying past shards retired by a rebuild.
func (t *Table) rlock(h uint64) *shard {
	for {
		sh := t.set.Load().pick(h)
		sh.mu.RLock()
		if !sh.retired {
			return sh
		}
		sh.mu.RUnlock()
	}
}

func (t *Table) lock(h uint64) *shard {
	for {
		sh := t.set.Load().pick(h)
		sh.mu.Lock()
		if !sh.retired {
			return sh
		}
		sh.mu.Unlock()
	}
}

// Get returns key's backend and refreshes the mapping's expiry. An expired
// mapping is removed and reported as a miss.
func (t *Table) Get(key string) (backend string, ok bool) {
	key = tableKey(key)
	h := maphash.String(t.seed, key)
	sh := t.rlock(h)
	d := &sh.d
	i := d.find(key, h)
	if i == noEntry {
		sh.misses.Add(1)
		sh.mu.RUnlock()
		return "", false
	}
	e := &d.entries[i]
	now := t.clock()
	old := e.touched.Load()
	if now-old < t.ttl.Load() && now-e.linked < t.grain.Load() && e.seg() == protected {
		// Fast path: the list position is fresh enough; only the time moves. (An entry
		// in probation is promoted, under the write lock.)
		for old < now && !e.touched.CompareAndSwap(old, now) {
			old = e.touched.Load()
		}
		backend = d.names[e.backend]
		sh.hits.Add(1)
		sh.mu.RUnlock()
		return backend, true
	}
	sh.mu.RUnlock()
	return t.getLocked(key, h)
}

// getLocked is Get's slow path: expire, or refresh and relink (an entry in probation is
// seen a second time: promoted to the protected segment).
func (t *Table) getLocked(key string, h uint64) (string, bool) {
	sh := t.lock(h)
	defer sh.mu.Unlock()
	d := &sh.d
	i := d.find(key, h)
	if i == noEntry {
		sh.misses.Add(1)
		return "", false
	}
	now := t.clock()
	e := &d.entries[i]
	if now-e.touched.Load() >= t.ttl.Load() {
		d.removeHashed(i, uint32(h))
		sh.expired++
		sh.misses.Add(1)
		return "", false
	}
	if now > e.touched.Load() {
		e.touched.Store(now)
	}
	if e.seg() == probation {
		d.moveTo(i, protected, now)
	} else {
		d.relink(i, now)
	}
	sh.hits.Add(1)
	return d.names[e.backend], true
}

// Put maps key to backend, inserting or overwriting (re-pinning) and
// refreshing its expiry; a new mapping (also one over an expired mapping) is in
// probation until a Get finds it. An insert first sweeps up to a few expired
// entries off its shard's old ends; if the shard is still full it evicts an
// expired entry left at an old end, else probation's least recently refreshed
// entry, else the protected segment's. An empty backend deletes the mapping.
func (t *Table) Put(key, backend string) {
	if backend == "" {
		t.Delete(key)
		return
	}
	key = tableKey(key)
	h := maphash.String(t.seed, key)
	sh := t.lock(h)
	defer sh.mu.Unlock()
	d := &sh.d
	now := t.clock()
	ttl := t.ttl.Load()
	if i := d.find(key, h); i != noEntry {
		e := &d.entries[i]
		ended := now-e.touched.Load() >= ttl
		if ended {
			sh.expired++ // the old session ended; this is a new one
			sh.inserts++
		} else {
			sh.updates++
		}
		if d.names[e.backend] != backend {
			id := d.intern(backend)
			d.unref(e.backend)
			e.backend = id
		}
		e.touched.Store(now)
		if ended {
			d.moveTo(i, probation, now)
		} else {
			d.relink(i, now)
		}
		return
	}
	sh.expired += uint64(d.sweep(now, ttl, sweepBatch))
	if d.n >= d.cap {
		d.remove(d.victim(now, ttl))
		sh.evicted++
	}
	insert(d, key, uint32(h), backend, now, d.headTime(probation, now), probation)
	sh.inserts++
}

// Delete removes key's mapping and reports whether a live one existed.
func (t *Table) Delete(key string) bool {
	key = tableKey(key)
	h := maphash.String(t.seed, key)
	sh := t.lock(h)
	defer sh.mu.Unlock()
	d := &sh.d
	i := d.find(key, h)
	if i == noEntry {
		return false
	}
	live := t.clock()-d.entries[i].touched.Load() < t.ttl.Load()
	d.removeHashed(i, uint32(h))
	if live {
		sh.deleted++
	} else {
		sh.expired++
	}
	return live
}

// eachShard runs fn on every shard under its write lock. If a rebuild
// retires the shard set midway it continues on the new set from the start:
// entries already handled were moved, not copied, so nothing is seen twice
// unless it was re-added concurrently.
func (t *Table) eachShard(fn func(sh *shard)) {
	set := t.set.Load()
	for i := 0; i < len(set.shards); i++ {
		sh := &set.shards[i]
		sh.mu.Lock()
		if sh.retired {
			sh.mu.Unlock()
			set = t.set.Load()
			i = -1
			continue
		}
		fn(sh)
		sh.mu.Unlock()
	}
}

// InvalidateBackend removes every mapping to backend (a backend that went
// down or was removed) and returns how many live mappings it removed.
// Mappings Put concurrently may survive; it is not a snapshot of the table.
func (t *Table) InvalidateBackend(backend string) int {
	total := 0
	t.eachShard(func(sh *shard) {
		live, expired := sh.d.invalidate(backend, t.clock(), t.ttl.Load())
		sh.invalidated += uint64(live)
		sh.expired += uint64(expired)
		total += live
	})
	return total
}

// Flush removes every mapping and returns how many live ones it removed.
// It also releases the table's memory.
func (t *Table) Flush() int {
	total := 0
	t.eachShard(func(sh *shard) {
		live := sh.d.countLive(t.clock(), t.ttl.Load())
		sh.invalidated += uint64(live)
		sh.expired += uint64(sh.d.n - live)
		total += live
		sh.d = newShardData(sh.d.seed, sh.d.cap)
	})
	return total
}

// Sweep removes every expired mapping now and returns how many. Tables need
// no sweeping (expired entries are removed on Get and on insert); an owner
// may call it on a timer so that Len and Stats.Entries count live sessions.
func (t *Table) Sweep() int {
	total := 0
	t.eachShard(func(sh *shard) {
		n := sh.d.sweep(t.clock(), t.ttl.Load(), -1)
		sh.expired += uint64(n)
		total += n
	})
	return total
}

// Len returns the number of mappings held, including expired ones not yet
// removed. It never exceeds MaxEntries.
func (t *Table) Len() int {
	for {
		set, n, ok := t.set.Load(), 0, true
		for i := range set.shards {
			sh := &set.shards[i]
			sh.mu.RLock()
			ok = !sh.retired
			n += sh.d.n
			sh.mu.RUnlock()
			if !ok {
				break
			}
		}
		if ok {
			return n
		}
	}
}

// Stats counts a table's traffic since New. Every mapping an insert created
// is, at any time, either held or was removed by exactly one cause, so
// Inserts == Entries + Expired + Evicted + Invalidated + Deleted
// whenever the table is quiescent.
type Stats struct {
	Entries     int    // mappings held, including expired ones not yet removed
	Hits        uint64 // Gets that found a live mapping
	Misses      uint64 // Gets that found none (or an expired one)
	Inserts     uint64 // Puts that created a mapping (also over an expired one)
	Updates     uint64 // Puts that overwrote a live mapping (re-pin or refresh)
	Expired     uint64 // mappings removed after idling TTL or longer
	Evicted     uint64 // live mappings removed to make room
	Invalidated uint64 // live mappings removed by InvalidateBackend or Flush
	Deleted     uint64 // live mappings removed by Delete (or Put with no backend)
	Capacity    int    // MaxEntries
	Protected   int    // mappings in the protected segment (seen again since their insert)
}

// Stats returns the table's counters. Each shard is read consistently; the
// shards are not read at one instant.
func (t *Table) Stats() Stats {
	for {
		set, ok := t.set.Load(), true
		s := Stats{Capacity: int(t.max.Load())}
		for i := range set.shards {
			sh := &set.shards[i]
			sh.mu.RLock()
			if ok = !sh.retired; ok {
				s.Entries += sh.d.n
				s.Protected += sh.d.nprot
				s.Hits += sh.hits.Load()
				s.Misses += sh.misses.Load()
				s.Inserts += sh.inserts
				s.Updates += sh.updates
				s.Expired += sh.expired
				s.Evicted += sh.evicted
				s.Invalidated += sh.invalidated
				s.Deleted += sh.deleted
			}
			sh.mu.RUnlock()
			if !ok {
				break
			}
		}
		if ok {
			return s
		}
	}
}

// Reconfigure applies a new TTL and MaxEntries (a reload) and keeps the
// sessions. A TTL change applies at once to every mapping (expiry is
// computed from the last refresh). Shrinking MaxEntries drops expired
// mappings and evicts the least recently refreshed down to the new bound.
// An invalid config is an error and changes nothing. Config.Now is ignored.
//
// Growing within the same shard count is O(shards). Shrinking, or a bound
// that changes the shard count, rebuilds the shards: O(entries), holding
// each shard's lock (all of them when the shard count changes) meanwhile.
func (t *Table) Reconfigure(cfg Config) error {
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("reconfiguring session table %q: %w", t.name, err)
	}
	t.reconf.Lock()
	defer t.reconf.Unlock()
	t.ttl.Store(int64(cfg.TTL))
	t.grain.Store(grainFor(cfg.TTL))
	oldMax := int(t.max.Load())
	if cfg.MaxEntries == oldMax {
		return nil
	}
	set := t.set.Load()
	n := shardCount(cfg.MaxEntries)
	if n != len(set.shards) {
		t.rebuild(set, n, cfg.MaxEntries)
	} else {
		for i := range set.shards {
			sh := &set.shards[i]
			sh.mu.Lock()
			if c := shardCap(i, n, cfg.MaxEntries); c >= sh.d.cap {
				sh.d.setCap(c)
			} else {
				old := sh.d
				sh.d = newShardData(t.seed, c)
				sh.expired += migrate([]*shardData{&old}, func(uint64) *shard { return sh }, t.clock(), t.ttl.Load())
			}
			sh.mu.Unlock()
		}
	}
	t.max.Store(int64(cfg.MaxEntries))
	return nil
}

// rebuild moves every live entry of set into a new set of n shards and
// publishes it. Called with t.reconf held.
func (t *Table) rebuild(set *shardSet, n, maxEntries int) {
	for i := range set.shards {
		set.shards[i].mu.Lock()
	}
	next := newShardSet(t.seed, n, maxEntries)
	carry := &next.shards[0]
	srcs := make([]*shardData, len(set.shards))
	for i := range set.shards {
		old := &set.shards[i]
		carry.hits.Add(old.hits.Load())
		carry.misses.Add(old.misses.Load())
		carry.inserts += old.inserts
		carry.updates += old.updates
		carry.expired += old.expired
		carry.evicted += old.evicted
		carry.invalidated += old.invalidated
		carry.deleted += old.deleted
		srcs[i] = &old.d
	}
	carry.expired += migrate(srcs, next.pick, t.clock(), t.ttl.Load())
	for i := range set.shards {
		old := &set.shards[i]
		old.retired = true
		old.d = shardData{} // let the old memory go even while stale pointers to set remain
	}
	t.set.Store(next)
	for i := range set.shards {
		set.shards[i].mu.Unlock()
	}
}

// migrate re-inserts the entries of srcs into the shards dst picks, which must be locked or
// unpublished: each segment's entries oldest first (a merge of the sources' lists by link
// time), probation's before the protected segment's, each into its own segment. Expired
// entries are dropped and counted (the returned count); a full destination evicts as an
// insert does, counted on it, so a shrink keeps the protected entries first, then the
// newest in probation.
func migrate(srcs []*shardData, dst func(h uint64) *shard, now, ttl int64) (expired uint64) {
	for seg := range 2 {
		cur := make(mergeHeap, 0, len(srcs))
		for _, s := range srcs {
			if t := s.lists[seg].tail; t != noEntry {
				cur = append(cur, cursor{src: s, i: t})
			}
		}
		cur.init()
		for len(cur) > 0 {
			c := &cur[0]
			s, i := c.src, c.i
			if c.i = s.entries[i].newer; c.i == noEntry {
				cur.pop()
			} else {
				cur.fix0()
			}
			e := &s.entries[i]
			touched := e.touched.Load()
			if now-touched >= ttl {
				expired++
				continue
			}
			key := s.keyBytes(i)
			h := maphash.Bytes(s.seed, key)
			sh := dst(h)
			d := &sh.d
			if d.n >= d.cap {
				d.remove(d.victim(now, ttl))
				sh.evicted++
			}
			insert(d, key, uint32(h), s.names[e.backend], touched, d.headTime(seg, e.linked), seg)
		}
	}
	return expired
}

// cursor walks one source list from tail to head.
type cursor struct {
	src *shardData
	i   int32
}

func (c *cursor) linked() int64 { return c.src.entries[c.i].linked }

// mergeHeap is a min-heap of cursors by the link time of their entry.
type mergeHeap []cursor

func (h mergeHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h mergeHeap) fix0() { h.down(0) }

func (h *mergeHeap) pop() {
	old := *h
	n := len(old) - 1
	old[0] = old[n]
	*h = old[:n]
	h.down(0)
}

func (h mergeHeap) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h[r].linked() < h[l].linked() {
			m = r
		}
		if h[i].linked() <= h[m].linked() {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}
