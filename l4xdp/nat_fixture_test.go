package l4xdp

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/gopacket/layers"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// NAT fixtures through BPF_PROG_RUN: the real program, run as if the frame came in on an
// interface of a namespace of the test's own, so bpf_fib_lookup resolves next hops from
// that namespace's routes and PERMANENT neighbours (nat_helpers_test.go). Every expected
// frame is built by gopacket from the addresses, ports and MACs the translation must give,
// with lengths and checksums computed from scratch: an equal frame proves the program's
// incremental checksum updates, byte for byte.

const (
	xdpRedirectAction = 4
	// natPort is the only port of the single-port range most fixtures use: the port a flow
	// gets is then known without the program's hash.
	natPort = 40000
)

// singlePort is the NAT configuration of the byte-exact fixtures: one source per family,
// one port.
var singlePort = NAT{Sources: []netip.Addr{natLB4, natLB6}, PortLow: natPort, PortHigh: natPort}

// wantCounts fails unless each named path counter has the given packets (unnamed ones are
// not checked).
func wantCounts(t *testing.T, f *Tables, want map[string]uint64) {
	t.Helper()
	got := pathCounts(t, f)
	for name, n := range want {
		if !slices.Contains(pathNames[:], name) {
			t.Fatalf("no path counter %q (have %v)", name, pathNames)
		}
		if got[name] != n {
			t.Fatalf("path counter %s = %d, want %d (all: %v)", name, got[name], n, got)
		}
	}
}

// A TCP flow to a NAT backend: its SYN and data leave for the router with the NAT source
// and port, the backend's replies leave for the client from the VIP.
func TestNATFixtureIPv4TCP(t *testing.T) {
	r := newNATRig(t, Options{})
	r.install(singlePort)
	fl := natFlow(natTCP4, 33000, netip.AddrPortFrom(natLB4, natPort))
	data := []byte("an odd-length payload")
	r.handshake(t, "", fl, r.lb0, xdpTX)
	r.expect("data", r.lb0, fl.fromClient("PA", data).frame(t), xdpTX, fl.toBackend("PA", data).frame(t))
	r.expect("reply data", r.lb0, fl.fromBackend("PA", data[:8]).frame(t), xdpTX, fl.toClient("PA", data[:8]).frame(t))
	r.expect("fin", r.lb0, fl.fromClient("FA", nil).frame(t), xdpTX, fl.toBackend("FA", nil).frame(t))
	wantCounts(t, r.f, map[string]uint64{"conn_miss": 1, "conn_hit": 2, "nat_forward": 3, "nat_reply": 2, "nat_no_port": 0})

	// Traffic to the NAT source outside the NAT range is the host's: a port above the range,
	// ssh. Inside the range, what no NAT flow holds (the flow's port from another host or
	// port, or another protocol) is a stray reply: dropped, so the host answers no backend
	// with a RST.
	for name, in := range map[string][]byte{
		"reply to a port above the range": fl.pkt(lbMAC, routerMAC, fl.s.addr, netip.AddrPortFrom(natLB4, natPort+1), "A", nil).frame(t),
		"ssh to the host's source":        fl.pkt(lbMAC, clientMAC, fl.client, netip.AddrPortFrom(natLB4, 22), "S", nil).frame(t),
	} {
		r.expect(name, r.lb0, in, xdpPass, in)
	}
	for name, in := range map[string][]byte{
		"from another host":      fl.pkt(lbMAC, routerMAC, netip.MustParseAddrPort("10.1.0.99:8080"), fl.nat, "A", nil).frame(t),
		"from another port":      fl.pkt(lbMAC, routerMAC, netip.AddrPortFrom(fl.s.addr.Addr(), 8081), fl.nat, "A", nil).frame(t),
		"udp to the flow's port": natfxPkt{dstMAC: lbMAC, srcMAC: routerMAC, src: fl.s.addr.Addr(), dst: natLB4, sport: 8080, dport: natPort, proto: 17, payload: []byte("x")}.frame(t),
	} {
		if ret, _ := r.run(r.lb0, in); ret != xdpDrop {
			t.Errorf("%s: action %d, want drop (a stray reply)", name, ret)
		}
	}
	wantCounts(t, r.f, map[string]uint64{"nat_reply": 2, "pass": 2, "nat_stray": 3})
}

