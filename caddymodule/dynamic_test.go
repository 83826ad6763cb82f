package caddymodule

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/stickylb/stickylb/policies/cookie"
)

// freshPool returns pool as a dynamic source returns it on every call: a new slice of new
// *Upstream values (new Dial strings too) naming the same upstreams.
func freshPool(pool reverseproxy.UpstreamPool) reverseproxy.UpstreamPool {
	out := make(reverseproxy.UpstreamPool, len(pool))
	for i, u := range pool {
		out[i] = &reverseproxy.Upstream{Host: u.Host, Dial: strings.Clone(u.Dial)}
	}
	return out
}

// TestDynamicPoolsDoNotRebuild: a dynamic pool of unchanged upstreams (a fresh slice of
// fresh values per request) builds each hash table and index once, and a changed one
// rebuilds.
func TestDynamicPoolsDoNotRebuild(t *testing.T) {
	base := testPool(50)
	h := &StickyHeader{Name: "X-Session", KeyedOptions: KeyedOptions{Table: t.Name()}}
	provision(t, h)
	c := &StickyCookie{SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
	provision(t, c)
	codec, _ := cookie.NewCodec([]byte(testSecret))
	now := time.Now()
	cookies := make([]string, len(base))
	for i, u := range base {
		cookies[i], _ = codec.Seal(cookie.Payload{Backend: u.Dial, Issued: now, Expires: now.Add(time.Hour)}, "lb_session")
	}
	const requests = 1000
	for i := 0; i < requests; i++ {
		pool := freshPool(base)
		r := request("/")
		r.Header.Set("X-Session", fmt.Sprintf("k%d", i%300))
		if u := h.Select(pool, r, httptest.NewRecorder()); u == nil {
			t.Fatal("no pick")
		}
		r = request("/")
		r.Header.Set("Cookie", "lb_session="+cookies[i%len(cookies)])
		if u := c.Select(pool, r, httptest.NewRecorder()); u != pool[i%len(cookies)] {
			t.Fatalf("cookie for %s went to %v", base[i%len(cookies)].Dial, u)
		}
	}
	if n := h.core.hasher.rebuilds.Load(); n != 1 {
		t.Fatalf("%d fresh pools of the same upstreams built the hash table %d times, want 1", requests, n)
	}
	if n := h.core.index.rebuilds.Load() + c.index.rebuilds.Load(); n > 2 {
		t.Fatalf("%d fresh pools of the same upstreams built the indexes %d times, want at most 2", requests, n)
	}
	// A pool that really changed rebuilds.
	grown := freshPool(append(base[:len(base):len(base)], &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: "10.0.9.9:80"}))
	r := request("/")
	r.Header.Set("X-Session", "a key the table does not hold")
	h.Select(grown, r, httptest.NewRecorder())
	if n := h.core.hasher.rebuilds.Load(); n != 2 {
		t.Fatalf("a new upstream: %d builds, want 2", n)
	}
}

// TestRetryWithFreshUpstreams: Caddy calls GetUpstreams again before a retry, so the retry's
// pool holds new *Upstream values: the upstream that failed must still be skipped.
func TestRetryWithFreshUpstreams(t *testing.T) {
	base := testPool(3)
	codec, _ := cookie.NewCodec([]byte(testSecret))
	now := time.Now()
	pinned, _ := codec.Seal(cookie.Payload{Backend: base[1].Dial, Issued: now, Expires: now.Add(time.Hour)}, "lb_session")
	sc := &StickyCookie{SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
	provision(t, sc)
	sh := &StickyHeader{Name: "X-Session", KeyedOptions: KeyedOptions{Table: t.Name()}}
	provision(t, sh)
	si := &StickyIP{}
	provision(t, si)
	wlc := &WeightedLeastConn{}
	provision(t, wlc)
	cases := []struct {
		name string
		sel  reverseproxy.Selector
		req  func() *http.Request
	}{
		{"sticky_cookie", sc, func() *http.Request {
			r := request("/")
			r.Header.Set("Cookie", "lb_session="+pinned)
			return r
		}},
		{"sticky_header", sh, func() *http.Request {
			r := request("/")
			r.Header.Set("X-Session", "user-7")
			return r
		}},
		{"sticky_ip", si, func() *http.Request {
			r := request("/")
			caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, "192.0.2.7")
			return r
		}},
		{"weighted_least_conn", wlc, func() *http.Request { return request("/") }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for k := 0; k < 20; k++ {
				r := tc.req()
				first := tc.sel.Select(freshPool(base), r, httptest.NewRecorder())
				second := tc.sel.Select(freshPool(base), r, httptest.NewRecorder())
				third := tc.sel.Select(freshPool(base), r, httptest.NewRecorder())
				if first == nil || second == nil || third == nil {
					t.Fatalf("no pick: %v %v %v", first, second, third)
				}
				if second.Dial == first.Dial || third.Dial == first.Dial || third.Dial == second.Dial {
					t.Fatalf("retries went back to an upstream that failed: %s, %s, %s", first.Dial, second.Dial, third.Dial)
				}
			}
		})
	}
}

