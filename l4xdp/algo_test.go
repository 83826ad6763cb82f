package l4xdp

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Fixtures for the weighted round-robin and weighted-least-connections picks. The program
// keeps each CPU's place in a schedule, so the test runs every packet on one CPU; expected
// backends come from the smooth weighted round robin worked by hand (WRR) or from a model
// of the rule written here (WLC), never from the program.

// onOneCPU pins the test's goroutine to one thread on CPU 0 until the test ends.
func onOneCPU(t testing.TB) {
	t.Helper()
	runtime.LockOSThread()
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Fatal(err)
	}
	one.Set(0)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	})
}

func activeOf(t *testing.T, f *Tables, slot uint32) int64 {
	t.Helper()
	n, err := f.Active(slot)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func setWeights(t *testing.T, f *Tables, ws map[uint32]uint32) {
	t.Helper()
	for slot, w := range ws {
		if err := f.SetWeight(slot, w); err != nil {
			t.Fatal(err)
		}
	}
}

func TestScheduleIsSmoothWRR(t *testing.T) {
	// nginx's example: {5, 1, 1} -> a a b a c a a.
	if got, want := fmt.Sprint(Schedule([]uint32{500, 100, 100})), "[0 0 1 0 2 0 0]"; got != want {
		t.Fatalf("schedule %s, want %s", got, want)
	}
	// Sums past the largest table are scaled down, each backend kept.
	s := Schedule([]uint32{1 << 20, 1})
	if len(s) > MaxTableSize || s[len(s)-1] != 1 && s[0] != 1 && !contains(s, 1) {
		t.Fatalf("scaled schedule of %d entries without backend 1", len(s))
	}
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// wrrFixture: a VIP of weights 3 (slot 0) and 1 (slot 2), whose smooth WRR schedule is a a
// b a, on one CPU.
func wrrFixture(t *testing.T, fx *fixture) packetScenario {
	const port = 8080
	seq := []int{0, 0, 2, 0}
	v := VIP{ID: 5, Addr: netip.AddrPortFrom(vip4, port), Proto: 6, Flags: FlagWRR, Table: fx.table,
		Schedule: []uint32{0, 0, 2, 0}, Pool: []uint32{0, 2}}
	syn := func(sport uint16, want int, what string) packetCase {
		return tx(what, tcp4(t, client4, vip4, sport, port, "S", nil, nil), tcp4(t, client4, vip4, sport, port, "S", nil, backMACs[want]))
	}
	// A non-SYN miss (a flow that started on another node) goes by the Maglev table, where
	// the schedule would have sent it elsewhere (slot 0 is next).
	mid := uint16(6000 + discriminating(t, func(i int) bool {
		return fx.expect(flowHash(client4, vip4, uint16(6000+i), port, 6, false)) != seq[0]
	}))
	midB := fx.expect(flowHash(client4, vip4, mid, port, 6, false))
	// Above the insert cap a new flow is not remembered, so its later packets will go by the
	// Maglev table: its SYN goes there too, not to the schedule's next (slot 0 after the
	// SYN of the last round).
	over := uint16(7000 + discriminating(t, func(i int) bool {
		return fx.expect(flowHash(client4, vip4, uint16(7000+i), port, 6, false)) != seq[1]
	}))
	overB := fx.expect(flowHash(client4, vip4, over, port, 6, false))
	return packetScenario{name: "weighted round robin", rig: drRigOnOneCPU, cases: cat(
		[]packetCase{
			step("VIP 5, WRR over slots 0 and 2, weights 300 and 100", func(t *testing.T, r *packetRig) {
				setVIP(v)(t, r)
				setWeights(t, r.f, map[uint32]uint32{0: 300, 2: 100})
			}),
			syn(5000, seq[0], "first SYN"),
			syn(5001, seq[1], "second SYN"),
			// A retransmitted SYN follows its entry and takes no turn of the schedule.
			syn(5000, seq[0], "retransmitted SYN"),
			syn(5002, seq[2], "third SYN (after a retransmission)"),
			syn(5003, seq[3], "fourth SYN"),
		},
		each(0, 8, func(i int) []packetCase {
			return []packetCase{syn(uint16(5100+i), seq[i%4], fmt.Sprintf("SYN %d of the second round", i))}
		}),
		[]packetCase{
			// 3 + 1 + 6 + 2 connections; the retransmission counts no second time.
			then("active connections", func(t *testing.T, r *packetRig) {
				if a0, a2 := activeOf(t, r.f, 0), activeOf(t, r.f, 2); a0 != 9 || a2 != 3 {
					t.Fatalf("active: slot 0 %d (want 9), slot 2 %d (want 3)", a0, a2)
				}
			}),
			counts(map[string]uint64{"wrr": 12}),
			tx("mid-stream ACK", tcp4(t, client4, vip4, mid, port, "A", nil, nil), tcp4(t, client4, vip4, mid, port, "A", nil, backMACs[midB])),
			counts(map[string]uint64{"midstream": 1, "wrr": 12}),
			syn(5200, seq[0], "the schedule did not move for the mid-stream flow"),
			step("this CPU's inserts for the second spent", func(t *testing.T, r *packetRig) { setInsertBudget(t, r.f, 1<<40) }),
			syn(over, overB, "a SYN above the insert cap goes by the Maglev table"),
			tx("and so does its next packet", tcp4(t, client4, vip4, over, port, "A", nil, nil), tcp4(t, client4, vip4, over, port, "A", nil, backMACs[overB])),
			counts(map[string]uint64{"wrr": 13, "insert_refused": 2}),
		})}
}

// wlcModel is the pick the program documents: the first candidate is the CPU's next
// schedule entry; a pool scanned whole replaces it with any backend of strictly fewer active
// connections per weight.
type wlcModel struct {
	sched  []uint32
	pos    int
	pool   []uint32
	weight map[uint32]int64
	active map[uint32]int64
}

func (m *wlcModel) pick() uint32 {
	best := m.sched[m.pos%len(m.sched)]
	m.pos++
	for _, s := range m.pool {
		if m.active[s]*m.weight[best] < m.active[best]*m.weight[s] {
			best = s
		}
	}
	m.active[best]++
	return best
}

func TestFixtureWLC(t *testing.T) {
	onOneCPU(t)
	fx := setup(t)
	const port = 8081
	ws := map[uint32]uint32{0: 100, 1: 100, 2: 200}
	// Smooth WRR over {1, 1, 2}: c a b c.
	m := &wlcModel{sched: []uint32{2, 0, 1, 2}, pool: []uint32{0, 1, 2},
		weight: map[uint32]int64{0: 100, 1: 100, 2: 200}, active: map[uint32]int64{}}
	v := VIP{ID: 6, Addr: netip.AddrPortFrom(vip4, port), Proto: 6, Flags: FlagWLC, Table: fx.table,
		Schedule: m.sched, Pool: m.pool}
	if err := fx.f.SetVIP(v); err != nil {
		t.Fatal(err)
	}
	setWeights(t, fx.f, ws)
	send := func(sport uint16, flags string, want int, what string) {
		t.Helper()
		ret, out := run(t, fx.f.Program(), tcp4(t, client4, vip4, sport, port, flags, nil, nil))
		check(t, what, ret, out, xdpTX, tcp4(t, client4, vip4, sport, port, flags, nil, backMACs[want]))
	}
	// Long-lived connections on slot 0 (opened elsewhere in the schedule's eyes: counts
	// put there by the test), then new connections go to the others until per-weight
	// counts even out.
	if err := fx.f.objs.Active.Put(uint32(0), int64(4)); err != nil {
		t.Fatal(err)
	}
	m.active[0] = 4
	got := map[uint32]int{}
	for i := 0; i < 12; i++ {
		want := m.pick()
		send(uint16(7000+i), "S", int(want), fmt.Sprintf("SYN %d", i))
		send(uint16(7000+i), "A", int(want), fmt.Sprintf("ACK %d", i))
		got[want]++
	}
	if got[0] != 0 {
		t.Errorf("slot 0 held 4 connections yet took %d of the first 12", got[0])
	}
	for s, n := range m.active {
		if a := activeOf(t, fx.f, s); a != n {
			t.Errorf("slot %d: active %d, model %d", s, a, n)
		}
	}
	// The counts even out: 4 / 100, then slots 1 and 2 at 4 / 100 and 8 / 200.
	if m.active[1]*200 != m.active[2]*100 || m.active[1] != 4 {
		t.Errorf("model counts %v did not even out", m.active)
	}
	// A SYN on an established entry is a new connection (a reused port): it re-picks, the
	// old one leaves its backend's count.
	old := entryBackend(t, fx.f, 7000, port)
	m.active[uint32(old)]--
	want := m.pick()
	send(7000, "S", int(want), "SYN on an established entry re-picks")
	send(7000, "S", int(want), "its retransmission follows the entry")
	// FIN and RST from the client take a connection off once, however often they come.
	for i := 0; i < 12; i++ {
		sport := uint16(7000 + i)
		flags := "F"
		if i%2 == 0 {
			flags = "R"
		}
		b := entryBackend(t, fx.f, sport, port)
		send(sport, flags, b, "close "+flags)
		if flags == "F" {
			send(sport, "F", b, "retransmitted FIN")
			send(sport, "A", b, "last ACK after FIN (entry kept)")
		}
	}
	var total int64
	for s := uint32(0); s < 3; s++ {
		total += activeOf(t, fx.f, s)
	}
	if total != 4 { // the 4 put there by the test
		t.Fatalf("after every close %d active, want the 4 long-lived", total)
	}
	// Recount puts a count that drifted (an eviction, say) back to what the table holds.
	if err := fx.f.objs.Active.Put(uint32(0), int64(57)); err != nil {
		t.Fatal(err)
	}
	if err := fx.f.Recount(); err != nil {
		t.Fatal(err)
	}
	if a := activeOf(t, fx.f, 0); a != 0 {
		t.Fatalf("after Recount slot 0 has %d, want 0 (no counted entry)", a)
	}
}

// entryBackend reads the backend slot the connection table holds for a client4 flow.
func entryBackend(t *testing.T, f *Tables, sport, dport uint16) int {
	t.Helper()
	k := lbFlow{Proto: 6}
	k.Src, k.Dst = client4.As16(), vip4.As16()
	k.Sport, k.Dport = htons(sport), htons(dport)
	var c lbConn
	if err := f.objs.Conns.Lookup(k, &c); err != nil {
		t.Fatalf("flow %d: %v", sport, err)
	}
	return int(c.Backend)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// The same flows' SYNs, then FINs, played on two CPUs at once (two threads pinned apart,
// as a SYN retransmitted while the first is handled elsewhere): each flow is counted once
// and taken off once, whatever the interleaving.
func TestActiveCountsAcrossCPUs(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs two CPUs")
	}
	fx := setup(t)
	const port, flows = 8083, 2000
	v := VIP{ID: 8, Addr: netip.AddrPortFrom(vip4, port), Proto: 6, Flags: FlagWLC, Table: fx.table,
		Schedule: []uint32{2, 0, 1, 2}, Pool: []uint32{0, 1, 2}}
	if err := fx.f.SetVIP(v); err != nil {
		t.Fatal(err)
	}
	setWeights(t, fx.f, map[uint32]uint32{0: 100, 1: 100, 2: 200})
	var syns, fins [][]byte
	for i := 0; i < flows; i++ {
		src := netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
		syns = append(syns, tcp4(t, src, vip4, 1234, port, "S", nil, nil))
		fins = append(fins, tcp4(t, src, vip4, 1234, port, "F", nil, nil))
	}
	play := func(pkts [][]byte) {
		t.Helper()
		errs := make(chan error, 2)
		for cpu := 0; cpu < 2; cpu++ {
			go func(cpu int) {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				var set unix.CPUSet
				set.Set(cpu)
				if err := unix.SchedSetaffinity(0, &set); err != nil {
					errs <- err
					return
				}
				for _, p := range pkts {
					out := make([]byte, len(p)+256)
					if _, err := fx.f.Program().Run(&ebpf.RunOptions{Data: p, DataOut: out}); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}(cpu)
		}
		for i := 0; i < 2; i++ {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	total := func() int64 {
		var n int64
		for s := uint32(0); s < 3; s++ {
			n += activeOf(t, fx.f, s)
		}
		return n
	}
	play(syns)
	if n := total(); n != flows {
		t.Fatalf("%d flows' SYNs on two CPUs: %d active, want %d", flows, n, flows)
	}
	play(fins)
	if n := total(); n != 0 {
		t.Fatalf("after their FINs on two CPUs: %d active, want 0", n)
	}
}
