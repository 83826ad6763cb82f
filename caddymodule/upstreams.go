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

// upstreamIndex finds an upstream by identity in O(1). Select receives the pool on every
// call; with static upstreams it is the same backing array each time, so the index is keyed
// by that array and rebuilt only when the pool changes (dynamic upstreams rebuild per new pool).
type upstreamIndex struct {
	cur atomic.Pointer[indexSnap]
}

type indexSnap struct {
	base *(*reverseproxy.Upstream) // &pool[0]: identifies the backing array
	n    int
	byID map[string]*reverseproxy.Upstream
}

// lookup returns the upstream of pool whose identity is id, or nil.
func (x *upstreamIndex) lookup(pool reverseproxy.UpstreamPool, id string) *reverseproxy.Upstream {
	if len(pool) == 0 {
		return nil
	}
	s := x.cur.Load()
	if s == nil || s.n != len(pool) || s.base != &pool[0] {
		s = &indexSnap{base: &pool[0], n: len(pool), byID: make(map[string]*reverseproxy.Upstream, len(pool))}
		for _, u := range pool {
			if u == nil {
				continue
			}
			if _, dup := s.byID[identity(u)]; !dup {
				s.byID[identity(u)] = u
			}
		}
		x.cur.Store(s)
	}
	return s.byID[id]
}

// Upstream eligibility. A pinned session may stay on an upstream that is draining (DESIGN:
// a draining backend keeps the sessions a tier pins); a new session may not.

// usableForPinned reports whether a session pinned to u may keep using it.
func usableForPinned(u *reverseproxy.Upstream) bool { return u.Available() }

// checkPin returns the upstream of pool a session pinned to id may use for this request,
// or nil and the re-pin reason: the upstream is gone, just failed this request, or is
// unavailable.
func checkPin(x *upstreamIndex, pool reverseproxy.UpstreamPool, id string, t *tried) (*reverseproxy.Upstream, string) {
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
// (Caddy calls Select again for the same request) never returns the upstream that just failed.
const triedVarKey = "stickylb.tried"

// tried is the set of upstreams already picked for one request (few: one per attempt).
type tried struct {
	ups []*reverseproxy.Upstream
}

// triedFor returns the request's tried set, or nil before the first pick.
func triedFor(r *http.Request) *tried {
	t, _ := caddyhttp.GetVar(r.Context(), triedVarKey).(*tried)
	return t
}

func (t *tried) has(u *reverseproxy.Upstream) bool {
	if t == nil {
		return false
	}
	for _, x := range t.ups {
		if x == u {
			return true
		}
	}
	return false
}

func (t *tried) empty() bool { return t == nil || len(t.ups) == 0 }

// recordPick adds u to the request's tried set.
func recordPick(r *http.Request, u *reverseproxy.Upstream) {
	if u == nil {
		return
	}
	t := triedFor(r)
	if t == nil {
		t = &tried{}
		caddyhttp.SetVar(r.Context(), triedVarKey, t)
	}
	if !t.has(u) {
		t.ups = append(t.ups, u)
	}
}

// poolForNew returns the upstreams a fallback selector may pick for a new session: without
// the ones this request already tried and without drained ones. Caddy's own selectors know
// neither, so they get a filtered pool; the pool itself is returned (no allocation) when
// nothing is excluded, the common case.
func poolForNew(pool reverseproxy.UpstreamPool, t *tried) reverseproxy.UpstreamPool {
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
