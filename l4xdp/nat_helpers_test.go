package l4xdp

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/stickylb/stickylb/internal/testkit/netnstest"
)

// The NAT fixtures' network and their packet builders. bpf_fib_lookup resolves next hops in
// the network namespace of the thread that runs the program, so each NAT fixture builds a
// namespace of its own: lb0 (the LB's interface, LB addresses, a client on its link, a router
// to the backends' subnets) and lb1 (a second interface with a router of its own, for the
// redirect case). Neighbours are PERMANENT with fixed MACs, so every expected byte is known
// before the program runs.

var (
	natLB4      = netip.MustParseAddr("10.0.0.1") // lb0's address, the first NAT source
	natLB4b     = netip.MustParseAddr("10.0.0.2") // lb0's second address, the second NAT source
	natLB6      = netip.MustParseAddr("fd00::1")
	natClient4  = netip.MustParseAddr("10.0.0.10") // on lb0's link, neighbour entry clientMAC
	natClient6  = netip.MustParseAddr("fd00::10")
	natRouter4  = netip.MustParseAddr("10.0.0.254") // next hop to 10.1.0.0/24
	natRouter6  = netip.MustParseAddr("fd00::fe")   // next hop to fd01::/64
	natRouter4b = netip.MustParseAddr("10.2.0.254") // lb1's next hop to 10.3.0.0/24
	natVIP4     = netip.MustParseAddr("10.0.0.100")
	natVIP6     = netip.MustParseAddr("fd00::100")
	// natRemote4 is a host whose packets reach the LB through the router (an ICMP error's
	// sender between the LB and the backends).
	natRemote4 = netip.MustParseAddr("10.1.0.254")
	natRemote6 = netip.MustParseAddr("fd01::fe")

	routerMAC  = net.HardwareAddr{0x02, 0, 0, 0, 0xfe, 0x01}
	routerMACb = net.HardwareAddr{0x02, 0, 0, 0, 0xfe, 0x02}
	lbMACb     = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xbb} // lb1's MAC (lb0's is lbMAC)
)

// natfxRig is one NAT fixture's namespace and forwarder.
type natfxRig struct {
	t   *testing.T
	kit *netnstest.Kit
	f   *Tables
	o   Options // the connection table's, rewritten into the config with the NAT's
	// ifindex of lb0 and lb1 in the namespace.
	lb0, lb1 uint32
}

