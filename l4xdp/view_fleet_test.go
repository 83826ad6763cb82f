package l4xdp

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"

	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// newFedLoader is newTestLoader whose maintenance loop (started by ApplyView) ends with
// the test, before its maps close.
func newFedLoader(t *testing.T, zone string) *Loader {
	t.Helper()
	l := newTestLoader(t, zone)
	t.Cleanup(l.stopMaintenance)
	return l
}

// feed applies to l the view a control plane builds from src and verdicts (keyed
// "service/identity"), through fleetview's encoding and decoding, as `stickylb xdp --xds`
// does.
func feed(t *testing.T, l *Loader, src string, verdicts map[string]fleetview.Verdict) {
	t.Helper()
	v, err := decodeFed(t, src, verdicts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.ApplyView(v.File, fedVerdicts(v)); err != nil {
		t.Fatal(err)
	}
}

// decodeFed is the view a control plane builds from src and verdicts, its load assignments
// edited by edit (nil: as built), as a node decodes it.
func decodeFed(t *testing.T, src string, verdicts map[string]fleetview.Verdict, edit func([]*endpointv3.ClusterLoadAssignment)) (*fleetview.View, error) {
	t.Helper()
	f, err := pools.Parse("pools.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	cs, ls := fleetview.Encode(f, func(svc string, b *pools.Backend) fleetview.Verdict {
		return verdicts[fleetview.Key(svc, b.Identity())]
	})
	if edit != nil {
		edit(ls)
	}
	c, e := map[string]proto.Message{}, map[string]proto.Message{}
	for i := range cs {
		c[cs[i].GetName()], e[ls[i].GetClusterName()] = cs[i], ls[i]
	}
	return fleetview.Decode(c, e)
}

// fedVerdicts hands v's verdicts to a loader, as `stickylb xdp --xds` does.
func fedVerdicts(v *fleetview.View) Verdicts {
	return func(service, id string) Verdict {
		vd := v.Verdict(service, id)
		return Verdict{State: vd.State, Since: vd.Since, From: vd.From}
	}
}

// tableNames is service's Maglev table as backend names: equal on two nodes that hold the
// same table, whatever slots each gave its backends.
func tableNames(t *testing.T, l *Loader, service string) []string {
	t.Helper()
	l.mu.Lock()
	id := l.vipIDs[service]
	l.mu.Unlock()
	var k lbVipKey
	var meta lbVipMeta
	size := uint32(0)
	for it := l.maps.objs.Vips.Iterate(); it.Next(&k, &meta); {
		if meta.Id == id {
			size = meta.TableSize
		}
	}
	var innerID ebpf.MapID
	if err := l.maps.objs.Maglev.Lookup(id, &innerID); err != nil {
		t.Fatal(err)
	}
	inner, err := ebpf.NewMapFromID(innerID)
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	ns, err := names(l.maps.objs.BackendNames)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, size)
	for i := range size {
		var s uint32
		if err := inner.Lookup(i, &s); err != nil {
			t.Fatal(err)
		}
		out[i] = ns[s]
	}
	return out
}

// weightOf is the weight the loader installed for service/id (weightScale units).
func weightOf(t *testing.T, l *Loader, key string) uint32 {
	t.Helper()
	l.mu.Lock()
	slot, ok := l.slots[key]
	l.mu.Unlock()
	if !ok {
		t.Fatalf("%s has no slot", key)
	}
	var w uint32
	if err := l.maps.objs.Weights.Lookup(slot, &w); err != nil {
		t.Fatal(err)
	}
	return w
}

// flowBackends sends n new flows (fixed keys) through l's program and returns each one's
// backend (the MAC's last byte).
func flowBackends(t *testing.T, l *Loader, n int) []int {
	t.Helper()
	out := make([]int, n)
	for i := range n {
		src := netip.AddrFrom4([4]byte{198, 51, 100, byte(i % 250)})
		ret, pkt := run(t, l.maps.Program(), tcp4(t, src, vip4, uint16(20000+i/250), 80, "S", nil, nil))
		if ret != xdpTX {
			t.Fatalf("flow %d: action %d", i, ret)
		}
		out[i] = int(net.HardwareAddr(pkt[:6])[5])
	}
	return out
}

// fedFile: web on 10.0.0.100:80, checked by the control plane, with a 2000 s slow-start
// window (steps of 100 s: a step boundary is 50 s from every time the test uses, far beyond the
// seconds its loaders take to load on a loaded machine), backends 10.0.5.1.. with MACs whose
// last byte is the backend's number.
func fedFile(backends int) string {
	var b strings.Builder
	b.WriteString("services:\n  - name: web\n    protocol: tcp\n    vip: 10.0.0.100:80\n    hash: {table_size: 1021}\n" +
		"    health_check: {protocol: tcp}\n    slow_start: {window: 2000s, aggression: 1, min_weight_percent: 10}\n    backends:\n")
	for i := 1; i <= backends; i++ {
		fmt.Fprintf(&b, "      - {address: 10.0.5.%d:80, mac: \"02:00:00:00:05:%02x\"}\n", i, i)
	}
	return b.String()
}