// UDP over IPv4: with a checksum, and with none (0), which must stay 0.
func TestNATFixtureIPv4UDP(t *testing.T) {
	r := newNATRig(t, Options{})
	r.install(singlePort)
	fl := natFlow(natUDP4, 5300, netip.AddrPortFrom(natLB4, natPort))
	q, a := []byte("query"), []byte("an answer, odd")
	r.expect("query", r.lb0, fl.fromClient("", q).frame(t), xdpTX, fl.toBackend("", q).frame(t))
	r.expect("answer", r.lb0, fl.fromBackend("", a).frame(t), xdpTX, fl.toClient("", a).frame(t))

	zero := natFlow(natUDP4Zero, 5301, netip.AddrPortFrom(natLB4, natPort))
	in, want := zero.fromClient("", q), zero.toBackend("", q)
	in.udpCsum0, want.udpCsum0 = true, true
	r.expect("query, no checksum", r.lb0, in.frame(t), xdpTX, want.frame(t))
	in, want = zero.fromBackend("", a), zero.toClient("", a)
	in.udpCsum0, want.udpCsum0 = true, true
	r.expect("answer, no checksum", r.lb0, in.frame(t), xdpTX, want.frame(t))
	wantCounts(t, r.f, map[string]uint64{"conn_miss": 2, "nat_forward": 2, "nat_reply": 2})
}

func TestNATFixtureIPv6(t *testing.T) {
	r := newNATRig(t, Options{})
	r.install(singlePort)
	fl := natFlow(natTCP6, 33000, netip.AddrPortFrom(natLB6, natPort))
	data := []byte("an odd-length payload")
	r.handshake(t, "", fl, r.lb0, xdpTX)
	r.expect("data", r.lb0, fl.fromClient("PA", data).frame(t), xdpTX, fl.toBackend("PA", data).frame(t))
	r.expect("reply data", r.lb0, fl.fromBackend("PA", data[:9]).frame(t), xdpTX, fl.toClient("PA", data[:9]).frame(t))

	u := natFlow(natUDP6, 5300, netip.AddrPortFrom(natLB6, natPort))
	r.expect("udp query", r.lb0, u.fromClient("", []byte("query")).frame(t), xdpTX, u.toBackend("", []byte("query")).frame(t))
	r.expect("udp answer", r.lb0, u.fromBackend("", []byte("answer!")).frame(t), xdpTX, u.toClient("", []byte("answer!")).frame(t))
	wantCounts(t, r.f, map[string]uint64{"conn_miss": 2, "conn_hit": 1, "nat_forward": 3, "nat_reply": 3})
}

// A backend whose next hop is on another interface than the client's: the forward is
// redirected there (the MACs are that interface's and its router's), and the reply, which
// comes in on that interface, is redirected back out of the client's.
func TestNATFixtureRedirect(t *testing.T) {
	r := newNATRig(t, Options{})
	r.install(singlePort)
	fl := natFlow(natTCPLB1, 33000, netip.AddrPortFrom(natLB4, natPort)).viaLB1()
	r.handshake(t, "", fl, r.lb1, xdpRedirectAction)
	wantCounts(t, r.f, map[string]uint64{"nat_forward": 1, "nat_reply": 1})
}

// A client with no neighbour entry: the reply goes back the way the flow came in, to the MAC
// its frames came from.
func TestNATFixtureReplyNoNeighbour(t *testing.T) {
	r := newNATRig(t, Options{})
	r.install(singlePort)
	fl := natFlow(natTCP4, 33000, netip.AddrPortFrom(natLB4, natPort))
	fl.client = netip.MustParseAddrPort("10.0.0.11:33000") // on lb0's link, not in its neighbour table
	fl.cmac = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xcd}
	r.handshake(t, "", fl, r.lb0, xdpTX)
	// The same when the reply comes in on another interface (the backend is behind lb1): it
	// is redirected to the one the flow came in on.
	fl1 := natFlow(natTCPLB1, 33000, netip.AddrPortFrom(natLB4, natPort)).viaLB1()
	fl1.client, fl1.cmac = fl.client, fl.cmac
	r.handshake(t, " via lb1", fl1, r.lb1, xdpRedirectAction)
	wantCounts(t, r.f, map[string]uint64{"nat_reply": 2, "nat_no_route": 0})
}