// newNATRig builds the namespace (torn down by the kit when the test ends, failed or not)
// and loads a forwarder with connection-table options o (a table of 4096 entries unless o
// says).
func newNATRig(t *testing.T, o Options) *natfxRig {
	kit := netnstest.New(t, "slnf")
	kit.AddNS("lb")
	// One `ip -batch` for the whole network: a command each would take most of a second.
	batch := []string{
		"link add lb0 address " + lbMAC.String() + " type veth peer name lb0p",
		"link add lb1 address " + lbMACb.String() + " type veth peer name lb1p",
		"link set lb0 up", "link set lb0p up", "link set lb1 up", "link set lb1p up",
		"address add " + natLB4.String() + "/24 dev lb0",
		"address add " + natLB4b.String() + "/24 dev lb0",
		"address add " + natLB6.String() + "/64 dev lb0 nodad",
		"address add 10.2.0.1/24 dev lb1",
		"route add 10.1.0.0/24 via " + natRouter4.String() + " dev lb0",
		"route add fd01::/64 via " + natRouter6.String() + " dev lb0",
		"route add 10.3.0.0/24 via " + natRouter4b.String() + " dev lb1",
		"route add 10.4.0.0/24 via 10.0.0.253 dev lb0", // 10.0.0.253: no neighbour entry
		"neigh replace " + natRouter4.String() + " lladdr " + routerMAC.String() + " nud permanent dev lb0",
		"neigh replace " + natRouter6.String() + " lladdr " + routerMAC.String() + " nud permanent dev lb0",
		"neigh replace " + natRouter4b.String() + " lladdr " + routerMACb.String() + " nud permanent dev lb1",
		"neigh replace " + natClient4.String() + " lladdr " + clientMAC.String() + " nud permanent dev lb0",
		"neigh replace " + natClient6.String() + " lladdr " + clientMAC.String() + " nud permanent dev lb0",
	}
	file := filepath.Join(t.TempDir(), "net.batch")
	if err := os.WriteFile(file, []byte(strings.Join(batch, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kit.Run("ip", "-n", kit.Name("lb"), "-batch", file)
	// bpf_fib_lookup answers FWD_DISABLED on an interface that does not forward.
	kit.In("lb", "sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	r := &natfxRig{t: t, kit: kit}
	kit.MustDo("lb", func() error {
		for _, x := range []struct {
			name string
			idx  *uint32
		}{{"lb0", &r.lb0}, {"lb1", &r.lb1}} {
			ifc, err := net.InterfaceByName(x.name)
			if err != nil {
				return err
			}
			*x.idx = uint32(ifc.Index)
		}
		return nil
	})
	if o.ConnTableSize == 0 {
		o.ConnTableSize = 4096 // a fixture's few flows; the default's 1M entries take a second to allocate
	}
	f, err := loadTables(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	r.f, r.o = f, o
	return r
}

// xdpMD is struct xdp_md as BPF_PROG_RUN takes it: data and data_end are offsets into the
// input (0 and its length); ingress_ifindex makes the run's device, whose namespace
// bpf_fib_lookup resolves in.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// run runs the program on frame in as if it came in on interface ifindex of the rig's
// namespace, and returns its action and output frame.
func (r *natfxRig) run(ifindex uint32, in []byte) (uint32, []byte) {
	r.t.Helper()
	out := make([]byte, len(in)+256)
	opts := &ebpf.RunOptions{Data: in, DataOut: out, Context: xdpMD{DataEnd: uint32(len(in)), IngressIfindex: ifindex}}
	var ret uint32
	r.kit.MustDo("lb", func() (err error) {
		ret, err = r.f.Program().Run(opts)
		return err
	})
	return ret, opts.DataOut
}

// natfxPkt is one TCP or UDP packet, every field the fixtures vary; its bytes are built by
// gopacket with lengths and checksums computed from scratch.
type natfxPkt struct {
	dstMAC, srcMAC net.HardwareAddr
	src, dst       netip.Addr
	sport, dport   uint16
	proto          uint8  // 6 or 17
	flags          string // TCP: S, A, P, F, R
	payload        []byte
	// udpCsum0 sends UDP over IPv4 with no checksum (0).
	udpCsum0 bool
	// opts are IPv4 options.
	opts []layers.IPv4Option
	// seq and ack are the TCP sequence and acknowledgement numbers when seqSet (else fixed
	// ones: 0x01020304, and 0x0a0b0c0d with ACK).
	seq, ack uint32
	seqSet   bool
}

// at is p with TCP sequence number seq and acknowledgement number ack (sent only with ACK).
func (p natfxPkt) at(seq, ack uint32) natfxPkt {
	p.seq, p.ack, p.seqSet = seq, ack, true
	return p
}

// l3 is the packet from its IP header on (what an ICMP error quotes).
func (p natfxPkt) l3(t testing.TB) []byte {
	t.Helper()
	b := p.frame(t)[14:]
	n := 40 + int(binary.BigEndian.Uint16(b[4:6])) // IPv6: header + payload length
	if p.src.Is4() {
		n = int(binary.BigEndian.Uint16(b[2:4]))
	}
	return b[:n] // without the Ethernet padding of a short frame
}

func (p natfxPkt) frame(t testing.TB) []byte {
	t.Helper()
	var ip gopacket.NetworkLayer
	var ipl gopacket.SerializableLayer
	et := layers.EthernetTypeIPv4
	if p.src.Is4() {
		v4 := &layers.IPv4{Version: 4, TTL: 64, Id: 0x1234, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocol(p.proto),
			SrcIP: p.src.AsSlice(), DstIP: p.dst.AsSlice(), Options: p.opts}
		ip, ipl = v4, v4
	} else {
		et = layers.EthernetTypeIPv6
		v6 := &layers.IPv6{Version: 6, HopLimit: 64, FlowLabel: 0x12345, NextHeader: layers.IPProtocol(p.proto),
			SrcIP: p.src.AsSlice(), DstIP: p.dst.AsSlice()}
		ip, ipl = v6, v6
	}
	var l4 gopacket.SerializableLayer
	switch p.proto {
	case 6:
		tc := &layers.TCP{SrcPort: layers.TCPPort(p.sport), DstPort: layers.TCPPort(p.dport), Seq: 0x01020304, Window: 64240,
			SYN: strings.Contains(p.flags, "S"), ACK: strings.Contains(p.flags, "A"), PSH: strings.Contains(p.flags, "P"),
			FIN: strings.Contains(p.flags, "F"), RST: strings.Contains(p.flags, "R")}
		if tc.ACK {
			tc.Ack = 0x0a0b0c0d
		}
		if p.seqSet {
			tc.Seq = p.seq
			if tc.ACK {
				tc.Ack = p.ack
			}
		}
		if tc.SYN {
			tc.Options = []layers.TCPOption{{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{0x05, 0xb4}}}
		}
		tc.SetNetworkLayerForChecksum(ip)
		l4 = tc
	case 17:
		u := &layers.UDP{SrcPort: layers.UDPPort(p.sport), DstPort: layers.UDPPort(p.dport)}
		u.SetNetworkLayerForChecksum(ip)
		l4 = u
	default:
		t.Fatalf("protocol %d", p.proto)
	}
	b := serialize(t, eth(p.dstMAC, p.srcMAC, et), ipl, l4, gopacket.Payload(p.payload))
	if p.proto == 17 {
		c := 14 + 40 + 6
		if p.src.Is4() {
			c = 14 + int(b[14]&0x0f)*4 + 6
		}
		switch {
		case p.udpCsum0:
			if !p.src.Is4() {
				t.Fatal("a UDP checksum of 0 is IPv4's only")
			}
			b[c], b[c+1] = 0, 0
		case b[c] == 0 && b[c+1] == 0: // computed 0 is sent as all ones (RFC 768); gopacket leaves it 0
			b[c], b[c+1] = 0xff, 0xff
		}
	}
	return b
}

// icmpErr builds an ICMP error (ICMPv4 or ICMPv6 by the addresses' family) from src to dst
// quoting quoted; rest is the 4 bytes after the checksum (the next-hop MTU of a frag-needed,
// the MTU of a packet too big).
func icmpErr(t testing.TB, dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, typ, code uint8, rest [4]byte, quoted []byte) []byte {
	t.Helper()
	if src.Is4() {
		ip := &layers.IPv4{Version: 4, TTL: 64, Id: 0x4321, Protocol: layers.IPProtocolICMPv4, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		ic := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(typ, code),
			Id: binary.BigEndian.Uint16(rest[0:2]), Seq: binary.BigEndian.Uint16(rest[2:4])}
		return serialize(t, eth(dstMAC, srcMAC, layers.EthernetTypeIPv4), ip, ic, gopacket.Payload(quoted))
	}
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolICMPv6, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	ic := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(typ, code)}
	ic.SetNetworkLayerForChecksum(ip)
	return serialize(t, eth(dstMAC, srcMAC, layers.EthernetTypeIPv6), ip, ic, gopacket.Payload(append(rest[:], quoted...)))
}

// truncQuote is what a router quotes: the IP header and 8 bytes of the transport header.
func truncQuote(l3 []byte) []byte {
	if l3[0]>>4 == 4 {
		return l3[:int(l3[0]&0x0f)*4+8]
	}
	return l3[:40+8]
}

// l4Source reads the source address and port of a frame's IPv4 or IPv6 TCP/UDP packet (the
// NAT source and port the program chose, for fixtures whose range has several).
func l4Source(t testing.TB, frame []byte) (netip.Addr, uint16) {
	t.Helper()
	if len(frame) < 14+40+4 {
		t.Fatalf("frame of %d bytes", len(frame))
	}
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case 0x0800:
		hl := int(frame[14]&0x0f) * 4
		return netip.AddrFrom4([4]byte(frame[26:30])), binary.BigEndian.Uint16(frame[14+hl:])
	case 0x86dd:
		return netip.AddrFrom16([16]byte(frame[22:38])), binary.BigEndian.Uint16(frame[54:])
	}
	t.Fatalf("frame of ethertype %x", frame[12:14])
	return netip.Addr{}, 0
}

// natfxSlot is one backend of the NAT fixtures: its slot, address and port, and the VIP
// (id, address and port, protocol) whose every table slot points at it.
type natfxSlot struct {
	slot  uint32
	addr  netip.AddrPort
	vipID uint32
	vip   netip.AddrPort
	proto uint8
}

// The fixtures' backends, all reached by NAT: each VIP sends every new flow to one backend,
// so each expected output is known without a hash.
var (
	natTCP4     = natfxSlot{0, netip.MustParseAddrPort("10.1.0.10:8080"), 1, netip.AddrPortFrom(natVIP4, 80), 6}
	natUDP4     = natfxSlot{1, netip.MustParseAddrPort("10.1.0.11:5353"), 2, netip.AddrPortFrom(natVIP4, 53), 17}
	natUDP4Zero = natfxSlot{2, netip.MustParseAddrPort("10.1.0.12:5353"), 3, netip.AddrPortFrom(natVIP4, 54), 17}
	natTCP6     = natfxSlot{3, netip.MustParseAddrPort("[fd01::10]:8080"), 4, netip.AddrPortFrom(natVIP6, 80), 6}
	natUDP6     = natfxSlot{4, netip.MustParseAddrPort("[fd01::10]:5353"), 5, netip.AddrPortFrom(natVIP6, 53), 17}
	natTCPLB1   = natfxSlot{5, netip.MustParseAddrPort("10.3.0.10:8080"), 6, netip.AddrPortFrom(natVIP4, 81), 6}
	natTCP4b    = natfxSlot{6, netip.MustParseAddrPort("10.1.0.13:8080"), 7, netip.AddrPortFrom(natVIP4, 82), 6}
	natNoNeigh  = natfxSlot{7, netip.MustParseAddrPort("10.4.0.10:8080"), 8, netip.AddrPortFrom(natVIP4, 83), 6}
	// natUDP4Same is backend natTCP4's address and port, over UDP: ports are allocated per
	// protocol too.
	natUDP4Same = natfxSlot{0, netip.MustParseAddrPort("10.1.0.10:8080"), 9, netip.AddrPortFrom(natVIP4, 80), 17}
)

var natfxAll = []natfxSlot{natTCP4, natUDP4, natUDP4Zero, natTCP6, natUDP6, natTCPLB1, natTCP4b, natNoNeigh, natUDP4Same}

// install writes the NAT configuration and the fixtures' backends and VIPs.
func (r *natfxRig) install(cfg NAT) {
	r.t.Helper()
	r.setNAT(cfg)
	for _, s := range natfxAll {
		r.natBackend(s.slot, s.addr)
		if err := r.f.SetWeight(s.slot, 1); err != nil { // as the loader does: a SYN of weight 0 re-picks
			r.t.Fatal(err)
		}
		table := make([]uint32, 7)
		for i := range table {
			table[i] = s.slot
		}
		if err := r.f.SetVIP(VIP{ID: s.vipID, Addr: s.vip, Proto: s.proto, Table: table}); err != nil {
			r.t.Fatal(err)
		}
	}
}

// setNAT writes the NAT sources and port range into the program's config (the insert cap
// from the rig's options, as the loader writes both).
func (r *natfxRig) setNAT(cfg NAT) {
	r.t.Helper()
	if err := cfg.Validate(); err != nil {
		r.t.Fatal(err)
	}
	if err := r.f.configure(r.o, cfg); err != nil {
		r.t.Fatal(err)
	}
}

// natBackend installs slot as a NAT backend at addr. Its MAC is one a DR forward would
// use, so a NAT backend sent by DR shows in the diff as that MAC.
func (r *natfxRig) natBackend(slot uint32, addr netip.AddrPort) {
	r.t.Helper()
	if err := r.f.SetBackend(slot, Backend{MAC: backMACs[0], Alive: true, NAT: true, Addr: addr}); err != nil {
		r.t.Fatal(err)
	}
}

// natfxFlow is one NAT flow as the fixtures expect it: the client, the backend's slot, the
// NAT source and port it should leave from, and the MACs of its hops.
type natfxFlow struct {
	s      natfxSlot
	client netip.AddrPort
	nat    netip.AddrPort
	// cmac is the client's MAC (its frames' source, and the replies' destination); bmac the
	// LB's MAC and rmac the router's on the backends' side.
	cmac, bmac, rmac net.HardwareAddr
}

// natFlow is a flow of slot s from client port cport, leaving from nat, through lb0.
func natFlow(s natfxSlot, cport uint16, nat netip.AddrPort) natfxFlow {
	c := natClient4
	if s.vip.Addr().Is6() {
		c = natClient6
	}
	return natfxFlow{s: s, client: netip.AddrPortFrom(c, cport), nat: nat, cmac: clientMAC, bmac: lbMAC, rmac: routerMAC}
}

func (fl natfxFlow) pkt(dstMAC, srcMAC net.HardwareAddr, src, dst netip.AddrPort, flags string, payload []byte) natfxPkt {
	return natfxPkt{dstMAC: dstMAC, srcMAC: srcMAC, src: src.Addr(), dst: dst.Addr(), sport: src.Port(), dport: dst.Port(),
		proto: fl.s.proto, flags: flags, payload: payload}
}

// fromClient is the client's packet as it reaches the LB.
func (fl natfxFlow) fromClient(flags string, payload []byte) natfxPkt {
	return fl.pkt(lbMAC, fl.cmac, fl.client, fl.s.vip, flags, payload)
}

// toBackend is that packet as the LB must send it on: to the router, from the NAT source.
func (fl natfxFlow) toBackend(flags string, payload []byte) natfxPkt {
	return fl.pkt(fl.rmac, fl.bmac, fl.nat, fl.s.addr, flags, payload)
}

// fromBackend is the backend's reply as it reaches the LB.
func (fl natfxFlow) fromBackend(flags string, payload []byte) natfxPkt {
	return fl.pkt(fl.bmac, fl.rmac, fl.s.addr, fl.nat, flags, payload)
}

// toClient is the reply as the LB must send it to the client: from the VIP.
func (fl natfxFlow) toClient(flags string, payload []byte) natfxPkt {
	return fl.pkt(fl.cmac, lbMAC, fl.s.vip, fl.client, flags, payload)
}

// expect runs in (arriving on ifindex) and fails unless the action is want's and the output
// is want's bytes exactly; a mismatch lists the differing bytes by offset and field.
func (r *natfxRig) expect(name string, ifindex uint32, in []byte, wantRet uint32, want []byte) {
	r.t.Helper()
	ret, out := r.run(ifindex, in)
	if ret != wantRet {
		r.t.Fatalf("%s: action %d, want %d\noutput %x\nwant   %x", name, ret, wantRet, out, want)
	}
	if d := byteDiff(out, want); d != "" {
		r.t.Fatalf("%s: output differs from the independently built frame:\n%s\ngot  %x\nwant %x", name, d, out, want)
	}
}

// viaLB1 is fl with its backend behind lb1 (the second interface's router and MAC).
func (fl natfxFlow) viaLB1() natfxFlow {
	fl.bmac, fl.rmac = lbMACb, routerMACb
	return fl
}

// byteDiff lists the bytes where got and want differ, each with the header field it falls
// in (IPv4/IPv6 with no options or extension headers), or "" when they are equal.
func byteDiff(got, want []byte) string {
	var b strings.Builder
	if len(got) != len(want) {
		fmt.Fprintf(&b, "length %d, want %d\n", len(got), len(want))
	}
	for i := 0; i < min(len(got), len(want)); i++ {
		if got[i] != want[i] {
			fmt.Fprintf(&b, "  byte %d (%s): %02x, want %02x\n", i, fieldAt(want, i), got[i], want[i])
		}
	}
	return b.String()
}

// fieldAt names the field at offset i of frame f, for diffs.
func fieldAt(f []byte, i int) string {
	switch {
	case i < 6:
		return "eth dst"
	case i < 12:
		return "eth src"
	case i < 14:
		return "ethertype"
	}
	v6 := f[12] == 0x86 && f[13] == 0xdd
	l3 := 20
	names := map[int]string{22: "ttl", 23: "proto", 24: "ip csum", 25: "ip csum"}
	for o := 26; o < 30; o++ {
		names[o] = "ip src"
	}
	for o := 30; o < 34; o++ {
		names[o] = "ip dst"
	}
	proto := byte(0)
	if len(f) > 23 {
		proto = f[23]
	}
	if v6 {
		l3 = 40
		names = map[int]string{21: "hop limit"}
		for o := 22; o < 38; o++ {
			names[o] = "ip src"
		}
		for o := 38; o < 54; o++ {
			names[o] = "ip dst"
		}
		if len(f) > 20 {
			proto = f[20]
		}
	}
	if n, ok := names[i]; ok {
		return n
	}
	if i < 14+l3 {
		return "ip header"
	}
	o := i - 14 - l3
	switch {
	case proto == 1 || proto == 58:
		switch {
		case o < 2:
			return "icmp type/code"
		case o < 4:
			return "icmp csum"
		case o < 8:
			return "icmp rest"
		}
		return fmt.Sprintf("quoted packet, byte %d", o-8)
	case o < 2:
		return "l4 sport"
	case o < 4:
		return "l4 dport"
	case proto == 17 && o < 6:
		return "udp length"
	case proto == 17 && o < 8:
		return "udp csum"
	case proto == 6 && (o == 16 || o == 17):
		return "tcp csum"
	case proto == 6 && o < 20:
		return "tcp header"
	}
	return "payload"
}
