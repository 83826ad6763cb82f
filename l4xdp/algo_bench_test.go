package l4xdp

import (
	"net/netip"
	"testing"
)

// BenchmarkProgRunAlgorithms: the new-connection path of weighted round robin and weighted
// least connections (a pool scanned whole, and the two choices of a larger pool) beside
// Maglev's, through BPF_PROG_RUN. BPF_PROG_RUN repeats one packet, so every backend is
// marked down (the VIP not in panic): each repeated SYN then finds its entry unusable and
// takes the whole path, uncount and delete the old entry, pick, insert, count; Maglev's
// arm does the same.
func BenchmarkProgRunAlgorithms(b *testing.B) {
	fx := setupWith(b, Options{InsertCap: -1})
	var slots []uint32
	for i := uint32(0); i < 20; i++ {
		if err := fx.f.SetBackend(i, Backend{MAC: backMACs[i%3], Alive: true, Down: true}); err != nil {
			b.Fatal(err)
		}
		if err := fx.f.SetWeight(i, 100*(1+i%3)); err != nil {
			b.Fatal(err)
		}
		slots = append(slots, i)
	}
	ws := make([]uint32, 20)
	for i := range ws {
		ws[i] = 100 * (1 + uint32(i)%3)
	}
	var sched20 []uint32
	for _, i := range Schedule(ws) {
		sched20 = append(sched20, uint32(i))
	}
	sched3 := []uint32{2, 0, 1, 2}
	vips := []VIP{
		{ID: 5, Addr: netip.AddrPortFrom(vip4, 8080), Proto: 6, Flags: FlagWRR, Table: fx.table, Schedule: sched3, Pool: slots[:3]},
		{ID: 6, Addr: netip.AddrPortFrom(vip4, 8081), Proto: 6, Flags: FlagWLC, Table: fx.table, Schedule: sched3, Pool: slots[:3]},
		{ID: 7, Addr: netip.AddrPortFrom(vip4, 8082), Proto: 6, Flags: FlagWLC, Table: fx.table, Schedule: sched20, Pool: slots},
	}
	for _, v := range vips {
		if err := fx.f.SetVIP(v); err != nil {
			b.Fatal(err)
		}
	}
	for _, arm := range []struct {
		name string
		port uint16
	}{{"maglev", 80}, {"wrr", 8080}, {"wlc-scan-3", 8081}, {"wlc-two-choices-20", 8082}} {
		syn := tcp4(b, client4, vip4, 4001, arm.port, "S", nil, nil)
		b.Run("new-flow="+arm.name, func(b *testing.B) {
			ret, d, err := fx.f.Program().Benchmark(syn, b.N, nil)
			if err != nil {
				b.Fatal(err)
			}
			if ret != xdpTX {
				b.Fatalf("action %d", ret)
			}
			b.ReportMetric(float64(d.Nanoseconds()), "ns/packet")
		})
	}
}
