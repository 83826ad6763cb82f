package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/policies/cookie"
	"github.com/stickylb/stickylb/policies/keys"
	"github.com/stickylb/stickylb/policies/sessions"
)

func init() {
	caddy.RegisterModule(new(AppCookie))
}

// Modes of app_cookie.
const (
	appModePrefix = "prefix"
	appModeLearn  = "learn"
)

// prefixSep separates the sealed identity from the application's value, as HAProxy's
// `cookie ... prefix` does. It is outside base64url, so the first one ends our prefix.
const prefixSep = '~'

// AppCookie follows the application's own session cookie NAME.
//
// In prefix mode (default) the upstream's `Set-Cookie: NAME=v` reaches the client as
// NAME=<sealed identity>~v; requests are routed by the prefix and forwarded with the
// original v. It keeps no state, so every Caddy node with the same secret routes the
// session the same way; a prefix is honoured for ttl after the upstream last set the
// cookie. In learn mode the value v is remembered against the upstream that set it (a
// bounded session table); requests whose v is not in this node's table go by the
// consistent hash of v and are not stored (only upstreams add keys: HAProxy's
// store-response), so a flood of invented values cannot evict real sessions. An application
// answers a request without its cookie with a fresh value, so cookie-less requests do add
// keys: those evict only keys nobody came back with (the table keeps keys seen twice in its
// protected segment), and MaxNewPerClient bounds what one client address adds.
//
// Both modes need the response: add the stickylb handler to the route (the Caddyfile
// directive `stickylb`, which sorts before reverse_proxy).
type AppCookie struct {
	// Name of the application's cookie, e.g. JSESSIONID.
	Name string `json:"name,omitempty"`
	// Mode is prefix (default) or learn.
	Mode string `json:"mode,omitempty"`
	// SecretOptions seal the prefix (prefix mode).
	SecretOptions
	// KeepCacheControl (prefix mode) leaves Cache-Control as the upstream sent it on
	// responses whose Set-Cookie the LB prefixed. By default such a response is made
	// private as sticky_cookie's are (see StickyCookie.KeepCacheControl): it carries a
	// cookie of the LB's, which a shared cache must not hand to other clients.
	KeepCacheControl bool `json:"keep_cache_control,omitempty"`
	// MaxNewPerClient (learn mode) bounds the new sessions one client address may start a
	// minute: values an upstream sets past it, for a request that carried no such value, are
	// not learned (they go by their hash, as values the table does not hold). Default
	// sessions.DefaultNewPerClient; negative: no bound. A client is its address as Caddy
	// determines it (trusted_proxies), an IPv6 client its /64.
	MaxNewPerClient int `json:"max_new_per_client,omitempty"`
	KeyedOptions

	codec  *cookie.Codec
	opened *openCache
	// respond is a.onResponse, bound once: a method value made per request allocates.
	respond func(*http.Request, http.Header)
	core    keyedCore
	perIP   *sessions.ClientCap // learn mode: nil when unbounded
	ttl     time.Duration
	context string
	varKey  string
	logger  *zap.Logger
	now     func() time.Time
	warn    sync.Once
}

// CaddyModule returns the Caddy module information.
func (*AppCookie) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.app_cookie",
		New: func() caddy.Module { return new(AppCookie) },
	}
}

// Provision sets up the policy.
func (a *AppCookie) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	a.now = time.Now
	if a.Name == "" {
		return errors.New("app_cookie: the application's cookie name is required")
	}
	if a.Mode == "" {
		a.Mode = appModePrefix
	}
	a.respond = a.onResponse
	a.context = "app_cookie:" + a.Name
	a.varKey = "stickylb.app_cookie." + a.Name
	a.ttl = time.Duration(a.TTL)
	if a.ttl == 0 {
		a.ttl = defaultTableTTL
	}
	switch a.Mode {
	case appModePrefix:
		if a.MaxSessions > 0 || a.Table != "" || a.MaxNewPerClient != 0 {
			return fmt.Errorf("app_cookie %s: max_sessions, max_new_per_client and table apply to learn mode only (prefix mode keeps no table)", a.Name)
		}
		codec, err := a.SecretOptions.codec(a.logger, "app_cookie "+a.Name)
		if err != nil {
			return fmt.Errorf("app_cookie %s: %w", a.Name, err)
		}
		a.codec = codec
		a.opened = newOpenCache()
		// The prefix carries the pin: no table (ttl bounds the prefix's validity instead).
		if err := a.core.provision(ctx, a, &a.KeyedOptions, "app_cookie", a.context, false); err != nil {
			return err
		}
	case appModeLearn:
		if len(a.Secrets) > 0 || a.SecretFile != "" || a.InsecureDemoSecret {
			return fmt.Errorf("app_cookie %s: secret applies to prefix mode only", a.Name)
		}
		if a.KeepCacheControl {
			return fmt.Errorf("app_cookie %s: keep_cache_control applies to prefix mode only (learn mode sets no cookie of its own)", a.Name)
		}
		if a.NoTable {
			return fmt.Errorf("app_cookie %s: learn mode needs its table (no_table applies to other policies)", a.Name)
		}
		a.core.learnOnly = true
		if err := a.core.provision(ctx, a, &a.KeyedOptions, "app_cookie", a.context, true); err != nil {
			return err
		}
		if n := a.MaxNewPerClient; n >= 0 {
			if n == 0 {
				n = sessions.DefaultNewPerClient
			}
			var err error
			if a.perIP, err = sessions.NewClientCap(n, nil); err != nil {
				return fmt.Errorf("app_cookie %s: max_new_per_client: %w", a.Name, err)
			}
		}
	default:
		return fmt.Errorf("app_cookie %s: mode %q: want %s or %s", a.Name, a.Mode, appModePrefix, appModeLearn)
	}
	// The response hook reads back which upstream answered: picks are recorded even when
	// nothing retries.
	a.core.picks = true
	return nil
}

