package caddymodule

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// defaultTableName names the session table of a keyed policy that names none: the policy's
// key (e.g. app_cookie:JSESSIONID) and a digest of where its handler sits — the server's
// listen addresses and, for each enclosing route from the server down, the route's
// matchers (with its rank among earlier routes of the same matchers, which two routes
// rarely share). Two sites with the same policy thus get two tables, while a reload that
// keeps the site's addresses and matchers finds the same name and keeps the sessions,
// whatever it changes in ttl, max_sessions or upstreams, and wherever the site block moves
// in the file. Outside an HTTP server (a unit test, say) the upstream set stands in for
// the site.
func defaultTableName(ctx caddy.Context, key string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", key)
	if srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && srv != nil {
		listen := slices.Clone(srv.Listen)
		slices.Sort(listen)
		fmt.Fprintf(h, "listen %q\n", listen)
		writeRoutePosition(h, srv.Routes)
		for _, m := range ctx.Modules() {
			if sr, ok := m.(*caddyhttp.Subroute); ok {
				writeRoutePosition(h, sr.Routes)
			}
		}
	} else {
		fmt.Fprintf(h, "upstreams %q\n", upstreamSet(ctx))
	}
	return key + "@" + hex.EncodeToString(h.Sum(nil)[:6])
}

// writeRoutePosition writes the route of routes whose handlers are being provisioned. Caddy
// provisions a route list's handlers route by route and drops each route's raw handler JSON
// once its handlers are loaded, so that route is the first one still holding it.
func writeRoutePosition(h hash.Hash, routes caddyhttp.RouteList) {
	cur := -1
	for i := range routes {
		if routes[i].HandlersRaw != nil {
			cur = i
			break
		}
	}
	if cur < 0 {
		fmt.Fprintf(h, "route ?\n")
		return
	}
	desc := routeMatchers(&routes[cur])
	rank := 0
	for i := 0; i < cur; i++ {
		if routeMatchers(&routes[i]) == desc {
			rank++
		}
	}
	fmt.Fprintf(h, "route %s #%d\n", desc, rank)
}

// routeMatchers describes a route's matchers (provisioned by the time handlers are) by
// type and JSON, so a host matcher and a path matcher with the same values differ.
func routeMatchers(r *caddyhttp.Route) string {
	var b strings.Builder
	b.WriteString(r.Group)
	for _, set := range r.MatcherSets {
		b.WriteString("|")
		for _, m := range set {
			j, _ := json.Marshal(m)
			fmt.Fprintf(&b, "%T=%s;", m, j)
		}
	}
	if len(r.MatcherSets) == 0 && len(r.MatcherSetsRaw) > 0 {
		j, _ := json.Marshal(r.MatcherSetsRaw)
		b.Write(j)
	}
	return b.String()
}

// upstreamSet returns the sorted dial addresses of the reverse_proxy handler the policy
// belongs to, or nil.
func upstreamSet(ctx caddy.Context) []string {
	mods := ctx.Modules()
	for i := len(mods) - 1; i >= 0; i-- {
		if h, ok := mods[i].(*reverseproxy.Handler); ok {
			var out []string
			for _, u := range h.Upstreams {
				if u != nil {
					out = append(out, u.Dial)
				}
			}
			slices.Sort(out)
			return out
		}
	}
	return nil
}

// configOwner identifies the config a module is provisioned for: the HTTP app instance at
// the root of its ancestry (a new one per config load), or nil outside one.
func configOwner(ctx caddy.Context) any {
	for _, m := range ctx.Modules() {
		if app, ok := m.(*caddyhttp.App); ok {
			return app
		}
	}
	return nil
}
