package caddymodule

import (
	"errors"
	"fmt"
	"slices"
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
//
// Hosts weigh what the control plane gives them (a stickylb_xds source: the pools file's
// weights, which the xDS tier gives Envoy and gRPC as endpoint weights), else 1 each (static
// upstreams carry no weight). With virtual_nodes, the weight unit is the smallest weight of
// the upstream's service in the pools file, as the xDS tier sizes its rings.
//
// The table is keyed by identity: it holds, for each of its hosts, the identity and the
// position it had in the pool it was built from. A pick checks that one position of the
// request's pool, so a dynamic pool naming the same upstreams in the same order (a fresh
// slice of fresh *Upstream values per request) uses the table as a static pool does, and
// a table is rebuilt only when the eligible identities or their weights change.
type hashPicker struct {
	algo             string
	tableSize        uint64
	minRing, maxRing uint64
	vnodes           uint64 // ring points per upstream; 0: minRing/maxRing size the ring
	// balance is bounded load's factor (Envoy's hash_balance_factor / 100); 0 is off.
	balance  float64
	mu       sync.Mutex // serializes rebuilds
	cur      atomic.Pointer[hashSnap]
	rebuilds atomic.Uint64
	now      func() time.Time
	// load is an upstream's in-flight requests, for bounded load: Caddy's own count.
	load func(*reverseproxy.Upstream) int64
}

func inFlight(u *reverseproxy.Upstream) int64 { return int64(u.NumRequests()) }

type hashSnap struct {
	n        int // length of the pool it was built from
	drainGen uint64
	checked  atomic.Int64 // UnixNano of the last full eligibility check
	ids      []string     // the table's hosts, by identity
	pos      []int32      // position of ids[i] in the pool the table was built from
	index    map[string]int32
	picker   chash.Walker
	// weights is the control plane's table the snapshot was built against: a pick compares
	// the pointer only; w and unit are what the build took from it, so a new table that
	// leaves this pool's weights alone does not rebuild it.
	weights *weightTable
	w       []uint32 // weight of ids[i]
	unit    uint32   // virtual-node weight unit
}

func newHashPicker(algo string, tableSize, minRing, maxRing, vnodes uint64, balance float64) (*hashPicker, error) {
	if c, ok := chash.ParseAlgorithm(algo); ok {
		algo = c
	}
	if balance != 0 && balance < 1 {
		return nil, fmt.Errorf("bounded_load %v: the factor must be at least 1 (1.25 lets an upstream take 25%% over its share)", balance)
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
		return &hashPicker{algo: hashRing, vnodes: vnodes, balance: balance, now: time.Now, load: inFlight}, nil
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
	return &hashPicker{algo: algo, tableSize: tableSize, minRing: minRing, maxRing: maxRing, balance: balance, now: time.Now, load: inFlight}, nil
}

// probeStep spreads the probes of a key whose hashed upstream is unusable for this request
// over the table (a fixed odd constant, so the walk is deterministic per key).
const probeStep = 0x9E3779B97F4A7C15

// at returns the request's upstream of the table's host i, or nil when the pool no longer
// holds that identity.
func (s *hashSnap) at(pool reverseproxy.UpstreamPool, i int) *reverseproxy.Upstream {
	if len(pool) == s.n {
		if u := pool[s.pos[i]]; u != nil && identity(u) == s.ids[i] {
			return u
		}
	}
	// Reordered or resized: find the identity (O(n), no allocation).
	for _, u := range pool {
		if u != nil && identity(u) == s.ids[i] {
			return u
		}
	}
	return nil
}

// pick returns the upstream for key hash h that may take a new session and that this
// request has not tried, or nil when none can. at is when the request began (zero: now),
// which the once-a-revalidateEvery eligibility check compares with its last run.
func (p *hashPicker) pick(pool reverseproxy.UpstreamPool, h uint64, t tried, at time.Time) *reverseproxy.Upstream {
	if at.IsZero() {
		at = p.now()
	}
	s := p.snapshot(pool, at)
	if s == nil || s.picker == nil {
		return nil
	}
	u := s.at(pool, p.first(s, pool, h))
	if u != nil && usableForNew(u) && !t.has(u) {
		return u
	}
	if u == nil || !usableForNew(u) {
		// The table is out of date: rebuild over what is eligible now, as Envoy would.
		if s = p.rebuild(pool, s, at); s == nil || s.picker == nil {
			return nil
		}
		u = s.at(pool, p.first(s, pool, h))
		if u != nil && usableForNew(u) && !t.has(u) {
			return u
		}
	}
	// The hashed upstream is eligible but failed this request (a retry): probe onwards,
	// deterministically per key, among the other eligible upstreams.
	for k := uint64(1); k <= uint64(2*len(s.ids)+8); k++ {
		u = s.at(pool, s.picker.Pick(h+k*probeStep))
		if u != nil && usableForNew(u) && !t.has(u) {
			return u
		}
	}
	for _, u := range pool {
		if u != nil && usableForNew(u) && !t.has(u) {
			return u
		}
	}
	return nil
}

// first is the table's host for h: its plain pick, or with bounded load the first host in
// Envoy's probe order whose in-flight requests are within its share.
func (p *hashPicker) first(s *hashSnap, pool reverseproxy.UpstreamPool, h uint64) int {
	if p.balance == 0 {
		return s.picker.Pick(h)
	}
	var total int64
	for i := range s.ids {
		if u := s.at(pool, i); u != nil {
			total += p.load(u)
		}
	}
	return chash.PickBounded(s.picker, h, p.balance, func(i int) int64 {
		if u := s.at(pool, i); u != nil {
			return p.load(u)
		}
		return 0
	}, total)
}

// snapshot returns the current table, rebuilding it when the pool's length, the drain
// set or the control plane's weights changed or when the periodic eligibility check (due
// when at, the request's start, is revalidateEvery past the last) finds a difference.
func (p *hashPicker) snapshot(pool reverseproxy.UpstreamPool, at time.Time) *hashSnap {
	if len(pool) == 0 {
		return nil
	}
	s := p.cur.Load()
	if s == nil || s.n != len(pool) || s.drainGen != drains.generation() || s.weights != xdsTable.current() {
		return p.rebuild(pool, s, at)
	}
	now := at.UnixNano()
	last := s.checked.Load()
	if now-last >= int64(revalidateEvery) && s.checked.CompareAndSwap(last, now) {
		if !sameEligible(pool, s) {
			return p.rebuild(pool, s, at)
		}
	}
	return s
}

// sameEligible reports whether the upstreams of pool eligible for new sessions are, as a
// set of identities, the table's hosts (the table does not depend on their order: hosts
// are placed in identity order). O(n); it runs on a rebuild and once a revalidateEvery.
func sameEligible(pool reverseproxy.UpstreamPool, s *hashSnap) bool {
	seen := make([]bool, len(s.ids))
	for _, u := range pool {
		if u == nil || !usableForNew(u) {
			continue
		}
		i, ok := s.index[identity(u)]
		if !ok {
			return false
		}
		seen[i] = true
	}
	for _, ok := range seen {
		if !ok {
			return false
		}
	}
	return true
}

// rebuild builds a table over the eligible upstreams of pool, unless another goroutine
// already replaced old with one that fits. With no eligible upstream the snapshot has no
// picker (and is kept until one turns eligible, so an outage does not rebuild on every
// request). A new weight table that gives the current hosts the weights and unit they
// have is only recorded, without a build. at, the request's start, is the new snapshot's
// last eligibility check.
func (p *hashPicker) rebuild(pool reverseproxy.UpstreamPool, old *hashSnap, at time.Time) *hashSnap {
	p.mu.Lock()
	defer p.mu.Unlock()
	wt := xdsTable.current()
	cur := p.cur.Load()
	fits := cur != nil && cur.n == len(pool) && cur.drainGen == drains.generation() && sameEligible(pool, cur)
	if fits && cur != old && cur.weights == wt {
		return cur
	}
	if fits && cur.weights != wt && cur.sameWeights(wt) {
		s := &hashSnap{n: cur.n, drainGen: cur.drainGen, ids: cur.ids, pos: cur.pos, index: cur.index,
			picker: cur.picker, weights: wt, w: cur.w, unit: cur.unit}
		s.checked.Store(at.UnixNano())
		p.cur.Store(s)
		return s
	}
	gen := drains.generation()
	s := &hashSnap{n: len(pool), drainGen: gen, index: make(map[string]int32, len(pool)), weights: wt}
	for j, u := range pool {
		if u == nil || !usableForNew(u) {
			continue
		}
		id := identity(u)
		if _, dup := s.index[id]; dup {
			continue
		}
		s.index[id] = int32(len(s.ids))
		s.ids = append(s.ids, id)
		s.pos = append(s.pos, int32(j))
	}
	if len(s.ids) == 0 {
		s.checked.Store(at.UnixNano())
		p.cur.Store(s)
		return s
	}
	s.w, s.unit = s.weighOn(wt)
	hosts := make([]chash.Host, len(s.ids))
	for i, id := range s.ids {
		hosts[i] = chash.Host{ID: id, Weight: s.w[i]}
	}
	var err error
	switch p.algo {
	case hashRing:
		switch {
		case p.vnodes != 0:
			// vnodes points per unit of weight: the ring the xDS server's sizes give Envoy
			// and gRPC over the same healthy backends.
			s.picker, err = chash.NewVirtualNodesRing(hosts, p.vnodes, s.unit)
			if errors.Is(err, chash.ErrVirtualNodes) {
				// Past Envoy's largest ring (which a pools file refuses): the largest ring.
				s.picker, err = chash.NewRing(hosts, chash.MaxRingSize, chash.MaxRingSize)
			}
		default:
			s.picker, err = chash.NewRing(hosts, p.minRing, p.maxRing)
		}
	default:
		size := p.tableSize
		for uint64(len(hosts)) > size { // more upstreams than slots: grow to the next prime
			size = nextPrime(size * 2)
		}
		s.picker, err = chash.NewMaglev(hosts, size)
	}
	if err != nil {
		// Hosts are deduplicated, weigh at least 1 (a weight sum past uint32, which Envoy
		// refuses too, is the only way here) and sizes were validated at provision; keep
		// the previous table rather than fail requests.
		return old
	}
	s.checked.Store(at.UnixNano())
	p.cur.Store(s)
	p.rebuilds.Add(1)
	return s
}

// weighOn returns the weights of the snapshot's hosts in wt and their virtual-node unit:
// an upstream the control plane names weighs its weight, in units of its service's
// smallest weight; any other weighs 1 in units of 1 (so equal weights with static upstreams).
func (s *hashSnap) weighOn(wt *weightTable) ([]uint32, uint32) {
	ws := make([]uint32, len(s.ids))
	unit := uint32(0)
	for i, id := range s.ids {
		w, u, ok := wt.lookup(id)
		if !ok {
			w, u = 1, 1
		}
		ws[i] = w
		if unit == 0 || u < unit {
			unit = u
		}
	}
	return ws, unit
}

// sameWeights reports whether wt gives the snapshot's hosts the weights and unit it was
// built with.
func (s *hashSnap) sameWeights(wt *weightTable) bool {
	ws, unit := s.weighOn(wt)
	return unit == s.unit && slices.Equal(ws, s.w)
}

func nextPrime(n uint64) uint64 {
	for !chash.IsPrime(n) {
		n++
	}
	return n
}