// Validate checks the configuration.
func (a *AppCookie) Validate() error { return a.KeyedOptions.validate("app_cookie") }

// Cleanup releases shared state.
func (a *AppCookie) Cleanup() error { a.core.cleanup(); return nil }

// Select routes by the cookie (prefix or learned value) and asks the handler to rewrite
// or learn the response's Set-Cookie.
func (a *AppCookie) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	hk := hookFor(r)
	if hk == nil {
		a.warn.Do(func() {
			a.logger.Error("app_cookie cannot see responses: add the `stickylb` handler to this route (before reverse_proxy); sessions are not kept until then",
				zap.String("cookie", a.Name))
		})
		a.core.stats.repins.add("no_handler")
	} else {
		hk.onResponse(a, a.respond)
	}
	if a.Mode == appModeLearn {
		return a.selectLearn(pool, r, w)
	}
	return a.selectPrefix(pool, r, w)
}

// selectPrefix routes by the sealed prefix of the request's cookie. The first attempt
// strips the prefix from the request (the upstream sees its own value), so what the prefix
// held is kept in the request's vars for retries: the open cache's entry, a pointer, so
// keeping it allocates nothing on the hit path; or, when the prefix yielded no pin, the
// reason (a re-pin on every attempt). A cookie without a prefix is read again by a retry.
func (a *AppCookie) selectPrefix(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	var pin *openedValue
	switch kept := caddyhttp.GetVar(r.Context(), a.varKey).(type) {
	case *openedValue:
		pin = kept
	case string:
		return a.pickNew(pool, r, w, kept)
	default:
		v, ok := requestCookie(r.Header, a.Name)
		if !ok {
			return a.pickNew(pool, r, w, "")
		}
		i := strings.IndexByte(v, prefixSep)
		if i < 0 {
			return a.pickNew(pool, r, w, "")
		}
		// The application must see its own value, whatever happens to the prefix.
		replaceRequestCookie(r.Header, a.Name, v[i+1:])
		e, err := a.openPrefix(v[:i], a.now())
		if err != nil {
			reason := reasonInvalid
			if errors.Is(err, cookie.ErrExpired) {
				reason = reasonExpired
			}
			a.core.stats.reject(cookie.Reason(err))
			caddyhttp.SetVar(r.Context(), a.varKey, reason)
			return a.pickNew(pool, r, w, reason)
		}
		caddyhttp.SetVar(r.Context(), a.varKey, e)
		pin = e
	}
	u, reason := checkPin(&a.core.index, pool, pin.backend, triedFor(r))
	if u == nil {
		return a.pickNew(pool, r, w, reason)
	}
	a.core.stats.hits.Add(1)
	recordPick(r, u)
	return u
}

// openPrefix returns what a prefix seals, from the cache when it opened before (see
// openCache; the expiry is checked on every request).
func (a *AppCookie) openPrefix(prefix string, now time.Time) (*openedValue, error) {
	if e := a.opened.get(prefix); e != nil {
		if !now.Before(e.expires) {
			return nil, fmt.Errorf("%w at %s", cookie.ErrExpired, e.expires.UTC().Format(time.RFC3339))
		}
		return e, nil
	}
	p, err := a.codec.Open(prefix, a.context, now)
	if err != nil {
		return nil, err
	}
	return a.opened.put(prefix, p.Backend, p.Expires), nil
}

