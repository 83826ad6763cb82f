package l4xdp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/stickylb/stickylb/internal/testkit/netnstest"
	"github.com/stickylb/stickylb/policies/chash"
)

// Packet fixtures through BPF_PROG_RUN, in the manner of Katran's tester: input bytes ->
// expected action and output bytes (the table and its runner: packet_fixtures_test.go).
// Expected outputs are built with gopacket from the expected backend, which the test
// computes from policies' Maglev table and the hash the program documents (FNV-1a over the
// flow bytes), never captured from the program.

var (
	lbMAC     = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xaa}
	clientMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xcc}
	backMACs  = []net.HardwareAddr{{0x02, 0, 0, 0, 0x01, 0x01}, {0x02, 0, 0, 0, 0x01, 0x02}, {0x02, 0, 0, 0, 0x01, 0x03}}
	vip4      = netip.MustParseAddr("10.0.0.100")
	vip6      = netip.MustParseAddr("2001:db8::100")
	client4   = netip.MustParseAddr("192.0.2.10")
	client6   = netip.MustParseAddr("2001:db8:c::10")
)

const (
	xdpDrop = 1
	xdpPass = 2
	xdpTX   = 3
)

// fixtureHosts are the fixtures' backends as Maglev sees them: backend i in slot i.
var fixtureHosts = []chash.Host{{ID: "10.0.1.1:80", Weight: 1}, {ID: "10.0.1.2:80", Weight: 1}, {ID: "10.0.1.3:80", Weight: 2}}

type fixture struct {
	f     *Tables
	table []uint32
}

func setup(t testing.TB) *fixture { return setupWith(t, Options{}) }

// setupWith loads the forwarder with o (table size, insert cap) and installs the fixtures'
// backends and VIPs: 1 vip4:80 TCP 5-tuple, 2 vip6:80 TCP source_ip, 3 vip4:443 UDP QUIC,
// 4 vip6:53 UDP 5-tuple.
func setupWith(t testing.TB, o Options) *fixture {
	netnstest.NeedRoot(t)
	f, err := loadTables(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	table := maglevSlots(t, fixtureHosts...)
	for i, mac := range backMACs {
		if err := f.SetBackend(uint32(i), Backend{MAC: mac, Alive: true}); err != nil {
			t.Fatal(err)
		}
	}
	vips := []VIP{
		{ID: 1, Addr: netip.AddrPortFrom(vip4, 80), Proto: 6, Table: table},
		{ID: 2, Addr: netip.AddrPortFrom(vip6, 80), Proto: 6, Flags: FlagSourceIP, Table: table},
		{ID: 3, Addr: netip.AddrPortFrom(vip4, 443), Proto: 17, Flags: FlagQUIC, CIDLength: 8, Table: table},
		{ID: 4, Addr: netip.AddrPortFrom(vip6, 53), Proto: 17, Table: table},
	}
	for _, v := range vips {
		if err := f.SetVIP(v); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.SetServerID(3, 2, 1); err != nil { // server_id 2 -> backend 1
		t.Fatal(err)
	}
	return &fixture{f: f, table: table}
}

// expect is the backend the fixture's Maglev table gives hash h.
func (fx *fixture) expect(h uint32) int {
	return int(fx.table[h%uint32(len(fx.table))])
}

// discriminating returns the first i in [0, 100) for which differ(i) holds: fixtures pick
// inputs for which a wrong path would pick another backend than the right one, so a bug
// cannot pass by landing on the same backend.
func discriminating(t testing.TB, differ func(i int) bool) int {
	t.Helper()
	for i := 0; i < 100; i++ {
		if differ(i) {
			return i
		}
	}
	t.Fatal("no discriminating fixture input in 100 tries")
	return 0
}

// client6Where is the first of 100 IPv6 clients next to client6 (client6 itself first) for
// which differ holds (see discriminating).
func client6Where(t testing.TB, differ func(src netip.Addr) bool) netip.Addr {
	t.Helper()
	at := func(i int) netip.Addr {
		a := client6.As16()
		a[15] += byte(i)
		return netip.AddrFrom16(a)
	}
	return at(discriminating(t, func(i int) bool { return differ(at(i)) }))
}

func serialize(t testing.TB, ls ...gopacket.SerializableLayer) []byte {
	t.Helper()
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

func eth(dst, src net.HardwareAddr, t layers.EthernetType) *layers.Ethernet {
	return &layers.Ethernet{DstMAC: dst, SrcMAC: src, EthernetType: t}
}

// tcp4 builds client -> dst TCP; to the LB when toBackend is nil, else as the LB sends it
// on to that backend (MACs rewritten, nothing else).
func tcp4(t testing.TB, src, dst netip.Addr, sport, dport uint16, flags string, opts []layers.IPv4Option, toBackend net.HardwareAddr) []byte {
	e := eth(lbMAC, clientMAC, layers.EthernetTypeIPv4)
	if toBackend != nil {
		e = eth(toBackend, lbMAC, layers.EthernetTypeIPv4)
	}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice(), Options: opts, Id: 7}
	tc := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), Seq: 1, Window: 65535,
		SYN: flags == "S", RST: flags == "R", ACK: flags == "A", FIN: flags == "F"}
	tc.SetNetworkLayerForChecksum(ip)
	return serialize(t, e, ip, tc, gopacket.Payload("hello"))
}

