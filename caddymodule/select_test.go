package caddymodule

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/cookie"
)

const testSecret = "0123456789abcdef0123456789abcdef"

func testPool(n int) reverseproxy.UpstreamPool {
	pool := make(reverseproxy.UpstreamPool, n)
	for i := range pool {
		pool[i] = &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: fmt.Sprintf("10.0.0.%d:80", i+1)}
	}
	return pool
}

func provision(t testing.TB, m caddy.Provisioner) {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := m.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if v, ok := m.(caddy.Validator); ok {
		if err := v.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	if c, ok := m.(caddy.CleanerUpper); ok {
		t.Cleanup(func() { _ = c.Cleanup() })
	}
}

// request returns a request with Caddy's vars in its context, as the server sets them up.
func request(target string) *http.Request {
	r := httptest.NewRequest("GET", target, nil)
	ctx := context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{})
	return r.WithContext(ctx)
}

// hookedRequest is request("/") with cookie as its Cookie header (none when empty) and the
// response hook the proxy's handler installs, which the test runs as the upstream answers.
func hookedRequest(cookie string) (*http.Request, *responseHook) {
	r := request("/")
	if cookie != "" {
		r.Header.Set("Cookie", cookie)
	}
	hk := &responseHook{r: r}
	caddyhttp.SetVar(r.Context(), hookVarKey, hk)
	return r, hk
}

func setCookieValue(t testing.TB, w *httptest.ResponseRecorder, name string) string {
	t.Helper()
	for _, c := range (&http.Response{Header: w.Header()}).Cookies() {
		if c.Name == name {
			return c.Value
		}
	}
	return ""
}

