// NAT: the loader's side (sources and ports, which backends need it, next hops, sweeping
// the reply table, the host's reserved ports). The translation itself is bpf/nat.h.

package l4xdp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/policies/pools"
)

// Backend and connection flags of NAT (mirror B_NAT, C_NAT and C_HS in bpf/consts.h).
const (
	backendNAT = 4
	connNAT    = 2
	connHS     = 8
)

// What a NAT flow's reply entry knows of its connection (mirror enum nat_state in
// bpf/consts.h): the bits nat_hold reads.
const (
	natReplied   = 1
	natEmbryonic = 2
	natShort     = 64
	natRST       = 128
)

// How long, at most, a NAT flow holds its port idle (seconds, written into the program's
// config): once a FIN was believed; after a RST believed (conntrack's CLOSE); and before its
// client completes the handshake, or a UDP flow's backend first answers (conntrack's
// unreplied), so that a flood of SYNs, which a listening backend answers, does not hold
// ports the VIP's idle timeout.
const (
	natHoldClosing   = 60
	natHoldRST       = 10
	natHoldUnreplied = 30
)

// natHold is how long entry e holds its port idle, in seconds: the program's nat_hold.
func natHold(e lbNatEntry) uint32 {
	h := e.Idle
	switch {
	case e.State&natRST != 0:
		h = min(h, natHoldRST)
	case e.State&natShort != 0:
		h = min(h, natHoldClosing)
	}
	if e.State&natEmbryonic != 0 || e.State&natReplied == 0 {
		h = min(h, natHoldUnreplied)
	}
	return h
}

// maxNATSources is how many NAT sources of each family the program holds (MAX_NAT_SOURCES/2).
const maxNATSources = 8

// ports returns the source port range, defaults applied.
func (n NAT) ports() (lo, hi uint16) {
	if n.PortLow == 0 && n.PortHigh == 0 {
		return DefaultNATPortLow, DefaultNATPortHigh
	}
	return n.PortLow, n.PortHigh
}

// Validate checks the NAT configuration: at most 8 sources of each family, specified
// unicast addresses, and a port range from 1024 up with its low end not above its high end.
func (n NAT) Validate() error {
	lo, hi := n.ports()
	if lo < 1024 || hi < lo {
		return fmt.Errorf("NAT ports %d-%d: want LOW-HIGH with 1024 <= LOW <= HIGH", lo, hi)
	}
	var v4, v6 int
	for _, a := range n.Sources {
		if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() {
			return fmt.Errorf("NAT source %v: want a unicast address of the LB", a)
		}
		if a.Unmap().Is4() {
			v4++
		} else {
			v6++
		}
	}
	if v4 > maxNATSources || v6 > maxNATSources {
		return fmt.Errorf("NAT sources: %d IPv4 and %d IPv6, at most %d of each", v4, v6, maxNATSources)
	}
	return nil
}

// has says whether a NAT backend of the family (IPv4 when v4) has a source to leave from.
func (n NAT) has(v4 bool) bool {
	for _, a := range n.Sources {
		if a.Unmap().Is4() == v4 {
			return true
		}
	}
	return false
}

// configureNAT writes the sources (IPv4 at 0.., IPv6 at 8..), the port range and the holds.
func (f *Tables) configureNAT(cfg *lbLbConfig, n NAT) error {
	cfg.NatPortLo, cfg.NatPortHi = n.ports()
	cfg.NatHoldClosing, cfg.NatHoldRst, cfg.NatHoldUnreplied = natHoldClosing, natHoldRST, natHoldUnreplied
	for _, a := range n.Sources {
		a = a.Unmap()
		idx := cfg.NatV4
		if !a.Is4() {
			idx = maxNATSources + cfg.NatV6
		}
		if err := f.objs.NatSources.Put(idx, lbNatSource{Addr: a.As16()}); err != nil {
			return fmt.Errorf("writing NAT source %v: %w", a, err)
		}
		if a.Is4() {
			cfg.NatV4++
		} else {
			cfg.NatV6++
		}
	}
	return nil
}

// natPlan is how the backends of one apply are reached: the set of those reached by NAT.
type natPlan map[*pools.Backend]bool

