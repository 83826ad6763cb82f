package health

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
)

// httpBackend is a real HTTP server on 127.0.0.1 whose answer a test flips.
// ?code=N overrides the status; ?stream=1 sends an endless body.
type httpBackend struct {
	addr          string
	status        atomic.Int32
	hang          atomic.Bool
	inFlight      atomic.Int32
	requests      atomic.Int64
	newConns      atomic.Int64
	redirectHits  atomic.Int64
	streamedBytes atomic.Int64
	quit          chan struct{}

	mu     sync.Mutex
	hosts  []string
	closes []bool
}

func newHTTPBackend(t *testing.T) *httpBackend {
	t.Helper()
	b := &httpBackend{quit: make(chan struct{})}
	b.status.Store(200)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(b.serve))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			b.newConns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	// Runs before srv.Close: releases handlers that hang.
	t.Cleanup(func() { close(b.quit) })
	b.addr = strings.TrimPrefix(srv.URL, "http://")
	return b
}

func (b *httpBackend) serve(w http.ResponseWriter, r *http.Request) {
	b.requests.Add(1)
	b.mu.Lock()
	b.hosts = append(b.hosts, r.Host)
	b.closes = append(b.closes, r.Close)
	b.mu.Unlock()
	if r.URL.Path == "/redirect-target" {
		b.redirectHits.Add(1)
		w.WriteHeader(500)
		return
	}
	if b.hang.Load() {
		b.inFlight.Add(1)
		defer b.inFlight.Add(-1)
		select {
		case <-r.Context().Done():
		case <-b.quit:
		}
		return
	}
	code := int(b.status.Load())
	if q := r.URL.Query().Get("code"); q != "" {
		code, _ = strconv.Atoi(q)
	}
	if code >= 300 && code < 400 {
		w.Header().Set("Location", "/redirect-target")
	}
	w.WriteHeader(code)
	if r.URL.Query().Get("stream") != "" {
		chunk := make([]byte, 32<<10)
		// Bounded: stops when the client goes away, or after 64 MiB.
		for b.streamedBytes.Load() < 64<<20 {
			n, err := w.Write(chunk)
			b.streamedBytes.Add(int64(n))
			if err != nil || r.Context().Err() != nil {
				return
			}
		}
	}
}

func (b *httpBackend) seen() (hosts []string, closes []bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.hosts...), append([]bool(nil), b.closes...)
}

func probeHTTP(t *testing.T, cfg Config, addr string) (bool, string, time.Duration) {
	t.Helper()
	cfg = cfg.WithDefaults()
	if err := cfg.validate(shortestInterval); err != nil {
		t.Fatal(err)
	}
	p, err := newHTTPProber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now() // before the deadline is set: a probe ending at it took >= Timeout
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
	defer cancel()
	out, result := p.probe(ctx, addr)
	ok := out == passed
	return ok, result, time.Since(start)
}

func TestHTTPExpectedStatuses(t *testing.T) {
	b := newHTTPBackend(t)
	cases := []struct {
		code   int
		list   []int
		ranges []StatusRange
		want   bool
	}{
		{200, nil, nil, true},
		{204, nil, nil, true},
		{302, nil, nil, true}, // the redirect is the answer; not followed
		{399, nil, nil, true},
		{404, nil, nil, false},
		{503, nil, nil, false},
		{404, []int{404}, nil, true},
		{200, []int{204}, nil, false},
		{503, nil, []StatusRange{{500, 599}}, true},
		{201, []int{200}, []StatusRange{{202, 204}}, false},
		{203, []int{200}, []StatusRange{{202, 204}}, true},
	}
	for _, tc := range cases {
		cfg := Config{Protocol: HTTP, Path: "/status?code=" + strconv.Itoa(tc.code), Timeout: time.Second, ExpectStatus: tc.list, ExpectRanges: tc.ranges}
		ok, result, _ := probeHTTP(t, cfg, b.addr)
		if ok != tc.want || result != "http: status "+strconv.Itoa(tc.code) {
			t.Errorf("status %d with expect %v %v: ok=%v %q, want ok=%v", tc.code, tc.list, tc.ranges, ok, result, tc.want)
		}
	}
	if n := b.redirectHits.Load(); n != 0 {
		t.Errorf("the probe followed a redirect %d times", n)
	}
}

func TestHTTPHostHeaderAndFreshConnections(t *testing.T) {
	b := newHTTPBackend(t)
	for _, host := range []string{"", "health.internal"} {
		ok, result, _ := probeHTTP(t, Config{Protocol: HTTP, Path: "/healthz", Host: host, Timeout: time.Second}, b.addr)
		if !ok || result != "http: status 200" {
			t.Fatalf("probe with host %q: %v %q", host, ok, result)
		}
	}
	hosts, closes := b.seen()
	if len(hosts) != 2 || hosts[0] != b.addr || hosts[1] != "health.internal" {
		t.Errorf("Host headers seen %q, want [%s health.internal]", hosts, b.addr)
	}
	for i, c := range closes {
		if !c {
			t.Errorf("request %d did not ask to close the connection", i)
		}
	}
	if news, reqs := b.newConns.Load(), b.requests.Load(); news != reqs {
		t.Errorf("%d requests over %d connections: a connection was reused", reqs, news)
	}
}

