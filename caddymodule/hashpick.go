package caddymodule

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/stickylb/stickylb/policies/chash"
)

// Hash algorithms a keyed policy can use; the names are the pools file's ("ring" is
// accepted too: chash.ParseAlgorithm).
const (
	hashMaglev = chash.AlgorithmMaglev
	hashRing   = chash.AlgorithmRingHash
)

// revalidateEvery bounds how long a cached hash table may lag behind a change in the set of
// eligible upstreams that no pick has run into (an upstream recovering, say). A pick that
// lands on an ineligible upstream rebuilds at once; this covers the rest, amortized O(1).
const revalidateEvery = time.Second

// hashPicker maps a key hash to an upstream with Maglev or the ring, built over the
// upstreams eligible for new sessions — the set Envoy builds its tables over (healthy,
// not draining) — so a Caddy node and an Envoy node with the same upstreams agree.
type hashPicker struct {
	algo             string
	tableSize        uint64
	minRing, maxRing uint64
	vnodes           uint64     // ring points per upstream; 0: minRing/maxRing size the ring
	mu               sync.Mutex // serializes rebuilds
	cur              atomic.Pointer[hashSnap]
	rebuilds         atomic.Uint64
	now              func() time.Time
}

type hashSnap struct {
	base     *(*reverseproxy.Upstream)
	n        int
	drainGen uint64
	checked  atomic.Int64 // UnixNano of the last full eligibility check
	ups      []*reverseproxy.Upstream
	picker   chash.Picker
}

func newHashPicker(algo string, tableSize, minRing, maxRing, vnodes uint64) (*hashPicker, error) {
	if c, ok := chash.ParseAlgorithm(algo); ok {
		algo = c
	}
	if vnodes != 0 {
		switch {
		case algo != hashRing:
			return nil, fmt.Errorf("virtual_nodes applies to hash %s (Maglev has no virtual nodes)", hashRing)
		case minRing != 0 || maxRing != 0:
			return nil, fmt.Errorf("virtual_nodes and min_ring_size/max_ring_size are exclusive: virtual_nodes sizes the ring from the upstreams")
		case vnodes > chash.MaxRingSize:
			return nil, fmt.Errorf("virtual_nodes %d is above %d", vnodes, chash.MaxRingSize)
		}
		return &hashPicker{algo: hashRing, vnodes: vnodes, now: time.Now}, nil
	}
	switch algo {
	case "", hashMaglev:
		algo = hashMaglev
		if tableSize == 0 {
			tableSize = chash.DefaultMaglevTableSize
		}
		if !chash.IsPrime(tableSize) {
			return nil, fmt.Errorf("table_size %d is not prime (Maglev needs a prime; the default is %d)", tableSize, chash.DefaultMaglevTableSize)
		}
	case hashRing:
		if minRing == 0 {
			minRing = chash.DefaultMinRingSize
		}
		if maxRing == 0 {
			maxRing = chash.DefaultMaxRingSize
		}
		if minRing > maxRing {
			return nil, fmt.Errorf("min ring size %d is above max ring size %d", minRing, maxRing)
		}
	default:
		return nil, fmt.Errorf("unknown hash %q (want %s or %s)", algo, hashMaglev, hashRing)
	}
	return &hashPicker{algo: algo, tableSize: tableSize, minRing: minRing, maxRing: maxRing, now: time.Now}, nil
}

// probeStep spreads the probes of a key whose hashed upstream is unusable for this request
// over the table (a fixed odd constant, so the walk is deterministic per key).
const probeStep = 0x9E3779B97F4A7C15

// pick returns the upstream for key hash h that may take a new session and that this
// request has not tried, or nil when none can.
func (p *hashPicker) pick(pool reverseproxy.UpstreamPool, h uint64, t *tried) *reverseproxy.Upstream {
	s := p.snapshot(pool)
	if s == nil || s.picker == nil {
		return nil
	}
	u := s.ups[s.picker.Pick(h)]
	if usableForNew(u) && !t.has(u) {
		return u
	}
	if !usableForNew(u) {
		// The table is out of date: rebuild over what is eligible now, as Envoy would.
		if s = p.rebuild(pool, s); s == nil || s.picker == nil {
			return nil
		}
		u = s.ups[s.picker.Pick(h)]
		if usableForNew(u) && !t.has(u) {
			return u
		}
	}
	// The hashed upstream is eligible but failed this request (a retry): probe onwards,
	// deterministically per key, among the other eligible upstreams.
	for k := uint64(1); k <= uint64(2*len(s.ups)+8); k++ {
		u = s.ups[s.picker.Pick(h+k*probeStep)]
		if usableForNew(u) && !t.has(u) {
			return u
		}
	}
	for _, u := range s.ups {
		if usableForNew(u) && !t.has(u) {
			return u
		}
	}
	return nil
}

