package l4xdp

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
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

// rewriteEntries puts every entry of m back as fn changes it.
func rewriteEntries[K, V any](t *testing.T, m *ebpf.Map, fn func(K, *V)) {
	t.Helper()
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		fn(k, &v)
		if err := m.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
}

// ageBy is a setup step that moves the program's clock d ahead for every flow: it ages every
// entry of both tables, as d of real idling would.
func ageBy(d time.Duration) func(t *testing.T, r *packetRig) {
	return func(t *testing.T, r *packetRig) {
		t.Helper()
		rewriteEntries(t, r.f.objs.NatRev, func(_ lbNatKey, e *lbNatEntry) { e.LastSeen -= uint64(d) })
		rewriteEntries(t, r.f.objs.Conns, func(_ lbFlow, c *lbConn) { c.LastSeen -= uint64(d) })
	}
}

// natRig is a NAT fixtures' rig: newNATRig's namespace and forwarder, with the fixtures'
// backends and VIPs installed under NAT configuration cfg.
func natRig(cfg NAT) func(t *testing.T) *packetRig {
	return func(t *testing.T) *packetRig {
		r := newNATRig(t, Options{})
		r.install(cfg)
		return &packetRig{f: r.f, nat: r}
	}
}

// natHandshake is fl's SYN in on lb0 and the backend's SYN-ACK in on back, each expecting act
// and the frame translated by the rules the flow names.
func natHandshake(t testing.TB, label string, fl natfxFlow, back string, act uint32) []packetCase {
	return []packetCase{
		{name: "syn" + label, via: "lb0", in: fl.fromClient("S", nil).frame(t), verdict: act, out: fl.toBackend("S", nil).frame(t)},
		{name: "syn-ack" + label, via: back, in: fl.fromBackend("SA", nil).frame(t), verdict: act, out: fl.toClient("SA", nil).frame(t)},
	}
}