func run(t testing.TB, p *ebpf.Program, in []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(in)+256)
	opts := &ebpf.RunOptions{Data: in, DataOut: out}
	ret, err := p.Run(opts)
	if err != nil {
		t.Fatal(err)
	}
	return ret, opts.DataOut
}

func check(t *testing.T, name string, gotRet uint32, got []byte, wantRet uint32, want []byte) {
	t.Helper()
	if gotRet != wantRet {
		t.Fatalf("%s: action %d, want %d", name, gotRet, wantRet)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: output\n%x\nwant\n%x", name, got, want)
	}
}

func tcp6(t testing.TB, src netip.Addr, sport uint16, mac net.HardwareAddr) []byte {
	e := eth(lbMAC, clientMAC, layers.EthernetTypeIPv6)
	if mac != nil {
		e = eth(mac, lbMAC, layers.EthernetTypeIPv6)
	}
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: vip6.AsSlice()}
	tc := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: 80, SYN: true, Window: 100}
	tc.SetNetworkLayerForChecksum(ip)
	return serialize(t, e, ip, tc)
}

func quic(t testing.TB, dcid []byte, long bool, mac net.HardwareAddr) []byte {
	e := eth(lbMAC, clientMAC, layers.EthernetTypeIPv4)
	if mac != nil {
		e = eth(mac, lbMAC, layers.EthernetTypeIPv4)
	}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: client4.AsSlice(), DstIP: vip4.AsSlice()}
	u := &layers.UDP{SrcPort: 50000, DstPort: 443}
	u.SetNetworkLayerForChecksum(ip)
	var p []byte
	if long {
		p = append([]byte{0xc0, 0, 0, 0, 1, byte(len(dcid))}, dcid...)
	} else {
		p = append([]byte{0x40}, dcid...)
	}
	return serialize(t, e, ip, u, gopacket.Payload(append(p, "quic payload"...)))
}

// frag6 builds an IPv6 fragment to vip6 (the fragment header by hand: gopacket does not
// serialize it); mac nil: as the client sends it, else as the LB sends it to that backend.
func frag6(t testing.TB, src netip.Addr, proto layers.IPProtocol, offset uint16, more bool, payload []byte, mac net.HardwareAddr) []byte {
	e := eth(lbMAC, clientMAC, layers.EthernetTypeIPv6)
	if mac != nil {
		e = eth(mac, lbMAC, layers.EthernetTypeIPv6)
	}
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolIPv6Fragment, SrcIP: src.AsSlice(), DstIP: vip6.AsSlice()}
	fh := []byte{byte(proto), 0, 0, 0, 0, 0, 0x12, 0x34}
	fo := offset << 3
	if more {
		fo |= 1
	}
	binary.BigEndian.PutUint16(fh[2:], fo)
	return serialize(t, e, ip, gopacket.Payload(append(fh, payload...)))
}

// each is the cases fn gives for every i in [lo, hi), in order.
func each(lo, hi int, fn func(i int) []packetCase) []packetCase {
	var out []packetCase
	for i := lo; i < hi; i++ {
		out = append(out, fn(i)...)
	}
	return out
}

