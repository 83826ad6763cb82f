package caddymodule

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/internal/hostcheck"
	"github.com/stickylb/stickylb/policies/status"
)

func init() {
	caddy.RegisterModule(StatusHandler{})
	caddy.RegisterModule(StatusAdmin{})
	httpcaddyfile.RegisterHandlerDirective("stickylb_status", parseStatusCaddyfile)
	// A terminal handler like Caddy's metrics: ordered right after it.
	httpcaddyfile.RegisterDirectiveOrder("stickylb_status", httpcaddyfile.After, "metrics")
}

// StatusHandler serves the live status page of every reverse_proxy in the config: the page
// at its route's root (any path ending in "/"), the JSON beside it (status.json), and the
// drain and undrain actions of the page (POST drain, POST undrain with
// {"upstream": "HOST:PORT"}), which edit the same drain set as the admin API's
// /stickylb/upstreams/ADDR/drain. Put it in a site of its own, e.g.
//
//	localhost:2020 {
//		stickylb_status
//	}
//
// Caddy's admin API cannot serve the page: it refuses browser navigations. The admin API
// serves the same JSON for tools at /stickylb/status.json.
//
// Every POST must come from the page's own origin (Sec-Fetch-Site / Origin) and carry the
// header X-Stickylb-Csrf: 1, so another site cannot drain upstreams through a visitor's
// browser. On a site that names no host (":2020"), a drain also needs the Host to be
// localhost or a loopback address: a page from a name that a DNS rebinding pointed at the
// site would otherwise be same-origin. The page itself is not authenticated: serve it
// where only operators reach it.
type StatusHandler struct {
	ctx    caddy.Context
	st     *statusState
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (StatusHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.stickylb_status",
		New: func() caddy.Module { return new(StatusHandler) },
	}
}

// Provision takes the shared status state and subscribes it to Caddy's health events,
// which carry the time of each upstream's last health change.
func (s *StatusHandler) Provision(ctx caddy.Context) error {
	s.ctx = ctx
	s.logger = ctx.Logger()
	st, err := acquireStatusState()
	if err != nil {
		return fmt.Errorf("stickylb_status: %w", err)
	}
	s.st = st
	evApp, err := ctx.App("events")
	if err != nil {
		return fmt.Errorf("stickylb_status: events app: %w", err)
	}
	ev, ok := evApp.(*caddyevents.App)
	if !ok {
		return fmt.Errorf("stickylb_status: events app is %T", evApp)
	}
	for _, name := range []string{"healthy", "unhealthy"} {
		if err := ev.On(name, st); err != nil {
			return fmt.Errorf("stickylb_status: subscribing to %s events: %w", name, err)
		}
	}
	return nil
}

// Validate checks the configuration (there is none to check).
func (*StatusHandler) Validate() error { return nil }

// Cleanup releases the shared status state.
func (s *StatusHandler) Cleanup() error {
	if s.st != nil {
		releaseStatusState()
		s.st = nil
	}
	return nil
}

// ServeHTTP serves the page, the JSON and the drain actions; it never calls next.
func (s *StatusHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	p := r.URL.Path
	switch {
	case strings.HasSuffix(p, "/"+status.JSONPath):
		if !allowMethods(w, r, http.MethodGet, http.MethodHead) {
			return nil
		}
		return status.ServeJSON(w, collectStatus(s.ctx, s.st, time.Now()))
	case strings.HasSuffix(p, "/"+status.DrainPath), strings.HasSuffix(p, "/"+status.UndrainPath):
		if !allowMethods(w, r, http.MethodPost) {
			return nil
		}
		return s.serveDrain(w, r, strings.HasSuffix(p, "/"+status.DrainPath))
	case strings.HasSuffix(p, "/"):
		if !allowMethods(w, r, http.MethodGet, http.MethodHead) {
			return nil
		}
		status.ServePage(w)
		return nil
	}
	return caddyhttp.Error(http.StatusNotFound, fmt.Errorf("stickylb_status serves the page at a path ending in /, and %s, %s, %s beside it",
		status.JSONPath, status.DrainPath, status.UndrainPath))
}

