package caddymodule

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
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

// Request variables. A policy reads what it needs of the request's vars (the client IP, the
// request's start time, its earlier picks) after one lookup of the vars map, rather than
// through caddyhttp.GetVar and SetVar, each of which walks the request's context (several
// layers deep in Caddy's handler chain).

// requestVars returns the vars map Caddy's server gives every request, or nil outside
// Caddy's handler chain (reading a nil map finds nothing; recordIn writes nothing to it).
func requestVars(r *http.Request) map[string]any {
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	return vars
}

// startTimeVarKey is the var in which Caddy's server records when each request began
// (time.Now() as it set the request up; its {http.request.duration} placeholders read it).
const startTimeVarKey = "start_time"

// requestTime returns when the request began as Caddy recorded it, or now() when the
// request carries no start time (a request built outside Caddy's server): a policy that
// needs a time only coarsely (once-a-second checks, cookie expiry) reads no clock of its own.
func requestTime(vars map[string]any, now func() time.Time) time.Time {
	if t, ok := vars[startTimeVarKey].(time.Time); ok {
		return t
	}
	return now()
}

// mayRetry reports whether the reverse_proxy handler a policy is provisioned in may call
// Select again for the same request (lb_retries or lb_try_duration set). Only then does the
// policy record its picks in the request's vars, so that a retry avoids the upstream that
// just failed: without retries nothing reads the record, and writing it costs a map insert
// per request. A policy provisioned outside a reverse_proxy handler records.
func mayRetry(ctx caddy.Context) bool {
	mods := ctx.Modules()
	for i := len(mods) - 1; i >= 0; i-- {
		if h, ok := mods[i].(*reverseproxy.Handler); ok {
			lb := h.LoadBalancing
			return lb != nil && (lb.Retries > 0 || lb.TryDuration > 0)
		}
	}
	return true
}

// pickLog says whether a policy records its picks in the request's vars: mayRetry, or the
// policy reads the record back (app_cookie, on the response).
type pickLog bool

// tried returns the picks recorded for the request, none when the policy records none.
func (l pickLog) tried(vars map[string]any) tried {
	if !l {
		return tried{}
	}
	return triedIn(vars)
}

// record records u when the policy records its picks.
func (l pickLog) record(vars map[string]any, u *reverseproxy.Upstream) {
	if l {
		recordIn(vars, u)
	}
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
func triedFor(r *http.Request) tried { return triedIn(requestVars(r)) }

// triedIn returns the tried set recorded in vars.
func triedIn(vars map[string]any) tried {
	switch v := vars[triedVarKey].(type) {
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
func recordPick(r *http.Request, u *reverseproxy.Upstream) { recordIn(requestVars(r), u) }

// recordIn adds u to the tried set in vars (read again here: a fallback policy may have
// recorded its own pick since the caller read it).
func recordIn(vars map[string]any, u *reverseproxy.Upstream) {
	if u == nil || vars == nil {
		return
	}
	t := triedIn(vars)
	switch {
	case t.empty():
		vars[triedVarKey] = u
	case t.one != nil && t.has(u):
		// The same upstream again (a fallback records its pick, then the policy that
		// called it): still one.
		if t.one != u {
			vars[triedVarKey] = u
		}
	case t.one != nil:
		s := &triedSet{ids: []string{identity(t.one)}, last: u}
		if !t.has(u) {
			s.ids = append(s.ids, identity(u))
		}
		vars[triedVarKey] = s
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
