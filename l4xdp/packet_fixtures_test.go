package l4xdp

import (
	"fmt"
	"testing"
)

// The packet fixtures as one table, as Katran's are data: each case a frame in, the verdict
// and the frame expected out. Cases run in order, scenario by scenario, each scenario on a
// forwarder of its own (its rig): a case sees the flows and map writes of the cases before
// it in its scenario, and nothing of another scenario's. The DR scenarios are in
// fixture_test.go, the NAT ones in nat_fixture_test.go; `go test -run
// 'TestPacketFixtures/NAME'` runs one scenario.

// A packetCase is one fixture. setup, when set, runs before the frame (maps written, entries
// aged); a case with no frame is a setup step alone. after, when set, checks what the case
// left (counters, entries). via is the interface the frame comes in on: "" on the DR rig,
// "lb0" or "lb1" on the NAT rig. A nil out checks the verdict alone (a dropped frame's
// bytes say nothing).
type packetCase struct {
	name    string
	setup   func(t *testing.T, r *packetRig)
	via     string
	in      []byte
	verdict uint32
	out     []byte
	after   func(t *testing.T, r *packetRig)
}

// A packetScenario is the cases that run on one rig, in order.
type packetScenario struct {
	name  string
	rig   func(t *testing.T) *packetRig
	cases []packetCase
}

// packetRig is what a scenario runs on: a loaded forwarder (f), and for the NAT scenarios
// the namespace its FIB lookups resolve in.
type packetRig struct {
	f   *Tables
	nat *natfxRig // nil on the DR rig
}

// drRig is the DR fixtures' forwarder: setup's backends and VIPs.
func drRig(t *testing.T) *packetRig { return &packetRig{f: setup(t).f} }

// drRigOnOneCPU is drRig with every packet run on CPU 0: the program keeps each CPU's place
// in a weighted round-robin schedule.
func drRigOnOneCPU(t *testing.T) *packetRig {
	onOneCPU(t)
	return drRig(t)
}

// run runs in through the program, as if it came in on interface via.
func (r *packetRig) run(t *testing.T, via string, in []byte) (uint32, []byte) {
	t.Helper()
	switch via {
	case "":
		return run(t, r.f.Program(), in)
	case "lb0":
		return r.nat.run(r.nat.lb0, in)
	case "lb1":
		return r.nat.run(r.nat.lb1, in)
	}
	t.Fatalf("no interface %q on the rig", via)
	return 0, nil
}

// TestPacketFixtures runs every scenario of the table.
func TestPacketFixtures(t *testing.T) {
	scenarios := append(append(drFixtures(t), natFixtures(t)...), tunnelFixtures(t)...)
	seen := map[string]bool{}
	for _, sc := range scenarios {
		if seen[sc.name] {
			t.Fatalf("two scenarios named %q", sc.name)
		}
		seen[sc.name] = true
		t.Run(sc.name, func(t *testing.T) { r := sc.rig(t); r.runCases(t, sc.cases) })
	}
}

// runCases runs cases on the rig, in order, failing at the first that goes otherwise.
func (r *packetRig) runCases(t *testing.T, cases []packetCase) {
	t.Helper()
	for i, c := range cases {
		name := fmt.Sprintf("case %d, %s", i, c.name)
		if c.setup != nil {
			c.setup(t, r)
		}
		if c.in != nil {
			ret, out := r.run(t, c.via, c.in)
			if ret != c.verdict {
				t.Fatalf("%s: action %d, want %d\noutput %x\nwant   %x", name, ret, c.verdict, out, c.out)
			}
			if d := byteDiff(out, c.out); c.out != nil && d != "" {
				t.Fatalf("%s: output differs from the independently built frame:\n%s\ngot  %x\nwant %x", name, d, out, c.out)
			}
		}
		if c.after != nil {
			c.after(t, r)
		}
	}
}

// The cases' constructors, so a table reads as a list of frames and verdicts.

// tx: in leaves by XDP_TX as out.
func tx(name string, in, out []byte) packetCase {
	return packetCase{name: name, in: in, verdict: xdpTX, out: out}
}

// passes: in goes to the stack unchanged.
func passes(name string, in []byte) packetCase {
	return packetCase{name: name, in: in, verdict: xdpPass, out: in}
}

// drops: in is dropped.
func drops(name string, in []byte) packetCase {
	return packetCase{name: name, in: in, verdict: xdpDrop}
}

// step: a setup step between frames.
func step(name string, setup func(t *testing.T, r *packetRig)) packetCase {
	return packetCase{name: name, setup: setup}
}

// then: a check of what the frames before left.
func then(name string, after func(t *testing.T, r *packetRig)) packetCase {
	return packetCase{name: name, after: after}
}

// counts: the named path counters have these packets (the others are not checked).
func counts(want map[string]uint64) packetCase {
	return then(fmt.Sprintf("path counters %v", want), func(t *testing.T, r *packetRig) { wantCounts(t, r.f, want) })
}

// on is c arriving on interface via.
func on(via string, c packetCase) packetCase {
	c.via = via
	return c
}

// setVIP is a setup step that installs v.
func setVIP(v VIP) func(t *testing.T, r *packetRig) {
	return func(t *testing.T, r *packetRig) {
		t.Helper()
		if err := r.f.SetVIP(v); err != nil {
			t.Fatal(err)
		}
	}
}

// setBackend is a setup step that installs backend slot idx.
func setBackend(idx uint32, b Backend) func(t *testing.T, r *packetRig) {
	return func(t *testing.T, r *packetRig) {
		t.Helper()
		if err := r.f.SetBackend(idx, b); err != nil {
			t.Fatal(err)
		}
	}
}

// forgetFlow is a setup step that deletes k's connection entry.
func forgetFlow(k lbFlow) func(t *testing.T, r *packetRig) {
	return func(t *testing.T, r *packetRig) {
		t.Helper()
		if err := r.f.objs.Conns.Delete(&k); err != nil {
			t.Fatalf("deleting the flow's connection entry: %v", err)
		}
	}
}

// steps runs fns in order, as one setup step.
func steps(fns ...func(t *testing.T, r *packetRig)) func(t *testing.T, r *packetRig) {
	return func(t *testing.T, r *packetRig) {
		t.Helper()
		for _, fn := range fns {
			fn(t, r)
		}
	}
}
