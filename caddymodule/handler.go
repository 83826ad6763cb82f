package caddymodule

import (
	"io"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	caddy.RegisterModule(Handler{})
	httpcaddyfile.RegisterHandlerDirective("stickylb", parseHandlerCaddyfile)
	// Ordered right before reverse_proxy, so `stickylb` can stand anywhere in a site block.
	httpcaddyfile.RegisterDirectiveOrder("stickylb", httpcaddyfile.Before, "reverse_proxy")
}

// Handler lets stickylb's selection policies see the upstream's response, which a
// reverse_proxy Selector cannot: app_cookie rewrites or learns the application's
// Set-Cookie there. Put it in the route before reverse_proxy (the Caddyfile directive
// `stickylb` is ordered there by default). It does nothing for requests whose policy does
// not ask for the response.
type Handler struct{}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.stickylb",
		New: func() caddy.Module { return new(Handler) },
	}
}

// hookVarKey names the request variable holding the request's *responseHook.
const hookVarKey = "stickylb.hook"

// responseHook collects what policies want done to the response headers, just before they
// are written. Policies register in Select, which may run several times (retries): one
// entry per policy, the last registration wins.
type responseHook struct {
	r    *http.Request
	fns  []hookFn
	buf  [2]hookFn // fns' first entries: one policy per request is the rule
	done bool
}

type hookFn struct {
	owner any
	fn    func(r *http.Request, h http.Header)
}

// onResponse registers fn for owner, replacing owner's earlier registration.
func (h *responseHook) onResponse(owner any, fn func(r *http.Request, h http.Header)) {
	for i := range h.fns {
		if h.fns[i].owner == owner {
			h.fns[i].fn = fn
			return
		}
	}
	h.fns = append(h.fns, hookFn{owner: owner, fn: fn})
}

func (h *responseHook) run(hdr http.Header) {
	if h.done {
		return
	}
	h.done = true
	for _, f := range h.fns {
		f.fn(h.r, hdr)
	}
}

// hookFor returns the request's hook, or nil when the stickylb handler is not in the route.
func hookFor(r *http.Request) *responseHook {
	h, _ := caddyhttp.GetVar(r.Context(), hookVarKey).(*responseHook)
	return h
}

// ServeHTTP wraps the response writer so the hook runs before the headers go out.
func (Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	hk := &responseHook{r: r}
	hk.fns = hk.buf[:0]
	caddyhttp.SetVar(r.Context(), hookVarKey, hk)
	return next.ServeHTTP(&hookWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, hook: hk}, r)
}

// hookWriter runs the hook at the first final (non-1xx) status, or at the first body write
// when the status is implicit.
type hookWriter struct {
	*caddyhttp.ResponseWriterWrapper
	hook *responseHook
}

// WriteHeader runs the hook before a final status.
func (w *hookWriter) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols {
		w.hook.run(w.Header())
	}
	w.ResponseWriterWrapper.WriteHeader(code)
}

// Write runs the hook if no status was written yet (an implicit 200).
func (w *hookWriter) Write(b []byte) (int, error) {
	w.hook.run(w.Header())
	return w.ResponseWriterWrapper.Write(b)
}

// ReadFrom runs the hook first: the wrapped ReadFrom would write the headers itself.
func (w *hookWriter) ReadFrom(r io.Reader) (int64, error) {
	w.hook.run(w.Header())
	return w.ResponseWriterWrapper.ReadFrom(r)
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	stickylb
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Errf("stickylb takes no options")
	}
	return nil
}

func parseHandlerCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var m Handler
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// Interface guards
var (
	_ caddyhttp.MiddlewareHandler = Handler{}
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
	_ http.ResponseWriter         = (*hookWriter)(nil)
	_ io.ReaderFrom               = (*hookWriter)(nil)
)
