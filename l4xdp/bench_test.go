package l4xdp

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// Benchmarks through BPF_PROG_RUN, in one run: the forwarder's established-flow and
// new-flow paths against the floor, a program that only swaps MACs and returns XDP_TX.
// Compare ns/packet.
func BenchmarkProgRun(b *testing.B) {
	fx := setup(b)
	est := tcp4(b, client4, vip4, 4000, 80, "A", nil, nil)
	run(b, fx.f.Program(), tcp4(b, client4, vip4, 4000, 80, "S", nil, nil)) // establish
	bench := func(name string, p *ebpf.Program, pkt []byte, reset func()) {
		b.Run(name, func(b *testing.B) {
			ret, d, err := p.Benchmark(pkt, b.N, reset)
			if err != nil {
				b.Fatal(err)
			}
			if ret != xdpTX {
				b.Fatalf("action %d", ret)
			}
			b.ReportMetric(float64(d.Nanoseconds()), "ns/packet")
		})
	}
	bench("path=floor", fx.f.FloorProgram(), est, nil)
	bench("path=established", fx.f.Program(), est, nil)
	// New flows: an RST is forwarded without being remembered, so every run takes the
	// Maglev path (connection-table miss, hash, table lookup) and leaves no entry behind.
	rst := tcp4(b, client4, netip.MustParseAddr("10.0.0.100"), 4001, 80, "R", nil, nil)
	bench("path=new-flow", fx.f.Program(), rst, nil)
}
