package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/policies/status"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// AdminAPI serves stickylb's endpoints on Caddy's admin listener (Caddy loads every
// admin.api module by itself):
//
//	GET    /stickylb/sessions                   tables and policy scopes with their counts
//	DELETE /stickylb/sessions                   flush every session table
//	DELETE /stickylb/sessions/TABLE             flush one table
//	GET    /stickylb/upstreams                  drained upstreams; health of every upstream
//	POST   /stickylb/upstreams/ADDR/drain       no new sessions for ADDR; pinned ones stay
//	                                            (header X-Stickylb-Csrf: 1, as every POST)
//	POST   /stickylb/upstreams/ADDR/undrain
//
// ADDR must be a dial address (HOST:PORT with one port, or a unix socket): anything else
// answers 400. An address no static upstream of the running config has is drained all the
// same, and the answer says so ("in_config": false): dynamic upstreams (dynamic
// stickylb_xds, Caddy's srv or a) are not in the config, and draining an upstream before a
// reload adds it keeps new sessions off it from its first request.
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.stickylb",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// Routes returns the admin routes.
func (AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/stickylb/sessions", Handler: caddy.AdminHandlerFunc(handleSessions)},
		{Pattern: "/stickylb/sessions/", Handler: caddy.AdminHandlerFunc(handleSessions)},
		{Pattern: "/stickylb/upstreams", Handler: caddy.AdminHandlerFunc(handleUpstreams)},
		{Pattern: "/stickylb/upstreams/", Handler: caddy.AdminHandlerFunc(handleUpstreams)},
	}
}

// TableInfo is one session table in GET /stickylb/sessions.
type TableInfo struct {
	Policy      string            `json:"policy"`
	Entries     int               `json:"entries"`
	Capacity    int               `json:"capacity"`
	TTL         string            `json:"ttl"`
	Hits        uint64            `json:"hits"`
	Misses      uint64            `json:"misses"`
	Inserts     uint64            `json:"inserts"`
	Expired     uint64            `json:"expired"`
	Evicted     uint64            `json:"evicted"`
	Invalidated uint64            `json:"invalidated"`
	Protected   int               `json:"protected"`
	Repins      map[string]uint64 `json:"repins"`
}

// ScopeInfo is one policy scope (a cookie or a table's policy) in GET /stickylb/sessions.
type ScopeInfo struct {
	Hits       uint64            `json:"hits"`
	Misses     uint64            `json:"misses"`
	Repins     map[string]uint64 `json:"repins"`
	Rejections map[string]uint64 `json:"cookie_rejections"`
	// NewCapped counts new sessions not learned (app_cookie learn): their client was over
	// max_new_per_client.
	NewCapped uint64 `json:"new_sessions_capped"`
}

// SessionsInfo is the body of GET /stickylb/sessions.
type SessionsInfo struct {
	Tables map[string]TableInfo `json:"tables"`
	Scopes map[string]ScopeInfo `json:"scopes"`
}

func sessionsInfo() SessionsInfo {
	out := SessionsInfo{Tables: map[string]TableInfo{}, Scopes: map[string]ScopeInfo{}}
	eachScope(func(name string, s *scopeStats) {
		out.Scopes[name] = ScopeInfo{
			Hits:       s.hits.Load(),
			Misses:     s.misses.Load(),
			Repins:     s.repins.snapshot(repinReasons),
			Rejections: s.rejections.snapshot(rejectReasons),
			NewCapped:  s.capped.Load(),
		}
	})
	eachTable(func(name string, t *sharedTable) {
		st := t.Stats()
		info := TableInfo{
			Policy: t.policy, Entries: st.Entries, Capacity: st.Capacity, TTL: t.Config().TTL.String(),
			Hits: st.Hits, Misses: st.Misses, Inserts: st.Inserts, Expired: st.Expired,
			Evicted: st.Evicted, Invalidated: st.Invalidated, Protected: st.Protected,
		}
		if sc, ok := out.Scopes[name]; ok {
			info.Repins = sc.Repins
		} else {
			info.Repins = map[string]uint64{}
		}
		out.Tables[name] = info
	})
	return out
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

func handleSessions(w http.ResponseWriter, r *http.Request) error {
	name := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/stickylb/sessions"), "/")
	switch r.Method {
	case http.MethodGet:
		if name != "" {
			info, ok := sessionsInfo().Tables[name]
			if !ok {
				return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no session table %q", name)}
			}
			return writeJSON(w, info)
		}
		return writeJSON(w, sessionsInfo())
	case http.MethodDelete:
		flushed := map[string]int{}
		found := false
		eachTable(func(n string, t *sharedTable) {
			if name == "" || n == name {
				found = true
				flushed[n] = t.Flush()
			}
		})
		if name != "" && !found {
			return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no session table %q", name)}
		}
		return writeJSON(w, map[string]any{"flushed": flushed})
	}
	return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
}

func handleUpstreams(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/stickylb/upstreams"), "/")
	if rest == "" {
		if r.Method != http.MethodGet {
			return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
		}
		list := map[string]string{}
		for addr, at := range drains.list() {
			list[addr] = at.UTC().Format(time.RFC3339)
		}
		return writeJSON(w, map[string]any{"drained": list, "upstreams": upstreamsHealth(caddy.ActiveContext())})
	}
	i := strings.LastIndexByte(rest, '/')
	if i <= 0 {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("want /stickylb/upstreams/ADDR/drain or /undrain")}
	}
	addr, action := rest[:i], rest[i+1:]
	if r.Method != http.MethodPost {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("%s needs POST", action)}
	}
	// A state change: the same CSRF rule as the status page's (the custom header, and a
	// same-origin request when a browser sends it), on top of Caddy's admin origin checks.
	if err := status.CheckStateChange(r); err != nil {
		return caddy.APIError{HTTPStatus: http.StatusForbidden, Err: err}
	}
	if action != "drain" && action != "undrain" {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("unknown action %q: want drain or undrain", action)}
	}
	// A drained entry that is not an address (drained before addresses were checked) can
	// still be undrained.
	if err := checkUpstreamAddress(addr); err != nil && (action == "drain" || !drains.drained(addr)) {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("%s: %w", action, err)}
	}
	var changed bool
	if action == "drain" {
		changed = drains.drain(addr, time.Now())
	} else {
		changed = drains.undrain(addr)
	}
	inConfig := knownUpstream(caddy.ActiveContext(), addr)
	caddy.Log().Named("stickylb").Info("upstream "+action, zap.String("upstream", addr), zap.Bool("changed", changed), zap.Bool("in_config", inConfig))
	return writeJSON(w, map[string]any{"upstream": addr, "drained": action == "drain", "changed": changed, "in_config": inConfig})
}

// Interface guards
var _ caddy.AdminRouter = AdminAPI{}
