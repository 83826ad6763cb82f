package caddymodule

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestAppCookiePrefixCacheControl: in prefix mode the LB rewrites the upstream's
// Set-Cookie with its own sealed prefix, so the response sets an LB cookie: as
// sticky_cookie's, it must not be stored by a shared cache (one client's pin and session
// handed to another), unless keep_cache_control. Learn mode sets nothing of the LB's and
// leaves the upstream's caching alone.
func TestAppCookiePrefixCacheControl(t *testing.T) {
	pool := testPool(3)
	// respond runs one request through a: Select, then the upstream's answer (its
	// Set-Cookie lines and Cache-Control lines, added as Caddy copies them), then the hook.
	respond := func(a *AppCookie, cookie string, setCookie, upstream []string) http.Header {
		r, hk := hookedRequest(cookie)
		w := httptest.NewRecorder()
		if a.Select(pool, r, w) == nil {
			t.Fatal("no upstream")
		}
		h := w.Header()
		for _, v := range setCookie {
			h.Add("Set-Cookie", v)
		}
		for _, v := range upstream {
			h.Add("Cache-Control", v)
		}
		hk.run(h)
		return h
	}
	cacheControl := func(h http.Header) string { return strings.Join(h.Values("Cache-Control"), ", ") }
	a := &AppCookie{Name: "JSESSIONID", SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
	provision(t, a)
	issue := []string{"JSESSIONID=app-1; Path=/; HttpOnly"}
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
	var prefixed string
	for _, tc := range cases {
		h := respond(a, "", issue, tc.upstream)
		if !strings.Contains(h.Get("Set-Cookie"), "~app-1;") {
			t.Fatalf("the upstream's cookie was not prefixed: %q", h.Get("Set-Cookie"))
		}
		prefixed, _ = splitSetCookie(h.Get("Set-Cookie"))
		if got := cacheControl(h); got != tc.want {
			t.Errorf("upstream %q: Cache-Control %q, want %q", tc.upstream, got, tc.want)
		}
	}
	// A request with the cookie whose response sets none, or deletes it (not prefixed),
	// sets no LB cookie: the upstream's caching stands.
	for _, sc := range [][]string{nil, {"other=1; Path=/"}, {"JSESSIONID=; Max-Age=0"}} {
		if h := respond(a, "JSESSIONID="+prefixed, sc, []string{"public, max-age=60"}); cacheControl(h) != "public, max-age=60" {
			t.Errorf("response setting %q: Cache-Control %q", sc, cacheControl(h))
		}
	}
	// Configurable off.
	k := &AppCookie{Name: "JSESSIONID", SecretOptions: SecretOptions{Secrets: []string{testSecret}}, KeepCacheControl: true}
	provision(t, k)
	if h := respond(k, "", issue, []string{"public, s-maxage=600"}); cacheControl(h) != "public, s-maxage=600" {
		t.Errorf("keep_cache_control: %q", cacheControl(h))
	}
	// Learn mode: the upstream's own cookie, untouched, and its caching too.
	l := &AppCookie{Name: "JSESSIONID", Mode: appModeLearn, KeyedOptions: KeyedOptions{Table: t.Name()}}
	provision(t, l)
	if h := respond(l, "", issue, []string{"public, max-age=60"}); cacheControl(h) != "public, max-age=60" || h.Get("Set-Cookie") != issue[0] {
		t.Errorf("learn mode: Set-Cookie %q, Cache-Control %q", h.Get("Set-Cookie"), cacheControl(h))
	}
}

// TestAppCookieKeepCacheControlOption: the Caddyfile's keep_cache_control reaches the JSON
// config, and learn mode, which sets no cookie of the LB's, refuses it.
func TestAppCookieKeepCacheControlOption(t *testing.T) {
	sp, err := adapt(t, "app_cookie JSESSIONID {\n secret "+testSecret+"\n keep_cache_control\n}")
	if err != nil {
		t.Fatal(err)
	}
	if sp["keep_cache_control"] != true {
		t.Fatalf("keep_cache_control not in the config: %v", sp)
	}
	if _, err := adapt(t, "app_cookie JSESSIONID {\n keep_cache_control yes\n}"); err == nil {
		t.Error("keep_cache_control with an argument: no error")
	}
	l := &AppCookie{Name: "JSESSIONID", Mode: appModeLearn, KeepCacheControl: true, KeyedOptions: KeyedOptions{Table: t.Name()}}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := l.Provision(ctx); err == nil || !strings.Contains(err.Error(), "keep_cache_control") {
		t.Errorf("learn mode with keep_cache_control: %v", err)
	}
}
