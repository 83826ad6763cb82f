package l4xdp

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
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
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, hdr),
		asm.JGT.Reg(asm.R4, asm.R3, "abort"),
		asm.LoadMapValue(asm.R7, tmpl.FD(), 0),
	}
	for off := int16(0); off < 48; off += 8 {
		insns = append(insns, asm.LoadMem(asm.R5, asm.R7, off, asm.DWord), asm.StoreMem(asm.R2, off, asm.R5, asm.DWord))
	}
	insns = append(insns,
		asm.LoadMem(asm.R5, asm.R7, 48, asm.Word), asm.StoreMem(asm.R2, 48, asm.R5, asm.Word),
		asm.LoadMem(asm.R5, asm.R7, 52, asm.Half), asm.StoreMem(asm.R2, 52, asm.R5, asm.Half),
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
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL", Instructions: insns})
	if err != nil {
		lt.tb.Fatalf("loading the header generator: %v", err)
	}
	lt.tp.GenXdp.Close() // loadTestProgs's cleanup closes the one in its place
	lt.tp.GenXdp = p
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
	for _, arm := range []struct {
		name  string
		setup func() func()
	}{{"floor", lt.armFloor}, {"stickylb-dr", lt.armStickylb}, {"nftables-nat", lt.armNftablesNAT}} {
		b.Run("arm="+arm.name, func(b *testing.B) {
			lt.tb = b
			undo := arm.setup()
			defer undo()
			n := uint32(max(b.N, 100000))
			b.ResetTimer()
			var r liveRun
			for try := 0; ; try++ {
				if r = lt.measure(b, n, liveBatch); len(r.moved) == 0 {
					break
				}
				if try == 4 {
					b.Fatalf("every run lost frames; the last lost %d of %d: %v", r.lost, n, r.moved)
				}
			}
			b.ReportMetric(r.pps, "pps")
			b.ReportMetric(1e9/r.pps, "ns/packet")
		})
	}
}
