package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// Benchmarks run each stickylb policy beside the Caddy built-in a user would otherwise pick,
// in one run, over the same pools: compare the ns/op of the impl=stickylb and impl=caddy arms.

func benchPools(b *testing.B, fn func(b *testing.B, pool reverseproxy.UpstreamPool)) {
	for _, n := range []int{3, 10, 100} {
		b.Run(fmt.Sprintf("upstreams=%d", n), func(b *testing.B) { fn(b, testPool(n)) })
	}
}

// runSelect times Select over 256 prepared requests, each with fresh vars as Caddy gives
// every request.
func runSelect(b *testing.B, sel reverseproxy.Selector, pool reverseproxy.UpstreamPool, reqs []*http.Request) {
	w := httptest.NewRecorder()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := reqs[i&255]
		r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
		if sel.Select(pool, r, w) == nil {
			b.Fatal("no upstream")
		}
	}
}

// cookieRequests returns 256 requests, each carrying the cookie sel set on a first visit.
func cookieRequests(b *testing.B, sel reverseproxy.Selector, pool reverseproxy.UpstreamPool, name string) []*http.Request {
	reqs := make([]*http.Request, 256)
	for i := range reqs {
		w := httptest.NewRecorder()
		sel.Select(pool, request("/"), w)
		v := setCookieValue(b, w, name)
		if v == "" {
			b.Fatal("no cookie set")
		}
		reqs[i] = httptest.NewRequest("GET", "/", nil)
		reqs[i].Header.Set("Cookie", name+"="+v)
	}
	return reqs
}

// BenchmarkCookie: a request with a valid session cookie, against Caddy's `cookie` policy
// (an HMAC of the upstream's address, checked against every upstream).
func BenchmarkCookie(b *testing.B) {
	benchPools(b, func(b *testing.B, pool reverseproxy.UpstreamPool) {
		b.Run("impl=stickylb", func(b *testing.B) {
			s := &StickyCookie{SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
			provision(b, s)
			runSelect(b, s, pool, cookieRequests(b, s, pool, "lb_session"))
		})
		b.Run("impl=caddy", func(b *testing.B) {
			s := &reverseproxy.CookieHashSelection{Name: "lb", Secret: testSecret}
			provision(b, s)
			runSelect(b, s, pool, cookieRequests(b, s, pool, "lb"))
		})
	})
}

func ipRequests() []*http.Request {
	reqs := make([]*http.Request, 256)
	for i := range reqs {
		reqs[i] = httptest.NewRequest("GET", "/", nil)
		reqs[i].RemoteAddr = fmt.Sprintf("192.0.2.%d:4000", i)
	}
	return reqs
}

// BenchmarkClientIP: sticky_ip (Maglev, O(1)) against Caddy's client_ip_hash (rendezvous
// hashing over every upstream).
func BenchmarkClientIP(b *testing.B) {
	benchPools(b, func(b *testing.B, pool reverseproxy.UpstreamPool) {
		reqs := ipRequests()
		b.Run("impl=stickylb", func(b *testing.B) {
			s := &StickyIP{}
			provision(b, s)
			// sticky_ip reads the client IP Caddy resolved; set it as the server would.
			ips := make([]*http.Request, len(reqs))
			for i, r := range reqs {
				ctx := context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: fmt.Sprintf("192.0.2.%d", i)})
				ips[i] = r.WithContext(ctx)
			}
			w := httptest.NewRecorder()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r := ips[i&255]
				vars := map[string]any{caddyhttp.ClientIPVarKey: r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)[caddyhttp.ClientIPVarKey]}
				r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, vars))
				if s.Select(pool, r, w) == nil {
					b.Fatal("no upstream")
				}
			}
		})
		b.Run("impl=caddy", func(b *testing.B) {
			s := &reverseproxy.IPHashSelection{}
			runSelect(b, s, pool, reqs)
		})
	})
}

// BenchmarkHeader: sticky_header without a table (hash only, as Caddy's header policy)
// against Caddy's `header` policy.
func BenchmarkHeader(b *testing.B) {
	benchPools(b, func(b *testing.B, pool reverseproxy.UpstreamPool) {
		reqs := make([]*http.Request, 256)
		for i := range reqs {
			reqs[i] = httptest.NewRequest("GET", "/", nil)
			reqs[i].Header.Set("X-Session", fmt.Sprintf("session-%08d", i))
		}
		b.Run("impl=stickylb", func(b *testing.B) {
			s := &StickyHeader{Name: "X-Session", KeyedOptions: KeyedOptions{NoTable: true}}
			provision(b, s)
			runSelect(b, s, pool, reqs)
		})
		b.Run("impl=stickylb-table", func(b *testing.B) {
			s := &StickyHeader{Name: "X-Session", KeyedOptions: KeyedOptions{Table: b.Name()}}
			provision(b, s)
			runSelect(b, s, pool, reqs)
		})
		b.Run("impl=caddy", func(b *testing.B) {
			s := &reverseproxy.HeaderHashSelection{Field: "X-Session"}
			provision(b, s)
			runSelect(b, s, pool, reqs)
		})
	})
}

// BenchmarkLeastConn: weighted_least_conn against Caddy's least_conn.
func BenchmarkLeastConn(b *testing.B) {
	benchPools(b, func(b *testing.B, pool reverseproxy.UpstreamPool) {
		reqs := make([]*http.Request, 256)
		for i := range reqs {
			reqs[i] = httptest.NewRequest("GET", "/", nil)
		}
		b.Run("impl=stickylb", func(b *testing.B) {
			s := &WeightedLeastConn{}
			provision(b, s)
			runSelect(b, s, pool, reqs)
		})
		b.Run("impl=caddy", func(b *testing.B) {
			runSelect(b, &reverseproxy.LeastConnSelection{}, pool, reqs)
		})
	})
}