func allowMethods(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m {
			return true
		}
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	http.Error(w, fmt.Sprintf("method %s not allowed", r.Method), http.StatusMethodNotAllowed)
	return false
}

// serveDrain drains or undrains an upstream of the config. Answers: 403 for a request that
// is not provably same-origin, 400 for a malformed body or address, 404 for an address no
// reverse_proxy of this config has, else 200 with what changed.
func (s *StatusHandler) serveDrain(w http.ResponseWriter, r *http.Request, drain bool) error {
	action := status.UndrainPath
	if drain {
		action = status.DrainPath
	}
	if err := status.CheckStateChange(r); err != nil {
		s.logger.Warn("refused "+action, zap.String("remote", r.RemoteAddr), zap.Error(err))
		http.Error(w, err.Error(), http.StatusForbidden)
		return nil
	}
	if err := s.checkHost(r); err != nil {
		s.logger.Warn("refused "+action, zap.String("remote", r.RemoteAddr), zap.String("host", r.Host), zap.Error(err))
		http.Error(w, err.Error(), http.StatusForbidden)
		return nil
	}
	req, err := status.ReadDrainRequest(r)
	if err == nil {
		err = checkUpstreamAddress(req.Upstream)
	}
	if err != nil {
		http.Error(w, action+": "+err.Error(), http.StatusBadRequest)
		return nil
	}
	if !knownUpstream(s.ctx, req.Upstream) {
		http.Error(w, fmt.Sprintf("%s: no reverse_proxy of this config has upstream %q", action, req.Upstream), http.StatusNotFound)
		return nil
	}
	var changed bool
	if drain {
		changed = drains.drain(req.Upstream, time.Now())
	} else {
		changed = drains.undrain(req.Upstream)
	}
	s.logger.Info("upstream "+action+" from the status page", zap.String("upstream", req.Upstream),
		zap.Bool("changed", changed), zap.String("remote", r.RemoteAddr))
	return writeJSON(w, map[string]any{"upstream": req.Upstream, "drained": drain, "changed": changed})
}

// checkHost refuses a drain whose Host a DNS rebinding could have chosen: on a site that
// names its hosts, Caddy routed the request here because its Host is one of them; on a
// catch-all site (no host matcher on the way to this handler) any name reaches it, and
// evil.example, re-resolved to this address, would pass the same-origin check (its Origin
// is its Host), so there the Host must be localhost or a loopback address.
func (s *StatusHandler) checkHost(r *http.Request) error {
	srv, _ := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if srv != nil && routedByHost(srv, s) || hostcheck.Loopback().Allows(r.Host) {
		return nil
	}
	return fmt.Errorf("host %q: this status site names no host, so it drains only for localhost or a loopback address; name the site (e.g. status.example:2020 { stickylb_status }) to drain through that name", r.Host)
}

// routedByHost reports whether every request that reaches h on srv matched a host
// matcher on its way: some route leading to h matches on Host in each of its matcher
// sets.
func routedByHost(srv *caddyhttp.Server, h caddyhttp.MiddlewareHandler) bool {
	found, byHost := routeToHandler(srv.Routes, h, false, 0)
	return found && byHost
}

// routeToHandler looks for h under routes; byHost says whether the routes it passed
// through to get there (byHost on entry, for the enclosing ones) match on Host.
func routeToHandler(routes caddyhttp.RouteList, h caddyhttp.MiddlewareHandler, byHost bool, depth int) (found, hostMatched bool) {
	if depth > maxRouteDepth {
		return false, false
	}
	for _, rt := range routes {
		matched := byHost || matchesHost(rt.MatcherSets)
		for _, mh := range rt.Handlers {
			if mh == h {
				return true, matched
			}
			if sub, ok := mh.(*caddyhttp.Subroute); ok {
				if f, m := routeToHandler(sub.Routes, h, matched, depth+1); f {
					return true, m
				}
			}
		}
	}
	return false, false
}

// matchesHost reports whether a route with these matcher sets matches on Host whichever
// set matches (no set, or one without a host matcher, lets any Host through).
func matchesHost(sets caddyhttp.MatcherSets) bool {
	if len(sets) == 0 {
		return false
	}
	for _, set := range sets {
		if !slices.ContainsFunc(set, func(m any) bool { _, ok := m.(*caddyhttp.MatchHost); return ok }) {
			return false
		}
	}
	return true
}