// pickNew starts a session on a fallback pick; the upstream's Set-Cookie will carry it.
func (a *AppCookie) pickNew(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter, reason string) *reverseproxy.Upstream {
	u := a.core.selectUnkeyed(requestVars(r), pool, r, w)
	if u == nil {
		return nil
	}
	if reason != "" {
		a.core.stats.repins.add(reason)
	} else {
		a.core.stats.misses.Add(1)
	}
	return u
}

func (a *AppCookie) selectLearn(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	v, ok := requestCookie(r.Header, a.Name)
	vars := requestVars(r)
	if !ok || v == "" || len(v) > keys.MaxValueLen {
		return a.core.selectUnkeyed(vars, pool, r, w)
	}
	return a.core.selectKey(vars, pool, a.key(v))
}

// key is the table and hash key of an application value: the value itself, or a digest
// when it is longer than the table keeps verbatim.
func (a *AppCookie) key(v string) keys.Key {
	return keys.NewKey(v, a.MaxKeyLength)
}

// onResponse rewrites (prefix) or learns (learn) the upstream's Set-Cookie for the cookie.
func (a *AppCookie) onResponse(r *http.Request, h http.Header) {
	t := triedFor(r)
	if t.empty() {
		return
	}
	served := t.last() // the last attempt is the one that answered
	lines := h["Set-Cookie"]
	prefixed := false // the response now sets a cookie of the LB's
	for i, line := range lines {
		if setCookieName(line) != a.Name {
			continue
		}
		value, rest := splitSetCookie(line)
		deleting := value == "" || isDeletion(rest)
		switch a.Mode {
		case appModeLearn:
			if deleting {
				if v, ok := requestCookie(r.Header, a.Name); ok && a.core.table != nil {
					a.core.table.Delete(a.key(v).TableKey)
				}
				continue
			}
			if len(value) <= keys.MaxValueLen && a.admit(r, value) {
				a.core.learn(a.key(value), served)
			}
		default:
			if deleting {
				continue
			}
			// The prefix lives for ttl from the upstream's last Set-Cookie of the cookie: the
			// upstream re-setting it (a refresh, a new value) slides the session.
			now := a.now()
			prefix, err := a.codec.Seal(cookie.Payload{Backend: identity(served), Issued: now, Expires: now.Add(a.ttl)}, a.context)
			if err != nil {
				if c := a.logger.Check(zap.ErrorLevel, "sealing app cookie prefix"); c != nil {
					c.Write(zap.String("cookie", a.Name), zap.Error(err))
				}
				continue
			}
			lines[i] = a.Name + "=" + prefix + string(prefixSep) + value + rest
			prefixed = true
		}
	}
	if prefixed && !a.KeepCacheControl {
		makePrivate(h)
	}
}

// admit says whether learn mode may learn value, set by the upstream for request r: a value
// the request carried is a session going on; a new one counts against the client's
// max_new_per_client.
func (a *AppCookie) admit(r *http.Request, value string) bool {
	if a.perIP == nil {
		return true
	}
	if v, ok := requestCookie(r.Header, a.Name); ok && v == value {
		return true
	}
	client, _ := netip.ParseAddr(clientIP(requestVars(r)))
	if a.perIP.Admit(client) {
		return true
	}
	a.core.stats.capped.Add(1)
	return false
}

// splitSetCookie splits a Set-Cookie line into its value and the attributes that follow
// (starting at the first ';', kept verbatim).
func splitSetCookie(line string) (value, rest string) {
	eq := strings.IndexByte(line, '=')
	if eq < 0 {
		return "", ""
	}
	v := line[eq+1:]
	if i := strings.IndexByte(v, ';'); i >= 0 {
		v, rest = v[:i], v[i:]
	}
	return strings.TrimSpace(v), rest
}

// isDeletion reports whether Set-Cookie attributes delete the cookie (Max-Age<=0 or an
// Expires in the past), which must not be prefixed or learned.
func isDeletion(attrs string) bool {
	for _, a := range strings.Split(attrs, ";") {
		k, v, _ := strings.Cut(strings.TrimSpace(a), "=")
		switch strings.ToLower(k) {
		case "max-age":
			if v = strings.TrimSpace(v); v != "" && (v[0] == '-' || v == "0") {
				return true
			}
		case "expires":
			if t, err := http.ParseTime(strings.TrimSpace(v)); err == nil && t.Before(time.Now()) {
				return true
			}
		}
	}
	return false
}

// Interface guards
var (
	_ caddy.Provisioner     = (*AppCookie)(nil)
	_ caddy.Validator       = (*AppCookie)(nil)
	_ caddy.CleanerUpper    = (*AppCookie)(nil)
	_ reverseproxy.Selector = (*AppCookie)(nil)
)
