package caddymodule

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// requestCookie returns the value of the first cookie called name in r's Cookie headers.
// It scans the headers in place instead of calling r.Cookie, which parses and allocates
// every cookie of the request: this runs on every request.
func requestCookie(h http.Header, name string) (string, bool) {
	for _, line := range h["Cookie"] {
		for len(line) > 0 {
			var part string
			if i := strings.IndexByte(line, ';'); i >= 0 {
				part, line = line[:i], line[i+1:]
			} else {
				part, line = line, ""
			}
			part = strings.TrimLeft(part, " \t")
			if len(part) <= len(name) || part[len(name)] != '=' || part[:len(name)] != name {
				continue
			}
			v := strings.TrimRight(part[len(name)+1:], " \t")
			if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
				v = v[1 : len(v)-1]
			}
			return v, true
		}
	}
	return "", false
}

// replaceRequestCookie rewrites the value of the first cookie called name in h's Cookie
// headers to value, leaving every other cookie as the client sent it. It mutates the
// header slice in place: Caddy's proxy loop copies request headers from that same map
// for each attempt, so the rewrite reaches the upstream on retries too.
func replaceRequestCookie(h http.Header, name, value string) bool {
	lines := h["Cookie"]
	for li, line := range lines {
		off := 0
		for off <= len(line) {
			end := strings.IndexByte(line[off:], ';')
			if end < 0 {
				end = len(line)
			} else {
				end += off
			}
			part := line[off:end]
			lead := len(part) - len(strings.TrimLeft(part, " \t"))
			p := part[lead:]
			if len(p) > len(name) && p[len(name)] == '=' && p[:len(name)] == name {
				start := off + lead + len(name) + 1
				lines[li] = line[:start] + value + line[end:]
				return true
			}
			off = end + 1
		}
	}
	return false
}

// cookieAttrs are the attributes of a cookie stickylb sets, following Caddy's cookie policy:
// HttpOnly, Path=/, and Secure with SameSite=None when the client connection is TLS (or a
// trusted proxy says X-Forwarded-Proto: https), SameSite=Lax otherwise.
type cookieAttrs struct {
	Path     string
	Domain   string
	MaxAge   int // seconds; 0 = a session cookie
	Secure   string
	HTTPOnly bool
	SameSite string
}

// Values of Secure: auto follows the connection; always and never force it.
const (
	secureAuto   = "auto"
	secureAlways = "always"
	secureNever  = "never"
)

func (a cookieAttrs) cookie(r *http.Request, name, value string) *http.Cookie {
	c := &http.Cookie{
		Name:     name,
		Value:    value,
		Path:     a.Path,
		Domain:   a.Domain,
		MaxAge:   a.MaxAge,
		HttpOnly: a.HTTPOnly,
		SameSite: http.SameSiteLaxMode,
	}
	switch a.Secure {
	case secureAlways:
		c.Secure = true
	case secureNever:
	default:
		c.Secure = isHTTPS(r)
	}
	if c.Secure {
		c.SameSite = http.SameSiteNoneMode
	}
	switch strings.ToLower(a.SameSite) {
	case "lax":
		c.SameSite = http.SameSiteLaxMode
	case "strict":
		c.SameSite = http.SameSiteStrictMode
	case "none":
		c.SameSite = http.SameSiteNoneMode
	}
	return c
}

// isHTTPS reports whether the client reached us over TLS, directly or through a proxy Caddy
// trusts (trusted_proxies) that says so.
func isHTTPS(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if trusted, ok := caddyhttp.GetVar(r.Context(), caddyhttp.TrustedProxyVarKey).(bool); ok && trusted {
		vals := r.Header.Values("X-Forwarded-Proto")
		if len(vals) > 0 {
			last := vals[len(vals)-1]
			if i := strings.LastIndexByte(last, ','); i >= 0 {
				last = last[i+1:]
			}
			return strings.EqualFold(strings.TrimSpace(last), "https")
		}
	}
	return false
}

// setResponseCookie sets c on w, replacing a Set-Cookie for the same name that an earlier
// attempt of this request added (a retry that re-pins must not leave two).
func setResponseCookie(w http.ResponseWriter, c *http.Cookie) {
	dropResponseCookie(w.Header(), c.Name)
	if v := c.String(); v != "" {
		w.Header().Add("Set-Cookie", v)
	}
}

// dropResponseCookie removes the Set-Cookie headers for name.
func dropResponseCookie(h http.Header, name string) {
	sc := h["Set-Cookie"]
	if len(sc) == 0 {
		return
	}
	kept := sc[:0]
	for _, line := range sc {
		if setCookieName(line) != name {
			kept = append(kept, line)
		}
	}
	if len(kept) == 0 {
		h.Del("Set-Cookie")
	} else {
		h["Set-Cookie"] = kept
	}
}

// setCookieName returns the cookie name of a Set-Cookie line.
func setCookieName(line string) string {
	if i := strings.IndexByte(line, '='); i >= 0 {
		return strings.TrimSpace(line[:i])
	}
	return ""
}

// makePrivate rewrites h's Cache-Control so that no shared cache stores the response:
// `public` and `s-maxage` are dropped and `private` is added unless `private` or
// `no-store` is already there; the other directives are kept in order.
func makePrivate(h http.Header) {
	var kept []string
	private := false
	for _, line := range h.Values("Cache-Control") {
		for _, d := range strings.Split(line, ",") {
			d = strings.TrimSpace(d)
			name, _, _ := strings.Cut(d, "=")
			switch strings.ToLower(strings.TrimSpace(name)) {
			case "":
				continue
			case "public", "s-maxage":
				continue
			case "private", "no-store":
				private = true
			}
			kept = append(kept, d)
		}
	}
	if !private {
		kept = append([]string{"private"}, kept...)
	}
	h.Set("Cache-Control", strings.Join(kept, ", "))
}
