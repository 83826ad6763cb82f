package agent

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"go.uber.org/zap/zaptest"

	"github.com/stickylb/stickylb/internal/testkit/netnstest"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// The agent's fixtures through BPF_PROG_RUN, in a namespace of the test's own (the socket
// lookups look there): a frame in, the verdict and the frame out. Expected frames are built
// here from the tunnel's definition (docs/xdp.md, ../bpf/gue.h) with gopacket, never taken
// from the program. Sockets are real: a listener and connections of the namespace, so the
// lookup's "socket here" and "none" are the kernel's answers.

const (
	tcOK       = 0
	tcShot     = 2
	tcRedirect = 7
	port       = 6080
)

var (
	beMAC, routerMAC = net.HardwareAddr{0x02, 0, 0, 0, 0xbe, 0x01}, net.HardwareAddr{0x02, 0, 0, 0, 0xfe, 0x01}
	lb4, lb6         = netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	self4, self6     = netip.MustParseAddr("10.1.0.21"), netip.MustParseAddr("fd01::21") // this backend
	second4          = netip.MustParseAddr("10.1.0.22")
	second6          = netip.MustParseAddr("fd01::22")
	vip4, vip6       = netip.MustParseAddr("10.0.0.100"), netip.MustParseAddr("2001:db8::100")
	client4, client6 = netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8:c::10")
	// local4 is a client address of the namespace itself: connections from it to the VIP
	// are this host's sockets for the lookup to find.
	local4 = netip.MustParseAddr("10.0.0.10")
)

func serialize(t testing.TB, ls ...gopacket.SerializableLayer) []byte {
	t.Helper()
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

// innerTCP is the client's TCP packet (IP header on) with flags S, A, P, F, R.
func innerTCP(t testing.TB, src netip.Addr, sport uint16, dst netip.Addr, dport uint16, flags string) []byte {
	t.Helper()
	tc := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), Seq: 1000, Ack: 2000, Window: 512}
	for _, f := range flags {
		switch f {
		case 'S':
			tc.SYN = true
		case 'A':
			tc.ACK = true
		case 'P':
			tc.PSH = true
		case 'F':
			tc.FIN = true
		case 'R':
			tc.RST = true
		}
	}
	payload := gopacket.Payload("inner payload")
	if src.Is4() {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		tc.SetNetworkLayerForChecksum(ip)
		return serialize(t, ip, tc, payload)
	}
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	tc.SetNetworkLayerForChecksum(ip)
	return serialize(t, ip, tc, payload)
}

// innerUDP is the client's UDP datagram.
func innerUDP(t testing.TB, src, dst netip.Addr) []byte {
	t.Helper()
	u := &layers.UDP{SrcPort: 5300, DstPort: 53}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	u.SetNetworkLayerForChecksum(ip)
	return serialize(t, ip, u, gopacket.Payload("query"))
}

// gueOpts are the GUE header's fields as the fixtures vary them; the zero value is the LB's
// header with no secondary.
type gueOpts struct {
	hops   uint8
	second netip.Addr
	vchl   int // -1 .. 255: the first byte as given (0: the LB's)
	proto  int // 0: the LB's (4 or 41)
	flags  uint16
	kind   int // 0: 'S'
	nopriv bool
}

