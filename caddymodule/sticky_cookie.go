package caddymodule

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/policies/cookie"
)

func init() {
	caddy.RegisterModule(new(StickyCookie))
}

// Cookie formats of sticky_cookie.
const (
	formatSealed = "sealed" // AEAD-sealed identity and expiry (default)
	formatEnvoy  = "envoy"  // Envoy's stateful-session cookie, for fleets mixing Caddy and Envoy
)

// Defaults of sticky_cookie.
const (
	defaultCookieName = "lb_session"
	defaultCookieTTL  = 30 * time.Minute
)

// StickyCookie pins a client to an upstream with a cookie the load balancer inserts. The
// cookie seals the upstream's identity, the issue time and an expiry with an AEAD, so it
// reveals nothing and cannot be forged; lookups are O(1) in the number of upstreams. The
// expiry slides: a cookie is re-sealed when less than half its TTL remains. A cookie that
// does not open, has expired, or names an upstream that is unknown, unavailable or just
// failed this request re-pins the client (a new pick and a fresh cookie), never an error.
type StickyCookie struct {
	// Name of the cookie. Default: lb_session.
	Name string `json:"name,omitempty"`
	// SecretOptions seal and open the cookie (format sealed).
	SecretOptions
	// TTL is the session lifetime without requests. Default: 30m.
	TTL caddy.Duration `json:"ttl,omitempty"`
	// Format is sealed (default) or envoy (Envoy's stateful-session cookie: base64 of the
	// upstream's ip:port, readable by Envoy's cookie-based session state; not encrypted).
	Format string `json:"format,omitempty"`
	// Path of the cookie. Default: /.
	Path string `json:"path,omitempty"`
	// Domain of the cookie. Default: none (host-only).
	Domain string `json:"domain,omitempty"`
	// MaxAge makes the cookie persistent for this long; default: a session cookie.
	MaxAge caddy.Duration `json:"max_age,omitempty"`
	// Secure is auto (default: set under TLS or a trusted X-Forwarded-Proto https), always
	// or never.
	Secure string `json:"secure,omitempty"`
	// HTTPOnly defaults to true.
	HTTPOnly *bool `json:"http_only,omitempty"`
	// SameSite is lax, strict or none; default: None when Secure, else Lax (as Caddy).
	SameSite string `json:"same_site,omitempty"`
	// KeepCacheControl leaves Cache-Control as the upstream sent it on responses that set
	// the cookie. By default such a response is made private (HAProxy's nocache): `private`
	// is added unless `private` or `no-store` is there, and `public` and `s-maxage` are
	// dropped, so no shared cache hands one client's pin to another.
	KeepCacheControl bool `json:"keep_cache_control,omitempty"`
	// FallbackRaw picks the upstream of a new session. Default: weighted_least_conn.
	FallbackRaw json.RawMessage `json:"fallback,omitempty" caddy:"namespace=http.reverse_proxy.selection_policies inline_key=policy"`

	fallback reverseproxy.Selector
	codec    *cookie.Codec
	attrs    cookieAttrs
	ttl      time.Duration
	opened   *openCache
	index    upstreamIndex
	stats    *scopeStats
	scope    string
	logger   *zap.Logger
	now      func() time.Time
	picks    pickLog
}

// CaddyModule returns the Caddy module information.
func (*StickyCookie) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.sticky_cookie",
		New: func() caddy.Module { return new(StickyCookie) },
	}
}

// Provision sets up the policy.
func (s *StickyCookie) Provision(ctx caddy.Context) error {
	s.logger = ctx.Logger()
	s.now = time.Now
	s.picks = pickLog(mayRetry(ctx))
	if s.Name == "" {
		s.Name = defaultCookieName
	}
	if s.Format == "" {
		s.Format = formatSealed
	}
	s.ttl = time.Duration(s.TTL)
	if s.ttl == 0 {
		s.ttl = defaultCookieTTL
	}
	if s.Secure == "" {
		s.Secure = secureAuto
	}
	s.attrs = cookieAttrs{
		Path:     s.Path,
		Domain:   s.Domain,
		MaxAge:   int(time.Duration(s.MaxAge).Seconds()),
		Secure:   s.Secure,
		HTTPOnly: s.HTTPOnly == nil || *s.HTTPOnly,
		SameSite: s.SameSite,
	}
	if s.attrs.Path == "" {
		s.attrs.Path = "/"
	}
	if s.Format == formatSealed {
		codec, err := s.SecretOptions.codec(s.logger, "sticky_cookie "+s.Name)
		if err != nil {
			return fmt.Errorf("sticky_cookie %s: %w", s.Name, err)
		}
		s.codec = codec
	}
	if s.FallbackRaw == nil {
		s.FallbackRaw = caddyconfig.JSONModuleObject(WeightedLeastConn{}, "policy", "weighted_least_conn", nil)
	}
	mod, err := ctx.LoadModule(s, "FallbackRaw")
	if err != nil {
		return fmt.Errorf("sticky_cookie %s: loading fallback selection policy: %w", s.Name, err)
	}
	s.fallback = mod.(reverseproxy.Selector)
	s.opened = newOpenCache()
	s.scope = "sticky_cookie:" + s.Name
	s.stats = acquireScope(s.scope)
	registerMetrics(ctx)
	return nil
}