func TestHTTPBodyDrainIsBounded(t *testing.T) {
	b := newHTTPBackend(t)
	cfg := Config{Protocol: HTTP, Path: "/big?stream=1", Timeout: 2 * time.Second}
	ok, result, took := probeHTTP(t, cfg, b.addr)
	if !ok || result != "http: status 200" {
		t.Fatalf("endless body: ok=%v %q", ok, result)
	}
	// The probe returns after maxBodyDrain bytes, not at the timeout.
	if took > time.Second {
		t.Errorf("probe of an endless body took %v", took)
	}
	t.Logf("endless body: probe returned in %v; server wrote %d bytes before the client closed", took, b.streamedBytes.Load())
}

func TestHTTPTimeout(t *testing.T) {
	b := newHTTPBackend(t)
	b.hang.Store(true)
	cfg := Config{Protocol: HTTP, Timeout: 150 * time.Millisecond}
	ok, result, took := probeHTTP(t, cfg, b.addr)
	if ok || result != "http: timeout" {
		t.Errorf("hanging backend: ok=%v %q, want http: timeout", ok, result)
	}
	if took < cfg.Timeout || took > cfg.Timeout+schedSlack {
		t.Errorf("timeout probe took %v, want %v (+%v)", took, cfg.Timeout, schedSlack)
	}
}

func TestHTTPRefusedAndPortOverride(t *testing.T) {
	b := newHTTPBackend(t)
	_, port, _ := net.SplitHostPort(b.addr)
	refused := loopback.Refused(t)
	ok, result, _ := probeHTTP(t, Config{Protocol: HTTP, Timeout: time.Second}, refused)
	if ok || result != "http: connection refused" {
		t.Errorf("closed port: ok=%v %q", ok, result)
	}
	// The traffic port is closed, the health port (Config.Port) serves.
	p, _ := strconv.Atoi(port)
	c, err := NewChecker(Config{Protocol: HTTP, Port: p, Interval: time.Second, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetTargets([]Target{{ID: "x", Address: refused}}); err != nil {
		t.Fatal(err)
	}
	ch, cancel := c.Subscribe(4)
	defer cancel()
	col := collect(ch)
	runChecker(t, c)
	tr, _ := col.waitTransition(t, firstProbeBound(c.Config())+schedSlack, 0, "x known", func(Transition) bool { return true })
	if !tr.Healthy || tr.Address != refused {
		t.Errorf("port override: %+v, want healthy via port %d", tr, p)
	}
}

// TestHTTPStatusFlip drives a Checker through 503 and back on a real server.
func TestHTTPStatusFlip(t *testing.T) {
	b := newHTTPBackend(t)
	cfg := Config{Protocol: HTTP, Path: "/healthz", Host: "svc", Interval: 100 * time.Millisecond, Timeout: 50 * time.Millisecond, HealthyThreshold: 2, UnhealthyThreshold: 2}
	c, err := NewChecker(cfg, AllowShortIntervals())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetTargets([]Target{{ID: "web-1", Address: b.addr}}); err != nil {
		t.Fatal(err)
	}
	ch, cancel := c.Subscribe(8)
	defer cancel()
	col := collect(ch)
	runChecker(t, c)
	bound := func(th int) time.Duration { return time.Duration(th)*cfg.Interval + cfg.Timeout + schedSlack }
	_, i := col.waitTransition(t, firstProbeBound(cfg)+schedSlack, 0, "healthy", func(tr Transition) bool { return tr.Healthy })
	b.status.Store(503)
	tr, i := col.waitTransition(t, bound(2), i+1, "unhealthy", func(tr Transition) bool { return !tr.Healthy })
	if tr.Reason != "http: status 503" || tr.From != Healthy {
		t.Errorf("down transition %+v", tr)
	}
	st, _ := c.Lookup("web-1")
	if st.State != Unhealthy || st.Reason != "http: status 503" || st.ConsecutiveFailures < 2 {
		t.Errorf("Lookup after 503: %+v", st)
	}
	b.status.Store(200)
	tr, _ = col.waitTransition(t, bound(2), i+1, "healthy again", func(tr Transition) bool { return tr.Healthy })
	if tr.Reason != "http: status 200" || tr.From != Unhealthy {
		t.Errorf("up transition %+v", tr)
	}
	hosts, _ := b.seen()
	for _, h := range hosts {
		if h != "svc" {
			t.Fatalf("a probe sent Host %q, want svc", h)
		}
	}
}
