package l4xdp

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/stickylb/stickylb/policies/chash"
)

// Tunnel fixtures through BPF_PROG_RUN, on the NAT fixtures' namespace (the FIB gives the
// tunnel's next hop and MTU as it gives NAT's). Every expected frame is built here from its
// definition (docs/xdp.md and bpf/gue.h): the outer headers by gopacket, the GUE header and
// its private data byte by byte, the outer source port from the flow hash written again
// below, each flow's primary and secondary from policies/chash's rendezvous table.

const tunnelPort = 6080

var (
	// Tunnel backends behind the router of lb0 (10.1.0.0/24, fd01::/64), and two behind a
	// route of MTU 1400 (10.5.0.0/24, fd05::/64).
	tunA, tunB, tunC, tunD = netip.MustParseAddr("10.1.0.21"), netip.MustParseAddr("10.1.0.22"), netip.MustParseAddr("10.1.0.23"), netip.MustParseAddr("10.1.0.24")
	tunA6, tunB6, tunC6    = netip.MustParseAddr("fd01::21"), netip.MustParseAddr("fd01::22"), netip.MustParseAddr("fd01::23")
	tunNarrow              = netip.MustParseAddr("10.5.0.10")
	tunNarrow6             = netip.MustParseAddr("fd05::10")
)

// The tunnel fixtures' VIPs (ids 11..) and table size.
const (
	tunRows      = 65537
	tunVIPTCP4   = 11 // natVIP4:80 tcp over A, B, C (then D)
	tunVIPTCP6   = 12 // natVIP6:80 tcp over A6, B6, C6
	tunVIPUDP4   = 13 // natVIP4:53 udp over A, B, C
	tunVIPNarrow = 14 // natVIP4:81 tcp, every row to tunNarrow
	tunVIPNar6   = 15 // natVIP6:81 tcp, every row to tunNarrow6
	tunVIPNoSC   = 16 // natVIP4:82 tcp over A, B, C, second chance off
	tunVIPNarU   = 17 // 10.0.0.101:81 udp, every row to tunNarrow (another address: fragments
	// go by address and protocol, and natVIP4's udp ones are the fixtures' of tunVIPUDP4)
)

// tunSlots are the backend slots of the tunnel fixtures: slot i holds tunSlotAddrs[i].
var tunSlotAddrs = []netip.Addr{tunA, tunB, tunC, tunD, tunA6, tunB6, tunC6, tunNarrow, tunNarrow6}

func tunSlot(a netip.Addr) uint32 {
	for i, x := range tunSlotAddrs {
		if x == a {
			return uint32(i)
		}
	}
	panic("no slot for " + a.String())
}

// tunHost is one backend as the rendezvous table ranks it: its identity is its address and
// port, as the pools file's.
type tunHost struct {
	addr     netip.Addr
	draining bool
}

// tunTable is the second-chance table over hosts, as backend slots (policies/chash builds it;
// the program only reads it).
type tunTable struct {
	primary, second []uint32
	rows            []chash.Pair
	hosts           []tunHost
	withSecond      bool
}

func newTunTable(t testing.TB, second bool, hosts ...tunHost) tunTable {
	t.Helper()
	rh := make([]chash.RendezvousHost, len(hosts))
	for i, h := range hosts {
		rh[i] = chash.RendezvousHost{ID: netip.AddrPortFrom(h.addr, 80).String(), Weight: 1, Draining: h.draining}
	}
	r, err := chash.NewRendezvous(rh, tunRows)
	if err != nil {
		t.Fatal(err)
	}
	tt := tunTable{primary: make([]uint32, tunRows), second: make([]uint32, tunRows), rows: r.Rows(), hosts: hosts, withSecond: second}
	for i, p := range r.Rows() {
		tt.primary[i], tt.second[i] = emptySlot, emptySlot
		if p.Primary >= 0 {
			tt.primary[i] = tunSlot(hosts[p.Primary].addr)
		}
		if p.Secondary >= 0 && second {
			tt.second[i] = tunSlot(hosts[p.Secondary].addr)
		}
	}
	return tt
}

// pair is the primary and secondary (invalid: none) of the row hash h falls in.
func (tt tunTable) pair(h uint32) (netip.Addr, netip.Addr) {
	p := tt.rows[h%tunRows]
	var pri, sec netip.Addr
	if p.Primary >= 0 {
		pri = tt.hosts[p.Primary].addr
	}
	if p.Secondary >= 0 && tt.second[h%tunRows] != emptySlot {
		sec = tt.hosts[p.Secondary].addr
	}
	return pri, sec
}

