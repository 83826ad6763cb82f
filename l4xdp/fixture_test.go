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
// expected action and output bytes. Expected outputs are built with gopacket from the
// expected backend, which the test computes from policies' Maglev table and the hash the
// program documents (FNV-1a over the flow bytes), never captured from the program.

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
	hosts := []chash.Host{{ID: "10.0.1.1:80", Weight: 1}, {ID: "10.0.1.2:80", Weight: 1}, {ID: "10.0.1.3:80", Weight: 2}}
	table := maglevSlots(t, hosts...)
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

func (fx *fixture) expect(b []byte) int {
	return int(fx.table[fnv1a(b)%uint32(len(fx.table))])
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

func TestFixtureTCP5Tuple(t *testing.T) {
	fx := setup(t)
	seen := map[int]bool{}
	for sport := uint16(40000); sport < 40040; sport++ {
		in := tcp4(t, client4, vip4, sport, 80, "S", nil, nil)
		b := fx.expect(flowHashInput(client4, vip4, sport, 80, 6, false))
		ret, out := run(t, fx.f.Program(), in)
		check(t, fmt.Sprintf("syn from port %d", sport), ret, out, xdpTX, tcp4(t, client4, vip4, sport, 80, "S", nil, backMACs[b]))
		seen[b] = true
		// The next packet of the flow hits the connection table, same backend.
		ret, out = run(t, fx.f.Program(), tcp4(t, client4, vip4, sport, 80, "A", nil, nil))
		check(t, "ack", ret, out, xdpTX, tcp4(t, client4, vip4, sport, 80, "A", nil, backMACs[b]))
	}
	if len(seen) != 3 {
		t.Fatalf("40 flows reached %d backends; 5-tuple hashing should spread them", len(seen))
	}
	c := pathCounts(t, fx.f)
	if c["conn_hit"] != 40 || c["conn_miss"] != 40 || c["forward"] != 80 {
		t.Fatalf("counters: %v", c)
	}
}

func TestFixtureNotForVIP(t *testing.T) {
	fx := setup(t)
	for name, in := range map[string][]byte{
		"other address": tcp4(t, client4, netip.MustParseAddr("10.0.0.101"), 1000, 80, "S", nil, nil),
		"other port":    tcp4(t, client4, vip4, 1000, 81, "S", nil, nil),
		"arp":           serialize(t, eth(lbMAC, clientMAC, layers.EthernetTypeARP), &layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4, Operation: 1, SourceHwAddress: clientMAC, SourceProtAddress: client4.AsSlice(), DstHwAddress: make([]byte, 6), DstProtAddress: vip4.AsSlice()}),
		"icmp echo":     serialize(t, eth(lbMAC, clientMAC, layers.EthernetTypeIPv4), &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: client4.AsSlice(), DstIP: vip4.AsSlice()}, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(8, 0)}),
	} {
		ret, out := run(t, fx.f.Program(), in)
		check(t, name, ret, out, xdpPass, in)
	}
}

func TestFixtureIPOptions(t *testing.T) {
	fx := setup(t)
	opts := []layers.IPv4Option{{OptionType: 7, OptionLength: 7, OptionData: []byte{4, 0, 0, 0, 0}}, {OptionType: 0, OptionLength: 1}} // record route + end
	in := tcp4(t, client4, vip4, 5555, 80, "S", opts, nil)
	if in[14]&0x0f <= 5 {
		t.Fatal("fixture has no IP options")
	}
	b := fx.expect(flowHashInput(client4, vip4, 5555, 80, 6, false))
	ret, out := run(t, fx.f.Program(), in)
	check(t, "options", ret, out, xdpTX, tcp4(t, client4, vip4, 5555, 80, "S", opts, backMACs[b]))
}