// TestBoundedLoad: with bounded_load, a key whose hashed upstream is over its share of
// in-flight requests goes elsewhere; without it, the hash alone decides.
func TestBoundedLoad(t *testing.T) {
	pool := testPool(4)
	plain := &StickyHeader{Name: "X-Session", KeyedOptions: KeyedOptions{NoTable: true}}
	provision(t, plain)
	bounded := &StickyHeader{Name: "X-Session", KeyedOptions: KeyedOptions{NoTable: true, BoundedLoad: 1.25}}
	provision(t, bounded)
	pick := func(s *StickyHeader, key string) *reverseproxy.Upstream {
		r := request("/")
		r.Header.Set("X-Session", key)
		return s.Select(pool, r, httptest.NewRecorder())
	}
	// Idle: bounded load changes nothing.
	for i := 0; i < 200; i++ {
		k := fmt.Sprintf("key-%d", i)
		if a, b := pick(plain, k), pick(bounded, k); a != b {
			t.Fatalf("%s: idle pools disagree: %s vs %s", k, a.Dial, b.Dial)
		}
	}
	// Load the upstream of key-0 with 20 in-flight requests while the
	// others carry none: its share at factor 1.25 is ceil(21*1.25/4) = 7.
	hot := pick(plain, "key-0")
	bounded.core.hasher.load = func(u *reverseproxy.Upstream) int64 {
		if u.Dial == hot.Dial {
			return 20
		}
		return 0
	}
	moved := 0
	for i := 0; i < 200; i++ {
		k := fmt.Sprintf("key-%d", i)
		if pick(plain, k) != hot {
			continue
		}
		if got := pick(bounded, k); got == hot {
			t.Fatalf("%s stayed on the overloaded %s", k, hot.Dial)
		}
		moved++
	}
	if moved == 0 {
		t.Fatal("no key hashed to the loaded upstream")
	}
	if pick(plain, "key-0") != hot {
		t.Fatal("without bounded_load the hash alone must decide")
	}
}

// TestOpenCacheNeverServesTampered: once a valid cookie is in the open cache, every value
// that differs from it in one character is still rejected, and the cached value's expiry
// still holds.
func TestOpenCacheNeverServesTampered(t *testing.T) {
	s := &StickyCookie{SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
	provision(t, s)
	clock := time.Unix(2_000_000_000, 0)
	s.now = func() time.Time { return clock }
	pool := testPool(3)
	codec, _ := cookie.NewCodec([]byte(testSecret))
	v, _ := codec.Seal(cookie.Payload{Backend: pool[2].Dial, Issued: clock, Expires: clock.Add(time.Hour)}, "lb_session")
	sel := func(value string) (*reverseproxy.Upstream, string) {
		r := request("/")
		r.Header.Set("Cookie", "lb_session="+value)
		w := httptest.NewRecorder()
		return s.Select(pool, r, w), setCookieValue(t, w, "lb_session")
	}
	for i := 0; i < 3; i++ {
		if u, fresh := sel(v); u != pool[2] || fresh != "" {
			t.Fatalf("valid cookie: %v, re-set %q", u, fresh)
		}
	}
	if s.opened.get(v) == nil {
		t.Fatal("the valid value is not cached")
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for i := range v {
		c := alphabet[(strings.IndexByte(alphabet, v[i])+1)%len(alphabet)]
		bad := v[:i] + string(c) + v[i+1:]
		if _, fresh := sel(bad); fresh == "" {
			t.Fatalf("value tampered at %d was accepted", i)
		}
		if s.opened.get(bad) != nil {
			t.Fatalf("value tampered at %d entered the cache", i)
		}
	}
	clock = clock.Add(time.Hour)
	if _, fresh := sel(v); fresh == "" {
		t.Fatal("an expired cookie was served from the cache")
	}
}
