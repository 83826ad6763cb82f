package caddymodule

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/stickylb/stickylb/policies/status"
)

// The status model of the Caddy tier (policies/status): every reverse_proxy handler of the
// running config is a service, read from what Caddy and stickylb keep anyway (Caddy's
// upstream state, the drain set, session tables, scope counters, slow-start clocks) at the
// moment a page or tool asks. Only two things are kept for it: the time of each upstream's
// last health change (Caddy's healthy/unhealthy events, which carry it) and a short history
// of new-session counters for a per-second rate. Both live in statusPool while a
// stickylb_status handler exists, so they survive reloads like the session tables.

// statusPool holds the one *statusState under statusPoolKey, refcounted by status handlers.
var statusPool = caddy.NewUsagePool()

const statusPoolKey = "status"

// Notes the Caddy tier always shows: what Caddy cannot tell.
const (
	noteNoCheckTimes = "Caddy does not report when it last probed an upstream, nor why a probe failed: " +
		"last check shows n/a; reason shows which mechanism marks an upstream down where that can be told."
	noteInFlight = "In flight counts Caddy's requests to the upstream's address from every handler " +
		"(Caddy keeps one counter per address)."
	panicNoteCaddy = "no upstream is healthy and not draining: Caddy answers these requests with an error " +
		"(it does not fail open)"
	noteStateless = "sessions live in sealed cookies held by the clients, so they cannot be counted; " +
		"new sessions per second are shown instead"
	noteNoTable = "no session table (no_table): the key's consistent hash alone pins sessions, so none are counted"
	noteDynamic = "dynamic upstreams: Caddy resolves them per request, so they cannot be listed here"
)

// rateWindow is how far back the new-sessions rate looks.
const rateWindow = 5 * time.Second

// statusState is what the status page keeps between requests.
type statusState struct {
	mu      sync.Mutex
	changes map[healthKey]healthChange
	samples map[string][]counterSample // by scope, oldest first, within rateWindow
	stop    chan struct{}
	now     func() time.Time
}

// healthKey names an upstream as one handler checks it: Caddy keeps active health per
// handler (two handlers may probe one address differently).
type healthKey struct {
	origin any // the *reverseproxy.Handler that emitted the event
	host   string
}

type healthChange struct {
	healthy bool
	at      time.Time
}

type counterSample struct {
	at    time.Time
	total uint64
}

func newStatusState(now func() time.Time) *statusState {
	return &statusState{
		changes: map[healthKey]healthChange{},
		samples: map[string][]counterSample{},
		stop:    make(chan struct{}),
		now:     now,
	}
}

// acquireStatusState returns the shared state, starting its sampler on first use. The
// caller must releaseStatusState in Cleanup.
func acquireStatusState() (*statusState, error) {
	v, _, err := statusPool.LoadOrNew(statusPoolKey, func() (caddy.Destructor, error) {
		st := newStatusState(time.Now)
		go st.sampleEvery(time.Second)
		return st, nil
	})
	if err != nil {
		return nil, fmt.Errorf("status state: %w", err)
	}
	return v.(*statusState), nil
}

func releaseStatusState() { _, _ = statusPool.Delete(statusPoolKey) }

// currentStatusState returns the shared state if a status handler holds it, else nil.
func currentStatusState() *statusState {
	var st *statusState
	statusPool.Range(func(_, v any) bool {
		st, _ = v.(*statusState)
		return false
	})
	return st
}

// Destruct stops the sampler when no status handler is left.
func (s *statusState) Destruct() error {
	close(s.stop)
	return nil
}

// Handle records Caddy's healthy and unhealthy events (caddyevents.Handler).
func (s *statusState) Handle(_ context.Context, e caddy.Event) error {
	host, _ := e.Data["host"].(string)
	if host == "" || (e.Name() != "healthy" && e.Name() != "unhealthy") {
		return nil
	}
	at := e.Timestamp()
	if at.IsZero() {
		at = s.now()
	}
	s.mu.Lock()
	s.changes[healthKey{origin: e.Origin(), host: normalizeHost(host)}] = healthChange{healthy: e.Name() == "healthy", at: at}
	s.mu.Unlock()
	return nil
}

