package caddymodule

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
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

// rebuildCase is one policy of TestDynamicPoolsDoNotRebuild: req(i) is its i-th request,
// pinned(i) the upstream position it must reach (-1: whatever its hash says), hashes and
// indexes the policy's hash table and upstream index (nil when it has none).
type rebuildCase struct {
	name    string
	sel     reverseproxy.Selector
	req     func(i int) *http.Request
	pinned  func(i int) int
	hashes  *atomic.Uint64
	indexes *atomic.Uint64
}

// TestDynamicPoolsDoNotRebuild: a dynamic pool of unchanged upstreams (a fresh slice of
// fresh values per request) builds each policy's hash table and upstream index once, and a
// pool that really changed rebuilds them once.
func TestDynamicPoolsDoNotRebuild(t *testing.T) {
	base := testPool(50)
	n := len(base)
	codec, _ := cookie.NewCodec([]byte(testSecret))
	now := time.Now()
	seal := func(i int, context string) string {
		v, _ := codec.Seal(cookie.Payload{Backend: base[i%n].Dial, Issued: now, Expires: now.Add(time.Hour)}, context)
		return v
	}
	cookies, prefixes := make([]string, n), make([]string, n)
	for i := range base {
		cookies[i], prefixes[i] = seal(i, "lb_session"), seal(i, "app_cookie:JSESSIONID")
	}
	header := &StickyHeader{Name: "X-Session", KeyedOptions: KeyedOptions{Table: t.Name() + "/header"}}
	sc := &StickyCookie{SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
	ip := &StickyIP{}
	ipTable := &StickyIP{KeyedOptions: KeyedOptions{Table: t.Name() + "/ip"}}
	url := &StickyURL{Query: "sid", KeyedOptions: KeyedOptions{Table: t.Name() + "/url"}}
	prefix := &AppCookie{Name: "JSESSIONID", SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
	learn := &AppCookie{Name: "JSESSIONID", Mode: appModeLearn, KeyedOptions: KeyedOptions{Table: t.Name() + "/learn"}}
	for _, p := range []caddy.Provisioner{header, sc, ip, ipTable, url, prefix, learn} {
		provision(t, p)
	}
	// learn mode holds what upstreams issued: learned-j on upstream j.
	for j := range base {
		learn.core.learn(learn.key(fmt.Sprintf("learned-%d", j)), base[j])
	}
	const requests = 1000
	// key is the i-th request's key: 300 keys in turn (the first visit of each is hashed and
	// stored, later ones are table hits), and after the first requests, every other one a
	// key never seen (hashed).
	key := func(i int) int {
		if i >= requests && i%2 == 1 {
			return i
		}
		return i % 300
	}
	withIP := func(i int) *http.Request {
		r := request("/")
		k := key(i)
		caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, fmt.Sprintf("10.%d.%d.1", k/256, k%256))
		return r
	}
	hashed := func(int) int { return -1 }
	byCookie := func(i int) int { return i % n }
	cases := []rebuildCase{
		{"sticky_header", header, func(i int) *http.Request {
			r := request("/")
			r.Header.Set("X-Session", fmt.Sprintf("k%d", key(i)))
			return r
		}, hashed, &header.core.hasher.rebuilds, &header.core.index.rebuilds},
		{"sticky_cookie", sc, func(i int) *http.Request {
			r := request("/")
			r.Header.Set("Cookie", "lb_session="+cookies[i%n])
			return r
		}, byCookie, nil, &sc.index.rebuilds},
		{"sticky_ip", ip, withIP, hashed, &ip.core.hasher.rebuilds, nil},
		{"sticky_ip_table", ipTable, withIP, hashed, &ipTable.core.hasher.rebuilds, &ipTable.core.index.rebuilds},
		{"sticky_url", url, func(i int) *http.Request {
			return request(fmt.Sprintf("/app?sid=s%d&x=1", key(i)))
		}, hashed, &url.core.hasher.rebuilds, &url.core.index.rebuilds},
		{"app_cookie_prefix", prefix, func(i int) *http.Request {
			r, _ := hookedRequest("JSESSIONID=" + prefixes[i%n] + "~app-value")
			return r
		}, byCookie, nil, &prefix.core.index.rebuilds},
		// Even requests carry a learned value (the index), odd ones a value no upstream
		// issued (the hash).
		{"app_cookie_learn", learn, func(i int) *http.Request {
			v := fmt.Sprintf("client-%d", i%300)
			if i%2 == 0 {
				v = fmt.Sprintf("learned-%d", (i/2)%n)
			}
			r, _ := hookedRequest("JSESSIONID=" + v)
			return r
		}, func(i int) int {
			if i%2 == 0 {
				return (i / 2) % n
			}
			return -1
		}, &learn.core.hasher.rebuilds, &learn.core.index.rebuilds},
	}
	for i := 0; i < requests; i++ {
		pool := freshPool(base)
		for _, tc := range cases {
			u := tc.sel.Select(pool, tc.req(i), httptest.NewRecorder())
			if u == nil {
				t.Fatalf("%s: no pick", tc.name)
			}
			if want := tc.pinned(i); want >= 0 && u != pool[want] {
				t.Fatalf("%s: request %d pinned to %s went to %s", tc.name, i, base[want].Dial, u.Dial)
			}
		}
	}
	builds := func(c *atomic.Uint64) uint64 {
		if c == nil {
			return 0
		}
		return c.Load()
	}
	for _, tc := range cases {
		for what, c := range map[string]*atomic.Uint64{"hash table": tc.hashes, "index": tc.indexes} {
			if c != nil && c.Load() != 1 {
				t.Errorf("%s: %d fresh pools of the same upstreams built the %s %d times, want 1", tc.name, requests, what, c.Load())
			}
		}
	}
	// A pool that really changed rebuilds, once, however many fresh copies of it come.
	grown := append(base[:n:n], &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: "10.0.9.9:80"})
	for _, tc := range cases {
		hashes, indexes := builds(tc.hashes), builds(tc.indexes)
		for i := 0; i < 2*n; i++ {
			tc.sel.Select(freshPool(grown), tc.req(requests+i), httptest.NewRecorder())
		}
		if tc.hashes != nil && builds(tc.hashes) != hashes+1 {
			t.Errorf("%s: a new upstream: %d hash table builds, want %d", tc.name, builds(tc.hashes), hashes+1)
		}
		if tc.indexes != nil && builds(tc.indexes) != indexes+1 {
			t.Errorf("%s: a new upstream: %d index builds, want %d", tc.name, builds(tc.indexes), indexes+1)
		}
	}
}