// fragments: every fragment, the first too, goes by (src, dst, proto).
func TestFixtureFragments(t *testing.T) {
	fx := setup(t)
	b := fx.expect(flowHashInput(client4, vip4, 0, 0, 6, false))
	if b == fx.expect(flowHashInput(client4, vip4, 7777, 80, 6, false)) {
		t.Fatal("fixture does not tell fragment hashing from 5-tuple hashing")
	}
	frag := func(flags layers.IPv4Flag, off uint16, mac net.HardwareAddr, payload []byte) []byte {
		e := eth(lbMAC, clientMAC, layers.EthernetTypeIPv4)
		if mac != nil {
			e = eth(mac, lbMAC, layers.EthernetTypeIPv4)
		}
		return serialize(t, e, &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: client4.AsSlice(), DstIP: vip4.AsSlice(), Flags: flags, FragOffset: off, Id: 99}, gopacket.Payload(payload))
	}
	tcpHdr := tcp4(t, client4, vip4, 7777, 80, "A", nil, nil)[34:]
	first := frag(layers.IPv4MoreFragments, 0, nil, tcpHdr)
	ret, out := run(t, fx.f.Program(), first)
	check(t, "first fragment", ret, out, xdpTX, frag(layers.IPv4MoreFragments, 0, backMACs[b], tcpHdr))
	later := frag(0, 3, nil, []byte("rest of the datagram"))
	ret, out = run(t, fx.f.Program(), later)
	check(t, "last fragment", ret, out, xdpTX, frag(0, 3, backMACs[b], []byte("rest of the datagram")))
	// A fragment for an address that is no VIP passes.
	other := serialize(t, eth(lbMAC, clientMAC, layers.EthernetTypeIPv4), &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: client4.AsSlice(), DstIP: []byte{10, 9, 9, 9}, Flags: layers.IPv4MoreFragments, Id: 1}, gopacket.Payload(tcpHdr))
	ret, out = run(t, fx.f.Program(), other)
	check(t, "fragment not for a VIP", ret, out, xdpPass, other)
}

// An ICMP error about a flow (the quoted packet is the backend's reply, VIP -> client)
// follows the flow.
func TestFixtureICMPErrorFollowsFlow(t *testing.T) {
	fx := setup(t)
	// Establish the flow; the ICMP error about it must go where the flow went, which is not
	// where its quoted header, unswapped, would hash.
	sport := 6000 + uint16(discriminating(t, func(i int) bool {
		p := 6000 + uint16(i)
		return fx.expect(flowHashInput(client4, vip4, p, 80, 6, false)) != fx.expect(flowHashInput(vip4, client4, 80, p, 6, false))
	}))
	syn := tcp4(t, client4, vip4, sport, 80, "S", nil, nil)
	ret, out := run(t, fx.f.Program(), syn)
	if ret != xdpTX {
		t.Fatalf("syn: %d", ret)
	}
	flowMAC := net.HardwareAddr(out[0:6])
	quoted := tcp4(t, vip4, client4, 80, sport, "A", nil, nil)[14:42] // IP header + 8 bytes
	build := func(dst, src net.HardwareAddr) []byte {
		return serialize(t, eth(dst, src, layers.EthernetTypeIPv4),
			&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: []byte{198, 51, 100, 1}, DstIP: vip4.AsSlice()},
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(3, 4)}, gopacket.Payload(quoted))
	}
	ret, out = run(t, fx.f.Program(), build(lbMAC, clientMAC))
	check(t, "icmp frag-needed", ret, out, xdpTX, build(flowMAC, lbMAC))
	c := pathCounts(t, fx.f)
	if c["icmp_error"] != 1 {
		t.Fatalf("counters: %v", c)
	}
}

func TestFixtureMalformed(t *testing.T) {
	fx := setup(t)
	full := tcp4(t, client4, vip4, 1234, 80, "S", nil, nil)
	ret, _ := run(t, fx.f.Program(), full[:14+20+10]) // TCP header cut short, to a VIP
	if ret != xdpDrop {
		t.Fatalf("truncated TCP to a VIP: %d, want drop", ret)
	}
	short := full[:14+12] // IP header cut short: the stack decides
	ret, out := run(t, fx.f.Program(), short)
	check(t, "truncated ip", ret, out, xdpPass, short)
	bad := append([]byte(nil), full...)
	bad[14] = 0x43 // IHL 3
	ret, _ = run(t, fx.f.Program(), bad)
	if ret != xdpDrop {
		t.Fatalf("ihl < 5: %d, want drop", ret)
	}
	c := pathCounts(t, fx.f)
	if c["malformed"] != 3 {
		t.Fatalf("counters: %v", c)
	}
}