// Two nodes fed the same view ramp a recovered backend from the control plane's
// transition time (health_since), whatever each saw before (a third never saw the backend
// down and goes by health_from), so they hold the same table at the same step; a node fed a later
// transition time is at another step; a backend first seen in a view ramps from its
// verdict's time on both.
func TestFedSlowStartSameStep(t *testing.T) {
	now := time.Now()
	const b2 = "web/10.0.5.2:80"
	down := map[string]fleetview.Verdict{b2: {State: health.Unhealthy, Since: now.Add(-3000 * time.Second)}}
	// 1050 s into a 2000 s window: step 10 of 20, factor 0.5, 50 s from either edge.
	up := map[string]fleetview.Verdict{b2: {State: health.Healthy, Since: now.Add(-1050 * time.Second)}}

	a, b := newFedLoader(t, ""), newFedLoader(t, "")
	feed(t, a, fedFile(4), down)
	feed(t, b, fedFile(4), down)
	if w := weightOf(t, a, b2); w != 0 {
		t.Fatalf("an unhealthy backend has weight %d", w)
	}
	feed(t, a, fedFile(4), up)
	feed(t, b, fedFile(4), up)
	for name, l := range map[string]*Loader{"a": a, "b": b} {
		if w := weightOf(t, l, b2); w != 50 {
			t.Errorf("node %s: the recovered backend's weight %d, want 50 (step 10 of 20 from health_since)", name, w)
		}
	}
	ta, tb := tableNames(t, a, "web"), tableNames(t, b, "web")
	if !slices.Equal(ta, tb) {
		t.Fatal("two nodes fed the same view hold different tables")
	}
	full := 0
	for _, n := range ta {
		if n == b2 {
			full++
		}
	}
	// Half the weight of each of three others: about 1/7 of the slots (not 1/4).
	if lo, hi := len(ta)/10, len(ta)/5; full < lo || full > hi {
		t.Errorf("the ramping backend holds %d of %d slots, want %d..%d", full, len(ta), lo, hi)
	}
	if fa, fb := flowBackends(t, a, 500), flowBackends(t, b, 500); !slices.Equal(fa, fb) {
		t.Error("the same new flows went to different backends on the two nodes")
	}

	// A node that connected after the backend went down (it never saw it unhealthy) ramps
	// it too when the control plane says the healthy verdict followed an unhealthy one.
	d := newFedLoader(t, "")
	feed(t, d, fedFile(4), map[string]fleetview.Verdict{b2: {State: health.Healthy, Since: up[b2].Since, From: health.Unhealthy}})
	if w := weightOf(t, d, b2); w != 50 {
		t.Errorf("a node that never saw the backend down: weight %d, want 50", w)
	}
	if !slices.Equal(ta, tableNames(t, d, "web")) {
		t.Error("a node that connected after the backend went down holds another table")
	}

	// A node that heard the transition as just happened is at step 0: its clock is the
	// verdict's, not the time the view arrived.
	c := newFedLoader(t, "")
	feed(t, c, fedFile(4), down)
	feed(t, c, fedFile(4), map[string]fleetview.Verdict{b2: {State: health.Healthy, Since: now}})
	if w := weightOf(t, c, b2); w != 10 {
		t.Errorf("a transition just now: weight %d, want 10 (min_weight_percent)", w)
	}

	// A backend first seen in a view, found healthy 1550 s ago: step 15, factor 0.75, on
	// both nodes.
	const b5 = "web/10.0.5.5:80"
	up[b5] = fleetview.Verdict{State: health.Healthy, Since: now.Add(-1550 * time.Second)}
	feed(t, a, fedFile(5), up)
	feed(t, b, fedFile(5), up)
	for name, l := range map[string]*Loader{"a": a, "b": b} {
		if w := weightOf(t, l, b5); w != 75 {
			t.Errorf("node %s: the new backend's weight %d, want 75", name, w)
		}
	}
	if !slices.Equal(tableNames(t, a, "web"), tableNames(t, b, "web")) {
		t.Fatal("after a backend joined, two nodes fed the same view hold different tables")
	}
	// Healthy again in a later view, unchanged: no new ramp.
	feed(t, a, fedFile(5), up)
	if w := weightOf(t, a, b2); w != 50 {
		t.Errorf("the same verdict again restarted the ramp: weight %d", w)
	}
}

