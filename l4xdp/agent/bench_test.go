package agent

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// tcRestoring returns a TC program that puts pkt back in the skb (room given back when a
// previous run's decapsulation shrank it, then pkt's bytes) and tail-calls target. A
// repeated BPF_PROG_RUN hands every run the skb the previous run left; every arm of
// BenchmarkAgent runs behind this program, so all pay the same.
func tcRestoring(tb testing.TB, pkt []byte, target *ebpf.Program) *ebpf.Program {
	tb.Helper()
	tmpl, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: uint32(len(pkt)+7) &^ 7, MaxEntries: 1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tmpl.Close() })
	val := make([]byte, tmpl.ValueSize())
	copy(val, pkt)
	if err := tmpl.Put(uint32(0), val); err != nil {
		tb.Fatal(err)
	}
	jump, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { jump.Close() })
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // skb->len
		asm.JGE.Imm(asm.R2, int32(len(pkt)), "same"),
		asm.Mov.Imm(asm.R3, int32(len(pkt))),
		asm.Sub.Reg(asm.R3, asm.R2),
		asm.Mov.Reg(asm.R2, asm.R3),
		asm.Mov.Imm(asm.R3, 1), // BPF_ADJ_ROOM_MAC
		asm.Mov.Imm(asm.R4, 0),
		asm.FnSkbAdjustRoom.Call(),
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("same"),
		asm.Mov.Imm(asm.R2, 0),
		asm.LoadMapValue(asm.R3, tmpl.FD(), 0),
		asm.Mov.Imm(asm.R4, int32(len(pkt))),
		asm.Mov.Imm(asm.R5, 0),
		asm.FnSkbStoreBytes.Call(),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, jump.FD()),
		asm.Mov.Imm(asm.R3, 0),
		asm.FnTailCall.Call(),
		asm.Mov.Imm(asm.R0, tcShot), // the tail call failed
		asm.Return(),
	}
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL", Instructions: insns})
	if err != nil {
		tb.Fatalf("loading the restoring program: %v", err)
	}
	tb.Cleanup(func() { p.Close() })
	if err := jump.Put(uint32(0), target); err != nil {
		tb.Fatalf("installing the tail call: %v", err)
	}
	return p
}

// tcProgram loads a TC program of insns.
func tcProgram(tb testing.TB, insns asm.Instructions) *ebpf.Program {
	tb.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL", Instructions: insns})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

// BenchmarkAgent: ns/packet through BPF_PROG_RUN of the agent decapsulating a tunnel packet
// (parse, source and port checks, the local-address lookup, bpf_skb_adjust_room) beside a
// bare TC program that only strips the same outer headers (bpf_skb_adjust_room, nothing
// checked) and one that passes every packet (TC_ACT_OK), in one run; and the agent passing
// a packet of no socket to its secondary (the socket lookup, the rewrite, the redirect).
// Goal: the agent's decap at most 2x the bare decap. Every arm runs behind the same
// restoring program, in a namespace of the benchmark's own (the socket lookup's).
func BenchmarkAgent(b *testing.B) {
	r := newRig(b)
	ack := innerTCP(b, client4, 40000, vip4, 80, "PA")
	plain := frame(b, lb4, self4, port, gueOpts{}, ack)
	second := frame(b, lb4, self4, port, gueOpts{hops: 1, second: second4}, ack)
	strip := int32(20 + 8 + 12)
	bare := tcProgram(b, asm.Instructions{asm.Mov.Imm(asm.R0, tcOK), asm.Return()})
	decap := tcProgram(b, asm.Instructions{
		asm.Mov.Imm(asm.R2, -strip),
		asm.Mov.Imm(asm.R3, 1), // BPF_ADJ_ROOM_MAC
		asm.Mov.Imm(asm.R4, 0),
		asm.FnSkbAdjustRoom.Call(),
		asm.Mov.Imm(asm.R0, tcOK),
		asm.Return(),
	})
	for _, arm := range []struct {
		name string
		p    *ebpf.Program
		pkt  []byte
		want uint32
	}{
		{"bare", bare, plain, tcOK},
		{"bare-decap", decap, plain, tcOK},
		{"agent-decap", r.a.objs.StickylbBackend, plain, tcOK},
		{"agent-second-chance", r.a.objs.StickylbBackend, second, tcRedirect},
	} {
		p := tcRestoring(b, arm.pkt, arm.p)
		b.Run("path="+arm.name, func(b *testing.B) {
			var ret uint32
			var d time.Duration
			r.kit.MustDo("be", func() (err error) {
				ret, d, err = p.Benchmark(arm.pkt, b.N, nil)
				return err
			})
			if ret != arm.want {
				b.Fatalf("verdict %d, want %d", ret, arm.want)
			}
			b.ReportMetric(float64(d.Nanoseconds()), "ns/packet")
		})
	}
}
