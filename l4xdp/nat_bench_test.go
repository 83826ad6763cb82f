package l4xdp

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/stickylb/stickylb/internal/testkit/netnstest"
	"github.com/stickylb/stickylb/policies/chash"
)

// NAT benchmarks: BPF_PROG_RUN ns/packet of an established NAT flow beside an established
// DR flow and the floor, and live frames through the LB's veth: our NAT against the
// kernel's (nftables DNAT + SNAT in the inet family, conntrack, the stack forwarding), with
// our DR arm and the floor for scale. bench/xdp.sh prints the ratios.

// Addresses of the live NAT pipeline (newLiveTopo's, with IP): the LB's client side on l0,
// its backend side on l1 (the NAT source), backends whose MACs (permanent neighbours) are
// liveBackendMACs, so the sink counts them as the DR arms' backends.
const (
	natLiveClientSide = "192.0.2.1/24" // client4 is on it
	natLiveSource     = "10.0.3.1"
	natLiveSubnet     = "10.0.3.0/24"
)

func natLiveBackend(i int) string { return fmt.Sprintf("10.0.3.%d", 2+i) }

// newNATLiveTopo is newLiveTopo with addresses, neighbours and forwarding on (the nftables
// arm forwards through the stack, and bpf_fib_lookup answers only on an interface that
// forwards), and with a generator that writes each frame's headers whole.
func newNATLiveTopo(tb testing.TB) *liveTopo {
	lt := newLiveTopo(tb)
	lt.useHeaderGenerator()
	lt.in("lb", "ip", "addr", "add", natLiveClientSide, "dev", "l0")
	lt.in("lb", "ip", "addr", "add", natLiveSource+"/24", "dev", "l1")
	for i, mac := range liveBackendMACs {
		lt.in("lb", "ip", "neigh", "replace", natLiveBackend(i), "lladdr", mac.String(), "dev", "l1", "nud", "permanent")
	}
	lt.in("lb", "sysctl", "-qw", "net.ipv4.ip_forward=1")
	return lt
}

// useHeaderGenerator replaces the live-frames generator with one that writes the frame's
// first 54 bytes (Ethernet, IPv4, TCP ports and the rest of the TCP header) from a template
// before setting the flow's source port. Live frames recycle their pages with what the
// frame last held: gen_xdp rewrites only MACs and the port, which is enough while the LB
// rewrites only MACs, but a NAT arm rewrites addresses and ports, and a recycled page would
// start its next frame already translated (the stack drops those: their source is the LB's
// own address).
func (lt *liveTopo) useHeaderGenerator() {
	lt.tb.Helper()
	const hdr = 14 + 20 + 20
	tmpl, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 64, MaxEntries: 1})
	if err != nil {
		lt.tb.Fatal(err)
	}
	lt.tb.Cleanup(func() { tmpl.Close() })
	val := make([]byte, 64) // the header, then at 56 the frame counter
	copy(val, lt.frame[:hdr])
	copy(val[0:6], lt.mac["l0"])
	copy(val[6:12], lt.mac["c0"])
	if err := tmpl.Put(uint32(0), val); err != nil {
		lt.tb.Fatal(err)
	}
	insns := writeBytes(tmpl, hdr)
	insns = append(insns,
		// One CPU runs the generator: a plain increment.
		asm.LoadMem(asm.R5, asm.R7, 56, asm.DWord),
		asm.Add.Imm(asm.R5, 1),
		asm.StoreMem(asm.R7, 56, asm.R5, asm.DWord),
		asm.Mod.Imm(asm.R5, liveFlows),
		asm.Add.Imm(asm.R5, liveBasePort),
		asm.HostTo(asm.BE, asm.R5, asm.Half),
		asm.StoreMem(asm.R2, 14+20, asm.R5, asm.Half),
		asm.Mov.Imm(asm.R0, xdpTX),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("abort"), // XDP_ABORTED
		asm.Return(),
	)
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, AttachType: ebpf.AttachXDP, License: "GPL", Instructions: insns})
	if err != nil {
		lt.tb.Fatalf("loading the header generator: %v", err)
	}
	lt.tp.GenXdp.Close() // loadTestProgs's cleanup closes the one in its place
	lt.tp.GenXdp = p
}

