package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// allocRuns is the number of measured requests per figure. Each figure repeats one request
// (AllocsPerRun's warm-up run makes it a hit: the cookie opened and cached, the key stored
// or hashed, the pool indexed), so the open cache's slots cannot make two requests of the
// measurement evict each other, whatever its seed.
const allocRuns = 50

// allocRequests is how many of a policy's prepared requests are measured.
const allocRequests = 4

// requestAllocs returns the allocations of one request in the benchmarks' harness (see
// runSelect): the vars map and context Caddy's server makes per request, the stickylb
// handler's hook when withHook, and sel.Select unless sel is nil (the floor). The i-th run
// gets pools(i): the same slice, or a fresh one of fresh *Upstream values.
func requestAllocs(sel reverseproxy.Selector, pools poolSource, q benchReq, withHook bool) float64 {
	w := httptest.NewRecorder()
	hk := &responseHook{}
	i := 0
	return testing.AllocsPerRun(allocRuns, func() {
		i++
		if q.reset != nil {
			q.reset(q.r)
		}
		vars := caddyVars(q.ip)
		if withHook {
			hk.r, hk.done = q.r, false
			vars[hookVarKey] = hk
		}
		r := q.r.WithContext(context.WithValue(q.r.Context(), caddyhttp.VarsCtxKey, vars))
		if sel != nil && sel.Select(pools(i), r, w) == nil {
			panic("no upstream")
		}
	})
}

// primeSelect sends q through sel once, as requestAllocs does.
func primeSelect(sel reverseproxy.Selector, pool reverseproxy.UpstreamPool, q benchReq, withHook bool) {
	if q.reset != nil {
		q.reset(q.r)
	}
	vars := caddyVars(q.ip)
	if withHook {
		vars[hookVarKey] = &responseHook{r: q.r}
	}
	sel.Select(pool, q.r.WithContext(context.WithValue(q.r.Context(), caddyhttp.VarsCtxKey, vars)), httptest.NewRecorder())
}

// provisionedSelector is what every stickylb policy is.
type provisionedSelector interface {
	reverseproxy.Selector
	caddy.Provisioner
}