// cat joins case lists.
func cat(lists ...[]packetCase) []packetCase {
	var out []packetCase
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// drFixtures are the DR forwarder's packet fixtures, on setup's backends and VIPs: 1 vip4:80
// TCP 5-tuple, 2 vip6:80 TCP source_ip, 3 vip4:443 UDP QUIC, 4 vip6:53 UDP 5-tuple. Every
// expected backend comes from policies' Maglev table and the hash the program documents.
func drFixtures(t *testing.T) []packetScenario {
	fx := &fixture{table: maglevSlots(t, fixtureHosts...)}
	size := len(fx.table)
	tcpTo := func(sport uint16, flags string, mac net.HardwareAddr) []byte {
		return tcp4(t, client4, vip4, sport, 80, flags, nil, mac)
	}
	// tcpVia is a client4 -> vip4:80 TCP packet in, out to the backend its 5-tuple hashes to.
	tcpVia := func(name string, sport uint16, flags string) packetCase {
		return tx(name, tcpTo(sport, flags, nil), tcpTo(sport, flags, backMACs[fx.expect(flowHash(client4, vip4, sport, 80, 6, false))]))
	}
	// tcpToB is a client4 -> vip4:80 TCP packet in, out to backend b.
	tcpToB := func(name string, sport uint16, flags string, b int) packetCase {
		return tx(name, tcpTo(sport, flags, nil), tcpTo(sport, flags, backMACs[b]))
	}
	vip1 := func(table []uint32) VIP {
		return VIP{ID: 1, Addr: netip.AddrPortFrom(vip4, 80), Proto: 6, Table: table}
	}

	// 5-tuple hashing spreads 40 flows over the three backends.
	spread := map[int]bool{}
	for sport := 40000; sport < 40040; sport++ {
		spread[fx.expect(flowHash(client4, vip4, uint16(sport), 80, 6, false))] = true
	}
	if len(spread) != 3 {
		t.Fatalf("40 flows hash to %d backends; the fixture needs 5-tuple hashing to spread them", len(spread))
	}
	ipOpts := []layers.IPv4Option{{OptionType: 7, OptionLength: 7, OptionData: []byte{4, 0, 0, 0, 0}}, {OptionType: 0, OptionLength: 1}} // record route + end
	if in := tcp4(t, client4, vip4, 5555, 80, "S", ipOpts, nil); in[14]&0x0f <= 5 {
		t.Fatal("fixture has no IP options")
	}

	// IPv4 fragments: every fragment, the first too, goes by (src, dst, proto).
	fragB := fx.expect(flowHash(client4, vip4, 0, 0, 6, false))
	if fragB == fx.expect(flowHash(client4, vip4, 7777, 80, 6, false)) {
		t.Fatal("fixture does not tell fragment hashing from 5-tuple hashing")
	}
	frag := func(flags layers.IPv4Flag, off uint16, mac net.HardwareAddr, dst netip.Addr, payload []byte) []byte {
		e := eth(lbMAC, clientMAC, layers.EthernetTypeIPv4)
		if mac != nil {
			e = eth(mac, lbMAC, layers.EthernetTypeIPv4)
		}
		return serialize(t, e, &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: client4.AsSlice(), DstIP: dst.AsSlice(), Flags: flags, FragOffset: off, Id: 99}, gopacket.Payload(payload))
	}
	fragTCP := tcpTo(7777, "A", nil)[34:]
	rest := []byte("rest of the datagram")
	noVIP := netip.AddrFrom4([4]byte{10, 9, 9, 9})

	// An ICMP error about a flow goes where the flow went, which is not where its quoted
	// header, unswapped, would hash.
	icmpPort := 6000 + uint16(discriminating(t, func(i int) bool {
		p := 6000 + uint16(i)
		return fx.expect(flowHash(client4, vip4, p, 80, 6, false)) != fx.expect(flowHash(vip4, client4, 80, p, 6, false))
	}))
	icmpFlowMAC := backMACs[fx.expect(flowHash(client4, vip4, icmpPort, 80, 6, false))]
	icmpAbout := func(sport uint16, dst, src net.HardwareAddr) []byte {
		quoted := tcp4(t, vip4, client4, 80, sport, "A", nil, nil)[14:42] // IP header + 8 bytes
		return serialize(t, eth(dst, src, layers.EthernetTypeIPv4),
			&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: []byte{198, 51, 100, 1}, DstIP: vip4.AsSlice()},
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(3, 4)}, gopacket.Payload(quoted))
	}

	full := tcpTo(1234, "S", nil)
	ihl3 := append([]byte(nil), full...)
	ihl3[14] = 0x43 // IHL 3

	quicKnown := []byte{0x01, 0x00, 0x02, 9, 9, 9, 9, 9}      // server_id 2 -> backend 1
	quicInitial := []byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4} // client-chosen: unknown id, hash the DCID

	// IPv6 fragments go by (src, dst, proto) among the VIP address's backends (vip6's UDP
	// VIP hashes the 5-tuple): a client whose fragments hash elsewhere than its flow does.
	frag6Src := client6Where(t, func(src netip.Addr) bool {
		return fx.expect(flowHash(src, vip6, 0, 0, 17, false)) != fx.expect(flowHash(src, vip6, 7000, 53, 17, false))
	})
	frag6B := fx.expect(flowHash(frag6Src, vip6, 0, 0, 17, false))
	udpHdr := []byte{0x1b, 0x58, 0, 53, 0, 40, 0, 0} // 7000 -> 53, length 40, no checksum
	frag6Rest := []byte("the rest of it, 8-byte units")
	frag6First := frag6(t, frag6Src, layers.IPProtocolUDP, 0, true, udpHdr, nil)

	// ICMPv6: a packet too big about the backend's reply of a flow (VIP -> client, sent by a
	// router to the VIP) goes where the flow went; informational ICMPv6 passes.
	udp6 := func(src, dst netip.Addr, sport, dport uint16, e *layers.Ethernet) []byte {
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		u := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
		u.SetNetworkLayerForChecksum(ip)
		return serialize(t, e, ip, u, gopacket.Payload("query"))
	}
	if fx.expect(flowHash(client6, vip6, 5353, 53, 17, false)) == fx.expect(flowHash(vip6, client6, 53, 5353, 17, false)) {
		t.Fatal("fixture does not tell the swapped inner header from the unswapped one")
	}
	v6FlowMAC := backMACs[fx.expect(flowHash(client6, vip6, 5353, 53, 17, false))]
	router := netip.MustParseAddr("2001:db8:ffff::1")
	icmp6 := func(typ, code uint8, body []byte, dst, src net.HardwareAddr) []byte {
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolICMPv6, SrcIP: router.AsSlice(), DstIP: vip6.AsSlice()}
		ic := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(typ, code)}
		ic.SetNetworkLayerForChecksum(ip)
		return serialize(t, eth(dst, src, layers.EthernetTypeIPv6), ip, ic, gopacket.Payload(body))
	}
	reply6 := udp6(vip6, client6, 53, 5353, eth(clientMAC, lbMAC, layers.EthernetTypeIPv6))[14:]
	tooBig := append([]byte{0, 0, 0x05, 0x00}, reply6[:40+8]...) // MTU 1280, quoted header + 8 bytes
	// Quoting a packet of no VIP flow (another source port's reply is still the VIP's: use
	// another address), and an echo request: the stack's.
	other6 := udp6(netip.MustParseAddr("2001:db8::999"), client6, 53, 5353, eth(clientMAC, lbMAC, layers.EthernetTypeIPv6))[14:]
	notOurs6 := icmp6(1, 4, append([]byte{0, 0, 0, 0}, other6[:48]...), lbMAC, clientMAC)
	echo6 := icmp6(128, 0, []byte{0, 1, 0, 1, 'p', 'i', 'n', 'g'}, lbMAC, clientMAC)

	redirB := fx.expect(flowHash(client4, vip4, 4444, 80, 6, false))
	finB := fx.expect(flowHash(client4, vip4, 2323, 80, 6, false))
	synB := fx.expect(flowHash(client4, vip4, 3434, 80, 6, false))
	synNext := (synB + 1) % len(backMACs)

	return append([]packetScenario{
		{name: "tcp 5-tuple", rig: drRig, cases: cat(
			each(40000, 40040, func(i int) []packetCase {
				sport := uint16(i)
				// The next packet of the flow hits the connection table, same backend.
				return []packetCase{tcpVia(fmt.Sprintf("syn from port %d", sport), sport, "S"), tcpVia("ack", sport, "A")}
			}),
			[]packetCase{counts(map[string]uint64{"conn_hit": 40, "conn_miss": 40, "forward": 80})})},
		{name: "not for a VIP", rig: drRig, cases: []packetCase{
			passes("other address", tcp4(t, client4, netip.MustParseAddr("10.0.0.101"), 1000, 80, "S", nil, nil)),
			passes("other port", tcp4(t, client4, vip4, 1000, 81, "S", nil, nil)),
			passes("arp", serialize(t, eth(lbMAC, clientMAC, layers.EthernetTypeARP), &layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4, Operation: 1, SourceHwAddress: clientMAC, SourceProtAddress: client4.AsSlice(), DstHwAddress: make([]byte, 6), DstProtAddress: vip4.AsSlice()})),
			passes("icmp echo", serialize(t, eth(lbMAC, clientMAC, layers.EthernetTypeIPv4), &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: client4.AsSlice(), DstIP: vip4.AsSlice()}, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(8, 0)})),
		}},
		{name: "ip options", rig: drRig, cases: []packetCase{
			tx("options", tcp4(t, client4, vip4, 5555, 80, "S", ipOpts, nil),
				tcp4(t, client4, vip4, 5555, 80, "S", ipOpts, backMACs[fx.expect(flowHash(client4, vip4, 5555, 80, 6, false))])),
		}},
		{name: "fragments", rig: drRig, cases: []packetCase{
			tx("first fragment", frag(layers.IPv4MoreFragments, 0, nil, vip4, fragTCP), frag(layers.IPv4MoreFragments, 0, backMACs[fragB], vip4, fragTCP)),
			tx("last fragment", frag(0, 3, nil, vip4, rest), frag(0, 3, backMACs[fragB], vip4, rest)),
			passes("fragment not for a VIP", frag(layers.IPv4MoreFragments, 0, nil, noVIP, fragTCP)),
		}},
		{name: "icmp error follows its flow", rig: drRig, cases: []packetCase{
			tcpVia("syn", icmpPort, "S"),
			tx("icmp frag-needed", icmpAbout(icmpPort, lbMAC, clientMAC), icmpAbout(icmpPort, icmpFlowMAC, lbMAC)),
			counts(map[string]uint64{"icmp_error": 1}),
		}},
		{name: "malformed", rig: drRig, cases: []packetCase{
			drops("truncated TCP to a VIP", full[:14+20+10]),
			passes("truncated ip: the stack decides", full[:14+12]),
			drops("ihl < 5", ihl3),
			counts(map[string]uint64{"malformed": 3}),
		}},
		{name: "rst", rig: drRig, cases: []packetCase{
			tcpVia("syn", 2222, "S"),
			tcpVia("rst", 2222, "R"),
			then("the flow left the connection table", func(t *testing.T, r *packetRig) {
				key := flowKey(client4, vip4, 2222, 80, 6)
				var c lbConn
				if err := r.f.objs.Conns.Lookup(&key, &c); err == nil {
					t.Fatal("the flow is still in the connection table after RST")
				}
			}),
		}},
		{name: "ipv6 source_ip", rig: drRig, cases: each(1000, 1010, func(i int) []packetCase {
			b := fx.expect(flowHash(client6, vip6, 0, 0, 6, true))
			return []packetCase{tx("v6 source_ip", tcp6(t, client6, uint16(i), nil), tcp6(t, client6, uint16(i), backMACs[b]))}
		})},
		{name: "quic", rig: drRig, cases: []packetCase{
			tx("short header, known server_id", quic(t, quicKnown, false, nil), quic(t, quicKnown, false, backMACs[1])),
			step("forget the flow so the next case decides anew", forgetFlow(flowKey(client4, vip4, 50000, 443, 17))),
			tx("initial, client-chosen DCID", quic(t, quicInitial, true, nil), quic(t, quicInitial, true, backMACs[fx.expect(fnv1a(quicInitial))])),
		}},
		// A new table (a backend drained or added) moves no established flow; new flows
		// follow the new table. A backend that leaves the pool (not alive): its flows re-pick.
		{name: "table swap keeps flows", rig: drRig, cases: cat(
			each(3000, 3020, func(i int) []packetCase { return []packetCase{tcpVia("syn", uint16(i), "S")} }),
			// Every new flow to backend 2 (0 and 1 draining: alive, out of the table).
			[]packetCase{step("swap in a table of backend 2 alone", setVIP(vip1(fill(size, 2))))},
			each(3000, 3020, func(i int) []packetCase { return []packetCase{tcpVia("established after the swap", uint16(i), "A")} }),
			[]packetCase{
				tcpToB("new flow after the swap", 9999, "S", 2),
				step("backend 0 leaves", setBackend(0, Backend{MAC: backMACs[0], Alive: false})),
			},
			each(3000, 3020, func(i int) []packetCase {
				b := fx.expect(flowHash(client4, vip4, uint16(i), 80, 6, false))
				if b == 0 {
					b = 2
				}
				return []packetCase{tcpToB("after backend 0 left", uint16(i), "A", b)}
			}))},
		{name: "ipv6 fragments", rig: drRig, cases: []packetCase{
			tx("v6 first fragment", frag6First, frag6(t, frag6Src, layers.IPProtocolUDP, 0, true, udpHdr, backMACs[frag6B])),
			tx("v6 last fragment", frag6(t, frag6Src, layers.IPProtocolUDP, 1, false, frag6Rest, nil), frag6(t, frag6Src, layers.IPProtocolUDP, 1, false, frag6Rest, backMACs[frag6B])),
			counts(map[string]uint64{"fragment": 2}),
			passes("v6 truncated fragment header: the stack decides", frag6First[:14+40+4]),
		}},
		{name: "icmpv6 error follows its flow", rig: drRig, cases: []packetCase{
			tx("udp flow", udp6(client6, vip6, 5353, 53, eth(lbMAC, clientMAC, layers.EthernetTypeIPv6)), udp6(client6, vip6, 5353, 53, eth(v6FlowMAC, lbMAC, layers.EthernetTypeIPv6))),
			tx("icmpv6 packet too big", icmp6(2, 0, tooBig, lbMAC, clientMAC), icmp6(2, 0, tooBig, v6FlowMAC, lbMAC)),
			passes("icmpv6 error about no VIP flow", notOurs6),
			passes("icmpv6 echo request", echo6),
			counts(map[string]uint64{"icmp_error": 1}),
		}},
		// A backend with an interface of its own gets its frames by redirect (XDP_REDIRECT),
		// MACs rewritten as for XDP_TX. Under BPF_PROG_RUN the redirect is reported, not done.
		{name: "redirect to the backend's interface", rig: drRig, cases: []packetCase{
			step("backend on ifindex 1", setBackend(uint32(redirB), Backend{MAC: backMACs[redirB], Ifindex: 1, Alive: true})),
			{name: "redirect", in: tcpTo(4444, "S", nil), verdict: xdpRedirectAction, out: tcpTo(4444, "S", backMACs[redirB])},
		}},
		// A FIN keeps the flow: the rest of the close (the client's last ACK) must reach the
		// same backend, even after a table change sent new flows elsewhere. Only RST forgets a
		// flow.
		{name: "fin keeps the flow", rig: drRig, cases: []packetCase{
			tcpVia("syn", 2323, "S"),
			step("new flows elsewhere", setVIP(vip1(fill(size, uint32((finB+1)%len(backMACs)))))),
			tcpToB("after FIN: F", 2323, "F", finB),
			tcpToB("after FIN: A", 2323, "A", finB),
		}},
		// A SYN is a new connection: it picks from the table even when its 5-tuple has an
		// entry (a client reusing a port), so it never follows a stale entry to a backend that
		// left the table; the entry then follows the new connection.
		{name: "syn picks from the table", rig: drRig, cases: []packetCase{
			tcpVia("syn", 3434, "S"),
			step("the flow's backend leaves the table (drained, or found dead)", setVIP(vip1(fill(size, uint32(synNext))))),
			tcpToB("established", 3434, "A", synB),
			tcpToB("new connection on the same 5-tuple", 3434, "S", synNext),
			tcpToB("its next packet", 3434, "A", synNext),
		}},
	}, append(hardeningFixtures(t, fx), wrrFixture(t, fx))...)
}