// checkUpstreamAddress accepts what a reverse_proxy upstream's dial address may be: one
// network address with exactly one port (or a unix socket), no placeholders.
func checkUpstreamAddress(a string) error {
	if strings.ContainsAny(a, "{}") {
		return fmt.Errorf("upstream %q: placeholders are not upstream addresses", a)
	}
	na, err := caddy.ParseNetworkAddress(a)
	if err != nil {
		return fmt.Errorf("upstream %q is not an address: %w", a, err)
	}
	if na.IsUnixNetwork() {
		return nil
	}
	if na.Host == "" || na.PortRangeSize() != 1 || na.StartPort == 0 {
		return fmt.Errorf("upstream %q: want HOST:PORT with one port", a)
	}
	return nil
}

// knownUpstream reports whether a reverse_proxy of ctx's config has a static upstream id.
func knownUpstream(ctx caddy.Context, id string) bool {
	app := httpApp(ctx)
	if app == nil {
		return false
	}
	for _, p := range findProxies(app) {
		for _, u := range p.h.Upstreams {
			if u != nil && identity(u) == id {
				return true
			}
		}
	}
	return false
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	stickylb_status
func (s *StatusHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Errf("stickylb_status takes no options")
	}
	return nil
}

func parseStatusCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	s := new(StatusHandler)
	err := s.UnmarshalCaddyfile(h.Dispenser)
	return s, err
}

// StatusAdmin serves the status JSON on Caddy's admin API, for tools:
//
//	GET /stickylb/status.json
type StatusAdmin struct {
	ctx caddy.Context
}

// CaddyModule returns the Caddy module information.
func (StatusAdmin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.stickylb_status",
		New: func() caddy.Module { return new(StatusAdmin) },
	}
}

// Provision keeps the config's context, which the snapshot reads the HTTP app from.
func (a *StatusAdmin) Provision(ctx caddy.Context) error {
	a.ctx = ctx
	return nil
}

// Routes returns the admin route.
func (a *StatusAdmin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/stickylb/status.json", Handler: caddy.AdminHandlerFunc(a.serve)}}
}

func (a *StatusAdmin) serve(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
	}
	return status.ServeJSON(w, collectStatus(a.ctx, currentStatusState(), time.Now()))
}

// UpstreamHealth is one upstream of one service in GET /stickylb/upstreams.
type UpstreamHealth struct {
	// Service names the reverse_proxy (its server's listen addresses); Upstream is the
	// upstream's identity (its dial address).
	Service  string `json:"service"`
	Upstream string `json:"upstream"`
	// Health is healthy or unhealthy as Caddy sees it now (active and passive checks).
	Health   string `json:"health"`
	Draining bool   `json:"draining"`
	InFlight *int64 `json:"in_flight"`
}

// upstreamsHealth lists every static upstream of every reverse_proxy of ctx's config.
func upstreamsHealth(ctx caddy.Context) []UpstreamHealth {
	out := []UpstreamHealth{}
	for _, svc := range collectStatus(ctx, currentStatusState(), time.Now()).Services {
		for _, b := range svc.Backends {
			out = append(out, UpstreamHealth{Service: svc.Name, Upstream: b.ID, Health: b.Health.State,
				Draining: b.Draining, InFlight: b.InFlight})
		}
	}
	return out
}

// Interface guards
var (
	_ caddy.Provisioner           = (*StatusHandler)(nil)
	_ caddy.Validator             = (*StatusHandler)(nil)
	_ caddy.CleanerUpper          = (*StatusHandler)(nil)
	_ caddyhttp.MiddlewareHandler = (*StatusHandler)(nil)
	_ caddyfile.Unmarshaler       = (*StatusHandler)(nil)
	_ caddy.AdminRouter           = (*StatusAdmin)(nil)
	_ caddy.Provisioner           = (*StatusAdmin)(nil)
	_ caddyevents.Handler         = (*statusState)(nil)
	_ caddy.Destructor            = (*statusState)(nil)
)