// Validate checks the configuration.
func (s *StickyCookie) Validate() error {
	switch s.Format {
	case formatSealed, formatEnvoy:
	default:
		return fmt.Errorf("sticky_cookie: format %q: want %s or %s", s.Format, formatSealed, formatEnvoy)
	}
	switch s.Secure {
	case secureAuto, secureAlways, secureNever:
	default:
		return fmt.Errorf("sticky_cookie: secure %q: want auto, always or never", s.Secure)
	}
	switch s.SameSite {
	case "", "lax", "strict", "none":
	default:
		return fmt.Errorf("sticky_cookie: same_site %q: want lax, strict or none", s.SameSite)
	}
	if s.ttl < time.Second {
		return fmt.Errorf("sticky_cookie: ttl %s is below 1s", s.ttl)
	}
	if s.MaxAge < 0 {
		return fmt.Errorf("sticky_cookie: max_age must not be negative")
	}
	return nil
}

// Cleanup releases shared state.
func (s *StickyCookie) Cleanup() error {
	releaseScope(s.scope)
	return nil
}

// Select returns the upstream the client's cookie names if it may still serve the
// session, else picks one with the fallback policy and sets a fresh cookie.
func (s *StickyCookie) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	vars := requestVars(r)
	t := s.picks.tried(vars)
	now := requestTime(vars, s.now)
	reason := ""
	if v, ok := requestCookie(r.Header, s.Name); ok && v != "" {
		id, expires, err := s.open(v, now)
		switch {
		case err != nil:
			reason = reasonInvalid
			if errors.Is(err, cookie.ErrExpired) {
				reason = reasonExpired
			}
			s.stats.reject(cookie.Reason(err))
		default:
			var u *reverseproxy.Upstream
			if u, reason = checkPin(&s.index, pool, id, t); u != nil {
				s.stats.hits.Add(1)
				// Slide the expiry when half the ttl is gone; an Envoy cookie without a
				// wall-clock expiry gets one.
				if expires.IsZero() || expires.Sub(now) < s.ttl/2 {
					s.setCookie(r, w, u, now)
				}
				s.picks.record(vars, u)
				return u
			}
		}
	}
	u := s.fallback.Select(poolForNew(pool, t), r, w)
	if u == nil {
		return nil
	}
	if reason != "" {
		s.stats.repins.add(reason)
	} else {
		s.stats.misses.Add(1)
	}
	s.setCookie(r, w, u, now)
	s.picks.record(vars, u)
	return u
}

// open returns the identity and expiry a cookie value carries. Values opened before are
// answered from the cache (see openCache), their expiry checked here as the codec would.
func (s *StickyCookie) open(v string, now time.Time) (string, time.Time, error) {
	if e := s.opened.get(v); e != nil {
		if !e.expires.IsZero() && !now.Before(e.expires) {
			return "", time.Time{}, fmt.Errorf("%w at %s", cookie.ErrExpired, e.expires.UTC().Format(time.RFC3339))
		}
		return e.backend, e.expires, nil
	}
	id, exp, err := s.openValue(v, now)
	if err == nil {
		s.opened.put(v, id, exp)
	}
	return id, exp, err
}

// openValue opens v with the codec (or decodes Envoy's cookie).
func (s *StickyCookie) openValue(v string, now time.Time) (string, time.Time, error) {
	if s.Format == formatEnvoy {
		// Enforced as current Envoys enforce it; none (or a monotonic one, which
		// DecodeEnvoy drops) means no expiry, and Select re-issues the cookie with one.
		addr, exp, err := cookie.DecodeEnvoy(v)
		if err != nil {
			return "", time.Time{}, err
		}
		if !exp.IsZero() && !now.Before(exp) {
			return "", time.Time{}, fmt.Errorf("%w at %s", cookie.ErrExpired, exp.UTC().Format(time.RFC3339))
		}
		return addr, exp, nil
	}
	p, err := s.codec.Open(v, s.Name, now)
	if err != nil {
		return "", time.Time{}, err
	}
	return p.Backend, p.Expires, nil
}

// setCookie sets the session cookie for u.
func (s *StickyCookie) setCookie(r *http.Request, w http.ResponseWriter, u *reverseproxy.Upstream, now time.Time) {
	var value string
	if s.Format == formatEnvoy {
		value = cookie.EncodeEnvoy(identity(u), now.Add(s.ttl))
	} else {
		v, err := s.codec.Seal(cookie.Payload{Backend: identity(u), Issued: now, Expires: now.Add(s.ttl)}, s.Name)
		if err != nil {
			if c := s.logger.Check(zap.ErrorLevel, "sealing session cookie"); c != nil {
				c.Write(zap.String("upstream", identity(u)), zap.Error(err))
			}
			return
		}
		value = v
	}
	setResponseCookie(w, s.attrs.cookie(r, s.Name, value))
	if !s.KeepCacheControl {
		if hk := hookFor(r); hk != nil {
			hk.onResponse(s, s.privateIfCookie)
		} else {
			// Without the stickylb handler the upstream's Cache-Control lines are added
			// after this one; private comes first, but public or s-maxage may remain.
			w.Header().Set("Cache-Control", "private")
		}
	}
}

// privateIfCookie makes a response that sets the cookie private (see KeepCacheControl).
func (s *StickyCookie) privateIfCookie(_ *http.Request, h http.Header) {
	for _, line := range h["Set-Cookie"] {
		if setCookieName(line) == s.Name {
			makePrivate(h)
			return
		}
	}
}

// Interface guards
var (
	_ caddy.Provisioner     = (*StickyCookie)(nil)
	_ caddy.Validator       = (*StickyCookie)(nil)
	_ caddy.CleanerUpper    = (*StickyCookie)(nil)
	_ reverseproxy.Selector = (*StickyCookie)(nil)
)