// lastChange returns the last health change seen for host under handler.
func (s *statusState) lastChange(handler any, host string) (healthChange, bool) {
	if s == nil {
		return healthChange{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.changes[healthKey{origin: handler, host: normalizeHost(host)}]
	return c, ok
}

// forget drops the changes of handlers no longer in the config (a reload replaces them).
func (s *statusState) forget(live map[any]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.changes {
		if !live[k.origin] {
			delete(s.changes, k)
		}
	}
}

// normalizeHost makes a dial address and the host of a health event comparable (events
// name host:port as Caddy joins it; the config may write it otherwise).
func normalizeHost(h string) string {
	if a, err := caddy.ParseNetworkAddress(h); err == nil && a.PortRangeSize() == 1 && !a.IsUnixNetwork() {
		return a.JoinHostPort(0)
	}
	return h
}

// sampleEvery records every scope's new-session total every d until Destruct.
func (s *statusState) sampleEvery(d time.Duration) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sample()
		}
	}
}

func (s *statusState) sample() {
	now := s.now()
	totals := map[string]uint64{}
	eachScope(func(name string, st *scopeStats) { totals[name] = newSessions(st) })
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, total := range totals {
		list := append(s.samples[name], counterSample{at: now, total: total})
		for len(list) > 1 && now.Sub(list[0].at) > rateWindow {
			list = list[1:]
		}
		s.samples[name] = list
	}
	for name := range s.samples {
		if _, ok := totals[name]; !ok {
			delete(s.samples, name)
		}
	}
}

