// Tunnel forwarding: the loader's side (the second-chance tables, the tunnel's source
// addresses). The encapsulation itself is bpf/tunnel.h, its format bpf/gue.h.

package l4xdp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/pools"
)

// backendTunnel mirrors B_TUNNEL in bpf/consts.h.
const backendTunnel = 8

// Tunnel's overhead on the client's packet (TUNNEL_OVERHEAD_V4 and _V6 in bpf/gue.h): outer
// IP, UDP, the GUE header and its private data (kind, hops, the secondary's address).
const (
	TunnelOverheadV4 = 20 + 8 + 4 + 8
	TunnelOverheadV6 = 40 + 8 + 4 + 20
)

// Tunnel configures tunnel forwarding: the addresses its packets leave from.
type Tunnel struct {
	// Sources are the outer source addresses, at most one IPv4 and one IPv6 (the backends'
	// `stickylb backend --lb-source` must allow them). None of a family: the interface's
	// first global address of that family.
	Sources []netip.Addr
}

// Validate checks the sources: specified unicast addresses, one per family at most.
func (t Tunnel) Validate() error {
	var v4, v6 int
	for _, a := range t.Sources {
		if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() {
			return fmt.Errorf("tunnel source %v: want a unicast address of the LB", a)
		}
		if a.Unmap().Is4() {
			v4++
		} else {
			v6++
		}
	}
	if v4 > 1 || v6 > 1 {
		return fmt.Errorf("tunnel sources: %d IPv4 and %d IPv6, at most one of each", v4, v6)
	}
	return nil
}

// sources returns the tunnel's IPv4 and IPv6 source (invalid: none), the interface's first
// global address of a family not given.
func (t Tunnel) sources(iface *net.Interface) (v4, v6 netip.Addr, err error) {
	for _, a := range t.Sources {
		if a = a.Unmap(); a.Is4() {
			v4 = a
		} else {
			v6 = a
		}
	}
	if (v4.IsValid() && v6.IsValid()) || iface == nil {
		return v4, v6, nil
	}
	addrs, err := netlink.AddrList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: iface.Index}}, netlink.FAMILY_ALL)
	if err != nil {
		return v4, v6, fmt.Errorf("reading the addresses of %s for the tunnel's source: %w", iface.Name, err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || !ip.IsGlobalUnicast() {
			continue
		}
		if ip = ip.Unmap(); ip.Is4() && !v4.IsValid() {
			v4 = ip
		} else if !ip.Is4() && !v6.IsValid() {
			v6 = ip
		}
	}
	return v4, v6, nil
}

// configureTunnel writes the tunnel's sources (invalid: none of that family) into the
// program's config, beside what configure wrote.
func (f *Tables) configureTunnel(v4, v6 netip.Addr) error {
	var cfg lbLbConfig
	if err := f.objs.Config.Lookup(uint32(0), &cfg); err != nil {
		return fmt.Errorf("reading the forwarder's config: %w", err)
	}
	cfg.TunnelV4, cfg.TunnelV6 = [4]byte{}, [16]byte{}
	if v4.IsValid() {
		cfg.TunnelV4 = v4.As4()
	}
	if v6.IsValid() {
		cfg.TunnelV6 = v6.As16()
	}
	if err := f.objs.Config.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("writing the tunnel's sources: %w", err)
	}
	return nil
}

// setTunnelTable installs v's second-chance table (FlagTunnel) in a fresh inner map swapped
// in whole, or removes the one a VIP that no longer tunnels had. Each row is one 8-byte
// value, primary | secondary << 32, so that a packet reads both from one table.
func (f *Tables) setTunnelTable(v VIP) error {
	if v.Flags&FlagTunnel == 0 {
		if err := f.objs.TunnelTables.Delete(v.ID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("vip %s: removing its second-chance table: %w", v.Addr, err)
		}
		return nil
	}
	if len(v.Second) != len(v.Table) {
		return fmt.Errorf("vip %s: %d secondaries for %d rows", v.Addr, len(v.Second), len(v.Table))
	}
	inner, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: MaxTableSize})
	if err != nil {
		return fmt.Errorf("vip %s: creating its second-chance table: %w", v.Addr, err)
	}
	defer inner.Close()
	keys, rows := make([]uint32, len(v.Table)), make([]uint64, len(v.Table))
	for i := range keys {
		keys[i], rows[i] = uint32(i), uint64(v.Table[i])|uint64(v.Second[i])<<32
	}
	if _, err := inner.BatchUpdate(keys, rows, nil); err != nil {
		return fmt.Errorf("vip %s: filling its second-chance table: %w", v.Addr, err)
	}
	if err := f.objs.TunnelTables.Put(v.ID, inner); err != nil {
		return fmt.Errorf("vip %s: installing its second-chance table: %w", v.Addr, err)
	}
	return nil
}

// secondChanceTable is the second-chance table of rows rows over hashed (the backends new
// flows go to) and draining (healthy backends that take no new flows but may hold
// connections: never primary, secondary where they rank first), as backend slots: the
// primaries and the secondaries (emptySlot: none; all of them without second chance).
// Weights are normalized as for Maglev, so a table with no ramp in progress is the one
// `stickylb plan` measures.
func secondChanceTable(hashed, draining []member, rows uint64, second bool) (primary, secondary []uint32, err error) {
	ms := append(append([]member(nil), hashed...), draining...)
	ws := tableWeights(ms)
	hosts := make([]chash.RendezvousHost, len(ms))
	for i, m := range ms {
		hosts[i] = chash.RendezvousHost{ID: m.id, Weight: max(ws[i], 1), Draining: i >= len(hashed)}
	}
	r, err := chash.NewRendezvous(hosts, rows)
	if err != nil {
		return nil, nil, err
	}
	primary, secondary = make([]uint32, rows), make([]uint32, rows)
	slot := func(i int32) uint32 {
		if i < 0 {
			return emptySlot
		}
		return ms[i].slot
	}
	for i, p := range r.Rows() {
		primary[i], secondary[i] = slot(p.Primary), emptySlot
		if second {
			secondary[i] = slot(p.Secondary)
		}
	}
	return primary, secondary, nil
}

// planTunnel checks that every tunnel service has a tunnel source of its family, and turns
// on forwarding on the interface for the families tunnel services use (the FIB lookup of the
// tunnel's next hop answers only for a forwarding interface, as NAT's).
func (l *Loader) planTunnel(f *pools.File, served []*pools.Service) error {
	var errs []error
	var v4, v6 bool
	for _, s := range served {
		if s.Forwarding != pools.ForwardingTunnel {
			continue
		}
		vip, _ := s.VIPAddrPort()
		is4 := vip.Addr().Unmap().Is4()
		src, family := l.tunnel6, "IPv6"
		if is4 {
			src, family = l.tunnel4, "IPv4"
		}
		if !src.IsValid() {
			errs = append(errs, fmt.Errorf("%s:%d: service %s: forwarding tunnel, and the loader has no tunnel source of the vip's family: %s has no global %s address; start it with --tunnel-source ADDR",
				f.Filename, s.Line, s.Name, l.cfg.Iface, family))
			continue
		}
		v4, v6 = v4 || is4, v6 || !is4
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Once per family: the rebuilds of health changes and slow start need not write sysctls.
	v4, v6 = v4 && !l.forwarding4, v6 && !l.forwarding6
	if err := l.enableForwarding(v4, v6, "the FIB lookups of tunnel forwarding need it"); err != nil {
		return err
	}
	l.forwarding4, l.forwarding6 = l.forwarding4 || v4, l.forwarding6 || v6
	return nil
}
