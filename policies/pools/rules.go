package pools

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/stickylb/stickylb/policies/chash"
	"go.yaml.in/yaml/v3"
)

// addrKind says which rules an "ip:port" field follows.
type addrKind int

const (
	addrListen  addrKind = iota // may be unspecified (0.0.0.0, ::)
	addrVIP                     // a unicast address the forwarder matches packets against
	addrBackend                 // a unicast address traffic is sent to
)

// checkAddr reports whether v is a valid "ip:port" for kind, reporting why not at n.
func (d *decoder) checkAddr(n *yaml.Node, what, v string, kind addrKind) bool {
	ap, err := netip.ParseAddrPort(v)
	if err != nil {
		d.errorf(n, "%s %q: %s", what, v, whyNotAddrPort(v))
		return false
	}
	a := ap.Addr()
	switch {
	case ap.Port() == 0:
		d.errorf(n, "%s %q: port 0 is not a port", what, v)
		return false
	case a.Zone() != "":
		d.errorf(n, "%s %q: IPv6 zones are not supported", what, v)
		return false
	case a.IsMulticast():
		d.errorf(n, "%s %q: a multicast address", what, v)
		return false
	case kind != addrListen && a.IsUnspecified():
		d.errorf(n, "%s %q: an unspecified address (0.0.0.0 or ::) is not a %s", what, v, map[addrKind]string{addrVIP: "VIP", addrBackend: "backend"}[kind])
		return false
	case a.Is4In6():
		d.errorf(n, "%s %q: write the IPv4 address as IPv4 (%s)", what, v, netip.AddrPortFrom(a.Unmap(), ap.Port()))
		return false
	}
	return true
}

// whyNotAddrPort says what is wrong with v, which netip.ParseAddrPort refused: the host
// when it is not an IP address, else the port.
func whyNotAddrPort(v string) string {
	const eg = "e.g. 10.0.1.1:8080 or [2001:db8::1]:8080"
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return "want ip:port (" + eg + ")"
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return "want ip:port (an IP address, not a host name, " + eg + ")"
	}
	n, err := strconv.ParseUint(port, 10, 64)
	switch {
	case port == "":
		return "no port after the address; want ip:port (" + eg + ")"
	case errors.Is(err, strconv.ErrRange) || err == nil && n > 65535:
		return "port " + port + " out of range 1..65535"
	case err != nil:
		return fmt.Sprintf("port %q is not a number; want ip:port (%s)", port, eg)
	}
	return "want ip:port (" + eg + ")"
}

// checkMAC reports whether v is an Ethernet MAC address written as six colon-separated
// pairs of hex digits.
func (d *decoder) checkMAC(n *yaml.Node, v string) bool {
	hw, err := net.ParseMAC(v)
	if err != nil || len(hw) != 6 || strings.Count(v, ":") != 5 {
		d.errorf(n, "mac %q: want six hex pairs separated by ':', e.g. 02:00:00:00:02:01", v)
		return false
	}
	if hw[0]&1 == 1 {
		d.errorf(n, "mac %q: a multicast or broadcast address is not a backend's", v)
		return false
	}
	return true
}