func TestStickyCookieRoundTrip(t *testing.T) {
	s := &StickyCookie{SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
	provision(t, s)
	pool := testPool(3)
	w := httptest.NewRecorder()
	first := s.Select(pool, request("/"), w)
	v := setCookieValue(t, w, "lb_session")
	if first == nil || v == "" {
		t.Fatalf("no pick or no cookie: %v %q", first, v)
	}
	sc := w.Header().Get("Set-Cookie")
	if !strings.Contains(sc, "HttpOnly") || !strings.Contains(sc, "Path=/") || !strings.Contains(sc, "SameSite=Lax") || strings.Contains(sc, "Secure") {
		t.Fatalf("cookie attributes over plain HTTP: %s", sc)
	}
	for i := 0; i < 20; i++ {
		r := request("/")
		r.Header.Set("Cookie", "other=1; lb_session="+v)
		w := httptest.NewRecorder()
		if got := s.Select(pool, r, w); got != first {
			t.Fatalf("request %d went to %s, pinned to %s", i, got.Dial, first.Dial)
		}
		if w.Header().Get("Set-Cookie") != "" {
			t.Fatal("a fresh cookie was re-set on every hit")
		}
	}
	if s.stats.hits.Load() != 20 || s.stats.misses.Load() != 1 {
		t.Fatalf("hits %d misses %d", s.stats.hits.Load(), s.stats.misses.Load())
	}
}

func TestStickyCookieRepins(t *testing.T) {
	s := &StickyCookie{SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
	provision(t, s)
	clock := time.Unix(2_000_000_000, 0)
	s.now = func() time.Time { return clock }
	pool := testPool(3)
	foreign, _ := cookie.NewCodec([]byte("another-secret-another-secret-xx"))
	foreignV, _ := foreign.Seal(cookie.Payload{Backend: pool[0].Dial, Issued: clock, Expires: clock.Add(time.Hour)}, "lb_session")
	codec, _ := cookie.NewCodec([]byte(testSecret))
	expiredV, _ := codec.Seal(cookie.Payload{Backend: pool[0].Dial, Issued: clock.Add(-2 * time.Hour), Expires: clock.Add(-time.Hour)}, "lb_session")
	unknownV, _ := codec.Seal(cookie.Payload{Backend: "10.9.9.9:80", Issued: clock, Expires: clock.Add(time.Hour)}, "lb_session")
	goodV, _ := codec.Seal(cookie.Payload{Backend: pool[0].Dial, Issued: clock, Expires: clock.Add(time.Hour)}, "lb_session")
	raw, _ := base64.RawURLEncoding.DecodeString(goodV)
	raw[len(raw)-1] ^= 1
	tampered := base64.RawURLEncoding.EncodeToString(raw)
	cases := []struct{ name, value, reason, reject string }{
		{"tampered", tampered, reasonInvalid, "auth"},
		{"foreign key", foreignV, reasonInvalid, "unknown_key"},
		{"expired", expiredV, reasonExpired, "expired"},
		{"garbage", "%%%not-a-cookie", reasonInvalid, "malformed"},
		{"unknown upstream", unknownV, reasonUnknown, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := request("/")
			r.Header.Set("Cookie", "lb_session="+tc.value)
			w := httptest.NewRecorder()
			if u := s.Select(pool, r, w); u == nil {
				t.Fatal("no upstream: a bad cookie must re-pin, never fail")
			}
			nv := setCookieValue(t, w, "lb_session")
			if nv == "" {
				t.Fatal("no fresh cookie after a re-pin")
			}
			if _, err := codec.Open(nv, "lb_session", clock); err != nil {
				t.Fatalf("fresh cookie does not open: %v", err)
			}
			if got := s.stats.repins.snapshot(nil)[tc.reason]; got == 0 {
				t.Fatalf("re-pin not counted as %s", tc.reason)
			}
			if tc.reject != "" && s.stats.rejections.snapshot(nil)[tc.reject] == 0 {
				t.Fatalf("rejection not counted as %s", tc.reject)
			}
		})
	}
	// Sliding expiry: past half the TTL a hit re-seals.
	s.ttl = time.Hour
	halfV, _ := codec.Seal(cookie.Payload{Backend: pool[1].Dial, Issued: clock.Add(-40 * time.Minute), Expires: clock.Add(20 * time.Minute)}, "lb_session")
	r := request("/")
	r.Header.Set("Cookie", "lb_session="+halfV)
	w := httptest.NewRecorder()
	if u := s.Select(pool, r, w); u != pool[1] {
		t.Fatalf("pinned cookie went to %v", u)
	}
	p, err := codec.Open(setCookieValue(t, w, "lb_session"), "lb_session", clock)
	if err != nil || !p.Expires.Equal(clock.Add(time.Hour)) {
		t.Fatalf("not re-sealed for a full TTL: %+v %v", p, err)
	}
}

func TestStickyCookieRetryAndDrain(t *testing.T) {
	s := &StickyCookie{SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
	provision(t, s)
	pool := testPool(3)
	codec, _ := cookie.NewCodec([]byte(testSecret))
	v, _ := codec.Seal(cookie.Payload{Backend: pool[2].Dial, Issued: time.Now(), Expires: time.Now().Add(time.Hour)}, "lb_session")
	r := request("/")
	r.Header.Set("Cookie", "lb_session="+v)
	if u := s.Select(pool, r, httptest.NewRecorder()); u != pool[2] {
		t.Fatalf("first attempt: %v", u)
	}
	// Caddy calls Select again for the same request after the attempt failed.
	w := httptest.NewRecorder()
	u := s.Select(pool, r, w)
	if u == nil || u == pool[2] {
		t.Fatalf("retry went back to the upstream that just failed: %v", u)
	}
	if setCookieValue(t, w, "lb_session") == "" || len(w.Header()["Set-Cookie"]) != 1 {
		t.Fatalf("retry must re-pin with exactly one cookie: %v", w.Header()["Set-Cookie"])
	}
	// Drain: the pinned session stays, new sessions avoid it.
	drains.drain(pool[0].Dial, time.Now())
	t.Cleanup(func() { drains.undrain(pool[0].Dial) })
	v0, _ := codec.Seal(cookie.Payload{Backend: pool[0].Dial, Issued: time.Now(), Expires: time.Now().Add(time.Hour)}, "lb_session")
	r = request("/")
	r.Header.Set("Cookie", "lb_session="+v0)
	if u := s.Select(pool, r, httptest.NewRecorder()); u != pool[0] {
		t.Fatalf("draining upstream lost its pinned session: %v", u)
	}
	for i := 0; i < 100; i++ {
		if u := s.Select(pool, request("/"), httptest.NewRecorder()); u == pool[0] {
			t.Fatal("draining upstream got a new session")
		}
	}
}

func TestStickyCookieEnvoyFormat(t *testing.T) {
	s := &StickyCookie{Format: formatEnvoy}
	provision(t, s)
	pool := testPool(3)
	// A cookie Envoy wrote (the pre-1.27 plain form) pins too.
	r := request("/")
	r.Header.Set("Cookie", "lb_session="+base64.StdEncoding.EncodeToString([]byte(pool[1].Dial)))
	if u := s.Select(pool, r, httptest.NewRecorder()); u != pool[1] {
		t.Fatalf("Envoy cookie not honoured: %v", u)
	}
	w := httptest.NewRecorder()
	u := s.Select(pool, request("/"), w)
	addr, _, err := cookie.DecodeEnvoy(setCookieValue(t, w, "lb_session"))
	if err != nil || addr != u.Dial {
		t.Fatalf("cookie for Envoy: %q %v (picked %s)", addr, err, u.Dial)
	}
}

func TestStickyCookieNeedsSecret(t *testing.T) {
	for _, secrets := range [][]string{nil, {"short"}, {testSecret, "short"}, {"{env.STICKYLB_TEST_UNSET}"}} {
		s := &StickyCookie{SecretOptions: SecretOptions{Secrets: secrets}}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err := s.Provision(ctx)
		cancel()
		if err == nil {
			t.Errorf("secrets %q accepted", secrets)
		}
	}
}

// TestStickyIPAgreesWithEnvoyHashing: the upstream sticky_ip picks is the one a Maglev over
// the same identities picks for XXH64 of the address text, which is what Envoy computes for
// hash_policy connection_properties.source_ip.
func TestStickyIPAgreesWithEnvoyHashing(t *testing.T) {
	s := &StickyIP{}
	provision(t, s)
	pool := testPool(5)
	hosts := make([]chash.Host, len(pool))
	for i, u := range pool {
		hosts[i] = chash.Host{ID: u.Dial, Weight: 1}
	}
	m, err := chash.NewMaglev(hosts, chash.DefaultMaglevTableSize)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 500; i++ {
		ip := fmt.Sprintf("192.0.%d.%d", i/250, i%250+1)
		if i%5 == 0 {
			ip = fmt.Sprintf("2001:db8::%x", i)
		}
		r := request("/")
		caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, ip)
		u := s.Select(pool, r, httptest.NewRecorder())
		// Envoy hashes the address as it prints it (RFC 5952 for IPv6: 2001:db8::, not ::0).
		if want := pool[m.Pick(chash.KeyHash(netip.MustParseAddr(ip).String()))]; u != want {
			t.Fatalf("%s: sticky_ip chose %s, Maglev %s", ip, u.Dial, want.Dial)
		}
	}
}

func TestStickyHeaderTableAndFallback(t *testing.T) {
	s := &StickyHeader{Name: "X-Session", KeyedOptions: KeyedOptions{TTL: caddy.Duration(time.Minute), Table: t.Name()}}
	provision(t, s)
	pool := testPool(4)
	picks := map[string]*reverseproxy.Upstream{}
	for i := 0; i < 200; i++ {
		k := fmt.Sprintf("user-%d", i%50)
		r := request("/")
		r.Header.Set("X-Session", k)
		u := s.Select(pool, r, httptest.NewRecorder())
		if p, ok := picks[k]; ok && p != u {
			t.Fatalf("%s moved from %s to %s", k, p.Dial, u.Dial)
		}
		picks[k] = u
	}
	if st := s.core.table.Stats(); st.Entries != 50 || st.Hits != 150 {
		t.Fatalf("table: %+v", st)
	}
	if u := s.Select(pool, request("/"), httptest.NewRecorder()); u == nil {
		t.Fatal("a request without the header must still be served")
	}
}

func TestAppCookiePrefixRewrite(t *testing.T) {
	a := &AppCookie{Name: "JSESSIONID", SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
	provision(t, a)
	pool := testPool(3)
	// First request: no cookie; the upstream sets one; the client sees it prefixed.
	r, hk := hookedRequest("")
	u := a.Select(pool, r, httptest.NewRecorder())
	h := http.Header{"Set-Cookie": {"JSESSIONID=abc123; Path=/; HttpOnly", "other=1"}}
	hk.run(h)
	line := h["Set-Cookie"][0]
	if !strings.HasPrefix(line, "JSESSIONID=") || !strings.HasSuffix(line, "~abc123; Path=/; HttpOnly") || h["Set-Cookie"][1] != "other=1" {
		t.Fatalf("rewritten Set-Cookie: %q", h["Set-Cookie"])
	}
	value := strings.TrimSuffix(strings.TrimPrefix(line, "JSESSIONID="), "; Path=/; HttpOnly")
	// Next request: routed by the prefix, forwarded with the application's own value.
	r2, _ := hookedRequest("a=1; JSESSIONID=" + value + "; b=2")
	if got := a.Select(pool, r2, httptest.NewRecorder()); got != u {
		t.Fatalf("prefix routed to %v, set by %v", got, u)
	}
	if c := r2.Header.Get("Cookie"); c != "a=1; JSESSIONID=abc123; b=2" {
		t.Fatalf("upstream sees %q", c)
	}
	// A tampered prefix: still forwarded unprefixed, and re-pinned.
	r3, _ := hookedRequest("JSESSIONID=AAAA" + value[4:])
	if got := a.Select(pool, r3, httptest.NewRecorder()); got == nil || r3.Header.Get("Cookie") != "JSESSIONID=abc123" {
		t.Fatalf("tampered prefix: %v, cookie %q", got, r3.Header.Get("Cookie"))
	}
}

func TestAppCookieLearn(t *testing.T) {
	a := &AppCookie{Name: "SID", Mode: appModeLearn, KeyedOptions: KeyedOptions{Table: t.Name()}}
	provision(t, a)
	pool := testPool(4)
	r, hk := hookedRequest("")
	u := a.Select(pool, r, httptest.NewRecorder())
	hk.run(http.Header{"Set-Cookie": {"SID=learned-value; Path=/"}})
	for i := 0; i < 10; i++ {
		r, _ := hookedRequest("SID=learned-value")
		if got := a.Select(pool, r, httptest.NewRecorder()); got != u {
			t.Fatalf("learned session went to %v, set by %v", got, u)
		}
	}
	// A deletion forgets it.
	r, hk = hookedRequest("SID=learned-value")
	a.Select(pool, r, httptest.NewRecorder())
	hk.run(http.Header{"Set-Cookie": {"SID=; Max-Age=0"}})
	if a.core.table.Len() != 0 {
		t.Fatalf("deleted session still in the table: %d", a.core.table.Len())
	}
}

func TestWeightedLeastConnFollowsWeights(t *testing.T) {
	p := &WeightedLeastConn{Weights: []int{3, 1, 0}}
	provision(t, p)
	pool := testPool(3)
	counts := map[*reverseproxy.Upstream]int{}
	for i := 0; i < 400; i++ {
		counts[p.Select(pool, request("/"), nil)]++
	}
	if counts[pool[0]] != 300 || counts[pool[1]] != 100 || counts[pool[2]] != 0 {
		t.Fatalf("sequential picks %d/%d/%d, want 300/100/0 (weight 0 takes none)", counts[pool[0]], counts[pool[1]], counts[pool[2]])
	}
}

func TestWeightedLeastConnSlowStart(t *testing.T) {
	p := &WeightedLeastConn{SlowStart: caddy.Duration(10 * time.Second), Clocks: t.Name()}
	provision(t, p)
	clock := time.Unix(1_000_000, 0)
	p.now = func() time.Time { return clock }
	pool := testPool(2)
	p.Select(pool, request("/"), nil) // first round: the initial upstreams are not ramped
	joined := append(pool, &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: "10.0.0.9:80"})
	share := func() float64 {
		n := 0
		for i := 0; i < 1000; i++ {
			if p.Select(joined, request("/"), nil) == joined[2] {
				n++
			}
		}
		return float64(n) / 1000
	}
	var prev float64
	for _, at := range []time.Duration{0, 3 * time.Second, 6 * time.Second, 11 * time.Second} {
		clock = time.Unix(1_000_000, 0).Add(at)
		got := share()
		f := p.ss.Factor(time.Unix(1_000_000, 0), clock)
		want := f / (2 + f)
		if got < want-0.01 || got > want+0.01 || got < prev {
			t.Fatalf("at %s the joining upstream took %.3f, want %.3f", at, got, want)
		}
		prev = got
	}
}

// TestStickyCookieEnvoyExpiry: an Envoy cookie's wall-clock expiry is enforced; an expiry
// that cannot be wall-clock time (before 2001: older Envoys wrote a monotonic clock) or none
// at all pins, and the cookie is re-issued with a real expiry.
func TestStickyCookieEnvoyExpiry(t *testing.T) {
	s := &StickyCookie{Format: formatEnvoy, TTL: caddy.Duration(time.Hour)}
	provision(t, s)
	clock := time.Unix(2_000_000_000, 0)
	s.now = func() time.Time { return clock }
	pool := testPool(3)
	try := func(v string) (*reverseproxy.Upstream, string) {
		r := request("/")
		r.Header.Set("Cookie", "lb_session="+v)
		w := httptest.NewRecorder()
		return s.Select(pool, r, w), setCookieValue(t, w, "lb_session")
	}
	// Expired a minute ago: a new session (the fallback may pick anything; the fresh cookie
	// must carry a future expiry).
	u, fresh := try(cookie.EncodeEnvoy(pool[1].Dial, clock.Add(-time.Minute)))
	if fresh == "" {
		t.Fatalf("an expired Envoy cookie still pinned %s without a new cookie", u.Dial)
	}
	if _, exp, _ := cookie.DecodeEnvoy(fresh); !exp.Equal(clock.Add(time.Hour)) {
		t.Fatalf("re-issued cookie expires at %v", exp)
	}
	if got := s.stats.repins.snapshot(nil)[reasonExpired]; got != 1 {
		t.Fatalf("expired re-pins %d", got)
	}
	// Valid for most of the ttl: a hit, nothing re-set.
	if u, fresh := try(cookie.EncodeEnvoy(pool[1].Dial, clock.Add(50*time.Minute))); u != pool[1] || fresh != "" {
		t.Fatalf("valid Envoy cookie: %v, re-set %q", u, fresh)
	}
	// A monotonic-clock expiry (12,345 s after boot) and no expiry: kept, re-issued.
	for _, v := range []string{cookie.EncodeEnvoy(pool[2].Dial, time.Unix(12345, 0)), base64.StdEncoding.EncodeToString([]byte(pool[2].Dial))} {
		u, fresh := try(v)
		if u != pool[2] {
			t.Fatalf("cookie without a wall-clock expiry did not pin: %v", u)
		}
		addr, exp, err := cookie.DecodeEnvoy(fresh)
		if err != nil || addr != pool[2].Dial || !exp.Equal(clock.Add(time.Hour)) {
			t.Fatalf("re-issued %q %v %v", addr, exp, err)
		}
	}
}

// TestAppCookieLearnCapsKeys: values over 8 KiB are neither learned nor hashed as keys.
func TestAppCookieLearnCapsKeys(t *testing.T) {
	a := &AppCookie{Name: "SID", Mode: appModeLearn, KeyedOptions: KeyedOptions{Table: t.Name()}}
	provision(t, a)
	pool := testPool(3)
	huge := strings.Repeat("v", 8<<10+1)
	r, hk := hookedRequest("")
	a.Select(pool, r, httptest.NewRecorder())
	hk.run(http.Header{"Set-Cookie": {"SID=" + huge + "; Path=/"}})
	r = request("/")
	r.Header.Set("Cookie", "SID="+huge)
	if a.Select(pool, r, httptest.NewRecorder()) == nil || a.core.table.Len() != 0 {
		t.Fatalf("a %d-byte value was kept: table holds %d", len(huge), a.core.table.Len())
	}
}

// TestAppCookiePrefixExpirySlides: a prefix lives for the policy's ttl (default 30m) from the
// upstream's last Set-Cookie of the cookie, not ten years.
func TestAppCookiePrefixExpirySlides(t *testing.T) {
	a := &AppCookie{Name: "JSESSIONID", SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
	provision(t, a)
	clock := time.Unix(2_000_000_000, 0)
	a.now = func() time.Time { return clock }
	pool := testPool(3)
	// visit sends value (if any), lets the upstream set setValue (if any), and returns the
	// upstream and the client's new cookie value.
	visit := func(value, setValue string) (*reverseproxy.Upstream, string) {
		cookie := ""
		if value != "" {
			cookie = "JSESSIONID=" + value
		}
		r, hk := hookedRequest(cookie)
		u := a.Select(pool, r, httptest.NewRecorder())
		h := http.Header{}
		if setValue != "" {
			h.Set("Set-Cookie", "JSESSIONID="+setValue+"; Path=/")
		}
		hk.run(h)
		v, _ := splitSetCookie(h.Get("Set-Cookie"))
		return u, v
	}
	u, v := visit("", "app-1")
	clock = clock.Add(20 * time.Minute)
	if got, _ := visit(v, ""); got != u {
		t.Fatalf("prefix not honoured within its ttl: %v, pinned to %v", got, u)
	}
	// The upstream sets the cookie again at 20 minutes: the prefix now lives to 50.
	_, v2 := visit(v, "app-1")
	clock = clock.Add(25 * time.Minute)
	if got, _ := visit(v2, ""); got != u {
		t.Fatalf("re-set prefix not honoured at 45 minutes: %v", got)
	}
	before := a.core.stats.repins.snapshot(nil)[reasonExpired]
	visit(v, "")
	if after := a.core.stats.repins.snapshot(nil)[reasonExpired]; after != before+1 {
		t.Fatalf("a prefix sealed 45 minutes ago was honoured (expired re-pins %d -> %d)", before, after)
	}
}

// TestStickyCookieCacheControl: a response that sets the LB cookie must not be stored by
// a shared cache (it would hand one client's pin to others).
func TestStickyCookieCacheControl(t *testing.T) {
	pool := testPool(3)
	respond := func(s *StickyCookie, cookieValue string, upstream []string, withHook bool) http.Header {
		r := request("/")
		if cookieValue != "" {
			r.Header.Set("Cookie", "lb_session="+cookieValue)
		}
		hk := &responseHook{r: r}
		if withHook {
			caddyhttp.SetVar(r.Context(), hookVarKey, hk)
		}
		w := httptest.NewRecorder()
		s.Select(pool, r, w)
		h := w.Header()
		for _, v := range upstream { // as Caddy copies the upstream's headers: added
			h.Add("Cache-Control", v)
		}
		hk.run(h)
		return h
	}
	s := &StickyCookie{SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
	provision(t, s)
	cases := []struct {
		upstream []string
		want     string
	}{
		{nil, "private"},
		{[]string{"public, max-age=60, s-maxage=600"}, "private, max-age=60"},
		{[]string{"max-age=60", "Public"}, "private, max-age=60"},
		{[]string{"no-store"}, "no-store"},
		{[]string{"private, max-age=5"}, "private, max-age=5"},
	}
	for _, tc := range cases {
		h := respond(s, "", tc.upstream, true)
		if got := strings.Join(h.Values("Cache-Control"), ", "); got != tc.want {
			t.Errorf("upstream %q: Cache-Control %q, want %q", tc.upstream, got, tc.want)
		}
	}
	// A hit sets no cookie and leaves the upstream's caching alone.
	w := httptest.NewRecorder()
	s.Select(pool, request("/"), w)
	v := setCookieValue(t, w, "lb_session")
	if h := respond(s, v, []string{"public, max-age=60"}, true); h.Get("Set-Cookie") != "" || h.Get("Cache-Control") != "public, max-age=60" {
		t.Errorf("hit: %q", h)
	}
	// Without the stickylb handler the response still says private (first).
	if h := respond(s, "", []string{"max-age=60"}, false); h.Values("Cache-Control")[0] != "private" {
		t.Errorf("without the handler: %q", h.Values("Cache-Control"))
	}
	// Configurable off.
	k := &StickyCookie{SecretOptions: SecretOptions{Secrets: []string{testSecret}}, KeepCacheControl: true}
	provision(t, k)
	if h := respond(k, "", []string{"public"}, true); h.Get("Cache-Control") != "public" {
		t.Errorf("keep_cache_control: %q", h.Values("Cache-Control"))
	}
}

// TestSecretSources: secrets from a file (first seals, all open), from the environment at
// provision, and the demo fallback, which warns.
func TestSecretSources(t *testing.T) {
	old, cur := "an-older-secret-0123456789abcdef-old", "the-current-secret-0123456789abcdef"
	oldCodec, _ := cookie.NewCodec([]byte(old))
	clock := time.Unix(2_000_000_000, 0)
	oldV, _ := oldCodec.Seal(cookie.Payload{Backend: "10.0.0.1:80", Issued: clock, Expires: clock.Add(time.Hour)}, "lb_session")
	path := filepath.Join(t.TempDir(), "secrets")
	if err := os.WriteFile(path, []byte("# rotated 2026-12\n"+cur+"\n\n"+old+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	c, err := (&SecretOptions{SecretFile: path}).codec(zap.New(core), "test")
	if err != nil {
		t.Fatal(err)
	}
	if p, err := c.Open(oldV, "lb_session", clock); err != nil || p.Backend != "10.0.0.1:80" {
		t.Fatalf("a cookie of the older secret: %v %v", p, err)
	}
	v, _ := c.Seal(cookie.Payload{Backend: "10.0.0.2:80", Issued: clock, Expires: clock.Add(time.Hour)}, "lb_session")
	curCodec, _ := cookie.NewCodec([]byte(cur))
	if _, err := curCodec.Open(v, "lb_session", clock); err != nil {
		t.Fatalf("the first line does not seal: %v", err)
	}
	t.Setenv("STICKYLB_TEST_SECRET", cur)
	if _, err := (&SecretOptions{Secrets: []string{"{env.STICKYLB_TEST_SECRET}"}}).codec(zap.New(core), "test"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []SecretOptions{{SecretFile: path, Secrets: []string{cur}}, {SecretFile: path + ".missing"}, {Secrets: []string{"{env.STICKYLB_TEST_UNSET}"}}} {
		if _, err := bad.codec(zap.New(core), "test"); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
	if logs.Len() != 0 {
		t.Fatalf("warnings without the demo secret: %v", logs.All())
	}
	demo := SecretOptions{Secrets: []string{"{env.STICKYLB_TEST_UNSET}"}, InsecureDemoSecret: true}
	if _, err := demo.codec(zap.New(core), "test"); err != nil || logs.FilterMessageSnippet("public demo secret").Len() != 1 {
		t.Fatalf("demo fallback: %v, logs %v", err, logs.All())
	}
	// With the variable set the demo flag changes nothing, and says nothing.
	demo.Secrets = []string{"{env.STICKYLB_TEST_SECRET}"}
	if c, err := demo.codec(zap.New(core), "test"); err != nil || logs.Len() != 1 {
		t.Fatalf("demo flag with a secret: %v %v", c, err)
	}
}

// TestWeightedLeastConnUniformTiesTakeTurns: with every upstream of weight 1, idle upstreams
// tie and take their turns in pool order, as the weighted scan's smooth round robin gives
// them (a static pool, and a fresh pool per request naming the same upstreams); one the
// request already tried is skipped.
func TestWeightedLeastConnUniformTiesTakeTurns(t *testing.T) {
	p := &WeightedLeastConn{}
	provision(t, p)
	pool := testPool(20) // more than the ties a scan remembers
	for i := 0; i < 60; i++ {
		src := pool
		if i%2 == 1 {
			src = freshPool(pool)
		}
		if got := p.Select(src, request("/"), nil); got.Dial != pool[i%20].Dial {
			t.Fatalf("pick %d went to %s, want %s", i, got.Dial, pool[i%20].Dial)
		}
	}
	for i := 0; i < 40; i++ {
		r := request("/")
		recordIn(requestVars(r), pool[0])
		if got := p.Select(pool, r, nil); got == nil || got.Dial == pool[0].Dial {
			t.Fatalf("a retry went back to %v", got)
		}
	}
}
