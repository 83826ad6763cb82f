package caddymodule

import (
	"net/http"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// identity is how stickylb names an upstream in cookies, tables and hashes: its dial
// address as written in the config (docs/pools.md: a backend's identity).
func identity(u *reverseproxy.Upstream) string { return u.Dial }

// Pools and identities. Caddy hands Select the pool on every call: with static upstreams the
// same slice each time, with dynamic ones (a/srv/multi, the control plane's source) a fresh
// slice of fresh *Upstream values each time, usually naming the same backends in the same
// order. Everything stickylb derives from a pool (indexes, hash tables, the tried set) is
// therefore keyed by identity, with the position where each identity last stood: a lookup
// checks that one position of the request's pool (O(1)), and only a pool whose identities
// really changed costs a rebuild.

// poolIDs is the identities of a pool in order, and the first position of each.
type poolIDs struct {
	ids []string
	pos map[string]int32
}

func newPoolIDs(pool reverseproxy.UpstreamPool) poolIDs {
	p := poolIDs{ids: make([]string, len(pool)), pos: make(map[string]int32, len(pool))}
	for i, u := range pool {
		if u == nil {
			continue
		}
		id := identity(u)
		p.ids[i] = id
		if _, dup := p.pos[id]; !dup {
			p.pos[id] = int32(i)
		}
	}
	return p
}

// find returns the upstream of pool whose identity is id and whether the answer is
// certain: pool must hold the same identities in the same positions as p for a negative
// answer to be, which is checked only then (O(n) string compares, no allocation).
func (p *poolIDs) find(pool reverseproxy.UpstreamPool, id string) (u *reverseproxy.Upstream, certain bool) {
	if len(pool) != len(p.ids) {
		return nil, false
	}
	if i, ok := p.pos[id]; ok {
		if u := pool[i]; u != nil && identity(u) == id {
			return u, true
		}
		return nil, false
	}
	return nil, p.same(pool)
}

// same reports whether pool names exactly p's identities in p's order.
func (p *poolIDs) same(pool reverseproxy.UpstreamPool) bool {
	if len(pool) != len(p.ids) {
		return false
	}
	for i, u := range pool {
		if u == nil {
			if p.ids[i] != "" {
				return false
			}
			continue
		}
		if identity(u) != p.ids[i] {
			return false
		}
	}
	return true
}

// upstreamIndex finds an upstream of the request's pool by identity in O(1).
type upstreamIndex struct {
	cur      atomic.Pointer[poolIDs]
	rebuilds atomic.Uint64
}

// lookup returns the upstream of pool whose identity is id, or nil.
func (x *upstreamIndex) lookup(pool reverseproxy.UpstreamPool, id string) *reverseproxy.Upstream {
	if len(pool) == 0 {
		return nil
	}
	if s := x.cur.Load(); s != nil {
		if u, certain := s.find(pool, id); certain {
			return u
		}
	}
	s := newPoolIDs(pool)
	x.cur.Store(&s)
	x.rebuilds.Add(1)
	u, _ := s.find(pool, id)
	return u
}

// Upstream eligibility. A pinned session may stay on an upstream that is draining (DESIGN:
// a draining backend keeps the sessions a tier pins); a new session may not.

// usableForPinned reports whether a session pinned to u may keep using it.
func usableForPinned(u *reverseproxy.Upstream) bool { return u.Available() }

// checkPin returns the upstream of pool a session pinned to id may use for this request,
// or nil and the re-pin reason: the upstream is gone, just failed this request, or is
// unavailable.
func checkPin(x *upstreamIndex, pool reverseproxy.UpstreamPool, id string, t tried) (*reverseproxy.Upstream, string) {
	u := x.lookup(pool, id)
	switch {
	case u == nil:
		return nil, reasonUnknown
	case t.has(u):
		return nil, reasonRetry
	case !usableForPinned(u):
		return nil, reasonUnavailable
	}
	return u, ""
}

// usableForNew reports whether u may take a new session.
func usableForNew(u *reverseproxy.Upstream) bool {
	return u.Available() && !drains.drained(identity(u))
}

// triedVarKey names the request variable that records this request's picks, so a retry
// (Caddy calls Select again for the same request, with a pool that may hold new *Upstream
// values) never returns the upstream that just failed. It holds the first pick's
// *Upstream (storing a pointer allocates nothing, which keeps the hit path free of
// allocations), and a *triedSet from the second pick on.
const triedVarKey = "stickylb.tried"

// triedSet is the identities picked for one request, in order (few: one per attempt).
type triedSet struct {
	ids  []string
	last *reverseproxy.Upstream
}

// tried is a request's picks as read from its vars: nothing, one upstream, or a set.
type tried struct {
	one  *reverseproxy.Upstream
	many *triedSet
}

// triedFor returns the request's tried set.
func triedFor(r *http.Request) tried {
	switch v := caddyhttp.GetVar(r.Context(), triedVarKey).(type) {
	case *reverseproxy.Upstream:
		return tried{one: v}
	case *triedSet:
		return tried{many: v}
	}
	return tried{}
}

// has reports whether an upstream with u's identity was already picked for the request.
func (t tried) has(u *reverseproxy.Upstream) bool {
	switch {
	case t.one != nil:
		return t.one == u || identity(t.one) == identity(u)
	case t.many != nil:
		id := identity(u)
		for _, x := range t.many.ids {
			if x == id {
				return true
			}
		}
	}
	return false
}

func (t tried) empty() bool { return t.one == nil && t.many == nil }

// last returns the last upstream picked for the request (the one that answered), or nil.
func (t tried) last() *reverseproxy.Upstream {
	if t.one != nil {
		return t.one
	}
	if t.many != nil {
		return t.many.last
	}
	return nil
}

// recordPick adds u to the request's tried set.
func recordPick(r *http.Request, u *reverseproxy.Upstream) {
	if u == nil {
		return
	}
	t := triedFor(r)
	switch {
	case t.empty():
		caddyhttp.SetVar(r.Context(), triedVarKey, u)
	case t.one != nil && t.has(u):
		// The same upstream again (a fallback records its pick, then the policy that
		// called it): still one.
		if t.one != u {
			caddyhttp.SetVar(r.Context(), triedVarKey, u)
		}
	case t.one != nil:
		s := &triedSet{ids: []string{identity(t.one)}, last: u}
		if !t.has(u) {
			s.ids = append(s.ids, identity(u))
		}
		caddyhttp.SetVar(r.Context(), triedVarKey, s)
	default:
		t.many.last = u
		if !t.has(u) {
			t.many.ids = append(t.many.ids, identity(u))
		}
	}
}

// poolForNew returns the upstreams a fallback selector may pick for a new session: without
// the ones this request already tried and without drained ones. Caddy's own selectors know
// neither, so they get a filtered pool; the pool itself is returned (no allocation) when
// nothing is excluded, the common case.
func poolForNew(pool reverseproxy.UpstreamPool, t tried) reverseproxy.UpstreamPool {
	if t.empty() && drains.empty.Load() {
		return pool
	}
	out := make(reverseproxy.UpstreamPool, 0, len(pool))
	for _, u := range pool {
		if u == nil || t.has(u) || drains.drained(identity(u)) {
			continue
		}
		out = append(out, u)
	}
	return out
}
