package caddymodule

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/fleetview"
)

// What a Caddy node fed by the control plane proxies to: fleetview's rule (no loopback
// unless allow_loopback, no link-local, no unspecified address), and never this Caddy's
// own listeners, its admin API first among them.

// ownListener says why ap is an address this Caddy listens on ("" when it is not): its
// admin endpoint, a server of its config, any app's listener. Caddy's listener pool counts
// each listener under the address its config writes, so ap is looked up as its IP, as
// localhost when it is a loopback address, and as a wildcard bind (":port", "0.0.0.0",
// "[::]") when it is an address of this host. A listener written with another host name
// is not matched; loopback and link-local addresses are refused without it.
func ownListener(ap netip.AddrPort) string {
	a, port := ap.Addr().Unmap(), strconv.Itoa(int(ap.Port()))
	hosts := []string{a.String()}
	if a.IsLoopback() {
		hosts = append(hosts, "localhost")
	}
	for _, h := range hosts {
		if caddyListens(h, port) {
			return "this Caddy listens there (its admin API or a server)"
		}
	}
	for _, h := range []string{"", "0.0.0.0", "::"} {
		if caddyListens(h, port) && fleetview.HostAddress(a) {
			return "this Caddy listens there on every address of the host (its admin API or a server)"
		}
	}
	return ""
}

// caddyListens reports whether Caddy's listener pool holds a TCP listener at host:port.
func caddyListens(host, port string) bool {
	addr := net.JoinHostPort(host, port)
	for _, network := range []string{"tcp", "tcp4", "tcp6"} {
		if caddy.ListenerUsage(network, addr) > 0 {
			return true
		}
	}
	return false
}

// admitted returns s with the backends this source may proxy to: those x's admission
// refuses are left out, and each refusal is logged once by the subscription while it lasts.
func (x *XDSUpstreams) admitted(name string, s *xdsService) *xdsService {
	adm := fleetview.Admission{AllowLoopback: x.AllowLoopback, Own: ownListener}
	var keep []xdsBackend
	for i, b := range s.Backends {
		ap, err := netip.ParseAddrPort(b.Dial)
		why := "not ip:port"
		if err == nil {
			why = adm.Refusal(ap)
		}
		if why == "" {
			if keep != nil {
				keep = append(keep, b)
			}
			continue
		}
		if keep == nil {
			keep = append(make([]xdsBackend, 0, len(s.Backends)), s.Backends[:i]...)
		}
		x.sub.refused(fleetview.Refused{Service: name, Address: b.Dial, Reason: why})
	}
	if keep == nil {
		return s
	}
	out := *s
	out.Backends = keep
	return &out
}

// refused logs r once while it lasts (a sub without a log, in a test, only records it).
func (s *xdsSub) refused(r fleetview.Refused) {
	if s.refusals.Add(r) && s.log != nil {
		s.log.Warn("left out a backend the control plane named", zap.String("service", r.Service),
			zap.String("address", r.Address), zap.String("reason", r.Reason))
	}
}

// defaultXDSMaxMessage bounds a response from the control plane on a Caddy node (the ADS
// client's own default, 256 MiB, suits a forwarder's whole fleet, not one service's
// upstreams): a hostile or broken control plane's huge view ends the stream unread.
const defaultXDSMaxMessage = 16 << 20

// parseByteSize reads a size: a number of bytes, or one followed by a unit (B, KB, MB, GB,
// KiB, MiB, GiB; case does not matter).
func parseByteSize(v string) (int, error) {
	i := 0
	for i < len(v) && v[i] >= '0' && v[i] <= '9' {
		i++
	}
	n, err := strconv.Atoi(v[:i])
	if err != nil {
		return 0, fmt.Errorf("%q is not a size (e.g. 16MiB)", v)
	}
	units := map[string]int{"": 1, "b": 1, "kb": 1000, "mb": 1000 * 1000, "gb": 1000 * 1000 * 1000,
		"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
	u, ok := units[strings.ToLower(strings.TrimSpace(v[i:]))]
	if !ok || n <= 0 || n > math.MaxInt32/u {
		return 0, fmt.Errorf("%q is not a size from 1 byte to 2 GiB (e.g. 16MiB)", v)
	}
	return n * u, nil
}