// natFixtures are the NAT fixtures whose every frame is known before the program runs (a
// single-port range, or a flow's port given): the rest, whose expected frames depend on the
// port the program hashed to, are tests of their own below.
func natFixtures(t *testing.T) []packetScenario {
	// in0 is a frame arriving on lb0 that leaves as out; in0Pass passes; in0Drop is dropped.
	in0 := func(name string, in, out natfxPkt) packetCase { return on("lb0", tx(name, in.frame(t), out.frame(t))) }
	in0Pass := func(name string, in []byte) packetCase { return on("lb0", passes(name, in)) }
	in0Drop := func(name string, in []byte) packetCase { return on("lb0", drops(name, in)) }
	icmp0 := func(name string, in, out []byte) packetCase { return on("lb0", tx(name, in, out)) }
	flags := func(fl natfxFlow) string {
		if fl.s.proto == 17 {
			return ""
		}
		return "S"
	}

	// A TCP flow to a NAT backend: its SYN and data leave for the router with the NAT source
	// and port, the backend's replies leave for the client from the VIP.
	tcp4 := natFlow(natTCP4, 33000, netip.AddrPortFrom(natLB4, natPort))
	data := []byte("an odd-length payload")

	// UDP over IPv4: with a checksum, and with none (0), which must stay 0.
	udp4 := natFlow(natUDP4, 5300, netip.AddrPortFrom(natLB4, natPort))
	q, a := []byte("query"), []byte("an answer, odd")
	zero := natFlow(natUDP4Zero, 5301, netip.AddrPortFrom(natLB4, natPort))
	noCsum := func(p natfxPkt) natfxPkt { p.udpCsum0 = true; return p }

	tcp6 := natFlow(natTCP6, 33000, netip.AddrPortFrom(natLB6, natPort))
	udp6 := natFlow(natUDP6, 5300, netip.AddrPortFrom(natLB6, natPort))
	viaLB1 := natFlow(natTCPLB1, 33000, netip.AddrPortFrom(natLB4, natPort)).viaLB1()

	// A client with no neighbour entry: on lb0's link, not in its neighbour table.
	noNeigh := tcp4
	noNeigh.client = netip.MustParseAddrPort("10.0.0.11:33000")
	noNeigh.cmac = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xcd}
	noNeigh1 := viaLB1
	noNeigh1.client, noNeigh1.cmac = noNeigh.client, noNeigh.cmac

	// A client the FIB has no route to (no default route here; the neighbour fallback is for
	// a known route only).
	far := natFlow(natTCP4b, 33000, netip.AddrPortFrom(natLB4, natPort))
	far.client = netip.MustParseAddrPort("192.0.2.10:33000")
	noNeighBackend := natFlow(natNoNeigh, 33000, netip.AddrPortFrom(natLB4, natPort))

	fragment := tcp4.fromClient("A", []byte("fragment")).frame(t)
	fragment[14+6] = 0x20 // more fragments (and no DF)
	binary.BigEndian.PutUint16(fragment[14+10:], 0)
	binary.BigEndian.PutUint16(fragment[14+10:], ipv4Checksum(fragment[14:34]))

	// ICMP errors from the backends' side: the flows, and what they quote.
	eTCP := natFlow(natTCP4, 33000, netip.AddrPortFrom(natLB4, natPort))
	eUDP := natFlow(natUDP4, 5300, netip.AddrPortFrom(natLB4, natPort))
	eTCP6 := natFlow(natTCP6, 33001, netip.AddrPortFrom(natLB6, natPort))
	eZero := natFlow(natUDP4Zero, 5301, netip.AddrPortFrom(natLB4, natPort))
	tooBig := []byte("a datagram too big")
	var none [4]byte
	mtu1400 := [4]byte{0, 0, 0x05, 0x78}
	zin, zout := noCsum(eZero.fromClient("", tooBig)), noCsum(eZero.toBackend("", tooBig))
	noFlow := eTCP.toBackend("S", tooBig)
	noFlow.sport = natPort + 1
	noFlowErr := icmpErr(t, lbMAC, routerMAC, natRemote4, natLB4, 3, 4, mtu1400, truncQuote(noFlow.l3(t)))

	// ICMP errors from the client's side.
	big := []byte("a reply too big for the client's path")
	mtu1280 := [4]byte{0, 0, 0x05, 0x00}
	clientRouter, clientRouter6 := netip.MustParseAddr("10.0.0.253"), netip.MustParseAddr("fd00::fd")

	// A retransmitted SYN, a RST that holds the port.
	rstA := newNATConv(t, natFlow(natTCP4, 33000, netip.AddrPortFrom(natLB4, natPort)))
	rstB := natFlow(natTCP4, 33001, netip.AddrPortFrom(natLB4, natPort))

	// Checksums that need care: IPv4 options (the ports are past them), and a UDP checksum
	// that comes out 0, which must leave as 0xffff (0 means none).
	ipOpts := []layers.IPv4Option{{OptionType: 7, OptionLength: 7, OptionData: []byte{4, 0, 0, 0, 0}}, {OptionType: 0, OptionLength: 1}} // record route + end
	withOpts := func(p natfxPkt) natfxPkt { p.opts = ipOpts; return p }
	var csumZero []packetCase
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
		for x := 0; x < 1<<16 && payload == nil; x++ { // a 2-byte payload whose translated checksum computes to 0
			p := []byte{byte(x >> 8), byte(x)}
			if f := u.toBackend("", p).frame(t); f[csumAt] == 0xff && f[csumAt+1] == 0xff {
				payload = p
			}
		}
		if payload == nil {
			t.Fatalf("%s: no payload gives a checksum of 0", c.name)
		}
		csumZero = append(csumZero, in0(c.name+" datagram whose checksum computes to 0", u.fromClient("", payload), u.toBackend("", payload)))
	}

	// A flow the backend never answered holds its port NAT_UNREPLIED (30 s) idle, not the
	// VIP's idle timeout (900 s here).
	age := ageBy
	unA := natFlow(natTCP4, 33000, netip.AddrPortFrom(natLB4, natPort))
	unB := newNATConv(t, natFlow(natTCP4, 33001, netip.AddrPortFrom(natLB4, natPort)))
	unC := natFlow(natTCP4, 33002, netip.AddrPortFrom(natLB4, natPort))

	return []packetScenario{
		{name: "nat ipv4 tcp", rig: natRig(singlePort), cases: cat(
			natHandshake(t, "", tcp4, "lb0", xdpTX),
			[]packetCase{
				in0("data", tcp4.fromClient("PA", data), tcp4.toBackend("PA", data)),
				in0("reply data", tcp4.fromBackend("PA", data[:8]), tcp4.toClient("PA", data[:8])),
				in0("fin", tcp4.fromClient("FA", nil), tcp4.toBackend("FA", nil)),
				counts(map[string]uint64{"conn_miss": 1, "conn_hit": 2, "nat_forward": 3, "nat_reply": 2, "nat_no_port": 0}),
				// Traffic to the NAT source outside the NAT range is the host's: a port above
				// the range, ssh.
				in0Pass("reply to a port above the range", tcp4.pkt(lbMAC, routerMAC, tcp4.s.addr, netip.AddrPortFrom(natLB4, natPort+1), "A", nil).frame(t)),
				in0Pass("ssh to the host's source", tcp4.pkt(lbMAC, clientMAC, tcp4.client, netip.AddrPortFrom(natLB4, 22), "S", nil).frame(t)),
				// Inside the range, what no NAT flow holds (the flow's port from another host
				// or port, or another protocol) is a stray reply: dropped, so the host answers
				// no backend with a RST.
				in0Drop("stray reply from another host", tcp4.pkt(lbMAC, routerMAC, netip.MustParseAddrPort("10.1.0.99:8080"), tcp4.nat, "A", nil).frame(t)),
				in0Drop("stray reply from another port", tcp4.pkt(lbMAC, routerMAC, netip.AddrPortFrom(tcp4.s.addr.Addr(), 8081), tcp4.nat, "A", nil).frame(t)),
				in0Drop("stray udp to the flow's port", natfxPkt{dstMAC: lbMAC, srcMAC: routerMAC, src: tcp4.s.addr.Addr(), dst: natLB4, sport: 8080, dport: natPort, proto: 17, payload: []byte("x")}.frame(t)),
				counts(map[string]uint64{"nat_reply": 2, "pass": 2, "nat_stray": 3}),
			})},
		{name: "nat ipv4 udp", rig: natRig(singlePort), cases: []packetCase{
			in0("query", udp4.fromClient("", q), udp4.toBackend("", q)),
			in0("answer", udp4.fromBackend("", a), udp4.toClient("", a)),
			in0("query, no checksum", noCsum(zero.fromClient("", q)), noCsum(zero.toBackend("", q))),
			in0("answer, no checksum", noCsum(zero.fromBackend("", a)), noCsum(zero.toClient("", a))),
			counts(map[string]uint64{"conn_miss": 2, "nat_forward": 2, "nat_reply": 2}),
		}},
		{name: "nat ipv6", rig: natRig(singlePort), cases: cat(
			natHandshake(t, "", tcp6, "lb0", xdpTX),
			[]packetCase{
				in0("data", tcp6.fromClient("PA", data), tcp6.toBackend("PA", data)),
				in0("reply data", tcp6.fromBackend("PA", data[:9]), tcp6.toClient("PA", data[:9])),
				in0("udp query", udp6.fromClient("", q), udp6.toBackend("", q)),
				in0("udp answer", udp6.fromBackend("", []byte("answer!")), udp6.toClient("", []byte("answer!"))),
				counts(map[string]uint64{"conn_miss": 2, "conn_hit": 1, "nat_forward": 3, "nat_reply": 3}),
			})},
		// A backend whose next hop is on another interface than the client's: the forward is
		// redirected there (the MACs are that interface's and its router's), and the reply,
		// which comes in on that interface, is redirected back out of the client's.
		{name: "nat redirect", rig: natRig(singlePort), cases: cat(
			natHandshake(t, "", viaLB1, "lb1", xdpRedirectAction),
			[]packetCase{counts(map[string]uint64{"nat_forward": 1, "nat_reply": 1})})},
		// A client with no neighbour entry: the reply goes back the way the flow came in, to
		// the MAC its frames came from; the same when the reply comes in on another interface
		// (the backend is behind lb1): it is redirected to the one the flow came in on.
		{name: "nat reply with no neighbour", rig: natRig(singlePort), cases: cat(
			natHandshake(t, "", noNeigh, "lb0", xdpTX),
			natHandshake(t, " via lb1", noNeigh1, "lb1", xdpRedirectAction),
			[]packetCase{counts(map[string]uint64{"nat_reply": 2, "nat_no_route": 0})})},
		// A NAT backend whose next hop has no neighbour entry: dropped and counted as such (not
		// as forwarded), never sent with a guessed MAC. A reply to a client the FIB has no
		// route to: dropped and counted, not counted as a reply.
		{name: "nat no route", rig: natRig(singlePort), cases: []packetCase{
			in0Drop("syn to a backend with no resolved next hop", noNeighBackend.fromClient("S", nil).frame(t)),
			counts(map[string]uint64{"nat_no_route": 1, "nat_forward": 0, "forward": 0}),
			in0("syn from a client with no route back", far.fromClient("S", nil), far.toBackend("S", nil)),
			in0Drop("reply to a client with no route", far.fromBackend("SA", nil).frame(t)),
			counts(map[string]uint64{"nat_no_route": 2, "nat_forward": 1, "nat_reply": 0}),
		}},
		// Fragments of a VIP whose backend is NAT: dropped and counted (a later fragment
		// carries no ports to translate).
		{name: "nat fragment", rig: natRig(singlePort), cases: []packetCase{
			in0Drop("fragment of a NAT VIP", fragment),
			counts(map[string]uint64{"nat_fragment": 1, "nat_forward": 0}),
		}},
		// ICMP errors from the backends' side about NAT flows (quoting what the LB sent the
		// backend, NAT source -> backend) reach the client as errors from the VIP quoting what
		// the client sent: outer and quoted addresses and ports, the quoted IP and transport
		// checksums (when quoted) and the ICMP checksum all translated.
		{name: "nat icmp error from the backend", rig: natRig(singlePort), cases: []packetCase{
			in0("tcp flow", eTCP.fromClient(flags(eTCP), tooBig), eTCP.toBackend(flags(eTCP), tooBig)),
			in0("udp flow", eUDP.fromClient(flags(eUDP), tooBig), eUDP.toBackend(flags(eUDP), tooBig)),
			in0("tcp6 flow", eTCP6.fromClient(flags(eTCP6), tooBig), eTCP6.toBackend(flags(eTCP6), tooBig)),
			// Port unreachable from the backend itself, quoting the whole datagram (as Linux
			// does).
			icmp0("udp port unreachable",
				icmpErr(t, lbMAC, routerMAC, eUDP.s.addr.Addr(), natLB4, 3, 3, none, eUDP.toBackend("", tooBig).l3(t)),
				icmpErr(t, clientMAC, lbMAC, natVIP4, natClient4, 3, 3, none, eUDP.fromClient("", tooBig).l3(t))),
			// Fragmentation needed from a router between the LB and the backend, quoting the
			// IP header and 8 bytes (no TCP checksum quoted).
			icmp0("tcp frag needed",
				icmpErr(t, lbMAC, routerMAC, natRemote4, natLB4, 3, 4, mtu1400, truncQuote(eTCP.toBackend("S", tooBig).l3(t))),
				icmpErr(t, clientMAC, lbMAC, natVIP4, natClient4, 3, 4, mtu1400, truncQuote(eTCP.fromClient("S", tooBig).l3(t)))),
			// The same quoting the whole segment: the quoted TCP checksum is translated too.
			icmp0("tcp frag needed, whole segment quoted",
				icmpErr(t, lbMAC, routerMAC, natRemote4, natLB4, 3, 4, mtu1400, eTCP.toBackend("S", tooBig).l3(t)),
				icmpErr(t, clientMAC, lbMAC, natVIP4, natClient4, 3, 4, mtu1400, eTCP.fromClient("S", tooBig).l3(t))),
			// IPv6 packet too big from a router, quoting the whole segment.
			icmp0("icmpv6 packet too big",
				icmpErr(t, lbMAC, routerMAC, natRemote6, natLB6, 2, 0, mtu1400, eTCP6.toBackend("S", tooBig).l3(t)),
				icmpErr(t, clientMAC, lbMAC, natVIP6, natClient6, 2, 0, mtu1400, eTCP6.fromClient("S", tooBig).l3(t))),
			// Port unreachable quoting a datagram with no UDP checksum: the quoted 0 stays 0.
			in0("flow with no udp checksum", zin, zout),
			icmp0("udp port unreachable, no udp checksum",
				icmpErr(t, lbMAC, routerMAC, eZero.s.addr.Addr(), natLB4, 3, 3, none, zout.l3(t)),
				icmpErr(t, clientMAC, lbMAC, natVIP4, natClient4, 3, 3, none, zin.l3(t))),
			counts(map[string]uint64{"icmp_error": 5, "nat_forward": 4}),
			// An error about no NAT flow (another port of the NAT source) is the host's.
			in0Pass("error about no NAT flow", noFlowErr),
			counts(map[string]uint64{"icmp_error": 5}),
		}},
		// An ICMP error from the client's side about a NAT flow (quoting the reply the LB sent,
		// VIP -> client) reaches the backend as an error about what the backend sent (backend
		// -> NAT source), from the NAT source.
		{name: "nat icmp error from the client", rig: natRig(singlePort), cases: []packetCase{
			in0("syn", tcp4.fromClient("S", nil), tcp4.toBackend("S", nil)),
			icmp0("frag needed from the client's side",
				icmpErr(t, lbMAC, clientMAC, clientRouter, natVIP4, 3, 4, mtu1280, tcp4.toClient("PA", big).l3(t)),
				icmpErr(t, routerMAC, lbMAC, natLB4, tcp4.s.addr.Addr(), 3, 4, mtu1280, tcp4.fromBackend("PA", big).l3(t))),
			// IPv6: packet too big, quoting the IP header and 8 bytes of the reply.
			in0("syn6", tcp6.fromClient("S", nil), tcp6.toBackend("S", nil)),
			icmp0("packet too big from the client's side",
				icmpErr(t, lbMAC, clientMAC, clientRouter6, natVIP6, 2, 0, mtu1280, truncQuote(tcp6.toClient("PA", big).l3(t))),
				icmpErr(t, routerMAC, lbMAC, natLB6, tcp6.s.addr.Addr(), 2, 0, mtu1280, truncQuote(tcp6.fromBackend("PA", big).l3(t)))),
			counts(map[string]uint64{"icmp_error": 2, "nat_forward": 4}),
		}},
		// A retransmitted SYN follows its flow (same port). A RST from the client does not free
		// the port at once (were it forged, one the backend ignores, it must not hand a live
		// flow's port to another flow): the backend's packets still reach the client, a second
		// flow still finds no port (the port is held 10 s), and the same client's new SYN on
		// the same 5-tuple gets its port back.
		{name: "nat rst holds the port", rig: natRig(singlePort), cases: []packetCase{
			rstA.client("S", nil),
			func() packetCase { rstA.c--; return rstA.client("S", nil) }(), // the same SYN again
			rstA.backend("SA", nil),
			rstA.client("A", nil),
			in0Drop("second flow while the only port is held", rstB.fromClient("S", nil).frame(t)),
			rstA.client("RA", nil),
			rstA.backend("A", nil),
			in0Drop("second flow right after the first one's RST", rstB.fromClient("S", nil).frame(t)),
			rstA.client("S", nil),
			counts(map[string]uint64{"conn_hit": 3, "conn_miss": 4, "nat_no_port": 2, "tcp_rst": 1, "nat_forward": 5, "nat_reply": 2}),
		}},
		{name: "nat checksum edges", rig: natRig(singlePort), cases: cat(
			[]packetCase{
				in0("syn with IP options", withOpts(tcp4.fromClient("S", nil)), withOpts(tcp4.toBackend("S", nil))),
				in0("reply with IP options", withOpts(tcp4.fromBackend("SA", nil)), withOpts(tcp4.toClient("SA", nil))),
			},
			csumZero)},
		// Once the client has completed the handshake, the flow idles as the VIP allows: a SYN
		// flood cannot hold a backend's ports for a quarter of an hour, an established flow
		// keeps its port.
		{name: "nat unreplied timeout", rig: natRig(singlePort), cases: cat(
			[]packetCase{
				in0("syn, never answered", unA.fromClient("S", nil), unA.toBackend("S", nil)),
				step("31 s idle", age(31*time.Second)),
				unB.client("S", nil), unB.backend("SA", nil), unB.client("A", nil),
				in0Drop("the unreplied flow again, its port taken", unA.fromClient("S", nil).frame(t)),
				step("31 s idle", age(31*time.Second)),
				in0Drop("a flow after 31 s idle of an established one (the port is held 900 s)", unC.fromClient("S", nil).frame(t)),
				counts(map[string]uint64{"nat_no_port": 2, "nat_reply": 1}),
			})},
	}
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