func tunVIP(id uint32, vip netip.AddrPort, proto uint8, tt tunTable) VIP {
	flags := uint32(FlagTunnel)
	if tt.withSecond {
		flags |= FlagSecondChance
	}
	return VIP{ID: id, Addr: vip, Proto: proto, Flags: flags, Table: tt.primary, Second: tt.second}
}

// tunnelRig is the NAT fixtures' namespace with the tunnel's sources (natLB4 and natLB6 when
// both, else natLB4 alone), routes of MTU 1400 to 10.5.0.0/24 and fd05::/64, the tunnel
// backends and VIPs.
func tunnelRig(both bool) func(t *testing.T) *packetRig {
	return func(t *testing.T) *packetRig {
		r := newNATRig(t, Options{})
		r.kit.Run("ip", "-n", r.kit.Name("lb"), "route", "add", "10.5.0.0/24", "via", natRouter4.String(), "dev", "lb0", "mtu", "lock", "1400")
		r.kit.Run("ip", "-n", r.kit.Name("lb"), "-6", "route", "add", "fd05::/64", "via", natRouter6.String(), "dev", "lb0", "mtu", "lock", "1400")
		v6 := natLB6
		if !both {
			v6 = netip.Addr{}
		}
		if err := r.f.configureTunnel(natLB4, v6); err != nil {
			t.Fatal(err)
		}
		for i, a := range tunSlotAddrs {
			if err := r.f.SetBackend(uint32(i), Backend{MAC: backMACs[0], Alive: true, Tunnel: true, Addr: netip.AddrPortFrom(a, tunnelPort)}); err != nil {
				t.Fatal(err)
			}
			if err := r.f.SetWeight(uint32(i), 1); err != nil {
				t.Fatal(err)
			}
		}
		abc := newTunTable(t, true, tunHost{addr: tunA}, tunHost{addr: tunB}, tunHost{addr: tunC})
		abc6 := newTunTable(t, true, tunHost{addr: tunA6}, tunHost{addr: tunB6}, tunHost{addr: tunC6})
		for _, v := range []VIP{
			tunVIP(tunVIPTCP4, netip.AddrPortFrom(natVIP4, 80), 6, abc),
			tunVIP(tunVIPTCP6, netip.AddrPortFrom(natVIP6, 80), 6, abc6),
			tunVIP(tunVIPUDP4, netip.AddrPortFrom(natVIP4, 53), 17, abc),
			tunVIP(tunVIPNarrow, netip.AddrPortFrom(natVIP4, 81), 6, newTunTable(t, true, tunHost{addr: tunNarrow})),
			tunVIP(tunVIPNar6, netip.AddrPortFrom(natVIP6, 81), 6, newTunTable(t, true, tunHost{addr: tunNarrow6})),
			tunVIP(tunVIPNarU, netip.MustParseAddrPort("10.0.0.101:81"), 17, newTunTable(t, true, tunHost{addr: tunNarrow})),
			tunVIP(tunVIPNoSC, netip.AddrPortFrom(natVIP4, 82), 6, newTunTable(t, false, tunHost{addr: tunA}, tunHost{addr: tunB}, tunHost{addr: tunC})),
		} {
			if err := r.f.SetVIP(v); err != nil {
				t.Fatal(err)
			}
		}
		return &packetRig{f: r.f, nat: r}
	}
}

// tunnelHash is the program's outer-source hash (tunnel_hash in bpf/tunnel.h) from its
// definition: the client address's last 32 bits xor both ports (each as the packet holds
// it, in 16-bit words read as the key holds them in memory), through murmur3's finalizer.
func tunnelHash(src netip.Addr, sport, dport uint16) uint32 {
	s := src.As16()
	var p [4]byte
	binary.BigEndian.PutUint16(p[:], sport)
	binary.BigEndian.PutUint16(p[2:], dport)
	word := func(b []byte) uint32 {
		return uint32(binary.LittleEndian.Uint16(b[0:]))<<16 | uint32(binary.LittleEndian.Uint16(b[2:]))
	}
	h := word(s[12:]) ^ word(p[:])
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	return h ^ h>>16
}

