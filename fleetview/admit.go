package fleetview

import (
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/stickylb/stickylb/policies/pools"
)

// What a node fed by the control plane dials. The control plane names backends by address,
// and a node that dialled whatever it was told would proxy clients to its own admin API
// (a Caddy node's 127.0.0.1:2019), to a cloud's metadata service (169.254.169.254) or to
// services bound to loopback only. So a node leaves out endpoints on loopback, link-local
// and unspecified addresses (IPv4, IPv6 and IPv4-mapped IPv6), and always its own admin
// address and listeners; a refused endpoint is left out and the rest of the view applies.

// AddressRefusal says why a node fed by the control plane leaves out a backend at a, or ""
// when it dials it. allowLoopback admits loopback addresses (demos and tests on one host),
// and nothing else.
func AddressRefusal(a netip.Addr, allowLoopback bool) string {
	a = a.Unmap()
	switch {
	case !a.IsValid():
		return "not an IP address"
	case a.IsUnspecified(), a.Is4() && a.As4()[0] == 0:
		return "an unspecified address (0.0.0.0/8 or ::) reaches this host"
	case a.IsLoopback() && !allowLoopback:
		return "a loopback address reaches this host's own services (allow_loopback or --allow-loopback admits it)"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return "a link-local address (169.254.0.0/16, fe80::/10) reaches the host's link, metadata services included"
	}
	return ""
}

// Admission is what a node fed by the control plane dials.
type Admission struct {
	// AllowLoopback admits backends on loopback addresses.
	AllowLoopback bool
	// Own says why ap is one of the node's own addresses (its admin API, a listener, a
	// VIP it serves), "" when it is not; nil: none. Own addresses are refused whatever
	// AllowLoopback says.
	Own func(ap netip.AddrPort) string
}

// Refusal says why ap is left out, "" when the node dials it.
func (a Admission) Refusal(ap netip.AddrPort) string {
	if a.Own != nil {
		if why := a.Own(netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())); why != "" {
			return why
		}
	}
	return AddressRefusal(ap.Addr(), a.AllowLoopback)
}

// Refused is one backend a node left out of a view.
type Refused struct {
	Service, Address, Reason string
}

// Filter returns v without the backends a refuses (v itself is not modified: the services
// that lose a backend are copies), and what it left out, in view order.
func (a Admission) Filter(v *View) (*View, []Refused) {
	out := &View{File: v.File, Verdicts: v.Verdicts, Waiting: v.Waiting}
	var refused []Refused
	for i, s := range v.File.Services {
		var keep []int
		for j, b := range s.Backends {
			if why := a.Refusal(b.AddrPort()); why != "" {
				refused = append(refused, Refused{Service: s.Name, Address: b.Address, Reason: why})
				continue
			}
			keep = append(keep, j)
		}
		if len(keep) == len(s.Backends) {
			continue
		}
		if out.File == v.File {
			f := *v.File
			f.Services = slices.Clone(v.File.Services)
			out.File = &f
		}
		cp := *s
		cp.Backends = make([]*pools.Backend, 0, len(keep))
		for _, j := range keep {
			cp.Backends = append(cp.Backends, s.Backends[j])
		}
		out.File.Services[i] = &cp
	}
	return out, refused
}

// HostAddress reports whether a is an address of this host: a loopback address or one an
// interface holds (in the node's network namespace). A listener bound to a wildcard takes
// connections on each of them.
func HostAddress(a netip.Addr) bool {
	a = a.Unmap()
	if a.IsLoopback() || a.IsUnspecified() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, ad := range addrs {
		if n, ok := ad.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a {
				return true
			}
		}
	}
	return false
}

// ListenerTakes reports whether a TCP listener at listen ("host:port" as a flag gives it;
// an empty or unspecified host binds every address of the host, localhost the loopback
// ones) takes connections to ap.
func ListenerTakes(listen string, ap netip.AddrPort) bool {
	host, port, err := net.SplitHostPort(listen)
	if err != nil || port != strconv.Itoa(int(ap.Port())) {
		return false
	}
	a := ap.Addr().Unmap()
	switch h, err := netip.ParseAddr(host); {
	case host == "" || err == nil && h.IsUnspecified():
		return HostAddress(a)
	case strings.EqualFold(host, "localhost"):
		return a.IsLoopback()
	case err == nil:
		return h.Unmap() == a
	}
	return false
}

// Refusals remembers the endpoints a node leaves out, so each is logged once while it
// stays refused, and lists them (a node's status). Safe for concurrent use.
type Refusals struct {
	mu   sync.Mutex
	seen map[Refused]bool
}

// Add records r and reports whether it is new (to be logged).
func (rs *Refusals) Add(r Refused) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.seen[r] {
		return false
	}
	if rs.seen == nil {
		rs.seen = map[Refused]bool{}
	}
	rs.seen[r] = true
	return true
}

// Set replaces the record with all (every refusal of the view now applied) and returns
// those that are new.
func (rs *Refusals) Set(all []Refused) []Refused {
	var fresh []Refused
	now := map[Refused]bool{}
	for _, r := range all {
		now[r] = true
		if rs.Add(r) {
			fresh = append(fresh, r)
		}
	}
	rs.Keep(func(r Refused) bool { return now[r] })
	return fresh
}

// Keep forgets the refusals keep rejects (endpoints no longer in the view): one that comes
// back is logged again.
func (rs *Refusals) Keep(keep func(Refused) bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for r := range rs.seen {
		if !keep(r) {
			delete(rs.seen, r)
		}
	}
}

// List returns the refusals recorded, by service and address.
func (rs *Refusals) List() []Refused {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	out := make([]Refused, 0, len(rs.seen))
	for r := range rs.seen {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Refused) int {
		return strings.Compare(a.Service+"\x00"+a.Address+"\x00"+a.Reason, b.Service+"\x00"+b.Address+"\x00"+b.Reason)
	})
	return out
}