// frame is inner in the tunnel from src to dst (the same family), UDP to dport with checksum
// 0, as the LB sends it (bpf/gue.h), with o's variations.
func frame(t testing.TB, src, dst netip.Addr, dport uint16, o gueOpts, inner []byte) []byte {
	t.Helper()
	v6 := src.Is6()
	hlen, proto := byte(2), byte(4)
	if v6 {
		hlen, proto = 5, 41
	}
	var priv []byte
	if !o.nopriv {
		kind := byte(0x53)
		if o.kind != 0 {
			kind = byte(o.kind)
		}
		priv = []byte{kind, o.hops, 0, 0}
		switch {
		case v6 && o.second.IsValid():
			a := o.second.As16()
			priv = append(priv, a[:]...)
		case v6:
			priv = append(priv, make([]byte, 16)...)
		case o.second.IsValid():
			a := o.second.As4()
			priv = append(priv, a[:]...)
		default:
			priv = append(priv, 0, 0, 0, 0)
		}
	} else {
		hlen = 0
	}
	g := []byte{hlen, proto, byte(o.flags >> 8), byte(o.flags)}
	if o.vchl != 0 {
		g[0] = byte(o.vchl)
	}
	if o.proto != 0 {
		g[1] = byte(o.proto)
	}
	payload := append(append(g, priv...), inner...)
	udp := &layers.UDP{SrcPort: 0xc123, DstPort: layers.UDPPort(dport)}
	var b []byte
	if v6 {
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		udp.SetNetworkLayerForChecksum(ip)
		b = serialize(t, &layers.Ethernet{DstMAC: beMAC, SrcMAC: routerMAC, EthernetType: layers.EthernetTypeIPv6}, ip, udp, gopacket.Payload(payload))
		b[14+40+6], b[14+40+7] = 0, 0
		return b
	}
	ip := &layers.IPv4{Version: 4, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	udp.SetNetworkLayerForChecksum(ip)
	b = serialize(t, &layers.Ethernet{DstMAC: beMAC, SrcMAC: routerMAC, EthernetType: layers.EthernetTypeIPv4}, ip, udp, gopacket.Payload(payload))
	b[14+20+6], b[14+20+7] = 0, 0
	return b
}

// decapped is what the stack receives of in: its Ethernet header, then the inner packet.
func decapped(in, inner []byte) []byte { return append(append([]byte(nil), in[:14]...), inner...) }

// rig is the fixtures' namespace and the agent's program, loaded (not attached: the
// fixtures run it) with the ports, sources and the namespace's addresses written.
type rig struct {
	t   testing.TB
	kit *netnstest.Kit
	a   *Agent
}

func newRig(t testing.TB) *rig {
	netnstest.NeedRoot(t)
	kit := netnstest.New(t, "slag")
	kit.AddNS("be")
	for _, a := range []string{vip4.String() + "/32", local4.String() + "/32", self4.String() + "/32"} {
		kit.In("be", "ip", "address", "add", a, "dev", "lo")
	}
	for _, a := range []string{vip6.String() + "/128", self6.String() + "/128"} {
		kit.In("be", "ip", "address", "add", a, "dev", "lo", "nodad")
	}
	a := &Agent{cfg: Config{Iface: "lo", LBSources: []netip.Prefix{netip.PrefixFrom(lb4, 32), netip.MustParsePrefix("fd00::/64")}},
		log: zaptest.NewLogger(t)}
	spec, err := loadBackend()
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.LoadAndAssign(&a.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("loading the agent: %+v", ve)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { a.objs.Close() })
	kit.MustDo("be", a.configure)
	return &rig{t: t, kit: kit, a: a}
}

func (r *rig) run(in []byte) (uint32, []byte) {
	r.t.Helper()
	out := make([]byte, len(in)+256)
	opts := &ebpf.RunOptions{Data: in, DataOut: out}
	var ret uint32
	r.kit.MustDo("be", func() (err error) {
		ret, err = r.a.objs.StickylbBackend.Run(opts)
		return err
	})
	return ret, opts.DataOut
}

func (r *rig) counts() map[string]uint64 {
	r.t.Helper()
	st, err := stats(r.a.objs.AgentStats)
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]uint64{}
	for k, c := range st {
		out[k] = c.Packets
	}
	return out
}

// agentCase is one fixture: a frame in, the verdict, the frame out (nil: the verdict alone,
// for a drop).
type agentCase struct {
	name    string
	in      []byte
	verdict uint32
	out     []byte
}

func (r *rig) check(cases []agentCase) {
	r.t.Helper()
	for i, c := range cases {
		ret, out := r.run(c.in)
		if ret != c.verdict {
			r.t.Fatalf("case %d, %s: verdict %d, want %d\nout  %x", i, c.name, ret, c.verdict, out)
		}
		if c.out != nil && string(out) != string(c.out) {
			r.t.Fatalf("case %d, %s: output differs from the independently built frame\ngot  %x\nwant %x", i, c.name, out, c.out)
		}
	}
}

func (r *rig) wantCounts(want map[string]uint64) {
	r.t.Helper()
	got := r.counts()
	for k, n := range want {
		if got[k] != n {
			r.t.Fatalf("path %s: %d packets, want %d (all: %v)", k, got[k], n, got)
		}
	}
}