// guePrivate is the GUE header and stickylb's private data (bpf/gue.h): version 0, C 0, Hlen
// 2 (IPv4) or 5 (IPv6), the inner protocol, flags 0; kind 'S', hops, two zero bytes, the
// secondary's address (zeros: none).
func guePrivate(v6 bool, hops uint8, second netip.Addr) []byte {
	if v6 {
		b := []byte{5, 41, 0, 0, 0x53, hops, 0, 0}
		var a [16]byte
		if second.IsValid() {
			a = second.As16()
		}
		return append(b, a[:]...)
	}
	b := []byte{2, 4, 0, 0, 0x53, hops, 0, 0}
	var a [4]byte
	if second.IsValid() {
		a = second.As4()
	}
	return append(b, a[:]...)
}

// tunneled is p as the LB sends it to backend through the tunnel: to the router, from the
// tunnel source of p's family, UDP from the flow's port to tunnelPort with checksum 0, the
// GUE header with second (and one hop) or none, then p's IP packet, its TOS or traffic
// class copied to the outer header.
func tunneled(t testing.TB, p natfxPkt, backend, second netip.Addr) []byte {
	t.Helper()
	return tunneledIP(t, p.l3(t), p.src, p.sport, p.dport, backend, second)
}

// tunneledIP is tunneled for IP packet inner of the flow from src:sport to port dport.
func tunneledIP(t testing.TB, inner []byte, src netip.Addr, sport, dport uint16, backend, second netip.Addr) []byte {
	t.Helper()
	h := tunnelHash(src, sport, dport)
	hops := uint8(0)
	if second.IsValid() {
		hops = 1
	}
	v6 := src.Is6()
	udp := &layers.UDP{SrcPort: layers.UDPPort(0xc000 | h&0x3fff), DstPort: tunnelPort}
	payload := append(guePrivate(v6, hops, second), inner...)
	var b []byte
	if v6 {
		ip := &layers.IPv6{Version: 6, TrafficClass: inner[0]<<4 | inner[1]>>4, FlowLabel: h & 0xfffff, HopLimit: 64,
			NextHeader: layers.IPProtocolUDP, SrcIP: natLB6.AsSlice(), DstIP: backend.AsSlice()}
		udp.SetNetworkLayerForChecksum(ip)
		b = serialize(t, eth(routerMAC, lbMAC, layers.EthernetTypeIPv6), ip, udp, gopacket.Payload(payload))
		b[14+40+6], b[14+40+7] = 0, 0
		return b
	}
	ip := &layers.IPv4{Version: 4, IHL: 5, TOS: inner[1], TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP,
		SrcIP: natLB4.AsSlice(), DstIP: backend.AsSlice()}
	udp.SetNetworkLayerForChecksum(ip)
	b = serialize(t, eth(routerMAC, lbMAC, layers.EthernetTypeIPv4), ip, udp, gopacket.Payload(payload))
	b[14+20+6], b[14+20+7] = 0, 0 // checksum 0: GUE needs none
	return b
}

// tooBig is the LB's answer to p, which encapsulated would not fit the path: ICMP
// fragmentation needed (ICMPv6 packet too big) from the VIP to the client with mtu, quoting
// p's first 88 (IPv6: 128) bytes of IP packet.
func tooBig(t testing.TB, p natfxPkt, mtu uint16) []byte {
	t.Helper()
	inner := p.l3(t)
	if p.src.Is6() {
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolICMPv6, SrcIP: p.dst.AsSlice(), DstIP: p.src.AsSlice()}
		ic := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(2, 0)}
		ic.SetNetworkLayerForChecksum(ip)
		body := binary.BigEndian.AppendUint32(nil, uint32(mtu))
		return serialize(t, eth(p.srcMAC, p.dstMAC, layers.EthernetTypeIPv6), ip, ic, gopacket.Payload(append(body, inner[:128]...)))
	}
	ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: p.dst.AsSlice(), DstIP: p.src.AsSlice()}
	ic := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(3, 4), Seq: mtu}
	return serialize(t, eth(p.srcMAC, p.dstMAC, layers.EthernetTypeIPv4), ip, ic, gopacket.Payload(inner[:88]))
}

// tunFlow is a client's flow to a tunnel VIP.
type tunFlow struct {
	client netip.AddrPort
	vip    netip.AddrPort
	proto  uint8
}

func (fl tunFlow) pkt(flags string, payload []byte) natfxPkt {
	return natfxPkt{dstMAC: lbMAC, srcMAC: clientMAC, src: fl.client.Addr(), dst: fl.vip.Addr(), sport: fl.client.Port(),
		dport: fl.vip.Port(), proto: fl.proto, flags: flags, payload: payload}
}

