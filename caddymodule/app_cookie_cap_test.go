package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestAppCookieLearnCapsNewSessionsPerClient: learn mode learns at most max_new_per_client
// new values a minute from one client address; other clients keep their own bound, and a
// value the request carried (the application re-setting its session) is learned whatever
// the bound. Prefix mode, which learns nothing, refuses the option.
func TestAppCookieLearnCapsNewSessionsPerClient(t *testing.T) {
	pool := testPool(3)
	a := &AppCookie{Name: "SID", Mode: appModeLearn, MaxNewPerClient: 3, KeyedOptions: KeyedOptions{Table: t.Name()}}
	provision(t, a)
	// respond runs a request from client ip, carrying cookie, whose upstream sets value.
	respond := func(ip, cookie, value string) {
		r, hk := hookedRequest(cookie)
		caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, ip)
		if a.Select(pool, r, httptest.NewRecorder()) == nil {
			t.Fatal("no upstream")
		}
		hk.run(http.Header{"Set-Cookie": {"SID=" + value + "; Path=/"}})
	}
	entries := func() int { return a.core.table.Stats().Entries }
	for i := range 5 {
		respond("192.0.2.1", "", fmt.Sprintf("a-%d", i))
	}
	if got := entries(); got != 3 {
		t.Fatalf("one client's 5 new sessions: %d learned, want 3", got)
	}
	respond("2001:db8::1", "", "b-0")
	if got := entries(); got != 4 {
		t.Fatalf("another client's first session not learned (%d entries)", got)
	}
	a.core.table.Delete("a-0")
	respond("192.0.2.1", "SID=a-0", "a-0") // the session the request carried, set again
	if got := entries(); got != 4 {
		t.Fatalf("a session the request carried was not learned again over the bound (%d entries)", got)
	}
	if got := a.core.stats.capped.Load(); got != 2 {
		t.Fatalf("%d capped, want 2", got)
	}
	p := &AppCookie{Name: "SID", MaxNewPerClient: 3, SecretOptions: SecretOptions{Secrets: []string{testSecret}}}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := p.Provision(ctx); err == nil || !strings.Contains(err.Error(), "max_new_per_client") {
		t.Errorf("prefix mode with max_new_per_client: %v", err)
	}
}
