package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/stickylb/stickylb/internal/testkit/testwait"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/policies/sessions"
	"github.com/stickylb/stickylb/policies/status"
)

// statusFreePort returns a loopback port nothing listens on right now.
func statusFreePort(t *testing.T) int {
	t.Helper()
	return loopback.FreePort(t)
}

// statusBackend is a real HTTP server on loopback answering with its name.
func statusBackend(t *testing.T, name string) (addr string, kill func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, name) }),
		ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), func() { srv.Close() }
}

// runCaddyfile runs Caddy with the Caddyfile cf until the test ends.
func runCaddyfile(t *testing.T, cf string) {
	t.Helper()
	cfgJSON, warn, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), nil)
	if err != nil {
		t.Fatalf("adapting: %v %v", err, warn)
	}
	if err := caddy.Load(cfgJSON, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
}

// statusWait polls cond every 20ms until it holds or within passes.
func statusWait(t *testing.T, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	testwait.Until(t, within, 20*time.Millisecond, what, cond)
}

func statusDo(t *testing.T, method, url, body string, hdr ...string) (int, string) {
	t.Helper()
	return statusDoHost(t, method, url, "", body, hdr...)
}

// statusDoHost is statusDo with the Host header host (the URL's when empty).
func statusDoHost(t *testing.T, method, url, host, body string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func statusSnap(t *testing.T, url string) status.Snapshot {
	t.Helper()
	code, body := statusDo(t, "GET", url, "")
	if code != 200 {
		t.Fatalf("GET %s: %d %s", url, code, body)
	}
	var s status.Snapshot
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("GET %s: %v in %s", url, err, body)
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	return s
}

func backendByID(s status.Service, id string) *status.Backend {
	for i := range s.Backends {
		if s.Backends[i].ID == id {
			return &s.Backends[i]
		}
	}
	return nil
}

// TestStatusHandlerLive runs a real Caddy config (from a Caddyfile, so the directive and its
// order are exercised) with a sticky_cookie proxy over three real backends and a status
// site, then reads the JSON, kills a backend, drains another from the status endpoint and
// checks what is refused.
func TestStatusHandlerLive(t *testing.T) {
	a1, _ := statusBackend(t, "b1")
	a2, _ := statusBackend(t, "b2")
	a3, kill3 := statusBackend(t, "b3")
	proxyPort, statusPort, adminPort := statusFreePort(t), statusFreePort(t), statusFreePort(t)
	cf := fmt.Sprintf(`{
	admin localhost:%d
	auto_https off
	skip_install_trust
	http_port %d
}
:%d {
	stickylb
	reverse_proxy %s %s %s {
		lb_policy sticky_cookie {
			secret status-test-secret-0123456789abcdef
			fallback weighted_least_conn 3 1 1
		}
		health_uri /
		health_interval 100ms
		health_timeout 1s
	}
}
:%d {
	stickylb_status
}
`, adminPort, proxyPort, proxyPort, a1, a2, a3, statusPort)
	runCaddyfile(t, cf)
	base := fmt.Sprintf("http://127.0.0.1:%d/", statusPort)
	proxy := fmt.Sprintf("http://127.0.0.1:%d/", proxyPort)

	// The page at the root, with its CSP; nothing at other paths.
	code, body := statusDo(t, "GET", base, "")
	if code != 200 || !strings.Contains(body, "stickylb status") {
		t.Fatalf("GET /: %d %.80q", code, body)
	}
	if code, _ := statusDo(t, "GET", base+"other", ""); code != 404 {
		t.Fatalf("GET /other: %d, want 404", code)
	}
	if code, _ := statusDo(t, "GET", base+"drain", ""); code != 405 {
		t.Fatalf("GET /drain: %d, want 405", code)
	}

	// Traffic: new sessions (misses) are counted.
	for i := 0; i < 5; i++ {
		if code, b := statusDo(t, "GET", proxy, ""); code != 200 {
			t.Fatalf("proxy: %d %s", code, b)
		}
	}
	s := statusSnap(t, base+"status.json")
	if s.Tier != status.TierCaddy || len(s.Services) != 2-1 {
		t.Fatalf("snapshot: tier %q, %d services, want caddy and 1", s.Tier, len(s.Services))
	}
	svc := s.Services[0]
	if svc.Name != fmt.Sprintf(":%d", proxyPort) || svc.Policy != "sticky_cookie" || svc.Balance != "weighted_least_conn" ||
		svc.Affinity.Mode != "cookie" || !svc.Affinity.Stateless || svc.Affinity.TTL != "30m0s" {
		t.Fatalf("service: %+v", svc)
	}
	if svc.Load.Sessions != nil || svc.Load.SessionsNote == "" {
		t.Fatalf("stateless cookies: sessions %v, note %q; want n/a and why", svc.Load.Sessions, svc.Load.SessionsNote)
	}
	if svc.Load.NewSessionsTotal == nil || *svc.Load.NewSessionsTotal != 5 {
		t.Fatalf("new sessions total %v, want 5", svc.Load.NewSessionsTotal)
	}
	if !svc.HealthCheck.Active || svc.HealthCheck.Bound != "1.1s" {
		t.Fatalf("health check: %+v, want active, bound 100ms x 1 + 1s", svc.HealthCheck)
	}
	if len(svc.Backends) != 3 {
		t.Fatalf("backends: %+v", svc.Backends)
	}
	for i, id := range []string{a1, a2, a3} {
		b := svc.Backends[i]
		if b.ID != id || b.Health.State != status.Healthy || b.Draining || b.InFlight == nil || *b.InFlight != 0 ||
			b.Health.LastCheck != nil || b.Sessions != nil {
			t.Fatalf("backend %d: %+v", i, b)
		}
		want := []float64{3, 1, 1}[i]
		if b.Weight == nil || *b.Weight != want || b.EffectiveWeight == nil || *b.EffectiveWeight != want {
			t.Fatalf("backend %s: weight %v effective %v, want %v", id, b.Weight, b.EffectiveWeight, want)
		}
	}
	if svc.Panic.Active {
		t.Fatalf("panic with three healthy backends")
	}
	// The same JSON on the admin API, for tools.
	as := statusSnap(t, fmt.Sprintf("http://localhost:%d/stickylb/status.json", adminPort))
	if len(as.Services) != 1 || len(as.Services[0].Backends) != 3 {
		t.Fatalf("admin status: %+v", as)
	}

	// Kill b3: Caddy's active check marks it down, and the event gives the time.
	killedAt := time.Now()
	kill3()
	// The killed backend refuses at once; the bound (interval x fails + timeout) plus 2 s.
	statusWait(t, 1100*time.Millisecond+2*time.Second, "b3 unhealthy in status.json", func() (bool, string) {
		b := backendByID(statusSnap(t, base+"status.json").Services[0], a3)
		return b.Health.State == status.Unhealthy && b.Health.Since != nil, fmt.Sprintf("%+v", b.Health)
	})
	b3 := backendByID(statusSnap(t, base+"status.json").Services[0], a3)
	if b3.Health.Since.Before(killedAt.Add(-time.Second)) || b3.Health.Since.After(time.Now()) ||
		!strings.Contains(b3.Health.Reason, "active health check") || *b3.EffectiveWeight != 0 {
		t.Fatalf("b3: %+v, effective %v", b3.Health, *b3.EffectiveWeight)
	}
	var ups struct {
		Upstreams []UpstreamHealth `json:"upstreams"`
	}
	_, ub := statusDo(t, "GET", fmt.Sprintf("http://localhost:%d/stickylb/upstreams", adminPort), "")
	if err := json.Unmarshal([]byte(ub), &ups); err != nil || len(ups.Upstreams) != 3 || ups.Upstreams[2].Health != status.Unhealthy ||
		ups.Upstreams[0].Health != status.Healthy {
		t.Fatalf("GET /stickylb/upstreams: %v %s", err, ub)
	}

	// Drain: refused without the header or cross-origin; 400 on a malformed address.
	body2 := `{"upstream":"` + a2 + `"}`
	for name, hdr := range map[string][]string{
		"no header":    {"Content-Type", "application/json"},
		"cross-site":   {status.CSRFHeader, "1", "Sec-Fetch-Site", "cross-site", "Origin", "http://evil.example"},
		"other origin": {status.CSRFHeader, "1", "Origin", "http://evil.example"},
	} {
		if code, b := statusDo(t, "POST", base+"drain", body2, hdr...); code != 403 {
			t.Fatalf("%s: %d %s, want 403", name, code, b)
		}
	}
	if drains.drained(a2) {
		t.Fatalf("a refused POST drained %s", a2)
	}
	for _, bad := range []string{`{"upstream":"localhost"}`, `{"upstream":"a:b:c"}`, `{"upstream":"{http.x}:1"}`, `{}`, `nope`} {
		code, b := statusDo(t, "POST", base+"drain", bad, status.CSRFHeader, "1")
		if code != 400 || !strings.Contains(b, "drain:") {
			t.Fatalf("%s: %d %q, want 400 with a message", bad, code, b)
		}
	}
	if code, b := statusDo(t, "POST", base+"drain", `{"upstream":"127.0.0.1:1"}`, status.CSRFHeader, "1"); code != 404 {
		t.Fatalf("unknown upstream: %d %s", code, b)
	}
	code, b := statusDo(t, "POST", base+"drain", body2, status.CSRFHeader, "1", "Sec-Fetch-Site", "same-origin",
		"Origin", fmt.Sprintf("http://127.0.0.1:%d", statusPort))
	if code != 200 || !drains.drained(a2) {
		t.Fatalf("same-origin drain: %d %s", code, b)
	}
	t.Cleanup(func() { drains.undrain(a2) })
	b2 := backendByID(statusSnap(t, base+"status.json").Services[0], a2)
	if !b2.Draining || b2.DrainedSince == nil || *b2.EffectiveWeight != 0 || b2.Health.State != status.Healthy {
		t.Fatalf("drained b2: %+v", b2)
	}
	// Only b1 is left for new sessions; with b1 drained too the service is in panic.
	if code, b := statusDo(t, "POST", base+"drain", `{"upstream":"`+a1+`"}`, status.CSRFHeader, "1"); code != 200 {
		t.Fatalf("drain b1: %d %s", code, b)
	}
	t.Cleanup(func() { drains.undrain(a1) })
	if p := statusSnap(t, base+"status.json").Services[0].Panic; !p.Active || p.Note == "" {
		t.Fatalf("panic = %+v with b1, b2 drained and b3 down", p)
	}
	if code, b := statusDo(t, "POST", base+"undrain", `{"upstream":"`+a1+`"}`, status.CSRFHeader, "1"); code != 200 || drains.drained(a1) {
		t.Fatalf("undrain b1: %d %s", code, b)
	}
	// The admin API's drain says whether the running config has the upstream, and refuses
	// what is not an address.
	adminUp := fmt.Sprintf("http://localhost:%d/stickylb/upstreams/", adminPort)
	if code, b := statusDo(t, "POST", adminUp+a1+"/drain", "", status.CSRFHeader, "1"); code != 200 || !strings.Contains(b, `"in_config":true`) || !drains.drained(a1) {
		t.Fatalf("admin drain of b1: %d %s, want 200 with in_config true", code, b)
	}
	if code, b := statusDo(t, "POST", adminUp+a1+"/undrain", "", status.CSRFHeader, "1"); code != 200 || drains.drained(a1) {
		t.Fatalf("admin undrain of b1: %d %s", code, b)
	}
	if code, b := statusDo(t, "POST", adminUp+"localhost/drain", "", status.CSRFHeader, "1"); code != 400 || !strings.Contains(b, "HOST:PORT") {
		t.Fatalf("admin drain of a host without a port: %d %s, want 400 with the reason", code, b)
	}
}

func TestStatusCheckUpstreamAddress(t *testing.T) {
	for a, ok := range map[string]bool{
		"localhost:9001": true, "10.0.0.1:80": true, "[::1]:443": true, "unix//run/app.sock": true,
		"localhost": false, "localhost:0": false, "a:1-3": false, "{env.X}:1": false, ":80": false, "a:b:c": false,
	} {
		if err := checkUpstreamAddress(a); (err == nil) != ok {
			t.Errorf("%q: %v, want ok %v", a, err, ok)
		}
	}
}

func TestStatusRate(t *testing.T) {
	now := time.Unix(1000, 0)
	st := newStatusState(func() time.Time { return now })
	stats := acquireScope("status-rate-test")
	defer releaseScope("status-rate-test")
	if _, ok := st.rate("status-rate-test", 0, now); ok {
		t.Fatal("a rate before any sample")
	}
	st.sample()
	for i := 0; i < 30; i++ {
		stats.misses.Add(1)
	}
	stats.repins.add(reasonExpired)
	now = now.Add(2 * time.Second)
	r, ok := st.rate("status-rate-test", newSessions(stats), now)
	if !ok || r != 15.5 {
		t.Fatalf("rate = %v %v, want 31 new sessions over 2 s", r, ok)
	}
	for i := 0; i < 10; i++ {
		now = now.Add(time.Second)
		st.sample()
	}
	if got := len(st.samples["status-rate-test"]); got > int(rateWindow/time.Second)+1 {
		t.Fatalf("%d samples kept, want at most the window's", got)
	}
}

// A keyed policy with a table: the service's sessions are the table's live mappings, and the
// weights are those of its weighted_least_conn fallback; without a table nothing is counted.
func TestStatusKeyedPolicyService(t *testing.T) {
	const name = "status-test-table"
	tbl, err := acquireTable(name, "sticky_url", t.Name(), sessions.Config{TTL: time.Minute, MaxEntries: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer releaseTable(tbl, name, t.Name())
	tbl.Put("k1", "a:1")
	tbl.Put("k2", "b:1")
	p := &StickyURL{Query: "sid"}
	p.core.table, p.core.tableKey, p.core.scope = tbl, name, name
	p.core.stats = acquireScope(name)
	defer releaseScope(name)
	p.core.stats.misses.Add(2)
	p.core.fallback = &WeightedLeastConn{Weights: []int{2}}
	h := &reverseproxy.Handler{
		LoadBalancing: &reverseproxy.LoadBalancing{SelectionPolicy: p},
		Upstreams:     reverseproxy.UpstreamPool{{Dial: "a:1"}, {Dial: "b:1"}},
	}
	svc := serviceStatus("x", proxyRef{h: h, server: "srv0"}, nil, map[string]time.Time{}, time.Now())
	if svc.Policy != "sticky_url" || svc.Balance != "weighted_least_conn" || svc.Affinity.Mode != "url" || svc.Affinity.Stateless ||
		svc.Affinity.TTL != "1m0s" {
		t.Fatalf("service: %+v", svc)
	}
	if svc.Load.Sessions == nil || *svc.Load.Sessions != 2 || svc.Load.SessionsCapacity == nil || *svc.Load.SessionsCapacity != 100 ||
		!strings.Contains(svc.Load.SessionsNote, name) {
		t.Fatalf("load: %+v", svc.Load)
	}
	if svc.Load.NewSessionsTotal == nil || *svc.Load.NewSessionsTotal != 2 || svc.Load.NewSessionsPerSec != nil {
		t.Fatalf("new sessions %v, rate %v: want 2 and n/a (no status handler samples them)", svc.Load.NewSessionsTotal, svc.Load.NewSessionsPerSec)
	}
	for i, want := range []float64{2, 1} {
		b := svc.Backends[i]
		if *b.Weight != want || *b.EffectiveWeight != want || b.InFlight != nil || b.Health.State != status.Healthy {
			t.Fatalf("backend %d: %+v", i, b)
		}
	}
	if svc.Load.InFlight != nil {
		t.Fatalf("service in flight %d though the backends' counts are unknown", *svc.Load.InFlight)
	}

	q := &StickyHeader{Name: "X-Session"}
	q.core.scope = "status-test-notable"
	h.LoadBalancing.SelectionPolicy = q
	svc = serviceStatus("y", proxyRef{h: h, server: "srv0"}, nil, nil, time.Now())
	if svc.Load.Sessions != nil || svc.Load.SessionsNote != noteNoTable || svc.Backends[0].Weight != nil || svc.Repins != nil {
		t.Fatalf("no_table service: %+v", svc)
	}
}

// An upstream that joins a weighted_least_conn pool with slow start ramps: the status shows
// the ramp (since when, the window, the share) and the effective weight new sessions see,
// the policy's own weight × its slow-start factor, whether the policy picks directly or as
// a sticky policy's fallback; the upstreams of the first config do not ramp, and the ramp
// ends with its window.
func TestStatusCaddySlowStart(t *testing.T) {
	p := &WeightedLeastConn{Weights: []int{2, 1, 4}, SlowStart: caddy.Duration(10 * time.Second), Clocks: t.Name()}
	provision(t, p)
	t0 := time.Unix(1_000_000, 0)
	clock := t0
	p.now = func() time.Time { return clock }
	pool := testPool(2)
	p.Select(pool, request("/"), nil) // the first config's upstreams: no ramp
	joined := append(pool, &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: "10.0.0.9:80"})
	p.Select(joined, request("/"), nil) // the joiner's ramp starts at t0
	q := &StickyURL{Query: "sid"}
	q.core.fallback = p
	for _, sel := range []reverseproxy.Selector{p, q} {
		h := &reverseproxy.Handler{LoadBalancing: &reverseproxy.LoadBalancing{SelectionPolicy: sel}, Upstreams: joined}
		at := t0.Add(3 * time.Second)
		svc := serviceStatus("x", proxyRef{h: h, server: "srv0"}, nil, nil, at)
		for i, b := range svc.Backends[:2] {
			if b.SlowStart != nil || *b.EffectiveWeight != *b.Weight {
				t.Fatalf("%T: first-config backend %d: slow start %+v, effective %v of %v; want no ramp", sel, i, b.SlowStart, *b.EffectiveWeight, *b.Weight)
			}
		}
		b := svc.Backends[2]
		f := p.ss.Factor(t0, at)
		if f <= 0 || f >= 1 {
			t.Fatalf("the ramp's factor 3 s into a 10 s window is %v", f)
		}
		if ss := b.SlowStart; ss == nil || !ss.Since.Equal(t0) || ss.Window != "10s" || ss.Factor != f {
			t.Fatalf("%T: joining backend's slow start %+v, want since %v, window 10s, factor %v", sel, b.SlowStart, t0, f)
		}
		if *b.Weight != 4 || *b.EffectiveWeight != 4*f {
			t.Fatalf("%T: joining backend: weight %v, effective %v; want 4 and 4 × %v", sel, *b.Weight, *b.EffectiveWeight, f)
		}
		// Past the window: no ramp, the full weight.
		b = serviceStatus("x", proxyRef{h: h, server: "srv0"}, nil, nil, t0.Add(11*time.Second)).Backends[2]
		if b.SlowStart != nil || *b.EffectiveWeight != 4 {
			t.Fatalf("%T: joining backend after the window: slow start %+v, effective %v", sel, b.SlowStart, *b.EffectiveWeight)
		}
	}
}