func TestFixtureRST(t *testing.T) {
	fx := setup(t)
	run(t, fx.f.Program(), tcp4(t, client4, vip4, 2222, 80, "S", nil, nil))
	b := fx.expect(flowHashInput(client4, vip4, 2222, 80, 6, false))
	ret, out := run(t, fx.f.Program(), tcp4(t, client4, vip4, 2222, 80, "R", nil, nil))
	check(t, "rst", ret, out, xdpTX, tcp4(t, client4, vip4, 2222, 80, "R", nil, backMACs[b]))
	var key lbFlow
	key.Src, key.Dst, key.Proto = client4.As16(), vip4.As16(), 6
	binary.BigEndian.PutUint16((*[2]byte)(unsafeSlice(&key.Sport))[:], 2222)
	binary.BigEndian.PutUint16((*[2]byte)(unsafeSlice(&key.Dport))[:], 80)
	var c lbConn
	if err := fx.f.objs.Conns.Lookup(&key, &c); err == nil {
		t.Fatal("the flow is still in the connection table after RST")
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

func TestFixtureIPv6SourceIP(t *testing.T) {
	fx := setup(t)
	b := fx.expect(flowHashInput(client6, vip6, 0, 0, 6, true))
	for sport := uint16(1000); sport < 1010; sport++ {
		ret, out := run(t, fx.f.Program(), tcp6(t, client6, sport, nil))
		check(t, "v6 source_ip", ret, out, xdpTX, tcp6(t, client6, sport, backMACs[b]))
	}
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

func TestFixtureQUIC(t *testing.T) {
	fx := setup(t)
	known := []byte{0x01, 0x00, 0x02, 9, 9, 9, 9, 9} // server_id 2 -> backend 1
	ret, out := run(t, fx.f.Program(), quic(t, known, false, nil))
	check(t, "short header, known server_id", ret, out, xdpTX, quic(t, known, false, backMACs[1]))
	fx.f.objs.Conns.Delete(func() *lbFlow { // forget the flow so the next case decides anew
		var k lbFlow
		k.Src, k.Dst, k.Proto = client4.As16(), vip4.As16(), 17
		binary.BigEndian.PutUint16((*[2]byte)(unsafeSlice(&k.Sport))[:], 50000)
		binary.BigEndian.PutUint16((*[2]byte)(unsafeSlice(&k.Dport))[:], 443)
		return &k
	}())
	initial := []byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4} // client-chosen: unknown id, hash the DCID
	b := fx.expect(initial)
	ret, out = run(t, fx.f.Program(), quic(t, initial, true, nil))
	check(t, "initial, client-chosen DCID", ret, out, xdpTX, quic(t, initial, true, backMACs[b]))
}

// TestFixtureTableSwapKeepsFlows: a new table (a backend drained or added) moves no
// established flow; new flows follow the new table.
func TestFixtureTableSwapKeepsFlows(t *testing.T) {
	fx := setup(t)
	var macs []net.HardwareAddr
	for sport := uint16(3000); sport < 3020; sport++ {
		_, out := run(t, fx.f.Program(), tcp4(t, client4, vip4, sport, 80, "S", nil, nil))
		macs = append(macs, append(net.HardwareAddr(nil), out[0:6]...))
	}
	only2 := make([]uint32, len(fx.table))
	for i := range only2 {
		only2[i] = 2 // every new flow to backend 2 (0 and 1 draining: alive, out of the table)
	}
	if err := fx.f.SetVIP(VIP{ID: 1, Addr: netip.AddrPortFrom(vip4, 80), Proto: 6, Table: only2}); err != nil {
		t.Fatal(err)
	}
	for i, sport := 0, uint16(3000); sport < 3020; i, sport = i+1, sport+1 {
		ret, out := run(t, fx.f.Program(), tcp4(t, client4, vip4, sport, 80, "A", nil, nil))
		check(t, "established after the swap", ret, out, xdpTX, tcp4(t, client4, vip4, sport, 80, "A", nil, macs[i]))
	}
	ret, out := run(t, fx.f.Program(), tcp4(t, client4, vip4, 9999, 80, "S", nil, nil))
	check(t, "new flow after the swap", ret, out, xdpTX, tcp4(t, client4, vip4, 9999, 80, "S", nil, backMACs[2]))
	// A backend that leaves the pool (not alive): its flows re-pick from the table.
	if err := fx.f.SetBackend(0, Backend{MAC: backMACs[0], Alive: false}); err != nil {
		t.Fatal(err)
	}
	for i, sport := 0, uint16(3000); sport < 3020; i, sport = i+1, sport+1 {
		ret, out := run(t, fx.f.Program(), tcp4(t, client4, vip4, sport, 80, "A", nil, nil))
		want := macs[i]
		if bytes.Equal(macs[i], backMACs[0]) {
			want = backMACs[2]
		}
		check(t, "after backend 0 left", ret, out, xdpTX, tcp4(t, client4, vip4, sport, 80, "A", nil, want))
	}
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

// IPv6 fragments, the first too, go by (src, dst, proto) among the VIP address's backends
// (vip6's UDP VIP hashes the 5-tuple): its unfragmented datagrams may go elsewhere, as for
// IPv4. (A source_ip VIP's fragments hash by the source: hardening_test.go.)
func TestFixtureIPv6Fragments(t *testing.T) {
	fx := setup(t)
	udp := layers.IPProtocolUDP
	// A client whose fragments hash elsewhere than its flow does.
	src := client6
	discriminating(t, func(i int) bool {
		a := client6.As16()
		a[15] += byte(i)
		src = netip.AddrFrom16(a)
		return fx.expect(flowHashInput(src, vip6, 0, 0, 17, false)) != fx.expect(flowHashInput(src, vip6, 7000, 53, 17, false))
	})
	b := fx.expect(flowHashInput(src, vip6, 0, 0, 17, false))
	udpHdr := []byte{0x1b, 0x58, 0, 53, 0, 40, 0, 0} // 7000 -> 53, length 40, no checksum
	first := frag6(t, src, udp, 0, true, udpHdr, nil)
	ret, out := run(t, fx.f.Program(), first)
	check(t, "v6 first fragment", ret, out, xdpTX, frag6(t, src, udp, 0, true, udpHdr, backMACs[b]))
	rest := []byte("the rest of it, 8-byte units")
	ret, out = run(t, fx.f.Program(), frag6(t, src, udp, 1, false, rest, nil))
	check(t, "v6 last fragment", ret, out, xdpTX, frag6(t, src, udp, 1, false, rest, backMACs[b]))
	c := pathCounts(t, fx.f)
	if c["fragment"] != 2 {
		t.Fatalf("counters: %v", c)
	}
	short := first[:14+40+4] // fragment header cut short: the stack decides
	ret, out = run(t, fx.f.Program(), short)
	check(t, "v6 truncated fragment header", ret, out, xdpPass, short)
}

// An ICMPv6 error about a flow (packet too big for the backend's reply, VIP -> client, sent
// by a router to the VIP) goes where the flow went; informational ICMPv6 passes.
func TestFixtureICMPv6ErrorFollowsFlow(t *testing.T) {
	fx := setup(t)
	udp6 := func(src, dst netip.Addr, sport, dport uint16, e *layers.Ethernet) []byte {
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		u := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
		u.SetNetworkLayerForChecksum(ip)
		return serialize(t, e, ip, u, gopacket.Payload("query"))
	}
	// The flow, client -> vip6:53 (UDP, 5-tuple); its quoted reply, unswapped, would hash to
	// another backend.
	if fx.expect(flowHashInput(client6, vip6, 5353, 53, 17, false)) == fx.expect(flowHashInput(vip6, client6, 53, 5353, 17, false)) {
		t.Fatal("fixture does not tell the swapped inner header from the unswapped one")
	}
	ret, out := run(t, fx.f.Program(), udp6(client6, vip6, 5353, 53, eth(lbMAC, clientMAC, layers.EthernetTypeIPv6)))
	if ret != xdpTX {
		t.Fatalf("udp flow: %d", ret)
	}
	flowMAC := net.HardwareAddr(out[0:6])
	if want := backMACs[fx.expect(flowHashInput(client6, vip6, 5353, 53, 17, false))]; !bytes.Equal(flowMAC, want) {
		t.Fatalf("flow went to %s, want %s", flowMAC, want)
	}
	reply := udp6(vip6, client6, 53, 5353, eth(clientMAC, lbMAC, layers.EthernetTypeIPv6))[14:]
	router := netip.MustParseAddr("2001:db8:ffff::1")
	icmp := func(typ, code uint8, body []byte, dst, src net.HardwareAddr) []byte {
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolICMPv6, SrcIP: router.AsSlice(), DstIP: vip6.AsSlice()}
		ic := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(typ, code)}
		ic.SetNetworkLayerForChecksum(ip)
		return serialize(t, eth(dst, src, layers.EthernetTypeIPv6), ip, ic, gopacket.Payload(body))
	}
	tooBig := append([]byte{0, 0, 0x05, 0x00}, reply[:40+8]...) // MTU 1280, quoted header + 8 bytes
	ret, out = run(t, fx.f.Program(), icmp(2, 0, tooBig, lbMAC, clientMAC))
	check(t, "icmpv6 packet too big", ret, out, xdpTX, icmp(2, 0, tooBig, flowMAC, lbMAC))
	// Quoting a packet of no VIP flow (another source port's reply is still the VIP's: use
	// another address), and an echo request: the stack's.
	other := udp6(netip.MustParseAddr("2001:db8::999"), client6, 53, 5353, eth(clientMAC, lbMAC, layers.EthernetTypeIPv6))[14:]
	notOurs := icmp(1, 4, append([]byte{0, 0, 0, 0}, other[:48]...), lbMAC, clientMAC)
	ret, out = run(t, fx.f.Program(), notOurs)
	check(t, "icmpv6 error about no VIP flow", ret, out, xdpPass, notOurs)
	echo := icmp(128, 0, []byte{0, 1, 0, 1, 'p', 'i', 'n', 'g'}, lbMAC, clientMAC)
	ret, out = run(t, fx.f.Program(), echo)
	check(t, "icmpv6 echo request", ret, out, xdpPass, echo)
	c := pathCounts(t, fx.f)
	if c["icmp_error"] != 1 {
		t.Fatalf("counters: %v", c)
	}
}

// A backend with an interface of its own gets its frames by redirect (XDP_REDIRECT), MACs
// rewritten as for XDP_TX. Under BPF_PROG_RUN the redirect is reported, not done.
func TestFixtureRedirectToBackendInterface(t *testing.T) {
	fx := setup(t)
	b := fx.expect(flowHashInput(client4, vip4, 4444, 80, 6, false))
	if err := fx.f.SetBackend(uint32(b), Backend{MAC: backMACs[b], Ifindex: 1, Alive: true}); err != nil {
		t.Fatal(err)
	}
	const xdpRedirect = 4
	ret, out := run(t, fx.f.Program(), tcp4(t, client4, vip4, 4444, 80, "S", nil, nil))
	check(t, "redirect", ret, out, xdpRedirect, tcp4(t, client4, vip4, 4444, 80, "S", nil, backMACs[b]))
}

// A FIN keeps the flow: the rest of the close (the client's last ACK) must reach the same
// backend, even after a table change sent new flows elsewhere. Only RST forgets a flow.
func TestFixtureFINKeepsFlow(t *testing.T) {
	fx := setup(t)
	b := fx.expect(flowHashInput(client4, vip4, 2323, 80, 6, false))
	run(t, fx.f.Program(), tcp4(t, client4, vip4, 2323, 80, "S", nil, nil))
	other := make([]uint32, len(fx.table))
	for i := range other {
		other[i] = uint32((b + 1) % len(backMACs))
	}
	if err := fx.f.SetVIP(VIP{ID: 1, Addr: netip.AddrPortFrom(vip4, 80), Proto: 6, Table: other}); err != nil {
		t.Fatal(err)
	}
	for _, flags := range []string{"F", "A"} {
		ret, out := run(t, fx.f.Program(), tcp4(t, client4, vip4, 2323, 80, flags, nil, nil))
		check(t, "after FIN: "+flags, ret, out, xdpTX, tcp4(t, client4, vip4, 2323, 80, flags, nil, backMACs[b]))
	}
}

// A SYN is a new connection: it picks from the table even when its 5-tuple has an entry (a
// client reusing a port), so it never follows a stale entry to a backend that left the
// table; the entry then follows the new connection.
func TestFixtureSYNPicksFromTable(t *testing.T) {
	fx := setup(t)
	b := fx.expect(flowHashInput(client4, vip4, 3434, 80, 6, false))
	run(t, fx.f.Program(), tcp4(t, client4, vip4, 3434, 80, "S", nil, nil))
	next := (b + 1) % len(backMACs)
	moved := make([]uint32, len(fx.table))
	for i := range moved {
		moved[i] = uint32(next) // b left the table (drained, or found dead)
	}
	if err := fx.f.SetVIP(VIP{ID: 1, Addr: netip.AddrPortFrom(vip4, 80), Proto: 6, Table: moved}); err != nil {
		t.Fatal(err)
	}
	ret, out := run(t, fx.f.Program(), tcp4(t, client4, vip4, 3434, 80, "A", nil, nil))
	check(t, "established", ret, out, xdpTX, tcp4(t, client4, vip4, 3434, 80, "A", nil, backMACs[b]))
	ret, out = run(t, fx.f.Program(), tcp4(t, client4, vip4, 3434, 80, "S", nil, nil))
	check(t, "new connection on the same 5-tuple", ret, out, xdpTX, tcp4(t, client4, vip4, 3434, 80, "S", nil, backMACs[next]))
	ret, out = run(t, fx.f.Program(), tcp4(t, client4, vip4, 3434, 80, "A", nil, nil))
	check(t, "its next packet", ret, out, xdpTX, tcp4(t, client4, vip4, 3434, 80, "A", nil, backMACs[next]))
}
