package caddymodule

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds"
)

// The stickylb_xds source end to end: a real control plane (xds.Server with the health
// monitor `stickylb xds` runs, probing real backends) serving a pools file, and a real
// Caddy loaded from a Caddyfile with `dynamic stickylb_xds` and sticky_cookie, proxying to
// httptest backends.

const (
	// e2ePushSlack is what a verdict may take from the checker to Caddy's view: the
	// transition callback, one snapshot build, one ADS push and its decode (milliseconds on
	// an idle machine; 2 s covers two cores shared by a whole test run).
	e2ePushSlack = 2 * time.Second
	// e2eK new sessions per check: with at least two non-draining backends and picks at
	// worst uniformly random, a backend is missed by all of them with probability
	// (1/2)^40 < 1e-12, well below 1e-6 (weighted_least_conn's smooth round robin at light
	// load picks it within two).
	e2eK = 40
)

type e2eBackend struct {
	name string
	srv  *httptest.Server
}

func (b *e2eBackend) addr() string { return strings.TrimPrefix(b.srv.URL, "http://") }

func startE2EBackend(t *testing.T, name string) *e2eBackend {
	t.Helper()
	b := &e2eBackend{name: name}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			io.WriteString(w, name)
		}
	}))
	t.Cleanup(b.srv.Close)
	return b
}

// e2eControlPlane is `stickylb xds` in process: the server, its health monitor, gRPC.
type e2eControlPlane struct {
	srv  *xds.Server
	mon  *health.Monitor
	g    *grpc.Server
	addr string
	ctx  context.Context
	stop func()
	path string
}

func startE2EControlPlane(t *testing.T, yaml string) *e2eControlPlane {
	t.Helper()
	cp := &e2eControlPlane{path: filepath.Join(t.TempDir(), "pools.yaml")}
	f := cp.write(t, yaml)
	ctx, cancel := context.WithCancel(context.Background())
	cp.ctx = ctx
	log := zaptest.NewLogger(t)
	cp.mon = health.NewMonitor(func(service string, tr health.Transition) {
		cp.srv.RecordTransition(service, tr)
		if err := cp.srv.Refresh(); err != nil {
			t.Errorf("publishing a verdict: %v", err)
		}
	})
	cp.srv = xds.NewServer(ctx, f, func(svc string, b *pools.Backend) health.State { return cp.mon.View(svc, b.Identity()) }, log)
	if err := cp.mon.Apply(ctx, pools.HealthServices(f.Services)); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cp.addr = ln.Addr().String()
	cp.g = grpc.NewServer()
	cp.srv.Register(cp.g)
	go cp.g.Serve(ln)
	var once sync.Once
	cp.stop = func() { once.Do(func() { cp.g.Stop(); cp.mon.Stop(); cancel() }) }
	t.Cleanup(cp.stop)
	return cp
}