// planNAT decides, for every backend of the served services, DR or NAT: the file's
// forwarding, and for auto the LB interface's subnets (a backend inside one, or with a mac:
// in the file, on the VIP's port, is reached directly). A NAT backend needs a source of its
// family, and the VIP's family (the translation keeps the IP version).
func (l *Loader) planNAT(f *pools.File, served []*pools.Service) (natPlan, error) {
	var addrs []netlink.Addr
	if l.iface != nil {
		var err error
		addrs, err = l.nl.AddrList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: l.iface.Index}}, netlink.FAMILY_ALL)
		if err != nil {
			return nil, transient(fmt.Errorf("reading the addresses of %s: %w", l.cfg.Iface, err), false)
		}
	}
	var subnets []netip.Prefix
	for _, a := range addrs {
		if a.IPNet == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IPNet.IP)
		ones, _ := a.IPNet.Mask.Size()
		if ok {
			subnets = append(subnets, netip.PrefixFrom(ip.Unmap(), ones).Masked())
		}
	}
	plan := natPlan{}
	var errs []error
	lo, hi := l.cfg.NAT.ports()
	for _, s := range served {
		vip, _ := s.VIPAddrPort()
		// A VIP on a NAT source inside the NAT range would take that port's replies for
		// client traffic (VIPs are looked up first).
		if slices.Contains(l.cfg.NAT.Sources, vip.Addr().Unmap()) && vip.Port() >= lo && vip.Port() <= hi {
			errs = append(errs, fmt.Errorf("%s:%d: service %s: vip %s is a --nat-source address on a port of the NAT range %d-%d: move the vip's port or the range", f.Filename, s.Line, s.Name, s.VIP, lo, hi))
		}
		for _, b := range s.Backends {
			ap := b.AddrPort()
			nat := false
			switch s.ForwardingOf(b) {
			case pools.ForwardingNAT:
				nat = true
			case pools.ForwardingAuto:
				// A mac: in the file says the backend is a neighbour on the LB's link
				// (addressed off the interface's subnets, say /32s): direct routing.
				nat = b.MAC == "" && !slices.ContainsFunc(subnets, func(p netip.Prefix) bool { return p.Contains(ap.Addr().Unmap()) })
			}
			if !nat {
				continue
			}
			where := fmt.Sprintf("%s:%d: service %s: backend %s", f.Filename, b.Line, s.Name, b.Address)
			v4 := ap.Addr().Unmap().Is4()
			switch {
			case v4 != vip.Addr().Unmap().Is4():
				errs = append(errs, fmt.Errorf("%s: reached by NAT, which keeps the IP version, but the vip %s is of the other family", where, s.VIP))
			case !l.cfg.NAT.has(v4):
				errs = append(errs, fmt.Errorf("%s: reached by NAT (%s), and the loader has no --nat-source of its family: start it with --nat-source ADDR (an address of this LB)", where, natReason(s, b)))
			}
			plan[b] = true
		}
	}
	return plan, errors.Join(errs...)
}

// natReason says why backend b of s is reached by NAT, for the error that asks for a source.
func natReason(s *pools.Service, b *pools.Backend) string {
	if f := b.Forwarding; f == pools.ForwardingNAT {
		return "forwarding: nat"
	}
	if s.Forwarding == pools.ForwardingNAT && b.Forwarding == "" {
		return "the service's forwarding: nat"
	}
	if vip, ok := s.VIPAddrPort(); ok && vip.Port() != b.AddrPort().Port() {
		return "its port differs from the vip's"
	}
	return "not on a subnet of the LB's interface, and no mac: given"
}