// TestAgentFixtures: decapsulation, second chance and its limits, refusals, malformed GUE.
func TestAgentFixtures(t *testing.T) {
	r := newRig(t)
	ack4 := innerTCP(t, client4, 40000, vip4, 80, "A")
	ack6 := innerTCP(t, client6, 40000, vip6, 80, "A")
	syn4 := innerTCP(t, client4, 40001, vip4, 80, "S")
	one4 := gueOpts{hops: 1, second: second4}
	one6 := gueOpts{hops: 1, second: second6}
	spent := gueOpts{hops: 0, second: second4}
	in := frame(t, lb4, self4, port, gueOpts{}, ack4)
	in6 := frame(t, lb6, self6, port, gueOpts{}, ack6)
	sc4 := frame(t, lb4, self4, port, one4, ack4)
	sc6 := frame(t, lb6, self6, port, one6, ack6)
	kernelFou := frame(t, lb4, self4, port, gueOpts{nopriv: true}, ack4)
	udp := innerUDP(t, client4, vip4)
	r.check([]agentCase{
		{"decapsulation", in, tcOK, decapped(in, ack4)},
		{"decapsulation, ipv6", in6, tcOK, decapped(in6, ack6)},
		{"no private data (a plain GUE encapsulator)", kernelFou, tcOK, decapped(kernelFou, ack4)},
		// No socket here for a non-SYN: on to the secondary, the outer destination and hop
		// count rewritten, the LB's source kept.
		{"second chance", sc4, tcRedirect, frame(t, lb4, second4, port, gueOpts{hops: 0, second: second4}, ack4)},
		{"second chance, ipv6", sc6, tcRedirect, frame(t, lb6, second6, port, gueOpts{hops: 0, second: second6}, ack6)},
		// A SYN starts a connection here: never passed on.
		{"none for a SYN", frame(t, lb4, self4, port, one4, syn4), tcOK, decapped(frame(t, lb4, self4, port, one4, syn4), syn4)},
		// No hop left: decapsulated (the stack answers), never forwarded again.
		{"none with no hops left", frame(t, lb4, self4, port, spent, ack4), tcOK, decapped(frame(t, lb4, self4, port, spent, ack4), ack4)},
		// The secondary is this host: nowhere else to go.
		{"none to itself", frame(t, lb4, self4, port, gueOpts{hops: 1, second: self4}, ack4), tcOK, nil},
		{"udp: decapsulated", frame(t, lb4, self4, port, one4, udp), tcOK, decapped(frame(t, lb4, self4, port, one4, udp), udp)},
	})
	r.wantCounts(map[string]uint64{"decap": 5, "second_chance": 2, "no_socket": 2})

	// Refused and dropped: a tunnel packet from a source that is no LB; GUE that does not
	// parse; an inner destination that is not this host's.
	short := frame(t, lb4, self4, port, gueOpts{}, ack4)[:14+20+8+2]
	fixLengths(short)
	badLen := frame(t, lb4, self4, port, gueOpts{}, ack4)
	binary.BigEndian.PutUint16(badLen[14+20+8+12+2:], uint16(len(ack4)+4)) // inner tot_len past the datagram
	fixInnerChecksum(badLen[14+20+8+12:])
	r.check([]agentCase{
		{"foreign source", frame(t, netip.MustParseAddr("10.0.0.99"), self4, port, one4, ack4), tcShot, nil},
		{"foreign source, ipv6", frame(t, netip.MustParseAddr("fd99::1"), self6, port, one6, ack6), tcShot, nil},
		{"short", short, tcShot, nil},
		{"wrong version", frame(t, lb4, self4, port, gueOpts{vchl: 0x42}, ack4), tcShot, nil},
		{"control message", frame(t, lb4, self4, port, gueOpts{vchl: 0x22}, ack4), tcShot, nil},
		{"flags", frame(t, lb4, self4, port, gueOpts{flags: 1}, ack4), tcShot, nil},
		{"private data of another length", frame(t, lb4, self4, port, gueOpts{vchl: 3}, ack4), tcShot, nil},
		{"private data of another kind", frame(t, lb4, self4, port, gueOpts{kind: 0x54}, ack4), tcShot, nil},
		{"inner of another family", frame(t, lb4, self4, port, gueOpts{proto: 41}, ack4), tcShot, nil},
		{"bad inner length", badLen, tcShot, nil},
		{"inner destination not local", frame(t, lb4, self4, port, one4, innerTCP(t, client4, 40000, netip.MustParseAddr("10.0.0.200"), 80, "A")), tcShot, nil},
	})
	r.wantCounts(map[string]uint64{"refused": 2, "malformed": 8, "not_local": 1, "second_chance": 2})

	// Everything else passes untouched: another UDP port, a foreign source to another port,
	// TCP to the host.
	other := frame(t, lb4, self4, port+1, one4, ack4)
	stranger := frame(t, netip.MustParseAddr("10.0.0.99"), self4, 53, one4, ack4)
	plain := append([]byte{0x02, 0, 0, 0, 0xbe, 0x01, 0x02, 0, 0, 0, 0xfe, 0x01, 0x08, 0x00}, ack4...)
	r.check([]agentCase{
		{"another port", other, tcOK, other},
		{"a stranger to another port", stranger, tcOK, stranger},
		{"tcp to the host", plain, tcOK, plain},
	})
	r.wantCounts(map[string]uint64{"decap": 5, "refused": 2, "malformed": 8, "not_local": 1, "second_chance": 2, "no_socket": 2})
}