// writeBytes is the start of a program that copies the first n bytes of the single value
// of array map tmpl over the packet's first n bytes (n a multiple of 2), jumping to "abort"
// when the packet is shorter. It leaves the packet's start in R2 and the value in R7.
func writeBytes(tmpl *ebpf.Map, n int16) asm.Instructions {
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, int32(n)),
		asm.JGT.Reg(asm.R4, asm.R3, "abort"),
		asm.LoadMapValue(asm.R7, tmpl.FD(), 0),
	}
	off := int16(0)
	for _, sz := range []asm.Size{asm.DWord, asm.Word, asm.Half} {
		for ; off+int16(sz.Sizeof()) <= n; off += int16(sz.Sizeof()) {
			insns = append(insns, asm.LoadMem(asm.R5, asm.R7, off, sz), asm.StoreMem(asm.R2, off, asm.R5, sz))
		}
	}
	return insns
}

// restoring returns a program that writes pkt over its input and tail-calls target. A
// repeated BPF_PROG_RUN hands every run the buffer the previous run left: a program that
// rewrites addresses (NAT) would see its own output from the second run on. Every arm of
// BenchmarkProgRunNAT runs behind this program, so all pay the same copy and tail call;
// forget, when given, are map entries it deletes first (the new-flow arm's: every run
// starts its flow afresh), which only that arm pays.
func restoring(tb testing.TB, pkt []byte, target *ebpf.Program, forget ...mapKey) *ebpf.Program {
	tb.Helper()
	size := (len(pkt) + 7) &^ 7
	val := make([]byte, size)
	copy(val, pkt)
	var offs []int32
	for _, f := range forget {
		offs = append(offs, int32(len(val)))
		val = append(val, f.key...)
	}
	tmpl, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: uint32((len(val) + 7) &^ 7), MaxEntries: 1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tmpl.Close() })
	val = append(val, make([]byte, int(tmpl.ValueSize())-len(val))...)
	if err := tmpl.Put(uint32(0), val); err != nil {
		tb.Fatal(err)
	}
	insns := append(asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1)}, writeBytes(tmpl, int16(len(pkt)&^1))...)
	for i, f := range forget { // R7 is the template: each key lies in it
		insns = append(insns,
			asm.LoadMapPtr(asm.R1, f.m.FD()),
			asm.Mov.Reg(asm.R2, asm.R7),
			asm.Add.Imm(asm.R2, offs[i]),
			asm.FnMapDeleteElem.Call(),
		)
	}
	return tailCalling(tb, "the restoring program", insns, target)
}

// tailCalling loads an XDP program of insns, which leave the context in R6, then a tail
// call to target. A tail call that fails, or a jump in insns to "abort", returns
// XDP_ABORTED; a jump to "tail" skips to the tail call.
func tailCalling(tb testing.TB, what string, insns asm.Instructions, target *ebpf.Program) *ebpf.Program {
	tb.Helper()
	jump, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { jump.Close() })
	insns = append(insns,
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("tail"),
		asm.LoadMapPtr(asm.R2, jump.FD()),
		asm.Mov.Imm(asm.R3, 0),
		asm.FnTailCall.Call(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("abort"), // XDP_ABORTED
		asm.Return(),
	)
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, AttachType: ebpf.AttachXDP, License: "GPL", Instructions: insns})
	if err != nil {
		tb.Fatalf("loading %s: %v", what, err)
	}
	tb.Cleanup(func() { p.Close() })
	if err := jump.Put(uint32(0), target); err != nil {
		tb.Fatalf("installing the tail call: %v", err)
	}
	return p
}

// mapKey is an entry of a map, by its key's bytes.
type mapKey struct {
	m   *ebpf.Map
	key []byte
}

// armNftablesNAT passes frames to the stack on l0 (a veth takes XDP_TX'd frames only while
// an XDP program runs on it), where nftables in the inet family does what a user would
// write for NAT without XDP: DNAT in prerouting to a backend picked by a jhash of the
// client's address and port, SNAT in postrouting to the LB's address on the backends' side;
// conntrack keeps each flow's translation, and the stack routes and forwards. Conntrack
// verifies no checksums and tracks TCP windows liberally: the generator rewrites the source
// port without the checksum, and sends the same segment again and again.
func (lt *liveTopo) armNftablesNAT() func() {
	pass, err := LoadPass()
	if err != nil {
		lt.tb.Fatal(err)
	}
	l := lt.attach("lb", "l0", pass)
	var addrs []string
	for i := range liveBackendMACs {
		addrs = append(addrs, fmt.Sprintf("%d : %s", i, natLiveBackend(i)))
	}
	rules := fmt.Sprintf(`table inet slnat {
	chain pre {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr %s tcp dport 80 dnat ip to jhash ip saddr . tcp sport mod %d map { %s }
	}
	chain post {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "l1" ip daddr %s snat ip to %s
	}
}
`, vip4, len(addrs), strings.Join(addrs, ", "), natLiveSubnet, natLiveSource)
	lt.in("lb", "sh", "-c", "nft -f - <<'EOF'\n"+rules+"EOF\n")
	lt.in("lb", "sysctl", "-qw", "net.netfilter.nf_conntrack_checksum=0", "net.netfilter.nf_conntrack_tcp_be_liberal=1")
	return func() {
		lt.in("lb", "nft", "delete", "table", "inet", "slnat")
		l.Close()
		pass.Close()
	}
}

