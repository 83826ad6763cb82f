package caddymodule

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/stickylb/stickylb/policies/status"
)

// What the status page reads from each selection policy. This file is the only place the
// status code looks inside the policies, so a change to a policy's fields shows up here.

// policyInfo is what the status page knows about a reverse_proxy's selection policy.
type policyInfo struct {
	name, balance string // module names of the policy and of what picks new sessions
	mode          string // affinity mode as the pools file names it
	stateless     bool   // sessions live in the clients (sealed cookies)
	noTable       bool   // a keyed policy without a table
	scope         string // stats scope (metrics label)
	ttl           time.Duration
	table         *sharedTable
	tableName     string
	stats         *scopeStats
	wlc           *WeightedLeastConn                        // weights and slow start of new sessions
	wrr           *reverseproxy.WeightedRoundRobinSelection // Caddy's own weights
	note          string
}

func moduleName(v any) string {
	if m, ok := v.(caddy.Module); ok {
		return m.CaddyModule().ID.Name()
	}
	if v == nil {
		return "random" // reverse_proxy's default
	}
	return "unknown"
}

// describePolicy reads a selection policy (ours or Caddy's).
func describePolicy(sel reverseproxy.Selector) policyInfo {
	pi := policyInfo{name: moduleName(sel), mode: "none"}
	fromCore := func(k *keyedCore, mode string) {
		pi.mode = mode
		pi.scope, pi.stats = k.scope, k.stats
		if k.table != nil {
			pi.table, pi.tableName = k.table, k.tableKey
			pi.ttl = k.table.Config().TTL
		} else {
			pi.noTable = true
		}
		pi.setFallback(k.fallback)
	}
	switch p := sel.(type) {
	case *StickyCookie:
		pi.mode, pi.stateless = "cookie", true
		pi.scope, pi.stats, pi.ttl = p.scope, p.stats, p.ttl
		pi.setFallback(p.fallback)
	case *AppCookie:
		fromCore(&p.core, "app_cookie")
		if p.Mode != "learn" {
			// prefix mode: the identity rides in the application's cookie; the table, if
			// any, only serves the keyed fallback.
			pi.stateless, pi.noTable, pi.table = true, false, nil
			pi.ttl = p.ttl
		}
	case *StickyURL:
		fromCore(&p.core, "url")
	case *StickyHeader:
		fromCore(&p.core, "header")
	case *StickyIP:
		fromCore(&p.core, "source_ip")
	case *WeightedLeastConn:
		pi.wlc = p
	case *reverseproxy.WeightedRoundRobinSelection:
		pi.wrr = p
	case *reverseproxy.CookieHashSelection:
		pi.mode, pi.stateless = "cookie", true
		pi.note = "Caddy's own cookie policy: stickylb keeps no counts for it"
	}
	return pi
}

func (pi *policyInfo) setFallback(sel reverseproxy.Selector) {
	pi.balance = moduleName(sel)
	switch f := sel.(type) {
	case *WeightedLeastConn:
		pi.wlc = f
	case *reverseproxy.WeightedRoundRobinSelection:
		pi.wrr = f
	}
}

// weight returns the configured weight of the i-th upstream, false when the policy has none.
func (pi *policyInfo) weight(i int, u *reverseproxy.Upstream) (float64, bool) {
	switch {
	case pi.wlc != nil:
		return pi.wlc.weight(i, u), true
	case pi.wrr != nil:
		if i < len(pi.wrr.Weights) {
			return float64(pi.wrr.Weights[i]), true
		}
		return 0, true // Caddy's weighted_round_robin skips upstreams past its list
	}
	return 0, false
}

// slowStart returns the ramp id is in now, nil when none (no slow start, never seen, or
// past the window).
func (pi *policyInfo) slowStart(id string, now time.Time) *status.SlowStart {
	p := pi.wlc
	if p == nil || p.clocks == nil || p.ss.Window <= 0 {
		return nil
	}
	p.clocks.mu.RLock()
	cl := p.clocks.clocks[id]
	p.clocks.mu.RUnlock()
	if cl == nil {
		return nil
	}
	s := cl.since.Load()
	if s == 0 {
		return nil
	}
	since := time.Unix(0, s)
	f := p.ss.Factor(since, now)
	if f >= 1 {
		return nil
	}
	return &status.SlowStart{Since: since.UTC(), Window: p.ss.Window.String(), Factor: f}
}
