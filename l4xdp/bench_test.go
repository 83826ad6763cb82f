package l4xdp

import (
	"testing"

	"github.com/cilium/ebpf"
)

// Benchmarks through BPF_PROG_RUN, in one run: the forwarder's established-flow and
// new-flow paths against the floor, a program that only swaps MACs and returns XDP_TX.
// Compare ns/packet.
func BenchmarkProgRun(b *testing.B) {
	// No insert cap: a benchmark repeats one SYN millions of times a second, which a cap
	// would turn into refused inserts after the first second's budget.
	fx := setupWith(b, Options{InsertCap: -1})
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
	bench("path=floor", loadTestProgs(b).FloorXdp, est, nil)
	bench("path=established", fx.f.Program(), est, nil)
	// New connections: a SYN skips the connection table, hashes the 5-tuple, picks from the
	// Maglev table and writes the flow's entry (an update of the same entry on every run,
	// which costs what an insert does), so every run takes the whole new-connection path.
	syn := tcp4(b, client4, vip4, 4001, 80, "S", nil, nil)
	bench("path=new-flow", fx.f.Program(), syn, nil)
	// Above the CPU's insert cap (a flood): hash and pick, no write.
	capped := setupWith(b, Options{InsertCap: 1})
	bench("path=new-flow-over-cap", capped.f.Program(), syn, nil)
}