// A NAT backend whose next hop has no neighbour entry: dropped and counted as such (not as
// forwarded), never sent with a guessed MAC.
func TestNATFixtureNoRoute(t *testing.T) {
	r := newNATRig(t, Options{})
	r.install(singlePort)
	fl := natFlow(natNoNeigh, 33000, netip.AddrPortFrom(natLB4, natPort))
	ret, _ := r.run(r.lb0, fl.fromClient("S", nil).frame(t))
	if ret != xdpDrop {
		t.Fatalf("syn to a backend with no resolved next hop: action %d, want drop", ret)
	}
	wantCounts(t, r.f, map[string]uint64{"nat_no_route": 1, "nat_forward": 0, "forward": 0})
	// A reply to a client the FIB has no route to (no default route here; the neighbour
	// fallback is for a known route only): dropped and counted, not counted as a reply.
	far := natFlow(natTCP4b, 33000, netip.AddrPortFrom(natLB4, natPort))
	far.client = netip.MustParseAddrPort("192.0.2.10:33000")
	r.expect("syn from a client with no route back", r.lb0, far.fromClient("S", nil).frame(t), xdpTX, far.toBackend("S", nil).frame(t))
	if ret, _ := r.run(r.lb0, far.fromBackend("SA", nil).frame(t)); ret != xdpDrop {
		t.Fatalf("reply to a client with no route: action %d, want drop", ret)
	}
	wantCounts(t, r.f, map[string]uint64{"nat_no_route": 2, "nat_forward": 1, "nat_reply": 0})
}

// Fragments of a VIP whose backend is NAT: dropped and counted (a later fragment carries no
// ports to translate).
func TestNATFixtureFragment(t *testing.T) {
	r := newNATRig(t, Options{})
	r.install(singlePort)
	fl := natFlow(natTCP4, 33000, netip.AddrPortFrom(natLB4, natPort))
	in := fl.fromClient("A", []byte("fragment")).frame(t)
	in[14+6] = 0x20 // more fragments (and no DF)
	binary.BigEndian.PutUint16(in[14+10:], 0)
	binary.BigEndian.PutUint16(in[14+10:], ipv4Checksum(in[14:34]))
	ret, _ := r.run(r.lb0, in)
	if ret != xdpDrop {
		t.Fatalf("fragment of a NAT VIP: action %d, want drop", ret)
	}
	wantCounts(t, r.f, map[string]uint64{"nat_fragment": 1, "nat_forward": 0})
}

