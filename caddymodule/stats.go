package caddymodule

import (
	"sort"
	"sync"
	"sync/atomic"
)

// Re-pin reasons: the label values of stickylb_repins_total and the keys of the admin API's
// repins object.
const (
	reasonExpired     = "expired"     // the mapping or cookie outlived its TTL
	reasonUnavailable = "unavailable" // the pinned upstream is unhealthy or full
	reasonUnknown     = "unknown"     // the pinned upstream is not in this pool (removed)
	reasonRetry       = "retry"       // the pinned upstream just failed this request
	reasonInvalid     = "invalid"     // the cookie or prefix did not open (tampered, foreign key, malformed)
)

var repinReasons = []string{reasonExpired, reasonInvalid, reasonRetry, reasonUnavailable, reasonUnknown}

// Cookie rejection reasons, as policies/cookie names them.
var rejectReasons = []string{"auth", "expired", "malformed", "unknown_key", "version"}

// scopeStats counts one policy scope's decisions (a sticky cookie name, an app cookie name,
// or a session table): requests served by their pin, new sessions, re-pins by reason and
// cookie rejections by reason. Lock-free: it is updated on every request.
type scopeStats struct {
	hits, misses atomic.Uint64
	// capped counts values an upstream set that learn mode did not learn: the client was
	// over max_new_per_client.
	capped     atomic.Uint64
	repins     counterSet
	rejections counterSet
}

func (s *scopeStats) reject(reason string) { s.rejections.add(reason) }

// counterSet counts events by a small set of labels.
type counterSet struct {
	m sync.Map // string -> *atomic.Uint64
}

func (c *counterSet) add(label string) {
	v, ok := c.m.Load(label)
	if !ok {
		v, _ = c.m.LoadOrStore(label, new(atomic.Uint64))
	}
	v.(*atomic.Uint64).Add(1)
}

// snapshot returns every label in want (zero if never counted) plus any other seen.
func (c *counterSet) snapshot(want []string) map[string]uint64 {
	out := make(map[string]uint64, len(want))
	for _, l := range want {
		out[l] = 0
	}
	c.m.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Uint64).Load()
		return true
	})
	return out
}

// scopes holds the stats of every scope in use, refcounted like the usage pools so that
// counts survive a reload while a scope no config uses disappears.
var scopes = struct {
	sync.Mutex
	m map[string]*scopeEntry
}{m: map[string]*scopeEntry{}}

type scopeEntry struct {
	refs  int
	stats *scopeStats
}

// acquireScope returns the stats of a scope, creating them on first use.
func acquireScope(name string) *scopeStats {
	scopes.Lock()
	defer scopes.Unlock()
	e := scopes.m[name]
	if e == nil {
		e = &scopeEntry{stats: &scopeStats{}}
		scopes.m[name] = e
	}
	e.refs++
	return e.stats
}

// releaseScope drops one reference taken by acquireScope.
func releaseScope(name string) {
	scopes.Lock()
	defer scopes.Unlock()
	if e := scopes.m[name]; e != nil {
		if e.refs--; e.refs <= 0 {
			delete(scopes.m, name)
		}
	}
}

// eachScope calls fn for every scope in name order.
func eachScope(fn func(name string, s *scopeStats)) {
	scopes.Lock()
	names := make([]string, 0, len(scopes.m))
	stats := make(map[string]*scopeStats, len(scopes.m))
	for n, e := range scopes.m {
		names = append(names, n)
		stats[n] = e.stats
	}
	scopes.Unlock()
	sort.Strings(names)
	for _, n := range names {
		fn(n, stats[n])
	}
}