// ValidName reports whether v can name a service: lowercase letters, digits and '-' (not
// at either end), at most MaxNameLength bytes.
func ValidName(v string) bool {
	if v == "" || len(v) > MaxNameLength || v[0] == '-' || v[len(v)-1] == '-' {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// ValidZone reports whether v can name a zone: letters, digits, '.', '_' and '-', at most
// MaxZoneLength bytes.
func ValidZone(v string) bool {
	if v == "" || len(v) > MaxZoneLength {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// ValidHashKey reports whether v can be a backend's hash_key: 1..MaxHashKeyLength
// printable ASCII characters without spaces.
func ValidHashKey(v string) bool {
	return v != "" && len(v) <= MaxHashKeyLength && printable(v) && !strings.ContainsAny(v, " \t")
}

// validToken reports whether v is an RFC 9110 token (cookie and header names).
func validToken(v string) bool {
	if v == "" || len(v) > 256 {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// printable reports whether v is printable ASCII.
func printable(v string) bool {
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return false
		}
	}
	return true
}

// validateService applies the rules that span fields of one service, after defaults.
// Each step checks one concern; a field rejected while decoding (st.good false) silences
// the rules that read it.
func (d *decoder) validateService(st *svcState) {
	s := st.s
	if !st.has("name") {
		d.errorf(st.node, "service: name is required ([a-z0-9-]+, e.g. web)")
	}
	if !st.has("protocol") {
		d.errorf(st.node, "service %s: protocol is required (http, grpc, tcp or udp)", s.Name)
		return
	}
	if !st.good("protocol") {
		return
	}
	d.validateServed(st)
	d.validateAffinity(st)
	d.validateBalance(st)
	d.validateHash(st)
	d.validateSlowStart(st)
	d.validateHealthCheck(st)
	d.validateBackends(st)
	d.validateDrainedZones(st)
}

func (s *Service) l4() bool { return s.Protocol == ProtocolTCP || s.Protocol == ProtocolUDP }

func (s *Service) hashing() bool { return s.Balance == BalanceMaglev || s.Balance == BalanceRingHash }

// modeOK reports whether the affinity mode was decoded, so rules may read it.
func (st *svcState) modeOK() bool { return st.good("affinity.mode") && st.good("affinity") }

// validateServed: where the service is served (listen, vip) against its protocol.
func (d *decoder) validateServed(st *svcState) {
	s, l4 := st.s, st.s.l4()
	if st.has("idle_timeout") && !st.has("vip") {
		d.errorf(st.keyPos("idle_timeout"), "idle_timeout applies to vip services (the XDP forwarder's connection table)")
	}
	if st.has("forwarding") && !st.has("vip") {
		d.errorf(st.keyPos("forwarding"), "forwarding applies to vip services (how the XDP forwarder reaches their backends)")
	}
	d.validateTunnel(st)
	if st.has("vip") && !l4 {
		d.errorf(st.keyPos("vip"), "vip applies to tcp and udp services (the XDP forwarder is L4); %s is %s", s.Name, s.Protocol)
	}
	if l4 && !st.has("listen") && !st.has("vip") {
		d.errorf(st.node, "service %s: a %s service needs listen (an Envoy listener), vip (the XDP forwarder), or both", s.Name, s.Protocol)
	}
}

// validateTunnel: tunnel_port and second_chance belong to forwarding tunnel, which a vip
// service's listener (Envoy, whose Maglev picks differently from the tunnel's table) and
// balances that do not hash (second chance covers only the flows the table placed) are
// warned about.
func (d *decoder) validateTunnel(st *svcState) {
	s := st.s
	tunnel := s.Forwarding == ForwardingTunnel
	for _, f := range []string{"tunnel_port", "second_chance"} {
		switch {
		case !st.has(f):
		case !st.has("vip"):
			d.errorf(st.keyPos(f), "%s applies to vip services with forwarding: tunnel", f)
		case st.good("forwarding") && !tunnel:
			d.errorf(st.keyPos(f), "%s applies to forwarding: tunnel, and service %s forwards by %s", f, s.Name, s.Forwarding)
		}
	}
	if !tunnel {
		return
	}
	if s.Listen != "" {
		d.warnf(st.keyPos("forwarding"), "forwarding tunnel builds the vip's table by rendezvous hashing (primary and secondary per row); the listener's Envoy uses Maglev, so the two tiers pick differently")
	}
	if s.SecondChance && st.good("balance") && (s.Balance == BalanceRoundRobin || s.Balance == BalanceLeastConn) {
		d.warnf(st.pos("balance"), "second chance covers flows the vip's table placed; %s places new flows by its own schedule, so a flow that moves between LB nodes after a backend change may still break (see docs/xdp.md)", s.Balance)
	}
}

// validateAffinity: the mode against the protocol, and the blocks that go with each mode.
func (d *decoder) validateAffinity(st *svcState) {
	if !st.modeOK() {
		return
	}
	s, l4, a := st.s, st.s.l4(), &st.s.Affinity
	switch a.Mode {
	case ModeCookie, ModeAppCookie, ModeURL, ModeHeader:
		if l4 {
			d.errorf(st.pos("affinity.mode"), "affinity mode %s needs HTTP; %s is a %s service (use none, source_ip%s)", a.Mode, s.Name, s.Protocol, map[bool]string{true: " or quic_cid", false: ""}[s.Protocol == ProtocolUDP])
		}
		if a.Mode == ModeURL && s.Protocol == ProtocolGRPC {
			d.errorf(st.pos("affinity.mode"), "affinity mode url does not apply to grpc (gRPC paths name methods); use header")
		}
	case ModeQUICCID:
		if s.Protocol != ProtocolUDP || s.VIP == "" && st.good("vip") {
			d.errorf(st.pos("affinity.mode"), "affinity mode quic_cid applies to udp services with a vip (the XDP forwarder reads QUIC connection IDs)")
		}
	}
	blocks := []struct {
		name, mode string
		set        bool
	}{
		{"cookie", ModeCookie, st.has("affinity.cookie")},
		{"app_cookie", ModeAppCookie, st.has("affinity.app_cookie")},
		{"url", ModeURL, st.has("affinity.url")},
		{"header", ModeHeader, st.has("affinity.header")},
		{"quic_cid", ModeQUICCID, st.has("affinity.quic_cid")},
	}
	for _, b := range blocks {
		switch {
		case b.set && a.Mode != b.mode:
			d.errorf(st.keyPos("affinity."+b.name), "affinity %s applies to mode %s, not %s", b.name, b.mode, a.Mode)
		case !b.set && a.Mode == b.mode && b.mode != ModeCookie && b.mode != ModeQUICCID:
			d.errorf(st.pos("affinity.mode"), "affinity mode %s needs an affinity.%s block (%s)", a.Mode, b.name, map[string]string{
				"app_cookie": "app_cookie: {name: JSESSIONID}",
				"url":        "url: {query: sid}, {path_segment: 2} or {suffix: \";jsessionid=\"}",
				"header":     "header: {name: x-session}",
			}[b.name])
		}
	}
	if a.Mode == ModeNone {
		for _, f := range []string{"ttl", "max_sessions"} {
			if st.has("affinity." + f) {
				d.errorf(st.keyPos("affinity."+f), "affinity %s has no effect with mode none", f)
			}
		}
	}
}

// validateBalance: the balance against the affinity mode and the tiers that serve it.
func (d *decoder) validateBalance(st *svcState) {
	s, a := st.s, &st.s.Affinity
	hashing := s.hashing()
	if st.good("balance") && st.modeOK() {
		switch {
		case a.Keyed() && s.VIP != "" && s.Balance != BalanceMaglev:
			d.errorf(st.pos("balance"), "affinity %s hashes its key, so a vip service must use balance maglev, not %s", a.Mode, s.Balance)
		case a.Keyed() && !hashing:
			what := a.Mode
			if a.Mode == ModeAppCookie {
				what = "app_cookie learn"
			}
			d.errorf(st.pos("balance"), "affinity %s hashes its key, so balance must be maglev or ring_hash, not %s", what, s.Balance)
		case s.VIP != "" && !s.vipBalance():
			d.errorf(st.pos("balance"), "a vip service's balance is maglev, weighted_round_robin or weighted_least_conn (the XDP forwarder's), not %s", s.Balance)
		}
		if s.Protocol == ProtocolGRPC && s.Balance == BalanceMaglev {
			d.warnf(st.pos("balance"), "gRPC clients have no Maglev: they use the ring_hash fallback, so they and Envoy nodes pick differently; use ring_hash where both serve")
		}
		if s.Protocol == ProtocolGRPC && s.Balance == BalanceLeastConn && s.weighted() {
			d.warnf(st.pos("balance"), "gRPC's least_request ignores endpoint weights")
		}
	}
}

// vipBalance reports whether the XDP forwarder has s's balance.
func (s *Service) vipBalance() bool {
	return s.Balance == BalanceMaglev || s.Balance == BalanceRoundRobin || s.Balance == BalanceLeastConn
}

// vipTableOnly: a vip service whose new flows are not hashed still has a Maglev table, for
// the flows that reach a node they did not start on; its hash block sets only table_size.
func (s *Service) vipTableOnly() bool {
	return s.VIP != "" && (s.Balance == BalanceRoundRobin || s.Balance == BalanceLeastConn)
}

// validateHash: the hash block against the balance, and its sizes against each other.
func (d *decoder) validateHash(st *svcState) {
	s, hashing := st.s, st.s.hashing()
	if st.has("hash") && st.good("balance") && !hashing && !s.vipTableOnly() {
		d.errorf(st.keyPos("hash"), "hash applies to balance maglev and ring_hash, not %s", s.Balance)
	}
	if s.vipTableOnly() {
		for _, f := range []string{"min_ring_size", "max_ring_size", "virtual_nodes", "bounded_load"} {
			if st.has("hash." + f) {
				d.errorf(st.keyPos("hash."+f), "hash %s does not apply to a %s vip service: its hash block sets only table_size (the Maglev table of flows that moved between LB nodes)", f, s.Balance)
			}
		}
		if st.good("hash.table_size") && s.Hash.TableSize > MaxVIPTableSize {
			d.errorf(st.pos("hash.table_size"), "table_size %d: a vip service's Maglev table holds at most %d slots (the XDP forwarder's largest)", s.Hash.TableSize, MaxVIPTableSize)
		}
		if st.good("hash.table_size") && uint64(len(s.Backends)) > s.Hash.TableSize {
			d.errorf(st.pos("hash.table_size"), "table_size %d is smaller than the %d backends", s.Hash.TableSize, len(s.Backends))
		}
	}
	if hashing {
		h := s.Hash
		if st.has("hash.table_size") && s.Balance != BalanceMaglev {
			d.errorf(st.keyPos("hash.table_size"), "hash table_size applies to balance maglev (ring_hash uses min_ring_size and max_ring_size)")
		}
		if st.good("hash.min_ring_size") && st.good("hash.max_ring_size") && h.MinRingSize > h.MaxRingSize {
			d.errorf(st.pos("hash.min_ring_size"), "min_ring_size %d is larger than max_ring_size %d", h.MinRingSize, h.MaxRingSize)
		}
		if s.Protocol == ProtocolGRPC && h.MaxRingSize > GRPCMaxRingSize {
			d.warnf(st.pos("hash.max_ring_size"), "gRPC caps rings at %d entries; its clients will build a smaller ring than Envoy's (max_ring_size %d)", GRPCMaxRingSize, h.MaxRingSize)
		}
		if s.VIP != "" && st.good("hash.table_size") && h.TableSize > MaxVIPTableSize {
			d.errorf(st.pos("hash.table_size"), "table_size %d: a vip service's Maglev table holds at most %d slots (the XDP forwarder's largest)", h.TableSize, MaxVIPTableSize)
		}
		d.checkVirtualNodes(st)
		if s.Balance == BalanceMaglev && st.good("hash.table_size") && uint64(len(s.Backends)) > h.TableSize {
			d.errorf(st.pos("hash.table_size"), "table_size %d is smaller than the %d backends", h.TableSize, len(s.Backends))
		}
	}
}

func (d *decoder) validateSlowStart(st *svcState) {
	s := st.s
	if !st.has("slow_start") || !st.good("balance") || s.Balance == BalanceLeastConn || s.Balance == BalanceRoundRobin {
		return
	}
	switch {
	case s.VIP == "" || s.Balance != BalanceMaglev:
		d.errorf(st.keyPos("slow_start"), "slow_start applies to weighted_least_conn and weighted_round_robin (Envoy ramps only those), and to vip services with maglev (the XDP forwarder ramps its tables), not %s", s.Balance)
	case s.Listen != "":
		d.warnf(st.keyPos("slow_start"), "slow_start with maglev ramps the XDP forwarder's tables only: Envoy's Maglev does not ramp, so the listener's backends take their full share at once")
	}
}

// validateHealthCheck: fields that apply to other probe protocols, and the timeout against
// the interval.
func (d *decoder) validateHealthCheck(st *svcState) {
	s := st.s
	if hc := s.HealthCheck; hc != nil && st.good("health_check.protocol") {
		if hc.Protocol != HealthHTTP {
			for _, f := range []string{"path", "expect_status"} {
				if st.has("health_check." + f) {
					d.errorf(st.keyPos("health_check."+f), "health_check %s applies to http checks, not %s", f, hc.Protocol)
				}
			}
		}
		if hc.Protocol == HealthICMP && st.has("health_check.port") {
			d.errorf(st.keyPos("health_check.port"), "health_check port does not apply to icmp checks")
		}
		// The checker's rule: a probe ends before the next one of the same backend starts.
		if st.good("health_check.timeout") && st.good("health_check.interval") && hc.Timeout >= hc.Interval {
			d.errorf(st.pos("health_check.timeout"), "health_check timeout %s must be shorter than the interval %s", hc.Timeout, hc.Interval)
		}
	}
}

// validateBackends: at least one; addresses, identities and server ids unique; a vip
// service's backends in the vip's family, and on its port when forwarded by direct routing;
// MACs and forwarding only where the forwarder uses them.
func (d *decoder) validateBackends(st *svcState) {
	s, a, modeOK := st.s, &st.s.Affinity, st.modeOK()
	if !st.has("backends") {
		d.errorf(st.node, "service %s: backends is required (at least one)", s.Name)
	} else if len(st.backends) == 0 && st.good("backends") {
		d.errorf(st.pos("backends"), "service %s: backends is empty (at least one is required)", s.Name)
	}
	vip, hasVIP := s.VIPAddrPort()
	addrs := map[string]int{}
	ids := map[string]int{}
	serverIDs := map[uint16]int{}
	for _, bs := range st.backends {
		b := bs.b
		if b.Address != "" {
			ap := b.AddrPort()
			canon := ap.String()
			if line, dup := addrs[canon]; dup {
				d.errorf(bs.node, "backend %s: address listed twice in service %s (first at line %d)", b.Address, s.Name, line)
			} else {
				addrs[canon] = b.Line
			}
			if hasVIP {
				// auto with another port is already NAT (ForwardingOf): only an explicit dr
				// keeps the port. A rejected forwarding value says nothing here.
				fwdOK := st.good("forwarding") && !bs.bad["forwarding"]
				if fwdOK && ap.Port() != vip.Port() && s.ForwardingOf(b) == ForwardingDR {
					d.errorf(fieldPos(bs, "address"), "backend %s: port %d differs from the vip's %d, and direct routing (forwarding: dr) keeps the port; use forwarding: nat or auto, or listen on %d", b.Address, ap.Port(), vip.Port(), vip.Port())
				}
				if fwdOK && ap.Port() != vip.Port() && s.ForwardingOf(b) == ForwardingTunnel {
					d.errorf(fieldPos(bs, "address"), "backend %s: port %d differs from the vip's %d, and the tunnel carries the client's packet unchanged; listen on %d", b.Address, ap.Port(), vip.Port(), vip.Port())
				}
				if ap.Addr().Is4() != vip.Addr().Is4() {
					d.errorf(fieldPos(bs, "address"), "backend %s: not the vip's address family (%s)", b.Address, vip.Addr())
				}
			}
			if bs.bad["hash_key"] {
				continue
			}
			id := b.Identity()
			if line, dup := ids[id]; dup {
				d.errorf(bs.node, "backend %s: identity %q already used at line %d (identities, hash_key or else address, must be unique: cookies and hashes name backends by them)", b.Address, id, line)
			} else {
				ids[id] = b.Line
			}
		}
		if b.MAC != "" && !hasVIP && st.good("vip") {
			d.errorf(fieldPos(bs, "mac"), "backend mac applies to vip services (the XDP forwarder rewrites MACs)")
		}
		d.checkBackendForwarding(st, bs, hasVIP)
		if b.ServerID != 0 {
			if line, dup := serverIDs[b.ServerID]; dup {
				d.errorf(fieldPos(bs, "server_id"), "server_id %d already used at line %d", b.ServerID, line)
			} else {
				serverIDs[b.ServerID] = b.Line
			}
			if modeOK && a.Mode != ModeQUICCID {
				d.warnf(fieldPos(bs, "server_id"), "server_id is read only in affinity mode quic_cid")
			}
		}
	}
}

// checkBackendForwarding: a backend's forwarding only where there is a vip, and a mac only
// where it is used (a NAT backend's next hop comes from the routing table).
func (d *decoder) checkBackendForwarding(st *svcState, bs *backendState, hasVIP bool) {
	b := bs.b
	if _, given := bs.given["forwarding"]; given && !hasVIP && st.good("vip") {
		d.errorf(fieldPos(bs, "forwarding"), "backend forwarding applies to vip services (how the XDP forwarder reaches their backends)")
	}
	if _, given := bs.given["forwarding"]; given && hasVIP && !bs.bad["forwarding"] {
		switch {
		case b.Forwarding == ForwardingTunnel:
			d.errorf(fieldPos(bs, "forwarding"), "backend %s: forwarding tunnel is a service's, for all its backends (each backend decapsulates): set forwarding: tunnel on service %s", b.Address, st.s.Name)
		case st.s.Forwarding == ForwardingTunnel:
			d.errorf(fieldPos(bs, "forwarding"), "backend %s: service %s forwards every backend by tunnel; remove this backend's forwarding", b.Address, st.s.Name)
		}
	}
	if b.MAC != "" && hasVIP && b.Address != "" && st.good("forwarding") && !bs.bad["forwarding"] {
		switch st.s.ForwardingOf(b) {
		case ForwardingNAT:
			d.warnf(fieldPos(bs, "mac"), "backend %s: mac is not used by NAT forwarding (the next hop comes from the routing table)", b.Address)
		case ForwardingTunnel:
			d.warnf(fieldPos(bs, "mac"), "backend %s: mac is not used by tunnel forwarding (the next hop comes from the routing table)", b.Address)
		}
	}
}

// validateDrainedZones warns about zone shifts that drain nothing or everything.
func (d *decoder) validateDrainedZones(st *svcState) {
	s := st.s
	zones := map[string]bool{}
	for _, b := range s.Backends {
		zones[b.Zone] = true
	}
	for _, z := range s.DrainedZones {
		if !zones[z] {
			d.warnf(st.pos("drained_zones"), "drained zone %q: no backend of %s is in it", z, s.Name)
		}
	}
	if len(st.backends) > 0 && len(s.DrainedZones) > 0 {
		live := false
		for _, b := range s.Backends {
			if !b.Drain && !s.ZoneDrained(b.Zone) {
				live = true
			}
		}
		if !live {
			d.warnf(st.pos("drained_zones"), "every backend of %s is drained: new sessions have nowhere to go", s.Name)
		}
	}
}

// weighted reports whether any two backends have different weights.
func (s *Service) weighted() bool {
	for _, b := range s.Backends {
		if b.Weight != s.Backends[0].Weight {
			return true
		}
	}
	return false
}

func fieldPos(bs *backendState, name string) *yaml.Node {
	if f, ok := bs.given[name]; ok {
		return f.val
	}
	return bs.node
}

// validateFile applies the rules across services: unique names, listeners and VIPs, and
// one backend host set per VIP address and protocol (fragments carry no ports, so all the
// ports of a VIP address hash among the same hosts).
func (d *decoder) validateFile(states []*svcState) {
	names := map[string]int{}
	listens := map[string]*svcState{}
	vips := map[string]*svcState{}
	type vipHosts struct {
		st    *svcState
		hosts []string
	}
	byAddr := map[string]vipHosts{}
	for _, st := range states {
		s := st.s
		if s.Name != "" {
			if line, dup := names[s.Name]; dup {
				d.errorf(st.pos("name"), "service name %q already used at line %d", s.Name, line)
			} else {
				names[s.Name] = s.Line
			}
		}
		space := "tcp"
		if s.Protocol == ProtocolUDP {
			space = "udp"
		}
		if ap, ok := s.ListenAddrPort(); ok {
			k := space + " " + ap.String()
			if o, dup := listens[k]; dup {
				d.errorf(st.pos("listen"), "listen %s already used by service %s at line %d", s.Listen, o.s.Name, o.s.Line)
			} else {
				listens[k] = st
			}
		}
		ap, ok := s.VIPAddrPort()
		if !ok {
			continue
		}
		k := space + " " + ap.String()
		if o, dup := vips[k]; dup {
			d.errorf(st.pos("vip"), "vip %s/%s already used by service %s at line %d", s.VIP, space, o.s.Name, o.s.Line)
			continue
		}
		vips[k] = st
		var hosts []string
		for _, b := range s.Backends {
			if b.Address != "" {
				hosts = append(hosts, b.AddrPort().Addr().String())
			}
		}
		sort.Strings(hosts)
		hosts = slices.Compact(hosts)
		ak := space + " " + ap.Addr().String()
		if o, seen := byAddr[ak]; seen {
			if !slices.Equal(o.hosts, hosts) {
				d.errorf(st.pos("vip"), "vip %s shares address %s (%s) with service %s at line %d but not its backend hosts (%s vs %s): fragments carry no ports, so every port of a VIP address must use the same hosts",
					s.VIP, ap.Addr(), space, o.st.s.Name, o.st.s.Line, strings.Join(hosts, ","), strings.Join(o.hosts, ","))
			} else if (s.Forwarding == ForwardingTunnel) != (o.st.s.Forwarding == ForwardingTunnel) {
				d.errorf(st.pos("vip"), "vip %s shares address %s (%s) with service %s at line %d, and only one of them forwards by tunnel: fragments carry no ports, so every port of a VIP address must reach its hosts the same way",
					s.VIP, ap.Addr(), space, o.st.s.Name, o.st.s.Line)
			}
		} else {
			byAddr[ak] = vipHosts{st, hosts}
		}
	}
}

// String renders a one-line summary of the service for logs.
func (s *Service) String() string {
	return fmt.Sprintf("%s (%s, affinity %s, balance %s, %d backends)", s.Name, s.Protocol, s.Affinity.Mode, s.Balance, len(s.Backends))
}

func isPrime(n uint64) bool { return chash.IsPrime(n) }