// rate returns the scope's new sessions per second over the last samples, false before
// two samples a second apart exist.
func (s *statusState) rate(scope string, total uint64, now time.Time) (float64, bool) {
	if s == nil {
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	list := s.samples[scope]
	if len(list) == 0 {
		return 0, false
	}
	first := list[0]
	dt := now.Sub(first.at)
	if dt < 900*time.Millisecond || total < first.total {
		return 0, false
	}
	return float64(total-first.total) / dt.Seconds(), true
}

// newSessions counts the sessions a scope started: first picks (misses) and re-pins.
func newSessions(st *scopeStats) uint64 {
	n := st.misses.Load()
	for _, v := range st.repins.snapshot(nil) {
		n += v
	}
	return n
}

// proxyRef is one reverse_proxy handler found in the config, with where it serves.
type proxyRef struct {
	h      *reverseproxy.Handler
	server string
	listen []string
}

// findProxies walks the HTTP app's servers (in name order) and their routes, subroutes,
// named and error routes, for reverse_proxy handlers.
func findProxies(app *caddyhttp.App) []proxyRef {
	var out []proxyRef
	names := make([]string, 0, len(app.Servers))
	for n := range app.Servers {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		srv := app.Servers[n]
		seen := map[*reverseproxy.Handler]bool{}
		add := func(h *reverseproxy.Handler) {
			if !seen[h] {
				seen[h] = true
				out = append(out, proxyRef{h: h, server: n, listen: srv.Listen})
			}
		}
		walkRoutes(srv.Routes, add, 0)
		if srv.Errors != nil {
			walkRoutes(srv.Errors.Routes, add, 0)
		}
		named := make([]string, 0, len(srv.NamedRoutes))
		for rn := range srv.NamedRoutes {
			named = append(named, rn)
		}
		sort.Strings(named)
		for _, rn := range named {
			if r := srv.NamedRoutes[rn]; r != nil {
				walkRoutes(caddyhttp.RouteList{*r}, add, 0)
			}
		}
	}
	return out
}

// maxRouteDepth bounds the walk; configs nest subroutes a few levels deep.
const maxRouteDepth = 32

func walkRoutes(routes caddyhttp.RouteList, fn func(*reverseproxy.Handler), depth int) {
	if depth > maxRouteDepth {
		return
	}
	for _, r := range routes {
		for _, h := range r.Handlers {
			switch v := h.(type) {
			case *reverseproxy.Handler:
				fn(v)
			case *caddyhttp.Subroute:
				walkRoutes(v.Routes, fn, depth+1)
				if v.Errors != nil {
					walkRoutes(v.Errors.Routes, fn, depth+1)
				}
			}
		}
	}
}

// httpApp returns the config's HTTP app, or nil when it has none.
func httpApp(ctx caddy.Context) *caddyhttp.App {
	v, err := ctx.AppIfConfigured("http")
	if err != nil {
		return nil
	}
	app, _ := v.(*caddyhttp.App)
	return app
}

// collectStatus builds the Caddy tier's snapshot of the config ctx belongs to.
func collectStatus(ctx caddy.Context, st *statusState, now time.Time) *status.Snapshot {
	snap := &status.Snapshot{
		Tier:    status.TierCaddy,
		Time:    now.UTC(),
		Actions: status.Actions{Drain: true},
		Notes:   []string{noteNoCheckTimes, noteInFlight},
	}
	if host, err := os.Hostname(); err == nil {
		snap.Node = host
	}
	if st == nil {
		snap.Notes = append(snap.Notes, "No stickylb_status handler is configured: health changes and "+
			"new-session rates are not recorded (n/a).")
	}
	for _, f := range xdsFeeds() {
		snap.AddFeed(f)
	}
	app := httpApp(ctx)
	if app == nil {
		snap.Services = []status.Service{}
		return snap
	}
	drained := drains.list()
	proxies := findProxies(app)
	live := make(map[any]bool, len(proxies))
	perServer := map[string]int{}
	for _, p := range proxies {
		perServer[p.server]++
	}
	seenInServer := map[string]int{}
	for _, p := range proxies {
		live[p.h] = true
		seenInServer[p.server]++
		name := strings.Join(p.listen, " ")
		if name == "" {
			name = p.server
		}
		if perServer[p.server] > 1 {
			name = fmt.Sprintf("%s #%d", name, seenInServer[p.server])
		}
		snap.Services = append(snap.Services, serviceStatus(name, p, st, drained, now))
	}
	if st != nil {
		st.forget(live)
	}
	return snap
}

// serviceStatus describes one reverse_proxy handler.
func serviceStatus(name string, p proxyRef, st *statusState, drained map[string]time.Time, now time.Time) status.Service {
	h := p.h
	var sel reverseproxy.Selector
	if h.LoadBalancing != nil {
		sel = h.LoadBalancing.SelectionPolicy
	}
	pi := describePolicy(sel)
	svc := status.Service{
		Name:     name,
		Listen:   p.listen,
		Policy:   pi.name,
		Balance:  pi.balance,
		Affinity: status.Affinity{Mode: pi.mode, Stateless: pi.stateless, Scope: pi.scope},
		Backends: []status.Backend{},
	}
	if pi.ttl > 0 {
		svc.Affinity.TTL = pi.ttl.String()
	}
	if pi.note != "" {
		svc.Notes = append(svc.Notes, pi.note)
	}
	hc := healthCheckStatus(h)
	svc.HealthCheck = hc

	// Load: sessions in the service's table, or new sessions per second when stateless.
	switch {
	case pi.table != nil:
		svc.Load.Sessions = status.Ptr(int64(pi.table.Len()))
		svc.Load.SessionsCapacity = status.Ptr(int64(pi.table.Config().MaxEntries))
		svc.Load.SessionsNote = fmt.Sprintf("sessions: live mappings of table %q; per upstream they are not counted", pi.tableName)
	case pi.stateless:
		svc.Load.SessionsNote = noteStateless
	case pi.noTable:
		svc.Load.SessionsNote = noteNoTable
	default:
		svc.Load.SessionsNote = "this policy keeps no sessions"
	}
	if pi.stats != nil {
		total := newSessions(pi.stats)
		svc.Load.NewSessionsTotal = status.Ptr(total)
		if r, ok := st.rate(pi.scope, total, now); ok {
			svc.Load.NewSessionsPerSec = status.Ptr(r)
		}
		svc.Repins = pi.stats.repins.snapshot(repinReasons)
	}
	if h.DynamicUpstreams != nil {
		svc.Notes = append(svc.Notes, noteDynamic)
	}

	for i, u := range h.Upstreams {
		if u == nil {
			continue
		}
		svc.Backends = append(svc.Backends, backendStatus(h, i, u, pi, st, drained, now))
	}
	svc.Finish(panicNoteCaddy)
	return svc
}

func healthCheckStatus(h *reverseproxy.Handler) status.HealthCheck {
	var hc status.HealthCheck
	if h.HealthChecks == nil {
		return hc
	}
	if a := h.HealthChecks.Active; a != nil && (a.URI != "" || a.Path != "" || a.Port != 0 || a.Upstream != "") {
		hc.Active = true
		hc.Target = a.URI
		if hc.Target == "" {
			hc.Target = a.Path
		}
		if a.Port != 0 {
			hc.Target += fmt.Sprintf(" (port %d)", a.Port)
		}
		// Caddy's defaults when unset: 30s interval, 5s timeout, 1 fail, 1 pass.
		interval, timeout := time.Duration(a.Interval), time.Duration(a.Timeout)
		if interval == 0 {
			interval = 30 * time.Second
		}
		if timeout == 0 {
			timeout = 5 * time.Second
		}
		hc.Fails, hc.Passes = max(a.Fails, 1), max(a.Passes, 1)
		hc.Interval, hc.Timeout = interval.String(), timeout.String()
		hc.Bound = (interval*time.Duration(hc.Fails) + timeout).String()
	}
	if p := h.HealthChecks.Passive; p != nil && (p.FailDuration > 0 || p.UnhealthyRequestCount > 0) {
		hc.Passive = true
	}
	return hc
}

// backendStatus describes the i-th upstream of h.
func backendStatus(h *reverseproxy.Handler, i int, u *reverseproxy.Upstream, pi policyInfo, st *statusState,
	drained map[string]time.Time, now time.Time) status.Backend {
	id := identity(u)
	b := status.Backend{ID: id, Address: u.Dial}
	healthy := u.Host == nil || u.Healthy()
	b.Health.State = status.Healthy
	if !healthy {
		b.Health.State = status.Unhealthy
		b.Health.Reason = downReason(h, u, st)
	}
	if c, ok := st.lastChange(h, u.Dial); ok && c.healthy == healthy {
		b.Health.Since = status.Ptr(c.at.UTC())
	}
	if at, ok := drained[id]; ok {
		b.Draining = true
		b.DrainedSince = status.Ptr(at.UTC())
	}
	if u.Host != nil {
		b.InFlight = status.Ptr(int64(u.NumRequests()))
	}
	if pi.table != nil {
		if c, ok := backendSessions(pi.table, id); ok {
			b.Sessions = status.Ptr(c)
		}
	}
	if w, ok := pi.weight(i, u); ok {
		b.Weight = status.Ptr(w)
		eff := w
		if ss := pi.slowStart(id, now); ss != nil {
			b.SlowStart = ss
			eff = w * ss.Factor
		}
		if !healthy || b.Draining || (u.Host != nil && u.Full()) {
			eff = 0 // takes no new sessions now
		}
		b.EffectiveWeight = status.Ptr(eff)
	}
	return b
}

// downReason tells which of Caddy's mechanisms marks u down, where that can be told.
func downReason(h *reverseproxy.Handler, u *reverseproxy.Upstream, st *statusState) string {
	var reasons []string
	if p := h.HealthChecks; p != nil && p.Passive != nil && p.Passive.MaxFails > 0 && u.Host != nil && u.Fails() >= p.Passive.MaxFails {
		reasons = append(reasons, fmt.Sprintf("passive: %d failed requests within %s (max_fails %d)",
			u.Fails(), time.Duration(p.Passive.FailDuration), p.Passive.MaxFails))
	}
	if c, ok := st.lastChange(h, u.Dial); ok && !c.healthy {
		reasons = append(reasons, "active health check failed")
	}
	if len(reasons) == 0 && h.CB != nil {
		reasons = append(reasons, "circuit breaker open, or an active check failed")
	}
	return strings.Join(reasons, "; ")
}

// backendSessions counts a table's sessions pinned to backend, when the table can.
func backendSessions(t *sharedTable, backend string) (int64, bool) {
	if c, ok := any(t.Table).(interface{ CountBackend(string) int }); ok {
		return int64(c.CountBackend(backend)), true
	}
	return 0, false
}