// hash is the flow's hash as the pick computes it (flowHash).
func (fl tunFlow) hash() uint32 {
	return flowHash(fl.client.Addr(), fl.vip.Addr(), fl.client.Port(), fl.vip.Port(), fl.proto, false)
}

func (fl tunFlow) key() lbFlow {
	k := lbFlow{Src: fl.client.Addr().As16(), Dst: fl.vip.Addr().As16(), Proto: fl.proto}
	k.Sport, k.Dport = netOrder(fl.client.Port()), netOrder(fl.vip.Port())
	return k
}

// otherThan is the first of the tunnel backends A, B, C that is neither a nor b.
func otherThan(a, b netip.Addr) netip.Addr {
	for _, x := range []netip.Addr{tunA, tunB, tunC} {
		if x != a && x != b {
			return x
		}
	}
	panic("no third backend")
}

// pin is a setup step that writes fl's connection entry, pinned to slot and last seen idle
// ago (as an earlier connection on the same 5-tuple may leave it).
func pin(fl tunFlow, slot uint32, idle time.Duration) func(t *testing.T, r *packetRig) {
	return pinTo(fl, tunVIPTCP4, slot, idle)
}

// pinTo is pin for a flow of VIP id.
func pinTo(fl tunFlow, id uint16, slot uint32, idle time.Duration) func(t *testing.T, r *packetRig) {
	return func(t *testing.T, r *packetRig) {
		t.Helper()
		var b lbBackend
		if err := r.f.objs.Backends.Lookup(slot, &b); err != nil {
			t.Fatal(err)
		}
		k := fl.key()
		c := lbConn{Backend: uint16(slot), Gen: b.Gen, VipId: id, LastSeen: monoNow() - uint64(idle)}
		if err := r.f.objs.Conns.Put(&k, &c); err != nil {
			t.Fatal(err)
		}
	}
}

// remembered fails unless the connection table's entry for fl exists as want says.
func remembered(fl tunFlow, want bool) func(t *testing.T, r *packetRig) {
	return func(t *testing.T, r *packetRig) {
		t.Helper()
		var c lbConn
		k := fl.key()
		if got := r.f.objs.Conns.Lookup(&k, &c) == nil; got != want {
			t.Fatalf("flow %v -> %v: remembered %v, want %v", fl.client, fl.vip, got, want)
		}
	}
}

