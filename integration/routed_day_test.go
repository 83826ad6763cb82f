package integration

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// daySlot is the time each event of the scripted day has: the event, the quiet point
// (routes and tables settled), and the rest of the slot under load.
const daySlot = 6 * time.Second

// fleetDayOf is the scripted day over the backends named prefix1..prefix5: 31 events,
// LB-node changes between backend changes, so that connections live through both.
func fleetDayOf(rf *routedFleet, prefix string) []func() {
	b := func(i int) string { return prefix + strconv.Itoa(i) }
	return []func(){
		func() { rf.addBackend(b(5)) },
		func() { rf.joinNode("lb4", true) }, // lb4 restarts gracefully later on
		func() { rf.setWeight(b(1), 2) },
		func() { rf.drainNode("lb2") },
		func() { rf.drainBackend(b(3), true) },
		func() { rf.undrainNode("lb2") },
		func() { rf.killBackend(b(2)) },
		func() { rf.killNode("lb1") },
		func() { rf.reviveBackend(b(2)) },
		func() { rf.joinNode("lb1", false) },
		func() { rf.drainBackend(b(3), false) },
		func() { rf.pullLink("lb3") },
		func() { rf.removeBackend(b(4)) },
		func() { rf.restoreLink("lb3") },
		func() { rf.restartGraceful("lb4") },
		func() { rf.setWeight(b(1), 1) },
		func() { rf.stopNode("lb2") },
		func() { rf.addBackend(b(4)) },
		func() { rf.joinNode("lb2", false) },
		func() { rf.drainBackend(b(5), true) },
		func() { rf.drainNode("lb1") },
		func() { rf.killBackend(b(1)) },
		func() { rf.undrainNode("lb1") },
		func() { rf.reviveBackend(b(1)) },
		func() { rf.killNode("lb3") },
		func() { rf.removeBackend(b(5)) },
		func() { rf.joinNode("lb3", false) },
		func() { rf.restartGraceful("lb4") },
		func() { rf.setWeight(b(2), 3) },
		func() { rf.pullLink("lb2") },
		func() { rf.restoreLink("lb2") },
	}
}

// TestRoutedFleetDay: a day of an L4 fleet in about 3 minutes under steady load (40
// long-lived connections living 5 to 40 s each, and about 20 new connections a second):
// broken connections put down to the kind of event that broke them, and the nodes' tables
// compared at every quiet point. Connections with an LB-node change and a backend change in
// their life are counted apart: nothing carries them today (the node the router moves them
// to has no entry for them, and the table moved under them), and they are the baseline that
// forwarding to the flow's first node must take to zero; so are those on a 5-tuple whose
// earlier connection a node may still hold (it ended without its FIN passing that node).
// Skipped under -short, as every end-to-end test in namespaces.
func TestRoutedFleetDay(t *testing.T) {
	runFleetDay(t, newRoutedFleet(t, "b1", "b2", "b3", "b4"), "b")
}

// runFleetDay runs the scripted day on rf, whose backends are named prefix1..prefix5 (1 to
// 4 in its pools file), and returns its report and the connections that broke. It fails t
// when the tables differed at a quiet point, or when one event alone broke a connection.
func runFleetDay(t *testing.T, rf *routedFleet, prefix string) (breakReport, []loadConn) {
	for _, lb := range []string{"lb1", "lb2", "lb3"} {
		rf.startNode(lb, false)
	}
	rf.waitRoutes(t, 10*time.Second, "lb1", "lb2", "lb3")
	if ok, saw := rf.waitQuiet(t, 5*time.Second); !ok {
		t.Fatalf("tables differ at the start: %s", saw)
	}
	load := rf.startLoad(vip4+":80", 40, 5*time.Second, 40*time.Second, 2, 100*time.Millisecond)
	testwait.For(t, 10*time.Second, "the load under way: every stream open and exchanging", func() (bool, string) {
		open, pings := load.progress()
		return open >= 40 && pings >= 80, fmt.Sprintf("%d open, %d exchanges", open, pings)
	})

	start := time.Now()
	events := fleetDayOf(rf, prefix)
	var disagreed []string
	for i, ev := range events {
		slot := time.Now()
		ev()
		rf.mu.Lock()
		e := rf.log[len(rf.log)-1]
		rf.mu.Unlock()
		ok, saw := rf.waitQuiet(t, 15*time.Second)
		if !ok {
			disagreed = append(disagreed, fmt.Sprintf("after %s %s: %s", e.kind, e.target, saw))
		}
		t.Logf("%3d %s %-22s %-4s quiet after %s", i+1, e.at.Format("15:04:05.0"), e.kind, e.target, time.Since(slot).Round(100*time.Millisecond))
		time.Sleep(max(0, daySlot-time.Since(slot))) // the rest of the slot, under load
	}
	day := time.Since(start)
	load.end()

	rep := attribute(load.snapshot(), rf.log)
	t.Logf("the day: %d events in %s, tables agreed at %d of %d quiet points\n%s", len(events), day.Round(time.Second),
		len(events)-len(disagreed), len(events), rep)
	if len(disagreed) > 0 {
		t.Errorf("the routed nodes' tables differed at quiet points:\n%s", strings.Join(disagreed, "\n"))
	}
	// An LB-node change alone never breaks a connection (every node holds the same table,
	// and its own flows' entries), nor does a backend change alone (the node keeps each
	// flow's entry); only their combination, a connection's own backend dying or leaving,
	// and a node's entry of an earlier connection on the same 5-tuple that ended without its
	// FIN there, do. (An earlier connection that closed through the node leaves an entry
	// that holds 10 s idle at most, and the client reuses its port a minute later at the
	// earliest: such a reuse breaks nothing, and is not excused.)
	if n := sum(rep.ByKind); n > 0 {
		t.Errorf("%d connections broke by one event alone:\n%s", n, strings.Join(rep.Alone, "\n"))
	}
	return rep, load.broken()
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
