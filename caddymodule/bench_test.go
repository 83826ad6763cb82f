package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// Benchmarks run each stickylb policy beside the Caddy built-in a user would otherwise pick,
// in one run, over the same pools: compare the ns/op and allocs/op of the impl=stickylb and
// impl=caddy arms. Each runs at 3, 10, 100, 128 and 1,000 upstreams, with a static pool (the
// same slice every request, as Caddy's static upstreams) and a dynamic one (a fresh slice of
// fresh *Upstream values every request, as Caddy's dynamic a/srv/multi sources and the
// control plane's source return them). 128 is the size the O(1) targets are stated at:
// sticky_ip and sticky_header at least 10x cheaper than client_ip_hash and header,
// sticky_cookie at least 50x cheaper than cookie (bench -bench '/upstreams=128/' for those).

var benchSizes = []int{3, 10, 100, 128, 1000}

// poolSource returns the pool of the i-th request.
type poolSource func(i int) reverseproxy.UpstreamPool

// freshPools is the number of distinct dynamic pools cycled through; each request gets
// another one than the request before, as from a dynamic source, without allocating in the
// timed loop.
const freshPools = 16

// dynamicPools returns freshPools copies of pool: new slices, new *Upstream values, new
// Dial strings, the same Hosts (Caddy shares a Host per address across dynamic upstreams).
func dynamicPools(pool reverseproxy.UpstreamPool) []reverseproxy.UpstreamPool {
	out := make([]reverseproxy.UpstreamPool, freshPools)
	for k := range out {
		p := make(reverseproxy.UpstreamPool, len(pool))
		for i, u := range pool {
			p[i] = &reverseproxy.Upstream{Host: u.Host, Dial: strings.Clone(u.Dial)}
		}
		out[k] = p
	}
	return out
}

func benchPools(b *testing.B, fn func(b *testing.B, src poolSource)) {
	for _, n := range benchSizes {
		static := testPool(n)
		dyn := dynamicPools(static)
		b.Run(fmt.Sprintf("upstreams=%d/pool=static", n), func(b *testing.B) {
			fn(b, func(int) reverseproxy.UpstreamPool { return static })
		})
		b.Run(fmt.Sprintf("upstreams=%d/pool=dynamic", n), func(b *testing.B) {
			fn(b, func(i int) reverseproxy.UpstreamPool { return dyn[i%freshPools] })
		})
	}
}

// benchReq is one prepared request: its client IP (as Caddy resolves it) and a function
// that restores anything a policy rewrites in place (app_cookie strips its prefix).
type benchReq struct {
	r     *http.Request
	ip    string
	reset func(r *http.Request)
}

// caddyVars returns the vars Caddy's server gives a request from clientIP before any handler
// runs (prepareRequest: whether a trusted proxy sent it, the client's IP, and the time the
// request began, a clock read of Caddy's own).
func caddyVars(clientIP string) map[string]any {
	return map[string]any{caddyhttp.TrustedProxyVarKey: false, caddyhttp.ClientIPVarKey: clientIP, startTimeVarKey: time.Now()}
}

// runSelect times Select over 256 prepared requests. Each gets fresh vars holding what
// Caddy's server puts there (so the map is as large as in Caddy), and the request's hook
// when the policy needs the stickylb handler.
func runSelect(b *testing.B, sel reverseproxy.Selector, src poolSource, reqs []benchReq, withHook bool) {
	w := httptest.NewRecorder()
	hk := &responseHook{}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		q := &reqs[i&255]
		if q.reset != nil {
			q.reset(q.r)
		}
		vars := caddyVars(q.ip)
		if withHook {
			hk.r, hk.done = q.r, false
			vars[hookVarKey] = hk
		}
		r := q.r.WithContext(context.WithValue(q.r.Context(), caddyhttp.VarsCtxKey, vars))
		if sel.Select(src(i), r, w) == nil {
			b.Fatal("no upstream")
		}
	}
}

func plainRequests(mod func(i int, r *http.Request)) []benchReq {
	reqs := make([]benchReq, 256)
	for i := range reqs {
		r := httptest.NewRequest("GET", "/", nil)
		if mod != nil {
			mod(i, r)
		}
		reqs[i] = benchReq{r: r, ip: fmt.Sprintf("192.0.2.%d", i)}
	}
	return reqs
}

// cookieRequests returns 256 requests, each carrying the cookie sel set on a first visit.
func cookieRequests(b testing.TB, sel reverseproxy.Selector, pool reverseproxy.UpstreamPool, name string) []benchReq {
	return plainRequests(func(i int, r *http.Request) {
		w := httptest.NewRecorder()
		sel.Select(pool, request("/"), w)
		v := setCookieValue(b, w, name)
		if v == "" {
			b.Fatal("no cookie set")
		}
		r.Header.Set("Cookie", name+"="+v)
	})
}