func tunnelFixtures(t *testing.T) []packetScenario {
	tcp := func(vip netip.AddrPort, client netip.Addr, port uint16) tunFlow {
		return tunFlow{client: netip.AddrPortFrom(client, port), vip: vip, proto: 6}
	}
	vip4, vip6 := netip.AddrPortFrom(natVIP4, 80), netip.AddrPortFrom(natVIP6, 80)
	abc := newTunTable(t, true, tunHost{addr: tunA}, tunHost{addr: tunB}, tunHost{addr: tunC})
	abc6 := newTunTable(t, true, tunHost{addr: tunA6}, tunHost{addr: tunB6}, tunHost{addr: tunC6})
	abcd := newTunTable(t, true, tunHost{addr: tunA}, tunHost{addr: tunB}, tunHost{addr: tunC}, tunHost{addr: tunD})
	abcDrainD := newTunTable(t, true, tunHost{addr: tunA}, tunHost{addr: tunB}, tunHost{addr: tunC}, tunHost{addr: tunD, draining: true})
	noSC := newTunTable(t, false, tunHost{addr: tunA}, tunHost{addr: tunB}, tunHost{addr: tunC})

	// in sends frame p in on lb0 and expects it out to the router by XDP_TX as out.
	in := func(name string, p natfxPkt, out []byte) packetCase {
		return on("lb0", tx(name, p.frame(t), out))
	}
	data := []byte("data through the tunnel")

	// A new connection: its SYN goes to its row's primary with the secondary and one hop;
	// its next packets follow the entry, with no secondary (this node saw it start: the
	// primary holds it).
	f1 := tcp(vip4, natClient4, 40001)
	p1, s1 := abc.pair(f1.hash())
	// A flow this node never saw start (its ACK is a miss): the row's pair, not remembered.
	f2 := tcp(vip4, natClient4, 40002)
	p2, s2 := abc.pair(f2.hash())
	stale := tcp(vip4, natClient4, 40004)
	ps, ss := abc.pair(stale.hash())
	f6 := tcp(vip6, natClient6, 40001)
	p6, s6 := abc6.pair(f6.hash())
	u := tunFlow{client: netip.AddrPortFrom(natClient4, 5300), vip: netip.AddrPortFrom(natVIP4, 53), proto: 17}
	pu, su := abc.pair(u.hash())
	off := tcp(netip.AddrPortFrom(natVIP4, 82), natClient4, 40003)
	po, _ := noSC.pair(off.hash())

	// A row that backend D takes when it joins: its previous primary becomes its secondary;
	// when D drains, the row goes back to that primary with D as the secondary.
	var moved tunFlow
	discriminating(t, func(i int) bool {
		moved = tcp(vip4, natClient4, uint16(41000+i))
		p, _ := abcd.pair(moved.hash())
		return p == tunD
	})
	pm, sm := abc.pair(moved.hash())
	pmAdd, smAdd := abcd.pair(moved.hash())
	pmDrain, smDrain := abcDrainD.pair(moved.hash())
	if smAdd != pm || pmDrain != pm || smDrain != tunD {
		t.Fatalf("rendezvous: row of %v: %v/%v, after the add %v/%v, after the drain %v/%v", moved.client, pm, sm, pmAdd, smAdd, pmDrain, smDrain)
	}

	// MTU 1400 toward the narrow backends: 1360 bytes of IPv4 (1328 of IPv6) fit once
	// encapsulated, one more does not. 20+20 (IPv6: 40+20) bytes of headers, the rest payload.
	narrow := tcp(netip.AddrPortFrom(natVIP4, 81), natClient4, 40010)
	narrow6 := tcp(netip.AddrPortFrom(natVIP6, 81), natClient6, 40010)
	narrowU := tunFlow{client: netip.AddrPortFrom(natClient4, 40011), vip: netip.MustParseAddrPort("10.0.0.101:81"), proto: 17}
	fits, over := make([]byte, 1360-40), make([]byte, 1361-40)
	fits6, over6 := make([]byte, 1328-60), make([]byte, 1329-60)
	udpOver := make([]byte, 1361-28)

	// A fragment of a tunnel VIP (the UDP one: fragments go by address and protocol) is
	// encapsulated as it is, to the primary of its (source, destination, protocol) hash.
	frag := u.pkt("", []byte("a fragment"))
	fragIn := frag.frame(t)
	fragIn[14+6] = 0x20 // more fragments (and no DF)
	binary.BigEndian.PutUint16(fragIn[14+10:], 0)
	binary.BigEndian.PutUint16(fragIn[14+10:], ipv4Checksum(fragIn[14:34]))
	fragHash := flowHash(u.client.Addr(), u.vip.Addr(), 0, 0, 17, false)
	pf, _ := abc.pair(fragHash)
	fragOut := tunneled(t, frag, pf, netip.Addr{})
	copy(fragOut[14+20+8+12:], fragIn[14:34]) // the inner header as it came, MF set
	// The outer port hashes the fragment's flow, whose ports are 0.
	binary.BigEndian.PutUint16(fragOut[14+20:], uint16(0xc000|tunnelHash(u.client.Addr(), 0, 0)&0x3fff))

	// One rig for all but the missing source (each rig loads the program: seconds each).
	return []packetScenario{
		{name: "tunnel", rig: tunnelRig(true), cases: []packetCase{
			in("syn to the primary, with the secondary", f1.pkt("S", nil), tunneled(t, f1.pkt("S", nil), p1, s1)),
			{name: "entry remembered", after: remembered(f1, true)},
			in("data follows the entry, no secondary", f1.pkt("PA", data), tunneled(t, f1.pkt("PA", data), p1, netip.Addr{})),
			// An entry to another backend than the row's primary, fresh: followed. Idle 3 s (an
			// earlier connection on the same 5-tuple, or a table that moved meanwhile): the
			// table's pair instead, and the entry goes.
			step("an entry to another backend", pin(stale, tunSlot(otherThan(ps, ss)), 0)),
			in("a fresh entry is followed", stale.pkt("A", nil), tunneled(t, stale.pkt("A", nil), otherThan(ps, ss), netip.Addr{})),
			step("idle 3 s", pin(stale, tunSlot(otherThan(ps, ss)), 3*time.Second)),
			in("an idle entry is not: the row's pair", stale.pkt("A", nil), tunneled(t, stale.pkt("A", nil), ps, ss)),
			{name: "the idle entry went", after: remembered(stale, false)},
			in("non-SYN miss: the row's pair", f2.pkt("A", nil), tunneled(t, f2.pkt("A", nil), p2, s2)),
			{name: "a non-SYN miss with a secondary is not remembered", after: remembered(f2, false)},
			in("and again: the same pair", f2.pkt("PA", data), tunneled(t, f2.pkt("PA", data), p2, s2)),
			in("udp: the row's pair", u.pkt("", data), tunneled(t, u.pkt("", data), pu, su)),
			{name: "udp remembered", after: remembered(u, true)},
			in("second chance off: no secondary", off.pkt("A", nil), tunneled(t, off.pkt("A", nil), po, netip.Addr{})),
			{name: "second chance off: remembered", after: remembered(off, true)},
			// Without second chance an idle entry is followed, as for direct routing.
			step("off's entry idle 3 s, to another backend", pinTo(off, tunVIPNoSC, tunSlot(otherThan(po, po)), 3*time.Second)),
			in("second chance off: an idle entry is followed", off.pkt("A", nil), tunneled(t, off.pkt("A", nil), otherThan(po, po), netip.Addr{})),
			on("lb0", tx("fragment: encapsulated to its primary", fragIn, fragOut)),
			counts(map[string]uint64{"tunnel": 10, "tunnel_second": 5, "forward": 10, "conn_miss": 6, "conn_hit": 3, "conn_stale": 1, "fragment": 1}),
			in("ipv6: syn to the primary, with the secondary", f6.pkt("S", nil), tunneled(t, f6.pkt("S", nil), p6, s6)),
			in("ipv6: data follows the entry", f6.pkt("PA", data), tunneled(t, f6.pkt("PA", data), p6, netip.Addr{})),
			counts(map[string]uint64{"tunnel": 12, "tunnel_second": 6}),
			// The MTU rule, TCP and UDP, both families: a packet that would exceed the route's
			// MTU (1400, locked) once encapsulated is answered with the MTU less the overhead,
			// sent back out to the client; one that fits is encapsulated.
			in("1360 bytes fit", narrow.pkt("PA", fits), tunneled(t, narrow.pkt("PA", fits), tunNarrow, netip.Addr{})),
			in("1361 bytes: fragmentation needed, MTU 1360", narrow.pkt("PA", over), tooBig(t, narrow.pkt("PA", over), 1400-TunnelOverheadV4)),
			in("udp, 1361 bytes: fragmentation needed", narrowU.pkt("", udpOver), tooBig(t, narrowU.pkt("", udpOver), 1400-TunnelOverheadV4)),
			in("ipv6, 1328 bytes fit", narrow6.pkt("PA", fits6), tunneled(t, narrow6.pkt("PA", fits6), tunNarrow6, netip.Addr{})),
			in("ipv6, 1329 bytes: packet too big, MTU 1328", narrow6.pkt("PA", over6), tooBig(t, narrow6.pkt("PA", over6), 1400-TunnelOverheadV6)),
			counts(map[string]uint64{"tunnel": 14, "tunnel_too_big": 3}),
			// One row across an add and a drain: before, its pair; D joins and ranks first, so
			// D is primary and the row's previous primary its secondary (the flow reaches it in
			// one more hop); D drains, so the previous primary serves again and D is secondary
			// (D's connections go on through second chance).
			in("before the add: the row's pair", moved.pkt("A", nil), tunneled(t, moved.pkt("A", nil), pm, sm)),
			step("D joins", setVIP(tunVIP(tunVIPTCP4, vip4, 6, abcd))),
			in("after the add: D, the previous primary second", moved.pkt("A", nil), tunneled(t, moved.pkt("A", nil), tunD, pm)),
			step("D drains", setVIP(tunVIP(tunVIPTCP4, vip4, 6, abcDrainD))),
			in("after the drain: the previous primary, D second", moved.pkt("A", nil), tunneled(t, moved.pkt("A", nil), pm, tunD)),
		}},
		// No tunnel source of the packet's family: dropped and counted, never sent from an
		// empty address.
		{name: "tunnel without a source", rig: tunnelRig(false), cases: []packetCase{
			on("lb0", drops("ipv6 with no IPv6 source", f6.pkt("S", nil).frame(t))),
			counts(map[string]uint64{"tunnel_no_route": 1, "tunnel": 0, "forward": 0}),
		}},
	}
}