// TestHitPathAllocatesNothingOfOurs: on the hit path (a valid cookie, a pinned or hashed
// key) Select allocates nothing beyond Caddy's own per-request floor (its vars map and
// context, measured in the same harness), with static pools and with dynamic ones (a fresh
// slice of fresh upstreams per request). app_cookie's prefix mode is the one exception, by
// exactly one allocation (see its case).
func TestHitPathAllocatesNothingOfOurs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates")
	}
	static := testPool(10)
	dyn := dynamicPools(static)
	sources := []struct {
		name string
		src  poolSource
	}{
		{"static", func(int) reverseproxy.UpstreamPool { return static }},
		{"dynamic", func(i int) reverseproxy.UpstreamPool { return dyn[i%freshPools] }},
	}
	headerReqs := func(testing.TB, reverseproxy.Selector, reverseproxy.UpstreamPool) []benchReq {
		return plainRequests(func(i int, r *http.Request) { r.Header.Set("X-Session", fmt.Sprintf("session-%08d", i)) })
	}
	urlReqs := func(testing.TB, reverseproxy.Selector, reverseproxy.UpstreamPool) []benchReq {
		return plainRequests(func(i int, r *http.Request) {
			r.URL.RawQuery = fmt.Sprintf("sid=session-%08d&x=1", i)
			r.RequestURI = "/app?" + r.URL.RawQuery
		})
	}
	plainReqs := func(testing.TB, reverseproxy.Selector, reverseproxy.UpstreamPool) []benchReq {
		return plainRequests(nil)
	}
	cases := []struct {
		name string
		sel  func(t *testing.T) provisionedSelector
		// reqs prepares requests for sel (a cookie it set, a value it learned).
		reqs     func(tb testing.TB, sel reverseproxy.Selector, pool reverseproxy.UpstreamPool) []benchReq
		withHook bool
		ours     float64 // allocations of Select above the floor
	}{
		{"sticky_cookie", func(*testing.T) provisionedSelector {
			return &StickyCookie{SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
		}, func(tb testing.TB, sel reverseproxy.Selector, pool reverseproxy.UpstreamPool) []benchReq {
			return cookieRequests(tb, sel, pool, "lb_session")
		}, false, 0},
		// The backend must get its own value without the prefix: a Cookie line the client
		// did not send, so one new string the length of the line (Go strings are
		// immutable; caching rewritten lines would keep client-sized strings alive to
		// save one short-lived one). The pin kept for retries allocates nothing.
		{"app_cookie_prefix", func(*testing.T) provisionedSelector {
			return &AppCookie{Name: "JSESSIONID", SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
		}, func(tb testing.TB, sel reverseproxy.Selector, pool reverseproxy.UpstreamPool) []benchReq {
			reqs := appCookieRequests(tb, sel.(*AppCookie), pool)
			for i := range reqs {
				line := reqs[i].r.Header.Get("Cookie")
				reqs[i].reset = func(r *http.Request) { r.Header["Cookie"][0] = line }
			}
			return reqs
		}, true, 1},
		{"app_cookie_learn", func(t *testing.T) provisionedSelector {
			return &AppCookie{Name: "JSESSIONID", Mode: appModeLearn, KeyedOptions: KeyedOptions{Table: t.Name()}}
		}, func(tb testing.TB, sel reverseproxy.Selector, pool reverseproxy.UpstreamPool) []benchReq {
			return appCookieRequests(tb, sel.(*AppCookie), pool)
		}, true, 0},
		{"sticky_ip", func(*testing.T) provisionedSelector { return &StickyIP{} }, plainReqs, false, 0},
		{"sticky_ip_table", func(t *testing.T) provisionedSelector {
			return &StickyIP{KeyedOptions: KeyedOptions{Table: t.Name()}}
		}, plainReqs, false, 0},
		{"sticky_header", func(*testing.T) provisionedSelector {
			return &StickyHeader{Name: "X-Session", KeyedOptions: KeyedOptions{NoTable: true}}
		}, headerReqs, false, 0},
		{"sticky_header_table", func(t *testing.T) provisionedSelector {
			return &StickyHeader{Name: "X-Session", KeyedOptions: KeyedOptions{Table: t.Name()}}
		}, headerReqs, false, 0},
		{"sticky_url", func(*testing.T) provisionedSelector {
			return &StickyURL{Query: "sid", KeyedOptions: KeyedOptions{NoTable: true}}
		}, urlReqs, false, 0},
		{"sticky_url_table", func(t *testing.T) provisionedSelector {
			return &StickyURL{Query: "sid", KeyedOptions: KeyedOptions{Table: t.Name()}}
		}, urlReqs, false, 0},
		{"weighted_least_conn", func(*testing.T) provisionedSelector { return &WeightedLeastConn{} }, plainReqs, false, 0},
	}
	for _, tc := range cases {
		for _, src := range sources {
			t.Run(tc.name+"/"+src.name, func(t *testing.T) {
				sel := tc.sel(t)
				provision(t, sel)
				reqs := tc.reqs(t, sel, src.src(0))
				for _, q := range reqs[:allocRequests] {
					// A first visit stores a table's key: every measured run is a hit.
					primeSelect(sel, src.src(0), q, tc.withHook)
					floor := requestAllocs(nil, src.src, q, tc.withHook)
					hits, counted := hitCount(sel)
					total := requestAllocs(sel, src.src, q, tc.withHook)
					if after, _ := hitCount(sel); counted && after-hits != allocRuns+1 {
						t.Fatalf("request %s %q: %d of %d measured requests were hits", q.r.URL, q.r.Header, after-hits, allocRuns+1)
					}
					if total-floor != tc.ours {
						t.Errorf("request %s %q: %v allocations with Select, %v without: Select adds %v, want %v",
							q.r.URL, q.r.Header, total, floor, total-floor, tc.ours)
					}
				}
			})
		}
	}
}

// hitCount returns how many requests sel served from a pin (a valid cookie or prefix, a
// key its table holds), when sel tells hits apart from hashed picks.
func hitCount(sel reverseproxy.Selector) (uint64, bool) {
	switch s := sel.(type) {
	case *StickyCookie:
		return s.stats.hits.Load(), true
	case *AppCookie:
		return s.core.stats.hits.Load(), true
	case *StickyHeader:
		return s.core.stats.hits.Load(), s.core.table != nil
	case *StickyURL:
		return s.core.stats.hits.Load(), s.core.table != nil
	case *StickyIP:
		return s.core.stats.hits.Load(), s.core.table != nil
	}
	return 0, false
}
