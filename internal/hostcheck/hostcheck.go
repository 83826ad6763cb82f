// Package hostcheck keeps an HTTP endpoint from answering requests addressed to names it
// does not have: the defence against DNS rebinding. A page from evil.example whose name
// is then re-resolved to the endpoint's address (127.0.0.1, a private address) reaches the
// endpoint as same-origin, and could read it or press its buttons; but the browser still
// sends Host: evil.example, the name it resolved. An endpoint that answers only its own
// names refuses it. An IP literal in Host is never such a page: no one else's page can
// have the endpoint's own address as its origin.
//
// One rule for every stickylb endpoint that has no authentication of its own: `stickylb
// xds --admin`, `stickylb xdp --metrics`, and the drains of Caddy's stickylb_status on a
// site that names no host.
package hostcheck

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Names are the Host names an endpoint answers. The zero value answers none.
type Names struct {
	names         map[string]bool     // host names, lower case, without a trailing dot
	ips           map[netip.Addr]bool // IP literals, unmapped, without a zone
	anyIP         bool                // every IP literal (a wildcard bind)
	anyLoopbackIP bool                // every loopback IP literal
}

// localhost is the name every loopback endpoint answers.
const localhost = "localhost"

// ForListen returns the names of an endpoint listening on addr (host:port) and answering
// the names in extra too:
//   - a wildcard bind (no host, 0.0.0.0, ::) answers every IP literal and localhost;
//   - an IP bind answers that address, and localhost too when it is a loopback one;
//   - a bind to a name answers that name (localhost: and every loopback address).
//
// An extra name is a host name or an IP literal, without a port.
func ForListen(addr string, extra ...string) (*Names, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("listen address %q: %w", addr, err)
	}
	n := &Names{names: map[string]bool{}, ips: map[netip.Addr]bool{}}
	ip, ipErr := netip.ParseAddr(host)
	switch {
	case host == "" || ipErr == nil && ip.IsUnspecified():
		n.anyIP = true
		n.names[localhost] = true
	case ipErr == nil:
		n.ips[canonical(ip)] = true
		if ip.IsLoopback() {
			n.names[localhost] = true
		}
	default:
		if err := n.add(host); err != nil {
			return nil, fmt.Errorf("listen address %q: %w", addr, err)
		}
		if name(host) == localhost {
			n.anyLoopbackIP = true
		}
	}
	for _, e := range extra {
		if err := n.add(e); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// Loopback returns the names of the loopback interface: localhost and every loopback
// address.
func Loopback() *Names {
	return &Names{names: map[string]bool{localhost: true}, anyLoopbackIP: true}
}

// add admits one more host name or IP literal.
func (n *Names) add(h string) error {
	if ip, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")); err == nil {
		n.ips[canonical(ip)] = true
		return nil
	}
	nm := name(h)
	if nm == "" || len(nm) > 253 || strings.Trim(nm, "abcdefghijklmnopqrstuvwxyz0123456789.-_") != "" {
		return fmt.Errorf("host name %q: want a DNS name or an IP address, without a port", h)
	}
	n.names[nm] = true
	return nil
}

// Allows reports whether a request whose Host header is host (with or without a port)
// is addressed to one of the names. An empty Host (an HTTP/1.0 tool) names nothing a page
// could come from, and passes.
func (n *Names) Allows(host string) bool {
	if host == "" {
		return true
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else {
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		ip = canonical(ip)
		return n.anyIP || n.anyLoopbackIP && ip.IsLoopback() || n.ips[ip]
	}
	return n.names[name(host)]
}

// Guard serves next the requests Allows and refuses the others with 421 Misdirected
// Request, saying which names the endpoint answers (hint says how to add one); refused,
// when set, hears of each refusal first.
func (n *Names) Guard(next http.Handler, hint string, refused func(*http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !n.Allows(r.Host) {
			if refused != nil {
				refused(r)
			}
			http.Error(w, fmt.Sprintf("Host %q is not a name of this endpoint (%s)", r.Host, hint), http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// name is h as names compare: lower case, without the trailing dot of a rooted name.
func name(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }

// canonical is ip as addresses compare: an IPv4-mapped IPv6 address as IPv4, no zone.
func canonical(ip netip.Addr) netip.Addr { return ip.Unmap().WithZone("") }
