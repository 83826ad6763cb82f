package main

import (
	"flag"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/stickylb/stickylb/l4xdp"
)

// natFlags are `stickylb xdp --nat-source` and `--nat-ports`: where the node's NAT flows
// leave from. Both modes (--pools and --xds) take them, since the addresses belong to the
// node, not to the fleet's configuration.
type natFlags struct {
	sources natSources
	ports   natPorts
}

// register adds the flags to fs, the port range at its default.
func (n *natFlags) register(fs *flag.FlagSet) {
	n.ports = natPorts{lo: l4xdp.DefaultNATPortLow, hi: l4xdp.DefaultNATPortHigh}
	fs.Var(&n.sources, "nat-source", "address of this LB that NAT flows leave from, IPv4 and/or IPv6 (repeat the flag or separate with commas); a backend reached by NAT needs one of its family")
	fs.Var(&n.ports, "nat-ports", "source ports of NAT flows, LO-HI with LO at least 1024; keep them out of the host's ephemeral range (net.ipv4.ip_local_port_range)")
}

// config is the loader's NAT configuration.
func (n *natFlags) config() l4xdp.NAT {
	return l4xdp.NAT{Sources: n.sources, PortLow: n.ports.lo, PortHigh: n.ports.hi}
}

// natSources is --nat-source: each use adds one address or a comma-separated list.
type natSources []netip.Addr

// String lists the addresses as the flag takes them.
func (s *natSources) String() string {
	out := make([]string, len(*s))
	for i, a := range *s {
		out[i] = a.String()
	}
	return strings.Join(out, ",")
}

// Set adds the addresses of v. Each must be one a backend in another subnet can answer:
// a routable unicast address, written plainly.
func (s *natSources) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		a, err := netip.ParseAddr(part)
		if err != nil {
			return fmt.Errorf("%q is not an IP address (e.g. 192.0.2.10 or 2001:db8::10)", part)
		}
		switch {
		case a.Zone() != "":
			return fmt.Errorf("%q: IPv6 zones are not supported", part)
		case a.Is4In6():
			return fmt.Errorf("%q: write the IPv4 address as IPv4 (%s)", part, a.Unmap())
		case a.IsUnspecified(), a.IsMulticast(), a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
			return fmt.Errorf("%q: not a unicast address (an address of this LB that backends answer)", part)
		case a.IsLoopback(), a.IsLinkLocalUnicast():
			return fmt.Errorf("%q: a loopback or link-local address cannot be routed to a backend in another subnet", part)
		}
		for _, o := range *s {
			if o == a {
				return fmt.Errorf("%q listed twice", part)
			}
		}
		*s = append(*s, a)
	}
	return nil
}

// natPorts is --nat-ports: an inclusive range of source ports.
type natPorts struct{ lo, hi uint16 }

// String is the range as the flag takes it.
func (p *natPorts) String() string { return fmt.Sprintf("%d-%d", p.lo, p.hi) }

// Set reads LO-HI. Ports under 1024 are refused: they are the privileged ports, where a
// NAT flow's source port would collide with the host's own services.
func (p *natPorts) Set(v string) error {
	los, his, ok := strings.Cut(v, "-")
	lo, err1 := strconv.ParseUint(strings.TrimSpace(los), 10, 16)
	hi, err2 := strconv.ParseUint(strings.TrimSpace(his), 10, 16)
	switch {
	case !ok || err1 != nil || err2 != nil:
		return fmt.Errorf("%q: want LO-HI, two ports from 1024 to 65535 (e.g. %d-%d)", v, l4xdp.DefaultNATPortLow, l4xdp.DefaultNATPortHigh)
	case lo < 1024:
		return fmt.Errorf("%q: LO %d is under 1024 (the privileged ports, where the host's own services listen)", v, lo)
	case lo > hi:
		return fmt.Errorf("%q: LO %d is above HI %d", v, lo, hi)
	}
	p.lo, p.hi = uint16(lo), uint16(hi)
	return nil
}