// Zones on a fed node: cross_zone false from the view keeps new flows in the node's zone;
// a drained zone (drained_zones in the view) takes none while another zone has a healthy
// backend, and is the last resort when none has (its backends are not draining ones).
func TestFedZones(t *testing.T) {
	hc := "    health_check: {protocol: tcp}\n"
	t.Run("cross-zone off keeps to the node's zone", func(t *testing.T) {
		l := newFedLoader(t, "a")
		feed(t, l, zoneFile(hc+"    cross_zone: false\n"), nil)
		got := map[int]int{}
		sendFlows(t, l, 0, 400, got)
		if got[1]+got[2] != 400 {
			t.Fatalf("a zone-a node sent %d of 400 new flows to zone a: %v", got[1]+got[2], got)
		}
		// Zone a down (the control plane's verdicts): zone b takes them.
		down := map[string]fleetview.Verdict{}
		for i := 1; i <= 2; i++ {
			down[fmt.Sprintf("web/10.0.5.%d:80", i)] = fleetview.Verdict{State: health.Unhealthy}
		}
		feed(t, l, zoneFile(hc+"    cross_zone: false\n"), down)
		got = map[int]int{}
		sendFlows(t, l, 1000, 400, got)
		if got[1]+got[2] != 0 {
			t.Fatalf("zone a down, still %d of 400 new flows there", got[1]+got[2])
		}
	})
	t.Run("cross-zone on spreads", func(t *testing.T) {
		l := newFedLoader(t, "a")
		feed(t, l, zoneFile(hc), nil)
		got := map[int]int{}
		sendFlows(t, l, 0, 400, got)
		// 2 of 10 backends in zone a: 80 expected, sigma 8.
		if n := got[1] + got[2]; n < 48 || n > 112 {
			t.Fatalf("cross-zone on: zone a took %d of 400 new flows, want 80 ± 32 (4 sigma)", n)
		}
	})
	t.Run("a drained zone is the last resort", func(t *testing.T) {
		l := newFedLoader(t, "a")
		drained := hc + "    cross_zone: false\n    drained_zones: [a]\n"
		feed(t, l, zoneFile(drained), nil)
		got := map[int]int{}
		sendFlows(t, l, 0, 400, got)
		if got[1]+got[2] != 0 {
			t.Fatalf("drained zone a took %d of 400 new flows", got[1]+got[2])
		}
		down := map[string]fleetview.Verdict{}
		for i := 3; i <= 10; i++ {
			down[fmt.Sprintf("web/10.0.5.%d:80", i)] = fleetview.Verdict{State: health.Unhealthy}
		}
		feed(t, l, zoneFile(drained), down)
		got = map[int]int{}
		sendFlows(t, l, 1000, 400, got)
		if got[1]+got[2] != 400 {
			t.Fatalf("zone b all down: drained zone a (the last resort) took %d of 400: %v", got[1]+got[2], got)
		}
		// A backend draining itself in the drained zone never takes new flows.
		src := strings.Replace(zoneFile(drained), "10.0.5.1:80, zone: a,", "10.0.5.1:80, zone: a, drain: true,", 1)
		feed(t, l, src, down)
		got = map[int]int{}
		sendFlows(t, l, 2000, 400, got)
		if got[1] != 0 || got[2] != 400 {
			t.Fatalf("a draining backend of the drained zone: %v", got)
		}
	})
}

// A fed node steps its ramps on its own between views (the maintenance loop runs for a
// loader fed by a control plane too): a backend recovered just now rises from the floor
// to its full weight within the window, plus the loop's tick and a stated slack.
func TestFedSlowStartStepsWithoutViews(t *testing.T) {
	// 4 s: the feed below must land within the first half of the window however loaded the
	// machine, and the polls must see many steps of 200 ms each.
	const window = 4 * time.Second
	src := strings.Replace(fedFile(2), "window: 2000s", "window: 4s", 1)
	l := newFedLoader(t, "")
	const b2 = "web/10.0.5.2:80"
	feed(t, l, src, map[string]fleetview.Verdict{b2: {State: health.Unhealthy}})
	start := time.Now()
	feed(t, l, src, map[string]fleetview.Verdict{b2: {State: health.Healthy, Since: start, From: health.Unhealthy}})
	if w := weightOf(t, l, b2); w >= 50 {
		t.Fatalf("weight %d at the ramp's start", w)
	}
	seen := map[uint32]bool{}
	deadline := start.Add(window + maintainTick + time.Second) // slack: a loaded 2-core machine
	for {
		w := weightOf(t, l, b2)
		seen[w] = true
		if w == 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("weight %d %s after the recovery (window %s); weights seen %v", w, time.Since(start), window, seen)
		}
		time.Sleep(maintainTick / 5) // polling the map, not waiting for an outcome
	}
	if len(seen) < 5 {
		t.Errorf("the ramp went through %d weights, want many of its %d steps: %v", len(seen), rampSteps, seen)
	}
}