// write writes the pools file and loads it from disk, as `stickylb xds` reads it.
func (cp *e2eControlPlane) write(t *testing.T, yaml string) *pools.File {
	t.Helper()
	if err := os.WriteFile(cp.path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := pools.Load(cp.path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// edit rewrites the pools file and applies it as `stickylb xds` does on a change.
func (cp *e2eControlPlane) edit(t *testing.T, yaml string) {
	t.Helper()
	f := cp.write(t, yaml)
	if err := cp.srv.Update(f); err != nil {
		t.Fatal(err)
	}
	if err := cp.mon.Apply(cp.ctx, pools.HealthServices(f.Services)); err != nil {
		t.Fatal(err)
	}
}

// loadSite (re)loads the in-process Caddy with one site on port whose body is site (a
// reverse_proxy block): no admin endpoint, no persisted config, no HTTPS, no logs.
func loadSite(t *testing.T, port int, site string) {
	t.Helper()
	src := fmt.Sprintf(`{
	admin off
	persist_config off
	auto_https off
	log {
		output discard
	}
}
http://127.0.0.1:%d {
%s
}
`, port, site)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting the Caddyfile: %v", err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading Caddy: %v", err)
	}
}

// loadXDSCaddy loads a site proxying to service api of the control plane at server, with
// sticky_cookie.
func loadXDSCaddy(t *testing.T, port int, server string) {
	t.Helper()
	loadSite(t, port, fmt.Sprintf(`	reverse_proxy {
		dynamic stickylb_xds {
			server  %s
			service api
			node_id e2e/caddy
			allow_loopback
		}
		lb_policy sticky_cookie {
			secret {env.STICKYLB_XDS_TEST_SECRET}
		}
	}`, server))
}

// liveSub is the one subscription the test's Caddy holds, or nil.
func liveSub() *xdsSub {
	var s *xdsSub
	subPool.Range(func(_, v any) bool {
		s, _ = v.(*xdsSub)
		return s == nil
	})
	return s
}

// backendIn returns the backend dial of the live view, if there is one.
func backendIn(dial string) (xdsBackend, bool) {
	s := liveSub()
	if s == nil {
		return xdsBackend{}, false
	}
	v := s.view.Load()
	if v == nil || v.Services["api"] == nil {
		return xdsBackend{}, false
	}
	for _, b := range v.Services["api"].Backends {
		if b.Dial == dial {
			return b, true
		}
	}
	return xdsBackend{}, false
}

func TestXDSSourceEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a control plane probing 4 backends and Caddy, twice: about 2 s")
	}
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	t.Setenv("STICKYLB_XDS_TEST_SECRET", testSecret)
	b0, b1, b2 := startE2EBackend(t, "b0"), startE2EBackend(t, "b1"), startE2EBackend(t, "b2")
	dead := loopback.Refused(t) // nothing answers there
	entry := func(addr, extra string) string { return "address: " + addr + extra }
	cp := startE2EControlPlane(t, poolstest.API(entry(b0.addr(), ""), entry(b1.addr(), ""), entry(b2.addr(), ""), entry(dead, "")))

	port := loopback.FreePort(t)
	loadXDSCaddy(t, port, cp.addr)
	t.Cleanup(func() { _ = caddy.Stop() })

	client := &http.Client{Timeout: 10 * time.Second}
	// get sends one request, with cookie when given, and returns the backend's name and the
	// cookie Caddy set.
	get := func(cookie string) (string, string, error) {
		req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
		if cookie != "" {
			req.Header.Set("Cookie", cookie)
		}
		resp, err := client.Do(req)
		if err != nil {
			return "", "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", "", fmt.Errorf("status %d: %s", resp.StatusCode, body)
		}
		set := ""
		if c := resp.Cookies(); len(c) > 0 {
			set = c[0].Name + "=" + c[0].Value
		}
		return string(body), set, nil
	}
	// newSessions sends K requests without a cookie and returns where they went.
	newSessions := func() map[string]int {
		t.Helper()
		got := map[string]int{}
		for range e2eK {
			name, _, err := get("")
			if err != nil {
				t.Fatalf("a new session: %v", err)
			}
			got[name]++
		}
		return got
	}
	state := func(dial string) string {
		b, ok := backendIn(dial)
		if !ok {
			return "absent"
		}
		return fmt.Sprintf("%s drain=%v", b.Health, b.Drain)
	}
	// Startup: every verdict within the first probe spread and the checker's thresholds.
	startup := 2*poolstest.Interval + poolstest.Timeout + e2ePushSlack
	testwait.For(t, startup, "the first verdicts at Caddy", func() (bool, string) {
		ok := state(dead) == "unhealthy drain=false"
		for _, b := range []*e2eBackend{b0, b1, b2} {
			ok = ok && state(b.addr()) == "healthy drain=false"
		}
		return ok, fmt.Sprintf("dead %s, b0 %s", state(dead), state(b0.addr()))
	})

	// Only healthy backends get requests; every one of them does.
	got := newSessions()
	if len(got) != 3 || got["b0"] == 0 || got["b1"] == 0 || got["b2"] == 0 {
		t.Fatalf("new sessions went to %v, want b0, b1 and b2", got)
	}
	var cookieB1 string
	testwait.For(t, 5*time.Second, "a session pinned to b1", func() (bool, string) {
		name, set, err := get("")
		if err == nil && name == "b1" && set != "" {
			cookieB1 = set
		}
		return cookieB1 != "", fmt.Sprint(name, err)
	})

	// Drain b1: its pinned session stays, new sessions go elsewhere.
	cp.edit(t, poolstest.API(entry(b0.addr(), ""), entry(b1.addr(), ", drain: true"), entry(b2.addr(), ""), entry(dead, "")))
	took := testwait.For(t, 2*time.Second, "b1 draining at Caddy", func() (bool, string) {
		return state(b1.addr()) == "healthy drain=true", state(b1.addr())
	})
	t.Logf("drain reached Caddy in %s", took)
	pinned := func() {
		t.Helper()
		for range 10 {
			if name, _, err := get(cookieB1); err != nil || name != "b1" {
				t.Fatalf("the session pinned to draining b1 went to %q (%v)", name, err)
			}
		}
	}
	pinned()
	if got := newSessions(); got["b1"] != 0 || got["b0"] == 0 || got["b2"] == 0 {
		t.Fatalf("new sessions with b1 draining went to %v", got)
	}

	// Kill b2: Caddy stops sending new sessions to it once the control plane's checker
	// has seen unhealthy_threshold failures and pushed the verdict.
	b2.srv.Close()
	bound := poolstest.Interval*poolstest.Unhealthy + poolstest.Timeout + e2ePushSlack
	took = testwait.For(t, bound, "b2 unhealthy at Caddy", func() (bool, string) {
		return strings.HasPrefix(state(b2.addr()), "unhealthy"), state(b2.addr())
	})
	t.Logf("a killed backend left Caddy's view in %s (bound %s = interval x unhealthy_threshold + timeout + push slack)", took, bound)
	if got := newSessions(); len(got) != 1 || got["b0"] != e2eK {
		t.Fatalf("new sessions after b2 died went to %v, want b0 only", got)
	}

	// Add b3 by editing the pools file: within 2 s new sessions reach it.
	b3 := startE2EBackend(t, "b3")
	edited := time.Now()
	cp.edit(t, poolstest.API(entry(b0.addr(), ""), entry(b1.addr(), ", drain: true"), entry(b2.addr(), ""), entry(dead, ""), entry(b3.addr(), "")))
	sent := 0
	took = testwait.For(t, 2*time.Second, "a new session on added b3", func() (bool, string) {
		if _, ok := backendIn(b3.addr()); !ok {
			return false, "b3 not in the view"
		}
		sent++
		if sent > e2eK {
			t.Fatalf("%d new sessions after b3 reached the view, none on it", e2eK)
		}
		name, _, err := get("")
		return err == nil && name == "b3", fmt.Sprint(name, err)
	})
	t.Logf("an added backend took its first new session %s after the edit (%d requests after it reached the view)", time.Since(edited).Round(time.Millisecond), sent)
	_ = took

	// Stop the control plane: Caddy keeps serving its last view.
	cp.stop()
	testwait.For(t, 10*time.Second, "Caddy notices the control plane is gone", func() (bool, string) {
		return !liveSub().client.Connected(), "still connected"
	})
	survive := func(when string) {
		t.Helper()
		pinned()
		if got := newSessions(); got["b1"]+got["b2"] != 0 || got["b0"] == 0 || got["b3"] == 0 {
			t.Fatalf("%s: new sessions went to %v, want b0 and b3", when, got)
		}
	}
	survive("control plane down")

	// Restart Caddy while the control plane is down: it serves the saved view.
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	if liveSub() != nil {
		t.Fatal("the subscription outlived every config using it")
	}
	loadXDSCaddy(t, port, cp.addr)
	s := liveSub()
	if s == nil || s.view.Load() == nil || s.client.Connected() || !s.client.LastUpdate().IsZero() {
		t.Fatal("restarted Caddy: want a subscription serving the saved view, never connected")
	}
	survive("Caddy restarted with the control plane down")
}