// appCookieRequests returns 256 requests carrying an app_cookie value the upstream set
// (through the policy's rewrite in prefix mode, learned in learn mode).
func appCookieRequests(b testing.TB, a *AppCookie, pool reverseproxy.UpstreamPool) []benchReq {
	return plainRequests(func(i int, r *http.Request) {
		first, hk := hookedRequest("")
		a.Select(pool, first, httptest.NewRecorder())
		h := http.Header{"Set-Cookie": {fmt.Sprintf("%s=app-session-%04d; Path=/", a.Name, i)}}
		hk.run(h)
		v, _ := splitSetCookie(h.Get("Set-Cookie"))
		line := a.Name + "=" + v
		r.Header.Set("Cookie", line)
	})
}

// BenchmarkCookie: a request with a valid session cookie (the hit path), against Caddy's
// `cookie` policy (an HMAC of the upstream's address, checked against every upstream).
func BenchmarkCookie(b *testing.B) {
	benchPools(b, func(b *testing.B, src poolSource) {
		b.Run("impl=stickylb", func(b *testing.B) {
			s := inProxy(b, "sticky_cookie", &StickyCookie{SecretOptions: SecretOptions{Secrets: []string{testSecret}}}, nil)
			runSelect(b, s, src, cookieRequests(b, s, src(0), "lb_session"), false)
		})
		b.Run("impl=stickylb-app_cookie", func(b *testing.B) {
			a := inProxy(b, "app_cookie", &AppCookie{Name: "JSESSIONID", SecretOptions: SecretOptions{Secrets: []string{testSecret}}}, nil).(*AppCookie)
			reqs := appCookieRequests(b, a, src(0))
			for i := range reqs {
				line := reqs[i].r.Header.Get("Cookie")
				reqs[i].reset = func(r *http.Request) { r.Header["Cookie"][0] = line }
			}
			runSelect(b, a, src, reqs, true)
		})
		b.Run("impl=stickylb-app_cookie_learn", func(b *testing.B) {
			a := inProxy(b, "app_cookie", &AppCookie{Name: "JSESSIONID", Mode: appModeLearn, KeyedOptions: KeyedOptions{Table: b.Name()}}, nil).(*AppCookie)
			runSelect(b, a, src, appCookieRequests(b, a, src(0)), true)
		})
		b.Run("impl=caddy", func(b *testing.B) {
			s := inProxy(b, "cookie", &reverseproxy.CookieHashSelection{Name: "lb", Secret: testSecret}, nil)
			runSelect(b, s, src, cookieRequests(b, s, src(0), "lb"), false)
		})
	})
}

// BenchmarkCookieMiss: a request without a cookie: a new session, a seal per request.
func BenchmarkCookieMiss(b *testing.B) {
	benchPools(b, func(b *testing.B, src poolSource) {
		b.Run("impl=stickylb", func(b *testing.B) {
			s := inProxy(b, "sticky_cookie", &StickyCookie{SecretOptions: SecretOptions{Secrets: []string{testSecret}}}, nil)
			runSelect(b, s, src, plainRequests(nil), false)
		})
		b.Run("impl=caddy", func(b *testing.B) {
			s := inProxy(b, "cookie", &reverseproxy.CookieHashSelection{Name: "lb", Secret: testSecret}, nil)
			runSelect(b, s, src, plainRequests(nil), false)
		})
	})
}

// benchArm is one side of a comparison: a selection policy's module name and config (made
// for its sub-benchmark: a table of stickylb's is named for it), provisioned in a
// reverse_proxy handler with retries lb_retries (0, Caddy's default: none; stickylb's
// policies record their picks for retries only when there are).
type benchArm struct {
	impl    string
	name    string
	cfg     func(b *testing.B) any
	retries int
}

// runArms runs each arm as sub-benchmark impl=<impl> over src and reqs.
func runArms(b *testing.B, src poolSource, reqs []benchReq, arms ...benchArm) {
	for _, a := range arms {
		b.Run("impl="+a.impl, func(b *testing.B) {
			var lb map[string]any
			if a.retries > 0 {
				lb = map[string]any{"retries": a.retries}
			}
			runSelect(b, inProxy(b, a.name, a.cfg(b), lb), src, reqs, false)
		})
	}
}

// inProxy returns the selection policy cfg (module name) as Caddy provisions it: loaded by a
// reverse_proxy handler, in the context of a running config, so that it sees its handler's
// load balancing (lb: more fields of it, such as retries; nil: Caddy's defaults). The
// handler and the policy are cleaned up when tb ends.
func inProxy(tb testing.TB, name string, cfg any, lb map[string]any) reverseproxy.Selector {
	tb.Helper()
	// A no-op when this config already runs; another test's config, or none, is replaced.
	if err := caddy.Load([]byte(`{"admin":{"disabled":true,"config":{"persist":false}}}`), false); err != nil {
		tb.Fatalf("loading an empty Caddy config: %v", err)
	}
	balancing := map[string]any{"selection_policy": caddyconfig.JSONModuleObject(cfg, "policy", name, nil)}
	for k, v := range lb {
		balancing[k] = v
	}
	raw, err := json.Marshal(map[string]any{"upstreams": []map[string]string{{"dial": "127.0.0.1:9"}}, "load_balancing": balancing})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.ActiveContext())
	tb.Cleanup(cancel)
	mod, err := ctx.LoadModuleByID("http.handlers.reverse_proxy", raw)
	if err != nil {
		tb.Fatalf("provisioning %s in a reverse_proxy handler: %v", name, err)
	}
	return mod.(*reverseproxy.Handler).LoadBalancing.SelectionPolicy
}

