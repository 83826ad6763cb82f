// Package caddymodule holds stickylb's Caddy modules: reverse_proxy selection policies that
// keep a client's requests on one upstream for the life of its session, and the pieces they
// need around Caddy's proxy loop.
//
// Selection policies (module IDs under http.reverse_proxy.selection_policies.):
//
//   - sticky_cookie: an LB-inserted cookie that seals the upstream's identity (AEAD, rotating
//     keys, sliding expiry), or Envoy's stateful-session cookie for mixed fleets.
//   - app_cookie: follows the application's own session cookie, either by prefixing its value
//     with a sealed identity (stateless, works across Caddy nodes) or by learning value ->
//     upstream from the upstream's Set-Cookie. Needs the stickylb handler (below).
//   - sticky_url, sticky_header: a key from the URL or a header, looked up in a bounded session
//     table, else consistently hashed (Maglev or ring, hashed as Envoy hashes it).
//   - sticky_ip: the client IP as Caddy resolves it, hashed as Envoy hashes source_ip.
//   - weighted_least_conn: argmin of in-flight requests / weight over Caddy's own counts,
//     with Envoy's slow start for new and recovered upstreams.
//
// The upstream source http.reverse_proxy.upstreams.stickylb_xds (Caddyfile `dynamic
// stickylb_xds`) takes a service's upstreams, weights, drain states and health verdicts from
// the control plane, `stickylb xds`, so every Caddy node routes on the same view.
//
// The handler http.handlers.stickylb (Caddyfile directive stickylb) lets policies see the
// upstream's response, which a Selector cannot. The admin module admin.api.stickylb serves
// /stickylb/sessions and /stickylb/upstreams/ADDR/drain. The handler
// http.handlers.stickylb_status (directive stickylb_status) serves the live status page of
// every reverse_proxy, its JSON and its drain buttons; admin.api.stickylb_status serves the
// JSON at /stickylb/status.json.
//
// Session tables, slow-start clocks, xDS subscriptions and the drain set live in Caddy usage pools and
// package-level registries so they survive config reloads; they are the only mutable state
// outside a module instance.
package caddymodule