// TestRetryWithFreshUpstreams: Caddy calls GetUpstreams again before a retry, so the retry's
// pool holds new *Upstream values: the upstream that failed must still be skipped.
func TestRetryWithFreshUpstreams(t *testing.T) {
	base := testPool(3)
	codec, _ := cookie.NewCodec([]byte(testSecret))
	now := time.Now()
	pinnedCookie, _ := codec.Seal(cookie.Payload{Backend: base[1].Dial, Issued: now, Expires: now.Add(time.Hour)}, "lb_session")
	sc := &StickyCookie{SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
	provision(t, sc)
	sh := &StickyHeader{Name: "X-Session", KeyedOptions: KeyedOptions{Table: t.Name()}}
	provision(t, sh)
	si := &StickyIP{}
	provision(t, si)
	wlc := &WeightedLeastConn{}
	provision(t, wlc)
	su := &StickyURL{Query: "sid", KeyedOptions: KeyedOptions{Table: t.Name() + "/url"}}
	provision(t, su)
	prefix := &AppCookie{Name: "JSESSIONID", SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
	provision(t, prefix)
	pinnedPrefix, _ := codec.Seal(cookie.Payload{Backend: base[1].Dial, Issued: now, Expires: now.Add(time.Hour)}, "app_cookie:JSESSIONID")
	learn := &AppCookie{Name: "JSESSIONID", Mode: appModeLearn, KeyedOptions: KeyedOptions{Table: t.Name() + "/learn"}}
	provision(t, learn)
	// The sessions these cases carry are pinned to base[1].
	pinned := map[string]bool{"sticky_cookie": true, "app_cookie_prefix": true, "app_cookie_learn": true}
	cases := []struct {
		name string
		sel  reverseproxy.Selector
		req  func() *http.Request
	}{
		{"sticky_cookie", sc, func() *http.Request {
			r := request("/")
			r.Header.Set("Cookie", "lb_session="+pinnedCookie)
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
		{"sticky_url", su, func() *http.Request { return request("/app?sid=user-7") }},
		// The first attempt strips the prefix from the request: the retries go by what
		// it held.
		{"app_cookie_prefix", prefix, func() *http.Request {
			r, _ := hookedRequest("JSESSIONID=" + pinnedPrefix + "~app-value")
			return r
		}},
		{"app_cookie_learn", learn, func() *http.Request {
			// Upstream 1 issued the value (again: the last round's retries moved the
			// session to the upstream that answered, as a re-pin must).
			learn.core.learn(learn.key("issued-by-1"), base[1])
			r, _ := hookedRequest("JSESSIONID=issued-by-1")
			return r
		}},
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
				if pinned[tc.name] && first.Dial != base[1].Dial {
					t.Fatalf("the first attempt went to %s, the session is pinned to %s", first.Dial, base[1].Dial)
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

// TestOpenCacheNeverServesTamperedPrefix: app_cookie's prefix mode opens its prefixes
// through the same open cache: once a valid prefix is cached, every prefix that differs from
// it in one character is still rejected (a re-pin, counted invalid) and never cached, and
// the cached prefix's expiry still holds.
func TestOpenCacheNeverServesTamperedPrefix(t *testing.T) {
	a := &AppCookie{Name: "JSESSIONID", SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
	provision(t, a)
	clock := time.Unix(2_000_000_000, 0)
	a.now = func() time.Time { return clock }
	pool := testPool(3)
	codec, _ := cookie.NewCodec([]byte(testSecret))
	v, _ := codec.Seal(cookie.Payload{Backend: pool[2].Dial, Issued: clock, Expires: clock.Add(time.Hour)}, "app_cookie:JSESSIONID")
	repins := func(reason string) uint64 { return a.core.stats.repins.snapshot(nil)[reason] }
	sel := func(prefix string) *reverseproxy.Upstream {
		r, _ := hookedRequest("JSESSIONID=" + prefix + "~app-value")
		u := a.Select(pool, r, httptest.NewRecorder())
		if got := r.Header.Get("Cookie"); got != "JSESSIONID=app-value" {
			t.Fatalf("the upstream would see %q", got)
		}
		return u
	}
	for i := 0; i < 3; i++ {
		if u := sel(v); u != pool[2] {
			t.Fatalf("valid prefix: %v", u)
		}
	}
	if a.opened.get(v) == nil {
		t.Fatal("the valid prefix is not cached")
	}
	hits := a.core.stats.hits.Load()
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for i := range v {
		c := alphabet[(strings.IndexByte(alphabet, v[i])+1)%len(alphabet)]
		bad := v[:i] + string(c) + v[i+1:]
		before := repins(reasonInvalid)
		sel(bad)
		if repins(reasonInvalid) != before+1 {
			t.Fatalf("prefix tampered at %d was accepted", i)
		}
		if a.opened.get(bad) != nil {
			t.Fatalf("prefix tampered at %d entered the cache", i)
		}
	}
	if a.core.stats.hits.Load() != hits {
		t.Fatal("a tampered prefix counted as a hit")
	}
	clock = clock.Add(time.Hour)
	before := repins(reasonExpired)
	sel(v)
	if repins(reasonExpired) != before+1 || a.core.stats.hits.Load() != hits {
		t.Fatal("an expired prefix was served from the cache")
	}
}

// TestPicksRecordedOnlyWhenRetried: provisioned by a reverse_proxy handler, as Caddy does,
// a policy records its picks in the request's vars only when the handler may call Select
// again for the request (lb_retries, lb_try_duration): then a retry avoids the upstream
// that failed. Without retries nothing would read the record, and none is written. app_cookie
// records either way: its response hook reads which upstream answered.
func TestPicksRecordedOnlyWhenRetried(t *testing.T) {
	base := testPool(3)
	cases := []struct {
		name string
		cfg  func() any
		req  func() *http.Request
	}{
		{"sticky_ip", func() any { return &StickyIP{} }, func() *http.Request {
			r := request("/")
			requestVars(r)[caddyhttp.ClientIPVarKey] = "192.0.2.7"
			return r
		}},
		{"sticky_header", func() any { return &StickyHeader{Name: "X-Session", KeyedOptions: KeyedOptions{NoTable: true}} }, func() *http.Request {
			r := request("/")
			r.Header.Set("X-Session", "user-7")
			return r
		}},
		{"weighted_least_conn", func() any { return &WeightedLeastConn{} }, func() *http.Request { return request("/") }},
		{"sticky_cookie", func() any { return &StickyCookie{SecretOptions: SecretOptions{Secrets: []string{testSecret}}} }, func() *http.Request { return request("/") }},
	}
	balancing := []struct {
		name  string
		lb    map[string]any
		retry bool
	}{
		{"no retries", nil, false},
		{"lb_retries", map[string]any{"retries": 2}, true},
		{"lb_try_duration", map[string]any{"try_duration": "5s"}, true},
	}
	for _, tc := range cases {
		for _, b := range balancing {
			t.Run(tc.name+"/"+b.name, func(t *testing.T) {
				sel := inProxy(t, tc.name, tc.cfg(), b.lb)
				r := tc.req()
				first := sel.Select(freshPool(base), r, httptest.NewRecorder())
				if _, recorded := requestVars(r)[triedVarKey]; first == nil || recorded != b.retry {
					t.Fatalf("picked %v; pick recorded %v, want %v", first, recorded, b.retry)
				}
				if !b.retry {
					return
				}
				second := sel.Select(freshPool(base), r, httptest.NewRecorder())
				if second == nil || second.Dial == first.Dial {
					t.Fatalf("the retry went to %v after %s failed", second, first.Dial)
				}
			})
		}
	}
	learn := inProxy(t, "app_cookie", &AppCookie{Name: "JSESSIONID", Mode: appModeLearn, KeyedOptions: KeyedOptions{Table: t.Name()}}, nil)
	r, _ := hookedRequest("JSESSIONID=some-value")
	if u := learn.Select(base, r, httptest.NewRecorder()); u == nil || triedFor(r).last() != u {
		t.Fatalf("app_cookie without retries: picked %v, recorded %v", u, triedFor(r).last())
	}
}

// TestEligibilityCheckGoesByRequestStart: the once-a-second check that a hash table's
// upstreams are still the eligible ones goes by when each request began, as Caddy's server
// recorded it in the request's vars: the policy reads no clock of its own. A pool whose
// third upstream was replaced is seen by the first request that began a second after the
// last check, and not before.
func TestEligibilityCheckGoesByRequestStart(t *testing.T) {
	s := &StickyIP{}
	provision(t, s)
	s.core.hasher.now = func() time.Time {
		t.Error("the policy read the clock though the request carries its start")
		return time.Now()
	}
	before := testPool(3)
	after := append(testPool(2), &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: "10.0.0.9:80"})
	start := time.Unix(2_000_000_000, 0)
	sel := func(pool reverseproxy.UpstreamPool, ip string, at time.Duration) *reverseproxy.Upstream {
		r := request("/")
		vars := requestVars(r)
		vars[caddyhttp.ClientIPVarKey], vars[startTimeVarKey] = ip, start.Add(at)
		return s.Select(pool, r, nil)
	}
	// A client on an upstream both pools hold: its picks never run into the change.
	ip := ""
	for i := 0; i < 100 && ip == ""; i++ {
		if c := fmt.Sprintf("192.0.2.%d", i); sel(before, c, 0) != before[2] {
			ip = c
		}
	}
	if ip == "" {
		t.Fatal("no client hashed away from the third upstream in 100")
	}
	built := s.core.hasher.rebuilds.Load()
	if sel(after, ip, 900*time.Millisecond); s.core.hasher.rebuilds.Load() != built {
		t.Fatal("the table was rebuilt by a request that began within a second of the last check")
	}
	if sel(after, ip, 1100*time.Millisecond); s.core.hasher.rebuilds.Load() != built+1 {
		t.Fatal("a request that began a second after the last check did not find the changed pool")
	}
}