// BenchmarkClientIP: sticky_ip (Maglev, O(1)) against Caddy's client_ip_hash (rendezvous
// hashing over every upstream). Both read the client IP Caddy resolved.
func BenchmarkClientIP(b *testing.B) {
	benchPools(b, func(b *testing.B, src poolSource) {
		runArms(b, src, plainRequests(nil),
			benchArm{impl: "stickylb", name: "sticky_ip", cfg: func(*testing.B) any { return &StickyIP{} }},
			benchArm{impl: "stickylb-retries", name: "sticky_ip", cfg: func(*testing.B) any { return &StickyIP{} }, retries: 2},
			benchArm{impl: "caddy", name: "client_ip_hash", cfg: func(*testing.B) any { return reverseproxy.ClientIPHashSelection{} }})
	})
}

// BenchmarkHeader: sticky_header without a table (hash only, as Caddy's header policy) and
// with one, against Caddy's `header` policy.
func BenchmarkHeader(b *testing.B) {
	benchPools(b, func(b *testing.B, src poolSource) {
		reqs := plainRequests(func(i int, r *http.Request) { r.Header.Set("X-Session", fmt.Sprintf("session-%08d", i)) })
		noTable := func(*testing.B) any {
			return &StickyHeader{Name: "X-Session", KeyedOptions: KeyedOptions{NoTable: true}}
		}
		runArms(b, src, reqs,
			benchArm{impl: "stickylb", name: "sticky_header", cfg: noTable},
			benchArm{impl: "stickylb-retries", name: "sticky_header", cfg: noTable, retries: 2},
			benchArm{impl: "stickylb-table", name: "sticky_header", cfg: func(b *testing.B) any {
				return &StickyHeader{Name: "X-Session", KeyedOptions: KeyedOptions{Table: b.Name()}}
			}},
			benchArm{impl: "caddy", name: "header", cfg: func(*testing.B) any { return &reverseproxy.HeaderHashSelection{Field: "X-Session"} }})
	})
}

// BenchmarkURL: sticky_url by query parameter against Caddy's `query` and `uri_hash`.
func BenchmarkURL(b *testing.B) {
	benchPools(b, func(b *testing.B, src poolSource) {
		reqs := plainRequests(func(i int, r *http.Request) {
			r.URL.RawQuery = fmt.Sprintf("sid=session-%08d&x=1", i)
			r.RequestURI = "/app?" + r.URL.RawQuery
		})
		runArms(b, src, reqs,
			benchArm{impl: "stickylb", name: "sticky_url", cfg: func(*testing.B) any {
				return &StickyURL{Query: "sid", KeyedOptions: KeyedOptions{NoTable: true}}
			}},
			benchArm{impl: "stickylb-table", name: "sticky_url", cfg: func(b *testing.B) any {
				return &StickyURL{Query: "sid", KeyedOptions: KeyedOptions{Table: b.Name()}}
			}},
			benchArm{impl: "caddy-query", name: "query", cfg: func(*testing.B) any { return &reverseproxy.QueryHashSelection{Key: "sid"} }},
			benchArm{impl: "caddy-uri_hash", name: "uri_hash", cfg: func(*testing.B) any { return reverseproxy.URIHashSelection{} }})
	})
}

// BenchmarkLeastConn: weighted_least_conn against Caddy's least_conn, idle upstreams (every
// upstream ties: the tie-break is what is measured).
func BenchmarkLeastConn(b *testing.B) {
	benchPools(b, func(b *testing.B, src poolSource) {
		runArms(b, src, plainRequests(nil),
			benchArm{impl: "stickylb", name: "weighted_least_conn", cfg: func(*testing.B) any { return &WeightedLeastConn{} }},
			benchArm{impl: "stickylb-retries", name: "weighted_least_conn", cfg: func(*testing.B) any { return &WeightedLeastConn{} }, retries: 2},
			benchArm{impl: "caddy", name: "least_conn", cfg: func(*testing.B) any { return reverseproxy.LeastConnSelection{} }})
	})
}

// BenchmarkFloor is what every arm pays outside Select: the vars map and the context, as
// Caddy's server creates them per request.
func BenchmarkFloor(b *testing.B) {
	reqs := plainRequests(nil)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		q := &reqs[i&255]
		r := q.r.WithContext(context.WithValue(q.r.Context(), caddyhttp.VarsCtxKey, caddyVars(q.ip)))
		if r == nil {
			b.Fatal()
		}
	}
}
