package caddymodule

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/stickylb/stickylb/policies/keys"
)

func init() {
	caddy.RegisterModule(new(StickyURL))
	caddy.RegisterModule(new(StickyHeader))
	caddy.RegisterModule(new(StickyIP))
}

// StickyURL keeps requests that carry the same URL feature — a query parameter, a path
// segment, or a path suffix such as ;jsessionid= — on one upstream, for clients that cannot
// keep cookies. Exactly one of Query, PathSegment and Suffix is set.
type StickyURL struct {
	// Query is the name of the query parameter holding the key.
	Query string `json:"query,omitempty"`
	// PathSegment is the index of the path segment holding the key, 0-based as Caddy's
	// {http.request.uri.path.N}; negative counts from the end (-1 = last).
	PathSegment *int `json:"path_segment,omitempty"`
	// Suffix is a path marker such as ";jsessionid=": the key is what follows it up to the
	// next ';', '?', '/' or the end.
	Suffix string `json:"suffix,omitempty"`
	KeyedOptions

	extract keys.Extractor
	core    keyedCore
}

// CaddyModule returns the Caddy module information.
func (*StickyURL) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.sticky_url",
		New: func() caddy.Module { return new(StickyURL) },
	}
}

// Provision sets up the policy.
func (s *StickyURL) Provision(ctx caddy.Context) error {
	if err := s.validateKey(); err != nil {
		return err
	}
	maxLen := s.maxKeyLength()
	switch {
	case s.Query != "":
		s.extract = keys.Query(s.Query, maxLen)
	case s.PathSegment != nil:
		s.extract = keys.PathSegment(*s.PathSegment, maxLen)
	default:
		s.extract = keys.PathSuffix(s.Suffix, maxLen)
	}
	return s.core.provision(ctx, s, &s.KeyedOptions, "sticky_url", "sticky_url:"+strings.ReplaceAll(s.extract.String(), " ", "="), !s.NoTable)
}

func (s *StickyURL) validateKey() error {
	n := 0
	if s.Query != "" {
		n++
	}
	if s.PathSegment != nil {
		n++
	}
	if s.Suffix != "" {
		n++
	}
	if n != 1 {
		return fmt.Errorf("sticky_url: set exactly one of query, path_segment and suffix (got %d)", n)
	}
	return nil
}

// Validate checks the configuration.
func (s *StickyURL) Validate() error {
	if err := s.validateKey(); err != nil {
		return err
	}
	return s.KeyedOptions.validate("sticky_url")
}

// Cleanup releases shared state.
func (s *StickyURL) Cleanup() error { s.core.cleanup(); return nil }

// Select returns the upstream of the request's URL key.
func (s *StickyURL) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	return s.core.selectExtracted(s.extract, pool, r, w)
}

// StickyHeader keeps requests that carry the same value of a request header on one
// upstream. Repeated header lines are joined with "," in order, as gRPC does.
type StickyHeader struct {
	// Name of the header.
	Name string `json:"name,omitempty"`
	KeyedOptions

	extract keys.Extractor
	core    keyedCore
}

// CaddyModule returns the Caddy module information.
func (*StickyHeader) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.sticky_header",
		New: func() caddy.Module { return new(StickyHeader) },
	}
}

// Provision sets up the policy.
func (s *StickyHeader) Provision(ctx caddy.Context) error {
	if s.Name == "" {
		return fmt.Errorf("sticky_header: a header name is required")
	}
	maxLen := s.maxKeyLength()
	s.extract = keys.Header(s.Name, maxLen)
	return s.core.provision(ctx, s, &s.KeyedOptions, "sticky_header", "sticky_header:"+http.CanonicalHeaderKey(s.Name), !s.NoTable)
}

// Validate checks the configuration.
func (s *StickyHeader) Validate() error { return s.KeyedOptions.validate("sticky_header") }

// Cleanup releases shared state.
func (s *StickyHeader) Cleanup() error { s.core.cleanup(); return nil }

// Select returns the upstream of the request's header key.
func (s *StickyHeader) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	return s.core.selectExtracted(s.extract, pool, r, w)
}

// StickyIP keeps a client IP on one upstream: the IP as Caddy resolves it (the remote
// address, or the client behind trusted_proxies), hashed as Envoy hashes source_ip
// (XXH64 of the address text), so a Caddy node and an Envoy node with the same upstreams
// pick the same one. Without ttl it keeps no table: the hash alone decides, O(1) with Maglev.
type StickyIP struct {
	KeyedOptions

	core keyedCore
}

// CaddyModule returns the Caddy module information.
func (*StickyIP) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.sticky_ip",
		New: func() caddy.Module { return new(StickyIP) },
	}
}

// Provision sets up the policy.
func (s *StickyIP) Provision(ctx caddy.Context) error {
	useTable := !s.NoTable && (s.TTL > 0 || s.Table != "" || s.MaxSessions > 0)
	return s.core.provision(ctx, s, &s.KeyedOptions, "sticky_ip", "sticky_ip", useTable)
}

// Validate checks the configuration.
func (s *StickyIP) Validate() error { return s.KeyedOptions.validate("sticky_ip") }

// Cleanup releases shared state.
func (s *StickyIP) Cleanup() error { s.core.cleanup(); return nil }

// Select returns the upstream of the client's IP.
func (s *StickyIP) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	vars := requestVars(r)
	ip := clientIP(vars)
	if ip == "" {
		return s.core.selectUnkeyed(vars, pool, r, w)
	}
	return s.core.selectKey(vars, pool, keys.Key{Value: ip, TableKey: ip})
}

// clientIP returns the client's address in the request's vars as Envoy prints it (an
// IPv4-mapped IPv6 address as IPv4, IPv6 in RFC 5952 form, no zone), or "" when Caddy could
// not tell.
func clientIP(vars map[string]any) string {
	s, _ := vars[caddyhttp.ClientIPVarKey].(string)
	if s == "" {
		return ""
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return ""
	}
	// Caddy's text is usually the canonical form already: use it as is, without
	// allocating a copy on every request.
	a = a.Unmap().WithZone("")
	var buf [64]byte
	if b := a.AppendTo(buf[:0]); string(b) == s {
		return s
	}
	return a.String()
}

// Interface guards
var (
	_ caddy.Provisioner     = (*StickyURL)(nil)
	_ caddy.Validator       = (*StickyURL)(nil)
	_ caddy.CleanerUpper    = (*StickyURL)(nil)
	_ reverseproxy.Selector = (*StickyURL)(nil)
	_ caddy.Provisioner     = (*StickyHeader)(nil)
	_ caddy.Validator       = (*StickyHeader)(nil)
	_ caddy.CleanerUpper    = (*StickyHeader)(nil)
	_ reverseproxy.Selector = (*StickyHeader)(nil)
	_ caddy.Provisioner     = (*StickyIP)(nil)
	_ caddy.Validator       = (*StickyIP)(nil)
	_ caddy.CleanerUpper    = (*StickyIP)(nil)
	_ reverseproxy.Selector = (*StickyIP)(nil)
)
