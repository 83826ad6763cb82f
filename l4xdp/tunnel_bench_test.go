package l4xdp

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/google/gopacket/layers"

	"github.com/stickylb/stickylb/internal/testkit/netnstest"
)

// restoringHead is restoring (nat_bench_test.go) for programs that move the packet's start:
// it first gives back what the previous run's encapsulation added in front (a repeated
// BPF_PROG_RUN hands every run the buffer, and the start, the previous run left), then
// writes pkt over the input and tail-calls target. Every arm of BenchmarkProgRunTunnel runs
// behind it, so all pay the same.
func restoringHead(tb testing.TB, pkt []byte, target *ebpf.Program) *ebpf.Program {
	tb.Helper()
	inner := restoring(tb, pkt, target)
	return tailCalling(tb, "the head-restoring program", asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
		asm.Sub.Reg(asm.R3, asm.R2),              // the frame's length
		asm.JLE.Imm(asm.R3, int32(len(pkt)), "tail"),
		asm.Sub.Imm(asm.R3, int32(len(pkt))),
		asm.Mov.Reg(asm.R2, asm.R3),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.FnXdpAdjustHead.Call(), // give the added headers back
	}, inner)
}

// BenchmarkProgRunTunnel: ns/packet through BPF_PROG_RUN of a packet of an established flow
// forwarded by tunnel (GUE encapsulation, next hop and MTU from the FIB's answer of the
// last second), beside an established DR flow, the floor (MAC swap, XDP_TX) and the floor of
// encapsulation (encap_floor_xdp: room for the outer headers written from a template with
// the packet's lengths and checksum, nothing looked up), in one run; and the packet of a
// flow this node did not see start (not remembered: the second-chance table at every
// packet, the secondary in the header). Goal: tunnel at most 1.3x DR. Every arm runs
// behind the same restoring program, on a thread in a namespace of the benchmark's own
// (the tunnel's route and neighbour: permanent).
func BenchmarkProgRunTunnel(b *testing.B) {
	kit := netnstest.New(b, "pt")
	kit.AddNS("lb")
	kit.Veth("lb", "n0", "lb", "n1")
	src, far := netip.MustParseAddr("10.0.3.1"), netip.MustParseAddr("10.0.3.2")
	kit.In("lb", "ip", "addr", "add", src.String()+"/24", "dev", "n0")
	kit.In("lb", "ip", "neigh", "replace", far.String(), "lladdr", backMACs[1].String(), "dev", "n0", "nud", "permanent")
	kit.In("lb", "ip", "neigh", "replace", "10.0.3.3", "lladdr", backMACs[2].String(), "dev", "n0", "nud", "permanent")
	kit.In("lb", "sysctl", "-qw", "net.ipv4.ip_forward=1")
	f, err := loadTables(Options{InsertCap: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	if err := f.configureTunnel(src, netip.Addr{}); err != nil {
		b.Fatal(err)
	}
	for slot, be := range []Backend{{MAC: backMACs[0], Alive: true},
		{MAC: backMACs[0], Alive: true, Tunnel: true, Addr: netip.AddrPortFrom(far, 6080)},
		{MAC: backMACs[0], Alive: true, Tunnel: true, Addr: netip.MustParseAddrPort("10.0.3.3:6080")}} {
		if err := f.SetBackend(uint32(slot), be); err != nil {
			b.Fatal(err)
		}
	}
	fill := func(slot uint32) []uint32 {
		t := make([]uint32, 4099)
		for i := range t {
			t[i] = slot
		}
		return t
	}
	for _, v := range []VIP{{ID: 1, Addr: netip.AddrPortFrom(vip4, 80), Proto: 6, Table: fill(0)},
		{ID: 2, Addr: netip.AddrPortFrom(vip4, 81), Proto: 6, Flags: FlagTunnel, Table: fill(1), Second: fill(2)}} {
		if err := f.SetVIP(v); err != nil {
			b.Fatal(err)
		}
	}
	tp := loadTestProgs(b)
	tmpl := tunnelTemplate(b, src, far)
	if err := tp.EncapTmpl.Put(uint32(0), tmpl); err != nil {
		b.Fatal(err)
	}
	// Established flows: their SYNs first, in the namespace (the tunnel's asks the FIB).
	kit.MustDo("lb", func() error {
		for _, port := range []uint16{80, 81} {
			if _, err := f.Program().Run(&ebpf.RunOptions{Data: tcp4(b, client4, vip4, 4000, port, "S", nil, nil), DataOut: make([]byte, 512)}); err != nil {
				return err
			}
		}
		return nil
	})
	// 100 bytes of payload: a frame past Ethernet's 60-byte minimum, which the tunnel would
	// cut (trailing padding), and no restoring puts back.
	pkt := func(sport, port uint16) []byte {
		return natfxPkt{dstMAC: lbMAC, srcMAC: clientMAC, src: client4, dst: vip4, sport: sport, dport: port, proto: 6,
			flags: "A", payload: make([]byte, 100)}.frame(b)
	}
	est := func(port uint16) []byte { return pkt(4000, port) }
	benchProgRunArms(b, kit, "lb", []progRunNATArm{
		{"floor", restoringHead(b, est(80), tp.FloorXdp), est(80), xdpTX, nil},
		{"encap-floor", restoringHead(b, est(81), tp.EncapFloorXdp), est(81), xdpTX, nil},
		{"dr-established", restoringHead(b, est(80), f.Program()), est(80), xdpTX, nil},
		// The tunnel's route is n0's, the packet arrives on lo: a redirect (as NAT's arms).
		{"tunnel-established", restoringHead(b, est(81), f.Program()), est(81), xdpRedirectAction, nil},
		// A flow that moved here: an ACK of no entry, hashed and looked up in the
		// second-chance table at every packet, the secondary written into the header.
		{"tunnel-moved-flow", restoringHead(b, pkt(4001, 81), f.Program()), pkt(4001, 81), xdpRedirectAction, nil},
	})
}

// tunnelTemplate is encap_floor_xdp's outer headers toward far: Ethernet, IPv4 from src,
// UDP to 6080, the GUE header with stickylb's private data (no secondary).
func tunnelTemplate(tb testing.TB, src, far netip.Addr) []byte {
	tb.Helper()
	ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP,
		SrcIP: src.AsSlice(), DstIP: far.AsSlice()}
	udp := &layers.UDP{SrcPort: 0xc123, DstPort: 6080}
	udp.SetNetworkLayerForChecksum(ip)
	frame := serialize(tb, eth(backMACs[1], lbMAC, layers.EthernetTypeIPv4), ip, udp)
	out := make([]byte, 56)
	copy(out, frame)
	copy(out[14+20+8:], []byte{2, 4, 0, 0, 0x53, 0, 0, 0, 0, 0, 0, 0})
	return out
}