// BenchmarkLiveNAT: packets/s at the backends through our NAT and nftables' (DNAT + SNAT,
// conntrack), fed by one generator in one run, beside our DR arm and the floor. Flows are
// established before timing (measure's first pass sends every flow once). Compare the pps
// and ns/packet metrics; bench/xdp.sh prints the ratios.
func BenchmarkLiveNAT(b *testing.B) {
	lt := newNATLiveTopo(b)
	lt.runArms(b, []liveArm{{"floor", lt.armFloor}, {"stickylb-dr", lt.armStickylb}, {"stickylb-nat", lt.armStickylbNAT},
		{"nftables-nat", lt.armNftablesNAT}})
}

// progRunNATArm is one arm of BenchmarkProgRunNAT: a packet, what the program must answer,
// and the map entries each run deletes first.
type progRunNATArm struct {
	name   string
	p      *ebpf.Program
	pkt    []byte
	want   uint32
	forget []mapKey
}

// benchProgRunArms runs each arm behind restoring, on a thread in namespace ns of kit (where
// bpf_fib_lookup finds its routes: BPF_PROG_RUN's packets arrive on that namespace's lo).
func benchProgRunArms(b *testing.B, kit *netnstest.Kit, ns string, arms []progRunNATArm) {
	for _, arm := range arms {
		p := restoring(b, arm.pkt, arm.p, arm.forget...)
		b.Run("path="+arm.name, func(b *testing.B) {
			var ret uint32
			var d time.Duration
			err := kit.Do(ns, func() (err error) {
				ret, d, err = p.Benchmark(arm.pkt, b.N, nil)
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			if ret != arm.want {
				b.Fatalf("action %d, want %d", ret, arm.want)
			}
			b.ReportMetric(float64(d.Nanoseconds()), "ns/packet")
		})
	}
}

// natBackend4 is BenchmarkProgRunNAT's NAT backend, behind the LB's NAT source natSource4.
var (
	natSource4  = netip.MustParseAddr("10.0.3.1")
	natBackend4 = netip.MustParseAddrPort("10.0.3.2:80")
)

// BenchmarkProgRunNAT: ns/packet through BPF_PROG_RUN of an established NAT flow, each
// way (the client's packet translated toward the backend, the backend's reply translated
// back; both routed by bpf_fib_lookup, so each ends in a redirect), beside an established
// DR flow and the floor, in one run. Every arm runs behind the same restoring program.
// The routes and neighbours bpf_fib_lookup answers from are a namespace of the
// benchmark's own: the backend's subnet and the client's on one veth, with permanent
// neighbours.
func BenchmarkProgRunNAT(b *testing.B) {
	kit := netnstest.New(b, "pn")
	kit.AddNS("lb")
	kit.Veth("lb", "n0", "lb", "n1")
	kit.In("lb", "ip", "addr", "add", natSource4.String()+"/24", "dev", "n0")
	kit.In("lb", "ip", "addr", "add", "192.0.2.1/24", "dev", "n0")
	kit.In("lb", "ip", "neigh", "replace", natBackend4.Addr().String(), "lladdr", backMACs[1].String(), "dev", "n0", "nud", "permanent")
	kit.In("lb", "ip", "neigh", "replace", client4.String(), "lladdr", clientMAC.String(), "dev", "n0", "nud", "permanent")
	kit.In("lb", "sysctl", "-qw", "net.ipv4.ip_forward=1") // bpf_fib_lookup answers only where forwarding is on
	f, err := loadTables(Options{InsertCap: -1}, NAT{Sources: []netip.Addr{natSource4}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	if err := f.SetBackend(0, Backend{MAC: backMACs[0], Alive: true}); err != nil {
		b.Fatal(err)
	}
	if err := f.SetBackend(1, Backend{MAC: make(net.HardwareAddr, 6), NAT: true, Addr: natBackend4, Alive: true}); err != nil {
		b.Fatal(err)
	}
	for i, port := range []uint16{80, 81} { // VIP 1: DR to slot 0; VIP 2: NAT to slot 1
		table := make([]uint32, 65537)
		for j := range table {
			table[j] = uint32(i)
		}
		if err := f.SetVIP(VIP{ID: uint32(i + 1), Addr: netip.AddrPortFrom(vip4, port), Proto: 6, Table: table}); err != nil {
			b.Fatal(err)
		}
	}
	// Establish both flows; the NAT flow's source port is the one its SYN left with, and its
	// handshake completes (the backend's SYN-ACK, the client's ACK of it), so that its packets
	// take the established path.
	natSeg := func(fromClient bool, flags string, seq, ack uint32, port uint16) []byte {
		if fromClient {
			return natfxPkt{dstMAC: lbMAC, srcMAC: clientMAC, src: client4, dst: vip4, sport: 4000, dport: 81, proto: 6,
				flags: flags, payload: []byte("hello")}.at(seq, ack).frame(b)
		}
		return natfxPkt{dstMAC: lbMAC, srcMAC: backMACs[1], src: natBackend4.Addr(), dst: natSource4, sport: natBackend4.Port(),
			dport: port, proto: 6, flags: flags, payload: []byte("hello")}.at(seq, ack).frame(b)
	}
	const isnClient, isnBackend = 1000, 7000
	syn := natfxPkt{dstMAC: lbMAC, srcMAC: clientMAC, src: client4, dst: vip4, sport: 4000, dport: 81, proto: 6, flags: "S"}.at(isnClient, 0).frame(b)
	var out []byte
	kit.MustDo("lb", func() error {
		if ret, _ := run(b, f.Program(), tcp4(b, client4, vip4, 4000, 80, "S", nil, nil)); ret != xdpTX {
			return fmt.Errorf("the DR SYN: action %d", ret)
		}
		var ret uint32
		if ret, out = run(b, f.Program(), syn); ret != benchXDPRedirect {
			return fmt.Errorf("the NAT SYN: action %d, want a redirect (to n0)", ret)
		}
		port := binary.BigEndian.Uint16(out[14+20:])
		for _, p := range [][]byte{natSeg(false, "SA", isnBackend, isnClient+1, port), natSeg(true, "A", isnClient+1, isnBackend+1, 0)} {
			if ret, _ := run(b, f.Program(), p); ret != benchXDPRedirect {
				return fmt.Errorf("the NAT handshake: action %d", ret)
			}
		}
		return nil
	})
	natPort := binary.BigEndian.Uint16(out[14+20:])
	// The backend's data, in sequence (the first run moves its sequence number on; the next
	// ones are the same segment again, as far as the program can tell: the same work).
	reply := natSeg(false, "PA", isnBackend+1, isnClient+1, natPort)
	est := tcp4(b, client4, vip4, 4000, 80, "A", nil, nil)
	// A new NAT flow: each run deletes its connection and reply entries first, so each one
	// picks, claims a port (the first it probes, the flow's own hash's) and writes both.
	newFlow := natfxPkt{dstMAC: lbMAC, srcMAC: clientMAC, src: client4, dst: vip4, sport: 4001, dport: 81, proto: 6, flags: "S"}.at(isnClient, 0).frame(b)
	var newPort uint16
	kit.MustDo("lb", func() error {
		ret, out := run(b, f.Program(), newFlow)
		if ret != benchXDPRedirect {
			return fmt.Errorf("the new NAT flow's SYN: action %d", ret)
		}
		newPort = binary.BigEndian.Uint16(out[14+20:])
		return nil
	})
	nk := lbNatKey{Lb: natSource4.As16(), Backend: natBackend4.Addr().As16(), Proto: 6}
	binary.BigEndian.PutUint16((*[2]byte)(unsafeSlice(&nk.LbPort))[:], newPort)
	binary.BigEndian.PutUint16((*[2]byte)(unsafeSlice(&nk.BackendPort))[:], natBackend4.Port())
	forget := []mapKey{{f.objs.Conns, keyBytes(b, flowKey(client4, vip4, 4001, 81, 6))}, {f.objs.NatRev, keyBytes(b, nk)}}
	benchProgRunArms(b, kit, "lb", []progRunNATArm{
		{"floor", loadTestProgs(b).FloorXdp, est, xdpTX, nil},
		{"fib-lookup", fibLookupOnly(b, natSource4, natBackend4.Addr()), est, xdpTX, nil},
		{"dr-established", f.Program(), est, xdpTX, nil},
		{"nat-established", f.Program(), tcp4(b, client4, vip4, 4000, 81, "A", nil, nil), benchXDPRedirect, nil},
		{"nat-reply", f.Program(), reply, benchXDPRedirect, nil},
		{"nat-new-flow", f.Program(), newFlow, benchXDPRedirect, forget},
	})
}

// keyBytes is a map key's bytes, as the kernel holds them.
func keyBytes(tb testing.TB, k any) []byte {
	tb.Helper()
	b, err := binary.Append(nil, binary.NativeEndian, k)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// fibLookupOnly returns a program that does what the floor does beside one bpf_fib_lookup
// from src to dst (IPv4, from the packet's ingress interface), answering XDP_TX when the
// lookup succeeds: the share of a NAT packet's cost that is the kernel's FIB, which DR
// does not pay.
func fibLookupOnly(tb testing.TB, src, dst netip.Addr) *ebpf.Program {
	tb.Helper()
	const p = -64 // struct bpf_fib_lookup (64 bytes) on the stack
	le := func(a netip.Addr) int64 { b := a.As4(); return int64(int32(binary.NativeEndian.Uint32(b[:]))) }
	insns := asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1), asm.Mov.Imm(asm.R1, 0)}
	for off := int16(p); off < 0; off += 8 {
		insns = append(insns, asm.StoreMem(asm.RFP, off, asm.R1, asm.DWord))
	}
	insns = append(insns,
		asm.StoreImm(asm.RFP, p+0, 2, asm.Byte),   // family: AF_INET
		asm.StoreImm(asm.RFP, p+1, 6, asm.Byte),   // l4_protocol: TCP
		asm.LoadMem(asm.R2, asm.R6, 12, asm.Word), // ctx->ingress_ifindex
		asm.StoreMem(asm.RFP, p+8, asm.R2, asm.Word),
		asm.StoreImm(asm.RFP, p+16, le(src), asm.Word), // ipv4_src, network order
		asm.StoreImm(asm.RFP, p+32, le(dst), asm.Word), // ipv4_dst
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, p),
		asm.Mov.Imm(asm.R3, 64),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnFibLookup.Call(),
		asm.JNE.Imm(asm.R0, 0, "fail"), // BPF_FIB_LKUP_RET_SUCCESS is 0
		asm.Mov.Imm(asm.R0, xdpTX),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("fail"), // XDP_ABORTED
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, AttachType: ebpf.AttachXDP, License: "GPL", Instructions: insns})
	if err != nil {
		tb.Fatalf("loading the FIB lookup program: %v", err)
	}
	tb.Cleanup(func() { prog.Close() })
	return prog
}

// armStickylbNAT attaches the forwarder to l0 with the three backends reached by NAT from
// natLiveSource (bpf_fib_lookup: out of l1, redirected), a fresh table each time.
func (lt *liveTopo) armStickylbNAT() func() {
	f, err := loadTables(Options{}, NAT{Sources: []netip.Addr{netip.MustParseAddr(natLiveSource)}})
	if err != nil {
		lt.tb.Fatal(err)
	}
	hosts := []chash.Host{{ID: "b1", Weight: 1}, {ID: "b2", Weight: 1}, {ID: "b3", Weight: 1}}
	table := maglevSlots(lt.tb, hosts...)
	for i := range liveBackendMACs {
		addr := netip.AddrPortFrom(netip.MustParseAddr(natLiveBackend(i)), 80)
		if err := f.SetBackend(uint32(i), Backend{MAC: make(net.HardwareAddr, 6), NAT: true, Addr: addr, Alive: true}); err != nil {
			lt.tb.Fatal(err)
		}
	}
	if err := f.SetVIP(VIP{ID: 1, Addr: netip.AddrPortFrom(vip4, 80), Proto: 6, Table: table}); err != nil {
		lt.tb.Fatal(err)
	}
	l := lt.attach("lb", "l0", f.Program())
	return func() {
		l.Close()
		f.Close()
	}
}

// benchXDPRedirect is XDP_REDIRECT, what a NAT arm ends in (bpf_fib_lookup names another
// interface than BPF_PROG_RUN's lo).
const benchXDPRedirect = 4