// snapshot returns the current table, rebuilding it when the pool or the drain set changed
// or when the periodic eligibility check finds a difference.
func (p *hashPicker) snapshot(pool reverseproxy.UpstreamPool) *hashSnap {
	if len(pool) == 0 {
		return nil
	}
	s := p.cur.Load()
	if s == nil || s.n != len(pool) || s.base != &pool[0] || s.drainGen != drains.generation() {
		return p.rebuild(pool, s)
	}
	now := p.now().UnixNano()
	last := s.checked.Load()
	if now-last >= int64(revalidateEvery) && s.checked.CompareAndSwap(last, now) {
		if !sameEligible(pool, s.ups) {
			return p.rebuild(pool, s)
		}
	}
	return s
}

// sameEligible reports whether the upstreams of pool eligible for new sessions are exactly
// ups (in pool order).
func sameEligible(pool reverseproxy.UpstreamPool, ups []*reverseproxy.Upstream) bool {
	i := 0
	for _, u := range pool {
		if u == nil || !usableForNew(u) {
			continue
		}
		if i >= len(ups) || ups[i] != u {
			return false
		}
		i++
	}
	return i == len(ups)
}

// rebuild builds a table over the eligible upstreams of pool, unless another goroutine
// already replaced old. With no eligible upstream the snapshot has no picker (and is kept
// until one turns eligible, so an outage does not rebuild on every request).
func (p *hashPicker) rebuild(pool reverseproxy.UpstreamPool, old *hashSnap) *hashSnap {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur := p.cur.Load(); cur != old && cur != nil && cur.n == len(pool) && cur.base == &pool[0] &&
		cur.drainGen == drains.generation() && sameEligible(pool, cur.ups) {
		return cur
	}
	gen := drains.generation()
	var ups []*reverseproxy.Upstream
	seen := make(map[string]bool, len(pool))
	for _, u := range pool {
		if u == nil || !usableForNew(u) || seen[identity(u)] {
			continue
		}
		seen[identity(u)] = true
		ups = append(ups, u)
	}
	if len(ups) == 0 {
		s := &hashSnap{base: &pool[0], n: len(pool), drainGen: gen}
		s.checked.Store(p.now().UnixNano())
		p.cur.Store(s)
		return s
	}
	hosts := make([]chash.Host, len(ups))
	for i, u := range ups {
		hosts[i] = chash.Host{ID: identity(u), Weight: 1}
	}
	var picker chash.Picker
	var err error
	switch p.algo {
	case hashRing:
		switch {
		case p.vnodes != 0 && p.vnodes*uint64(len(hosts)) <= chash.MaxRingSize:
			// Upstreams weigh 1 each, so every one gets vnodes points: the ring the xDS
			// server's sizes give Envoy and gRPC over the same healthy backends.
			picker, err = chash.NewVirtualNodesRing(hosts, p.vnodes, 1)
		case p.vnodes != 0:
			// Past Envoy's largest ring (which a pools file refuses): the largest ring.
			picker, err = chash.NewRing(hosts, chash.MaxRingSize, chash.MaxRingSize)
		default:
			picker, err = chash.NewRing(hosts, p.minRing, p.maxRing)
		}
	default:
		size := p.tableSize
		for uint64(len(hosts)) > size { // more upstreams than slots: grow to the next prime
			size = nextPrime(size * 2)
		}
		picker, err = chash.NewMaglev(hosts, size)
	}
	if err != nil {
		// Hosts are deduplicated and weighted 1 and sizes were validated at provision,
		// so this cannot happen; keep the previous table rather than fail requests.
		return old
	}
	s := &hashSnap{base: &pool[0], n: len(pool), drainGen: gen, ups: ups, picker: picker}
	s.checked.Store(p.now().UnixNano())
	p.cur.Store(s)
	p.rebuilds.Add(1)
	return s
}

func nextPrime(n uint64) uint64 {
	for !chash.IsPrime(n) {
		n++
	}
	return n
}
