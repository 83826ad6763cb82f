// Backend MACs from the neighbour table.

package l4xdp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/stickylb/stickylb/policies/pools"
)

// resolveMACs returns the MAC of every backend: from the pools file, else the neighbour
// table of the interface, read once a round for all of them, else installed (the MAC the
// backend's slot holds already: a neighbour entry the kernel flushed, on a carrier loss or
// for a backend that stopped answering, does not stop the tables from being rebuilt around
// it). It asks the kernel to resolve the missing ones (a datagram each, the installed ones
// too, to refresh them) and waits up to wait for those it has no MAC for at all.
func (l *Loader) resolveMACs(bs []*pools.Backend, installed map[*pools.Backend]net.HardwareAddr, wait time.Duration) (map[*pools.Backend]net.HardwareAddr, error) {
	out := make(map[*pools.Backend]net.HardwareAddr, len(bs))
	var missing []*pools.Backend
	for _, b := range bs {
		if hw := b.HardwareAddr(); hw != nil {
			out[b] = hw
		} else {
			missing = append(missing, b)
		}
	}
	deadline := time.Now().Add(wait)
	for first := true; len(missing) > 0; first = false {
		neighs, err := l.nl.NeighList(l.iface.Index, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("reading the neighbour table of %s: %w", l.cfg.Iface, err)
		}
		known := make(map[netip.Addr]net.HardwareAddr, len(neighs))
		for _, n := range neighs {
			if a, ok := netip.AddrFromSlice(n.IP); ok && len(n.HardwareAddr) == 6 && n.State&usableNeighbour != 0 {
				known[a.Unmap()] = n.HardwareAddr
			}
		}
		still := missing[:0]
		for _, b := range missing {
			if hw, ok := known[b.AddrPort().Addr().Unmap()]; ok {
				out[b] = hw
				continue
			}
			if hw := installed[b]; hw != nil {
				out[b] = hw
				if first {
					pokeNeighbour(b.AddrPort().Addr())
				}
				continue
			}
			still = append(still, b)
		}
		missing = still
		if len(missing) == 0 {
			break
		}
		if !time.Now().Before(deadline) {
			var errs []error
			for _, b := range missing {
				errs = append(errs, fmt.Errorf("backend %s: no MAC in the neighbour table of %s; set mac: in the pools file or make it reachable", b.Address, l.cfg.Iface))
			}
			return nil, errors.Join(errs...)
		}
		for _, b := range missing {
			pokeNeighbour(b.AddrPort().Addr())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return out, nil
}

// usableNeighbour is the neighbour-table states whose MAC the kernel would send to.
const usableNeighbour = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_PERMANENT | netlink.NUD_DELAY | netlink.NUD_PROBE

// pokeNeighbour sends one datagram toward addr (its discard port): the kernel resolves the
// neighbour on the way, the next hop's when addr is behind a router.
func pokeNeighbour(addr netip.Addr) {
	if c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 9))); err == nil {
		c.Write([]byte{0})
		c.Close()
	}
}