// resolveNextHops makes the kernel resolve the next hop of every NAT backend (the FIB lookup
// of the program finds a route but sends nothing while the neighbour is unknown), waiting up
// to wait; a next hop still unresolved is logged, not fatal: the kernel keeps trying, and the
// program counts what it drops meanwhile (nat_no_route). The maintenance loop calls it again
// with no wait, so a neighbour entry the kernel dropped (the kernel's own traffic never uses
// it: XDP sends past it) is asked for again.
func (l *Loader) resolveNextHops(bs []*pools.Backend, wait time.Duration) {
	deadline := time.Now().Add(wait)
	for len(bs) > 0 {
		bs = slices.DeleteFunc(slices.Clone(bs), nextHopKnown)
		if len(bs) == 0 {
			return
		}
		for _, b := range bs {
			pokeNeighbour(b.AddrPort().Addr())
		}
		if time.Now().After(deadline) {
			if wait > 0 {
				for _, b := range bs {
					l.log.Warn("the next hop of a NAT backend is not resolved yet: its flows are dropped (nat_no_route) until it is",
						zap.String("backend", b.Address))
				}
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// nextHopKnown says whether the kernel has a usable neighbour entry for the next hop toward
// backend b.
func nextHopKnown(b *pools.Backend) bool {
	ip := net.IP(b.AddrPort().Addr().Unmap().AsSlice())
	routes, err := netlink.RouteGet(ip)
	if err != nil || len(routes) == 0 {
		return false
	}
	hop := routes[0].Gw
	if hop == nil {
		hop = ip
	}
	neighs, err := netlink.NeighList(routes[0].LinkIndex, netlink.FAMILY_ALL)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(neighs, func(n netlink.Neigh) bool {
		return n.IP.Equal(hop) && len(n.HardwareAddr) == 6 && n.State&usableNeighbour != 0
	})
}

// SweepNAT removes the reply entries of NAT flows idle past their hold (an entry whose
// connection entry was evicted stays until then: the flow's next packet finds it its own
// and keeps its port, and a backend that speaks first still reaches the client). It returns
// the entries left.
func (f *Tables) SweepNAT() (int, error) {
	now := monoNow()
	var stale []lbNatKey
	var staleSeen []uint64
	left := 0
	err := eachEntry(f.objs.NatRev, func(k lbNatKey, e lbNatEntry) {
		if now > e.LastSeen && now-e.LastSeen > uint64(natHold(e))*1e9 {
			stale, staleSeen = append(stale, k), append(staleSeen, e.LastSeen)
			return
		}
		left++
	})
	if err != nil {
		return 0, fmt.Errorf("reading the NAT table: %w", err)
	}
	var e lbNatEntry
	for i, k := range stale {
		// Read again just before: a new flow may have taken the port over since the batch
		// was read (its entry is fresh). What a packet does between this read and the
		// delete is the program's race with its own takeover, which a port seen idle past
		// its timeout has lost anyway.
		if err := f.objs.NatRev.Lookup(k, &e); err != nil || e.LastSeen != staleSeen[i] {
			continue
		}
		if err := f.objs.NatRev.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return left, fmt.Errorf("removing an ended NAT flow: %w", err)
		}
	}
	return left, nil
}

// enableForwarding turns on forwarding on the LB's interface for the families asked (IPv4
// when v4, IPv6 when v6): the kernel's FIB lookup from XDP (the next hop of a NAT or tunnel
// packet) answers only for an interface that forwards (BPF_FIB_LKUP_RET_FWD_DISABLED
// otherwise). why says who needs it, for the errors.
func (l *Loader) enableForwarding(v4, v6 bool, why string) error {
	for _, fam := range []struct {
		on   bool
		v4   bool
		path string
	}{{v4, true, "/proc/sys/net/ipv4/conf/%s/forwarding"}, {v6, false, "/proc/sys/net/ipv6/conf/%s/forwarding"}} {
		if !fam.on {
			continue
		}
		path := fmt.Sprintf(fam.path, l.cfg.Iface)
		if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == "1" {
			continue
		}
		if !fam.v4 {
			// A forwarding interface ignores router advertisements unless accept_ra is 2:
			// keep a host that takes its IPv6 route or address from them doing so.
			ra := fmt.Sprintf("/proc/sys/net/ipv6/conf/%s/accept_ra", l.cfg.Iface)
			if b, err := os.ReadFile(ra); err == nil && strings.TrimSpace(string(b)) == "1" {
				if err := os.WriteFile(ra, []byte("2\n"), 0o644); err != nil {
					return fmt.Errorf("keeping router advertisements on %s (accept_ra 2): %w", l.cfg.Iface, err)
				}
				l.log.Info("set accept_ra to 2 on the interface: with forwarding on, 1 would ignore router advertisements",
					zap.String("sysctl", ra))
			}
		}
		if err := os.WriteFile(path, []byte("1\n"), 0o644); err != nil {
			return fmt.Errorf("turning on forwarding on %s (%s): %w", l.cfg.Iface, why, err)
		}
		l.log.Info("turned on forwarding on the interface: the next hops of NAT and tunnel packets come from the kernel's FIB, which answers only for a forwarding interface",
			zap.String("sysctl", path), zap.String("for", why))
	}
	return nil
}

// reservePorts adds the NAT port range to the host's ip_local_reserved_ports when a NAT
// source is an address of this host (of this network namespace): the host's own sockets
// then never take a port the program hands to NAT flows. What it added is recorded in the
// pinned nat_reserved map for Detach.
func (l *Loader) reservePorts() error {
	if len(l.cfg.NAT.Sources) == 0 {
		return nil
	}
	local, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("reading the host's addresses: %w", err)
	}
	hosts := false
	for _, s := range l.cfg.NAT.Sources {
		if slices.ContainsFunc(local, func(a netlink.Addr) bool { return a.IP.Equal(net.IP(s.Unmap().AsSlice())) }) {
			hosts = true
		}
	}
	if !hosts {
		return nil
	}
	lo, hi := l.cfg.NAT.ports()
	cur, err := readReserved()
	if err != nil {
		return err
	}
	added := subtract([]portRange{{lo, hi}}, cur)
	if len(added) == 0 {
		return nil
	}
	rec := merge(append(readRecorded(l.maps.objs.NatReserved), added...))
	if len(rec) > natReservedSlots {
		return fmt.Errorf("the host's reserved ports around %d-%d are in more than %d pieces: reserve %d-%d yourself (sysctl net.ipv4.ip_local_reserved_ports)", lo, hi, natReservedSlots, lo, hi)
	}
	if err := writeReserved(merge(append(cur, added...))); err != nil {
		return err
	}
	for i := range natReservedSlots {
		var v lbPortRange
		if i < len(rec) {
			v = lbPortRange{Lo: rec[i].lo, Hi: rec[i].hi}
		}
		if err := l.maps.objs.NatReserved.Put(uint32(i), v); err != nil {
			return fmt.Errorf("recording the reserved ports: %w", err)
		}
	}
	l.log.Info("reserved the NAT ports from the host's own (a NAT source is the host's address)",
		zap.String("added", formatRanges(added)))
	return nil
}

// natReservedSlots is the size of the pinned record of reserved ports (nat_reserved).
const natReservedSlots = 16

// readRecorded reads the ranges a loader recorded in m (nat_reserved).
func readRecorded(m *ebpf.Map) []portRange {
	var out []portRange
	for i := range natReservedSlots {
		var v lbPortRange
		if err := m.Lookup(uint32(i), &v); err == nil && v.Lo != 0 {
			out = append(out, portRange{v.Lo, v.Hi})
		}
	}
	return out
}

// releasePorts takes back from ip_local_reserved_ports what loaders of this pin directory
// added (Detach).
func releasePorts(dir string) error {
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, "nat_reserved"), nil)
	if err != nil {
		return nil // pinned by a loader without NAT: nothing reserved
	}
	defer m.Close()
	rec := readRecorded(m)
	if len(rec) == 0 {
		return nil
	}
	cur, err := readReserved()
	if err != nil {
		return err
	}
	return writeReserved(subtract(cur, rec))
}