// ipv4Checksum is the IPv4 header checksum of h (its checksum field zeroed).
func ipv4Checksum(h []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// ICMP errors from the backends' side about NAT flows (quoting what the LB sent the
// backend, NAT source -> backend) reach the client as errors from the VIP quoting what the
// client sent: outer and quoted addresses and ports, the quoted IP and transport checksums
// (when quoted) and the ICMP checksum all translated.
func TestNATFixtureICMPErrorFromBackend(t *testing.T) {
	r := newNATRig(t, Options{})
	r.install(singlePort)
	tcp := natFlow(natTCP4, 33000, netip.AddrPortFrom(natLB4, natPort))
	udp := natFlow(natUDP4, 5300, netip.AddrPortFrom(natLB4, natPort))
	tcp6 := natFlow(natTCP6, 33001, netip.AddrPortFrom(natLB6, natPort))
	zero := natFlow(natUDP4Zero, 5301, netip.AddrPortFrom(natLB4, natPort))
	data := []byte("a datagram too big")
	for _, fl := range []natfxFlow{tcp, udp, tcp6} {
		flags := "S"
		if fl.s.proto == 17 {
			flags = ""
		}
		r.expect("flow", r.lb0, fl.fromClient(flags, data).frame(t), xdpTX, fl.toBackend(flags, data).frame(t))
	}
	var none [4]byte
	mtu := [4]byte{0, 0, 0x05, 0x78} // 1400

	// Port unreachable from the backend itself, quoting the whole datagram (as Linux does).
	r.expect("udp port unreachable", r.lb0,
		icmpErr(t, lbMAC, routerMAC, udp.s.addr.Addr(), natLB4, 3, 3, none, udp.toBackend("", data).l3(t)),
		xdpTX,
		icmpErr(t, clientMAC, lbMAC, natVIP4, natClient4, 3, 3, none, udp.fromClient("", data).l3(t)))
	// Fragmentation needed from a router between the LB and the backend, quoting the IP
	// header and 8 bytes (no TCP checksum quoted).
	r.expect("tcp frag needed", r.lb0,
		icmpErr(t, lbMAC, routerMAC, natRemote4, natLB4, 3, 4, mtu, truncQuote(tcp.toBackend("S", data).l3(t))),
		xdpTX,
		icmpErr(t, clientMAC, lbMAC, natVIP4, natClient4, 3, 4, mtu, truncQuote(tcp.fromClient("S", data).l3(t))))
	// The same quoting the whole segment: the quoted TCP checksum is translated too.
	r.expect("tcp frag needed, whole segment quoted", r.lb0,
		icmpErr(t, lbMAC, routerMAC, natRemote4, natLB4, 3, 4, mtu, tcp.toBackend("S", data).l3(t)),
		xdpTX,
		icmpErr(t, clientMAC, lbMAC, natVIP4, natClient4, 3, 4, mtu, tcp.fromClient("S", data).l3(t)))
	// IPv6 packet too big from a router, quoting the whole segment.
	r.expect("icmpv6 packet too big", r.lb0,
		icmpErr(t, lbMAC, routerMAC, natRemote6, natLB6, 2, 0, mtu, tcp6.toBackend("S", data).l3(t)),
		xdpTX,
		icmpErr(t, clientMAC, lbMAC, natVIP6, natClient6, 2, 0, mtu, tcp6.fromClient("S", data).l3(t)))
	// Port unreachable quoting a datagram with no UDP checksum: the quoted 0 stays 0.
	zin, zout := zero.fromClient("", data), zero.toBackend("", data)
	zin.udpCsum0, zout.udpCsum0 = true, true
	r.expect("flow with no udp checksum", r.lb0, zin.frame(t), xdpTX, zout.frame(t))
	r.expect("udp port unreachable, no udp checksum", r.lb0,
		icmpErr(t, lbMAC, routerMAC, zero.s.addr.Addr(), natLB4, 3, 3, none, zout.l3(t)),
		xdpTX,
		icmpErr(t, clientMAC, lbMAC, natVIP4, natClient4, 3, 3, none, zin.l3(t)))
	wantCounts(t, r.f, map[string]uint64{"icmp_error": 5, "nat_forward": 4})

	// An error about no NAT flow (another port of the NAT source) is the host's.
	other := tcp.toBackend("S", data)
	other.sport = natPort + 1
	in := icmpErr(t, lbMAC, routerMAC, natRemote4, natLB4, 3, 4, mtu, truncQuote(other.l3(t)))
	r.expect("error about no NAT flow", r.lb0, in, xdpPass, in)
	wantCounts(t, r.f, map[string]uint64{"icmp_error": 5})
}

// An ICMP error from the client's side about a NAT flow (quoting the reply the LB sent, VIP
// -> client) reaches the backend as an error about what the backend sent (backend -> NAT
// source), from the NAT source.
func TestNATFixtureICMPErrorFromClient(t *testing.T) {
	r := newNATRig(t, Options{})
	r.install(singlePort)
	fl := natFlow(natTCP4, 33000, netip.AddrPortFrom(natLB4, natPort))
	r.expect("syn", r.lb0, fl.fromClient("S", nil).frame(t), xdpTX, fl.toBackend("S", nil).frame(t))
	data := []byte("a reply too big for the client's path")
	mtu := [4]byte{0, 0, 0x05, 0x00}
	clientRouter := netip.MustParseAddr("10.0.0.253")
	r.expect("frag needed from the client's side", r.lb0,
		icmpErr(t, lbMAC, clientMAC, clientRouter, natVIP4, 3, 4, mtu, fl.toClient("PA", data).l3(t)),
		xdpTX,
		icmpErr(t, routerMAC, lbMAC, natLB4, fl.s.addr.Addr(), 3, 4, mtu, fl.fromBackend("PA", data).l3(t)))
	// IPv6: packet too big, quoting the IP header and 8 bytes of the reply.
	fl6 := natFlow(natTCP6, 33000, netip.AddrPortFrom(natLB6, natPort))
	r.expect("syn6", r.lb0, fl6.fromClient("S", nil).frame(t), xdpTX, fl6.toBackend("S", nil).frame(t))
	clientRouter6 := netip.MustParseAddr("fd00::fd")
	r.expect("packet too big from the client's side", r.lb0,
		icmpErr(t, lbMAC, clientMAC, clientRouter6, natVIP6, 2, 0, mtu, truncQuote(fl6.toClient("PA", data).l3(t))),
		xdpTX,
		icmpErr(t, routerMAC, lbMAC, natLB6, fl6.s.addr.Addr(), 2, 0, mtu, truncQuote(fl6.fromBackend("PA", data).l3(t))))
	wantCounts(t, r.f, map[string]uint64{"icmp_error": 2, "nat_forward": 4})
}

// Port exhaustion: ports are allocated per (NAT source, backend, protocol). With a range of
// two ports, two flows to one backend take both, a third is dropped and counted (never sent
// unremembered, nor from a port another flow holds), while a flow to another backend, or of
// another protocol to the same backend, still gets a port.
func TestNATFixturePortExhaustion(t *testing.T) {
	r := newNATRig(t, Options{})
	r.install(NAT{Sources: []netip.Addr{natLB4}, PortLow: natPort, PortHigh: natPort + 1})
	inRange := func(p uint16) bool { return p == natPort || p == natPort+1 }
	var flows []natfxFlow
	for _, cport := range []uint16{33000, 33001} {
		fl := natFlow(natTCP4, cport, netip.AddrPort{})
		ret, out := r.run(r.lb0, fl.fromClient("S", nil).frame(t))
		src, port := l4Source(t, out)
		if ret != xdpTX || src != natLB4 || !inRange(port) {
			t.Fatalf("flow from %d: action %d, source %s:%d", cport, ret, src, port)
		}
		fl.nat = netip.AddrPortFrom(src, port)
		if d := byteDiff(out, fl.toBackend("S", nil).frame(t)); d != "" {
			t.Fatalf("flow from %d:\n%s", cport, d)
		}
		flows = append(flows, fl)
	}
	if flows[0].nat == flows[1].nat {
		t.Fatalf("two flows to one backend share %s", flows[0].nat)
	}
	third := natFlow(natTCP4, 33002, netip.AddrPort{})
	for i := range 2 { // and its retransmission
		if ret, out := r.run(r.lb0, third.fromClient("S", nil).frame(t)); ret != xdpDrop {
			t.Fatalf("third flow, try %d: action %d (output %x), want drop", i, ret, out)
		}
	}
	wantCounts(t, r.f, map[string]uint64{"nat_no_port": 2, "nat_forward": 2})
	var k lbFlow
	k.Src, k.Dst, k.Proto = natClient4.As16(), natVIP4.As16(), 6
	binary.BigEndian.PutUint16((*[2]byte)(unsafeSlice(&k.Sport))[:], 33002)
	binary.BigEndian.PutUint16((*[2]byte)(unsafeSlice(&k.Dport))[:], 80)
	var c lbConn
	if err := r.f.objs.Conns.Lookup(&k, &c); err == nil {
		t.Fatalf("the dropped flow has a connection entry: %+v", c)
	}
	// The two flows hold: their packets and replies keep their own ports.
	for _, fl := range flows {
		r.expect(fmt.Sprintf("data of %s", fl.client), r.lb0, fl.fromClient("A", []byte("x")).frame(t), xdpTX, fl.toBackend("A", []byte("x")).frame(t))
		r.expect(fmt.Sprintf("reply to %s", fl.client), r.lb0, fl.fromBackend("A", []byte("y")).frame(t), xdpTX, fl.toClient("A", []byte("y")).frame(t))
	}
	// Another backend, and another protocol to the same backend address and port.
	for _, s := range []natfxSlot{natTCP4b, natUDP4Same} {
		fl := natFlow(s, 33002, netip.AddrPort{})
		flags := "S"
		if s.proto == 17 {
			flags = ""
		}
		ret, out := r.run(r.lb0, fl.fromClient(flags, []byte("z")).frame(t))
		src, port := l4Source(t, out)
		if ret != xdpTX || src != natLB4 || !inRange(port) {
			t.Fatalf("flow to %s/%d: action %d, source %s:%d", s.addr, s.proto, ret, src, port)
		}
		fl.nat = netip.AddrPortFrom(src, port)
		if d := byteDiff(out, fl.toBackend(flags, []byte("z")).frame(t)); d != "" {
			t.Fatalf("flow to %s/%d:\n%s", s.addr, s.proto, d)
		}
	}
	wantCounts(t, r.f, map[string]uint64{"nat_no_port": 2, "nat_forward": 6, "nat_reply": 2})
}

// Two NAT sources of a family: new flows spread over both (source by the flow's hash), every
// (source, port) distinct, each in the range, and each reply back to its own client; an
// IPv6 flow takes the IPv6 source.
func TestNATFixtureSourcesSpread(t *testing.T) {
	r := newNATRig(t, Options{})
	const lo, hi = 61000, 61031 // 32 ports a source: no flow of 16 can find its source full
	r.install(NAT{Sources: []netip.Addr{natLB4, natLB6, natLB4b}, PortLow: lo, PortHigh: hi})
	seen := map[netip.AddrPort]netip.AddrPort{}
	perSource := map[netip.Addr]int{}
	var flows []natfxFlow
	for cport := uint16(34000); cport < 34016; cport++ {
		fl := natFlow(natTCP4, cport, netip.AddrPort{})
		ret, out := r.run(r.lb0, fl.fromClient("S", nil).frame(t))
		src, port := l4Source(t, out)
		if ret != xdpTX || (src != natLB4 && src != natLB4b) || port < lo || port > hi {
			t.Fatalf("flow from %d: action %d, source %s:%d", cport, ret, src, port)
		}
		fl.nat = netip.AddrPortFrom(src, port)
		if prev, dup := seen[fl.nat]; dup {
			t.Fatalf("flows from %s and %s share %s", prev, fl.client, fl.nat)
		}
		seen[fl.nat] = fl.client
		perSource[src]++
		if d := byteDiff(out, fl.toBackend("S", nil).frame(t)); d != "" {
			t.Fatalf("flow from %d:\n%s", cport, d)
		}
		flows = append(flows, fl)
	}
	// 16 flows by a hash: all on one source has probability 2^-15.
	if perSource[natLB4] == 0 || perSource[natLB4b] == 0 {
		t.Fatalf("16 flows over 2 sources: %v", perSource)
	}
	for _, fl := range flows {
		r.expect(fmt.Sprintf("reply to %s", fl.client), r.lb0, fl.fromBackend("SA", nil).frame(t), xdpTX, fl.toClient("SA", nil).frame(t))
	}
	fl := natFlow(natTCP6, 34000, netip.AddrPort{})
	ret, out := r.run(r.lb0, fl.fromClient("S", nil).frame(t))
	if src, port := l4Source(t, out); ret != xdpTX || src != natLB6 || port < lo || port > hi {
		t.Fatalf("IPv6 flow: action %d, source %s:%d", ret, src, port)
	}
	wantCounts(t, r.f, map[string]uint64{"nat_forward": 17, "nat_reply": 16, "nat_no_port": 0})
}

// A retransmitted SYN follows its flow (same port). A RST from the client does not free the
// port at once (a forged RST, which the backend ignores, must not hand a live flow's port to
// another flow): the backend's answer still reaches the client, a second flow still finds no
// port, and the same client's new SYN on the same 5-tuple gets its port back.
func TestNATFixtureRSTHoldsPort(t *testing.T) {
	r := newNATRig(t, Options{})
	r.install(singlePort)
	a := natFlow(natTCP4, 33000, netip.AddrPortFrom(natLB4, natPort))
	r.expect("syn", r.lb0, a.fromClient("S", nil).frame(t), xdpTX, a.toBackend("S", nil).frame(t))
	r.expect("retransmitted syn", r.lb0, a.fromClient("S", nil).frame(t), xdpTX, a.toBackend("S", nil).frame(t))
	b := natFlow(natTCP4, 33001, netip.AddrPortFrom(natLB4, natPort))
	if ret, _ := r.run(r.lb0, b.fromClient("S", nil).frame(t)); ret != xdpDrop {
		t.Fatalf("second flow while the only port is held: action %d, want drop", ret)
	}
	r.expect("rst", r.lb0, a.fromClient("RA", nil).frame(t), xdpTX, a.toBackend("RA", nil).frame(t))
	r.expect("the backend's challenge ack", r.lb0, a.fromBackend("A", nil).frame(t), xdpTX, a.toClient("A", nil).frame(t))
	if ret, _ := r.run(r.lb0, b.fromClient("S", nil).frame(t)); ret != xdpDrop {
		t.Fatalf("second flow right after the first one's RST: action %d, want drop (the port is held %d s)", ret, 10)
	}
	r.expect("the client's new syn", r.lb0, a.fromClient("S", nil).frame(t), xdpTX, a.toBackend("S", nil).frame(t))
	wantCounts(t, r.f, map[string]uint64{"conn_hit": 2, "conn_miss": 4, "nat_no_port": 2, "tcp_rst": 1, "nat_forward": 4, "nat_reply": 1})
}

// A port whose flow has been idle past the VIP's idle timeout is taken over by a new flow;
// the old flow's next packet is then no longer its own: dropped (no port left), never sent
// from the port the new flow holds.
func TestNATFixtureIdlePortReclaimed(t *testing.T) {
	r := newNATRig(t, Options{})
	r.install(singlePort)
	const idle = time.Second
	table := []uint32{natTCP4b.slot, natTCP4b.slot, natTCP4b.slot}
	if err := r.f.SetVIP(VIP{ID: natTCP4b.vipID, Addr: natTCP4b.vip, Proto: 6, IdleTimeout: idle, Table: table}); err != nil {
		t.Fatal(err)
	}
	a := natFlow(natTCP4b, 33000, netip.AddrPortFrom(natLB4, natPort))
	r.expect("syn", r.lb0, a.fromClient("S", nil).frame(t), xdpTX, a.toBackend("S", nil).frame(t))
	b := natFlow(natTCP4b, 33001, netip.AddrPortFrom(natLB4, natPort))
	// Until a's entry has been idle past the timeout, b finds no port; the program's clock
	// is coarse (a few ms): 2 s of slack over the timeout.
	var ret uint32
	var out []byte
	testwait.Until(t, idle+2*time.Second, 100*time.Millisecond, "the idle flow's port taken over", func() (bool, string) {
		ret, out = r.run(r.lb0, b.fromClient("S", nil).frame(t))
		return ret != xdpDrop, fmt.Sprintf("action %d", ret)
	})
	if ret != xdpTX {
		t.Fatalf("new flow after the timeout: action %d", ret)
	}
	if d := byteDiff(out, b.toBackend("S", nil).frame(t)); d != "" {
		t.Fatalf("new flow after the timeout:\n%s", d)
	}
	r.expect("the new flow's reply", r.lb0, b.fromBackend("SA", nil).frame(t), xdpTX, b.toClient("SA", nil).frame(t))
	if ret, out := r.run(r.lb0, a.fromClient("A", []byte("late")).frame(t)); ret != xdpDrop {
		t.Fatalf("the idle flow's late packet: action %d, output %x; want drop (its port is the new flow's)", ret, out)
	}
	r.expect("the new flow's data", r.lb0, b.fromClient("A", []byte("x")).frame(t), xdpTX, b.toBackend("A", []byte("x")).frame(t))
}

// Translations whose TCP/UDP checksum needs care: IPv4 options (the ports are past them),
// and a UDP checksum that comes out 0, which must leave as 0xffff (0 means none).
func TestNATFixtureChecksumEdges(t *testing.T) {
	r := newNATRig(t, Options{})
	r.install(singlePort)
	fl := natFlow(natTCP4, 33000, netip.AddrPortFrom(natLB4, natPort))
	opts := []layers.IPv4Option{{OptionType: 7, OptionLength: 7, OptionData: []byte{4, 0, 0, 0, 0}}, {OptionType: 0, OptionLength: 1}} // record route + end
	in, want := fl.fromClient("S", nil), fl.toBackend("S", nil)
	in.opts, want.opts = opts, opts
	r.expect("syn with IP options", r.lb0, in.frame(t), xdpTX, want.frame(t))
	in, want = fl.fromBackend("SA", nil), fl.toClient("SA", nil)
	in.opts, want.opts = opts, opts
	r.expect("reply with IP options", r.lb0, in.frame(t), xdpTX, want.frame(t))

	// A 2-byte payload for which the translated datagram's checksum computes to 0.
	for _, c := range []struct {
		name string
		s    natfxSlot
		nat  netip.AddrPort
	}{{"udp4", natUDP4, netip.AddrPortFrom(natLB4, natPort)}, {"udp6", natUDP6, netip.AddrPortFrom(natLB6, natPort)}} {
		u := natFlow(c.s, 5300, c.nat)
		csumAt := 14 + 20 + 6 // frames are padded to 60 bytes: count from the front
		if c.s.vip.Addr().Is6() {
			csumAt = 14 + 40 + 6
		}
		var payload []byte
		for x := 0; x < 1<<16 && payload == nil; x++ {
			p := []byte{byte(x >> 8), byte(x)}
			if f := u.toBackend("", p).frame(t); f[csumAt] == 0xff && f[csumAt+1] == 0xff {
				payload = p
			}
		}
		if payload == nil {
			t.Fatalf("%s: no payload gives a checksum of 0", c.name)
		}
		r.expect(c.name+" datagram whose checksum computes to 0", r.lb0, u.fromClient("", payload).frame(t), xdpTX, u.toBackend("", payload).frame(t))
	}
}

// More concurrent flows to one backend than a new flow may probe ports (32): each finds a
// port, since probing starts at a hashed point of the range, not at its low end.
func TestNATFixtureManyFlowsOneBackend(t *testing.T) {
	r := newNATRig(t, Options{})
	const lo, hi, flows = 61000, 61255, 48 // 256 ports: a run of 32 taken ones is far off
	r.install(NAT{Sources: []netip.Addr{natLB4}, PortLow: lo, PortHigh: hi})
	ports := map[uint16]bool{}
	for cport := uint16(35000); cport < 35000+flows; cport++ {
		fl := natFlow(natTCP4, cport, netip.AddrPort{})
		ret, out := r.run(r.lb0, fl.fromClient("S", nil).frame(t))
		if ret != xdpTX {
			t.Fatalf("flow %d of %d: action %d (ports so far %d)", cport-35000+1, flows, ret, len(ports))
		}
		src, port := l4Source(t, out)
		if src != natLB4 || port < lo || port > hi || ports[port] {
			t.Fatalf("flow from %d: source %s:%d (taken before: %v)", cport, src, port, ports[port])
		}
		ports[port] = true
	}
	wantCounts(t, r.f, map[string]uint64{"nat_forward": flows, "nat_no_port": 0})
}

// A NAT flow whose connection entry is evicted (the table is an LRU: a flood of new flows
// evicts entries, with no callback) keeps its translation while its reply entry lives: its
// next packet must leave from the same port, or the backend sees a segment of no connection
// of its own and resets the client's.
func TestNATFixtureFlowOutlivesConnEviction(t *testing.T) {
	r := newNATRig(t, Options{})
	r.install(NAT{Sources: []netip.Addr{natLB4}, PortLow: 61000, PortHigh: 61255})
	fl := natFlow(natTCP4, 33000, netip.AddrPort{})
	ret, out := r.run(r.lb0, fl.fromClient("S", nil).frame(t))
	if ret != xdpTX {
		t.Fatalf("syn: action %d", ret)
	}
	fl.nat = netip.AddrPortFrom(l4Source(t, out))
	var k lbFlow
	k.Src, k.Dst, k.Proto = natClient4.As16(), natVIP4.As16(), 6
	binary.BigEndian.PutUint16((*[2]byte)(unsafeSlice(&k.Sport))[:], fl.client.Port())
	binary.BigEndian.PutUint16((*[2]byte)(unsafeSlice(&k.Dport))[:], fl.s.vip.Port())
	if err := r.f.objs.Conns.Delete(&k); err != nil {
		t.Fatalf("evicting the flow's connection entry: %v", err)
	}
	r.expect("reply after the eviction", r.lb0, fl.fromBackend("SA", nil).frame(t), xdpTX, fl.toClient("SA", nil).frame(t))
	r.expect("next packet after the eviction", r.lb0, fl.fromClient("A", []byte("x")).frame(t), xdpTX, fl.toBackend("A", []byte("x")).frame(t))
}

// A flow the backend never answered holds its port NAT_UNREPLIED (30 s) idle, not the VIP's
// idle timeout (900 s here): a SYN flood cannot hold a backend's ports for a quarter of an
// hour. Once the backend has answered, the flow idles as the VIP allows. (The clock is moved
// by aging every entry: both tables, as a second of real idling would.)
func TestNATFixtureUnrepliedTimeout(t *testing.T) {
	r := newNATRig(t, Options{})
	r.install(singlePort)
	age := func(d time.Duration) {
		t.Helper()
		var nk lbNatKey
		var ne lbNatEntry
		for it := r.f.objs.NatRev.Iterate(); it.Next(&nk, &ne); {
			ne.LastSeen -= uint64(d)
			if err := r.f.objs.NatRev.Put(nk, ne); err != nil {
				t.Fatal(err)
			}
		}
		var ck lbFlow
		var cv lbConn
		for it := r.f.objs.Conns.Iterate(); it.Next(&ck, &cv); {
			cv.LastSeen -= uint64(d)
			if err := r.f.objs.Conns.Put(ck, cv); err != nil {
				t.Fatal(err)
			}
		}
	}
	a := natFlow(natTCP4, 33000, netip.AddrPortFrom(natLB4, natPort))
	r.expect("syn, never answered", r.lb0, a.fromClient("S", nil).frame(t), xdpTX, a.toBackend("S", nil).frame(t))
	age(31 * time.Second)
	b := natFlow(natTCP4, 33001, netip.AddrPortFrom(natLB4, natPort))
	r.handshake(t, " of a flow that takes the unreplied one's port", b, r.lb0, xdpTX)
	if ret, _ := r.run(r.lb0, a.fromClient("S", nil).frame(t)); ret != xdpDrop {
		t.Fatalf("the unreplied flow again, its port taken: action %d, want drop", ret)
	}
	age(31 * time.Second)
	c := natFlow(natTCP4, 33002, netip.AddrPortFrom(natLB4, natPort))
	if ret, _ := r.run(r.lb0, c.fromClient("S", nil).frame(t)); ret != xdpDrop {
		t.Fatalf("a flow after 31 s idle of an answered one: action %d, want drop (the port is held 900 s)", ret)
	}
	wantCounts(t, r.f, map[string]uint64{"nat_no_port": 2, "nat_reply": 1})
}