// fixLengths sets an IPv4 frame's total and UDP lengths to what it holds, and the header
// checksum.
func fixLengths(f []byte) {
	binary.BigEndian.PutUint16(f[14+2:], uint16(len(f)-14))
	binary.BigEndian.PutUint16(f[14+20+4:], uint16(len(f)-14-20))
	binary.BigEndian.PutUint16(f[14+10:], 0)
	binary.BigEndian.PutUint16(f[14+10:], ipChecksum(f[14:34]))
}

// fixInnerChecksum recomputes an inner IPv4 header's checksum (a bad length is not a bad
// checksum).
func fixInnerChecksum(ip []byte) {
	binary.BigEndian.PutUint16(ip[10:], 0)
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip[:20]))
}

func ipChecksum(h []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// TestAgentSockets: the lookup's answers are the kernel's sockets. A packet of an
// established connection, or one in TIME_WAIT, is this host's (decapsulated); a listener's
// port alone (no connection, no SYN cookie sent) is not (passed on).
func TestAgentSockets(t *testing.T) {
	r := newRig(t)
	var ln net.Listener
	r.kit.MustDo("be", func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(vip4, 8080).String())
		return err
	})
	t.Cleanup(func() { ln.Close() })
	dial := func() (client, server *net.TCPConn) {
		t.Helper()
		accepted := make(chan net.Conn, 1)
		go func() {
			c, err := ln.Accept()
			if err == nil {
				accepted <- c
			}
		}()
		r.kit.MustDo("be", func() error {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: local4.AsSlice()}, Timeout: 5 * time.Second}
			c, err := d.Dial("tcp", netip.AddrPortFrom(vip4, 8080).String())
			if err != nil {
				return err
			}
			client = c.(*net.TCPConn)
			return nil
		})
		server = testwait.Recv(t, accepted, 5*time.Second, "the accepted connection").(*net.TCPConn)
		return client, server
	}
	est, estServer := dial()
	t.Cleanup(func() { est.Close(); estServer.Close() })
	// TIME_WAIT on the server's side: it closes first, then the client.
	tw, twServer := dial()
	twServer.Close()
	buf := make([]byte, 1)
	tw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := tw.Read(buf); err == nil {
		t.Fatal("the server's close did not reach the client")
	}
	tw.Close()
	portOf := func(c *net.TCPConn) uint16 { return uint16(c.LocalAddr().(*net.TCPAddr).Port) }
	testwait.For(t, 5*time.Second, "the server's socket in TIME_WAIT", func() (bool, string) {
		out := r.kit.In("be", "ss", "-Htn", "state", "time-wait", "src", netip.AddrPortFrom(vip4, 8080).String())
		return out != "", out
	})
	one := gueOpts{hops: 1, second: second4}
	at := func(sport uint16) []byte {
		return frame(t, lb4, self4, port, one, innerTCP(t, local4, sport, vip4, 8080, "A"))
	}
	estIn, twIn := at(portOf(est)), at(portOf(tw))
	noConn := uint16(1)
	for noConn == portOf(est) || noConn == portOf(tw) {
		noConn++
	}
	r.check([]agentCase{
		{"established: this host's", estIn, tcOK, decapped(estIn, estIn[14+20+8+12:])},
		{"time-wait: this host's", twIn, tcOK, decapped(twIn, twIn[14+20+8+12:])},
		{"a listener alone: passed on", at(noConn), tcRedirect, nil},
	})
	r.wantCounts(map[string]uint64{"decap": 2, "second_chance": 1})
}