// Port exhaustion: ports are allocated per (NAT source, backend, protocol). With a range of
// two ports, two established flows to one backend take both, a third is dropped and counted
// (never sent unremembered, nor from a port another flow holds), while a flow to another
// backend, or of another protocol to the same backend, still gets a port.
func TestNATFixturePortExhaustion(t *testing.T) {
	r := newNATRig(t, Options{})
	r.install(NAT{Sources: []netip.Addr{natLB4}, PortLow: natPort, PortHigh: natPort + 1})
	inRange := func(p uint16) bool { return p == natPort || p == natPort+1 }
	var flows []natfxFlow
	for _, cport := range []uint16{33000, 33001} {
		cv := newNATConv(t, natFlow(natTCP4, cport, netip.AddrPort{}))
		if !r.open(cv, natLB4, natPort, natPort+1) || !r.establish(cv) {
			t.Fatalf("flow from %d: no port, or its handshake dropped", cport)
		}
		flows = append(flows, cv.fl)
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
	wantCounts(t, r.f, map[string]uint64{"nat_no_port": 2, "nat_forward": 4})
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
	wantCounts(t, r.f, map[string]uint64{"nat_no_port": 2, "nat_forward": 8, "nat_reply": 4})
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
	a := newNATConv(t, natFlow(natTCP4b, 33000, netip.AddrPortFrom(natLB4, natPort)))
	if !r.send(a, true, "S", nil) || !r.establish(a) {
		t.Fatal("the first flow's handshake was dropped")
	}
	b := newNATConv(t, natFlow(natTCP4b, 33001, netip.AddrPortFrom(natLB4, natPort)))
	// Until a's entry has been idle past the timeout, b finds no port; the program's clock
	// is coarse (a few ms): 2 s of slack over the timeout.
	syn, want := b.seg(true, "S", nil)
	var ret uint32
	var out []byte
	testwait.Until(t, idle+2*time.Second, 100*time.Millisecond, "the idle flow's port taken over", func() (bool, string) {
		ret, out = r.run(r.lb0, syn.frame(t))
		return ret != xdpDrop, fmt.Sprintf("action %d", ret)
	})
	if ret != xdpTX {
		t.Fatalf("new flow after the timeout: action %d", ret)
	}
	if d := byteDiff(out, want.frame(t)); d != "" {
		t.Fatalf("new flow after the timeout:\n%s", d)
	}
	if !r.establish(b) {
		t.Fatal("the new flow's handshake was dropped")
	}
	late, _ := a.seg(true, "A", []byte("late"))
	if ret, out := r.run(r.lb0, late.frame(t)); ret != xdpDrop {
		t.Fatalf("the idle flow's late packet: action %d, output %x; want drop (its port is the new flow's)", ret, out)
	}
	if !r.send(b, true, "A", []byte("x")) {
		t.Fatal("the new flow's data was dropped")
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