const reservedPortsSysctl = "/proc/sys/net/ipv4/ip_local_reserved_ports"

type portRange struct{ lo, hi uint16 }

func readReserved() ([]portRange, error) {
	b, err := os.ReadFile(reservedPortsSysctl)
	if err != nil {
		return nil, fmt.Errorf("reading the host's reserved ports: %w", err)
	}
	return parseRanges(string(b)), nil
}

func writeReserved(rs []portRange) error {
	s := formatRanges(rs)
	if s == "" {
		s = "\n" // an empty write is refused; a newline clears the list
	}
	if err := os.WriteFile(reservedPortsSysctl, []byte(s), 0o644); err != nil {
		return fmt.Errorf("writing the host's reserved ports (%s): %w", reservedPortsSysctl, err)
	}
	return nil
}

// parseRanges reads the sysctl's "a-b,c" format (what it cannot read it skips: the kernel
// wrote it).
func parseRanges(s string) []portRange {
	var out []portRange
	for _, f := range strings.Split(strings.TrimSpace(s), ",") {
		lo, hi, found := strings.Cut(strings.TrimSpace(f), "-")
		if !found {
			hi = lo
		}
		a, err1 := strconv.ParseUint(lo, 10, 16)
		b, err2 := strconv.ParseUint(hi, 10, 16)
		if err1 == nil && err2 == nil && a <= b {
			out = append(out, portRange{uint16(a), uint16(b)})
		}
	}
	return merge(out)
}

func formatRanges(rs []portRange) string {
	var parts []string
	for _, r := range rs {
		if r.lo == r.hi {
			parts = append(parts, strconv.Itoa(int(r.lo)))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", r.lo, r.hi))
		}
	}
	return strings.Join(parts, ",")
}

// merge sorts ranges and joins the overlapping and adjacent ones.
func merge(rs []portRange) []portRange {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b portRange) int { return int(a.lo) - int(b.lo) })
	var out []portRange
	for _, r := range rs {
		if n := len(out); n > 0 && int(r.lo) <= int(out[n-1].hi)+1 {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

// subtract returns the ports of a not in b.
func subtract(a, b []portRange) []portRange {
	var out []portRange
	for _, r := range merge(a) {
		lo := int(r.lo)
		for _, x := range merge(b) {
			if int(x.hi) < lo || x.lo > r.hi {
				continue
			}
			if int(x.lo) > lo {
				out = append(out, portRange{uint16(lo), x.lo - 1})
			}
			lo = int(x.hi) + 1
		}
		if lo <= int(r.hi) {
			out = append(out, portRange{uint16(lo), r.hi})
		}
	}
	return out
}
