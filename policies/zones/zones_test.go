package zones

import (
	"fmt"
	"math"
	"testing"
)

// twoZones is the classic cross-zone example: zone A has 2 servers, zone B 8; each zone's LB nodes
// receive half of the traffic.
func twoZones() ([]Traffic, []Backend) {
	var bs []Backend
	for i := 0; i < 2; i++ {
		bs = append(bs, Backend{ID: fmt.Sprintf("a%d", i), Zone: "A", Weight: 1, Healthy: true})
	}
	for i := 0; i < 8; i++ {
		bs = append(bs, Backend{ID: fmt.Sprintf("b%d", i), Zone: "B", Weight: 1, Healthy: true})
	}
	return []Traffic{{Zone: "A", Share: 0.5}, {Zone: "B", Share: 0.5}}, bs
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

func TestSeed003CrossZoneOn(t *testing.T) {
	nodes, bs := twoZones()
	for id, s := range Shares(nodes, bs, Policy{CrossZone: true}) {
		if !near(s, 0.10) {
			t.Errorf("%s: %v, want 10%%", id, s)
		}
	}
}

func TestSeed003CrossZoneOff(t *testing.T) {
	nodes, bs := twoZones()
	for id, s := range Shares(nodes, bs, Policy{CrossZone: false}) {
		want := 0.0625
		if id[0] == 'a' {
			want = 0.25
		}
		if !near(s, want) {
			t.Errorf("%s: %v, want %v", id, s, want)
		}
	}
}

func TestFailoverAndDrain(t *testing.T) {
	nodes, bs := twoZones()
	bs[0].Healthy, bs[1].Healthy = false, false // zone A has no healthy server left
	sh := Shares(nodes, bs, Policy{CrossZone: false})
	for id, s := range sh {
		want := 0.125 // all traffic over the 8 B servers
		if id[0] == 'a' {
			want = 0
		}
		if !near(s, want) {
			t.Errorf("failover %s: %v, want %v", id, s, want)
		}
	}
	nodes, bs = twoZones()
	sh = Shares(nodes, bs, Policy{CrossZone: true, DrainedZones: []string{"B"}})
	if !near(sh["a0"], 0.5) || !near(sh["b3"], 0) {
		t.Errorf("zone shift away from B: %v", sh)
	}
	bs[2].Drain = true
	sh = Shares(nodes, bs, Policy{CrossZone: true})
	if !near(sh["b0"], 0) || !near(sh["a0"], 1.0/9) {
		t.Errorf("drained backend: %v", sh)
	}
	// Weights count.
	nodes, bs = twoZones()
	bs[0].Weight = 3
	sh = Shares(nodes, bs, Policy{CrossZone: false})
	if !near(sh["a0"], 0.375) || !near(sh["a1"], 0.125) {
		t.Errorf("weighted zone A: %v", sh)
	}
}

func TestLocalities(t *testing.T) {
	_, bs := twoZones()
	bs[0].Weight = 3
	on := Localities("A", bs, Policy{CrossZone: true})
	if len(on) != 2 || on[0].Zone != "A" || on[0].Priority != 0 || on[1].Priority != 0 {
		t.Fatalf("cross on: %+v", on)
	}
	if on[0].Weight != 4 || on[1].Weight != 8 {
		t.Fatalf("locality weight must be the sum of endpoint weights: %v %v", on[0].Weight, on[1].Weight)
	}
	off := Localities("B", bs, Policy{CrossZone: false})
	if off[0].Zone != "B" || off[0].Priority != 0 || off[1].Zone != "A" || off[1].Priority != 1 {
		t.Fatalf("cross off from B: %+v", off)
	}
	for i := 1; i < len(off[0].Endpoints); i++ {
		if off[0].Endpoints[i-1].ID >= off[0].Endpoints[i].ID {
			t.Fatalf("endpoints not sorted: %+v", off[0].Endpoints)
		}
	}
	unknown := Localities("C", bs, Policy{CrossZone: false})
	if unknown[0].Priority != 0 || unknown[1].Priority != 0 {
		t.Fatalf("a node outside every zone sees all at P0: %+v", unknown)
	}
	shift := Localities("A", bs, Policy{CrossZone: false, DrainedZones: []string{"A"}})
	if shift[0].Zone != "B" || shift[0].Priority != 0 || shift[1].Zone != "A" || shift[1].Priority != 1 {
		t.Fatalf("drained own zone goes last: %+v", shift)
	}
	for _, e := range shift[1].Endpoints {
		if !e.Draining {
			t.Fatalf("endpoint of a drained zone not draining: %+v", e)
		}
	}
}

// A drained zone is the last resort, as the xDS tier's lowest priority is: it takes the
// traffic only once no other zone has a healthy backend.
func TestDrainedZoneIsLastResort(t *testing.T) {
	nodes := []Traffic{{Zone: "a", Share: 0.5}, {Zone: "b", Share: 0.5}}
	bs := []Backend{{ID: "a1", Zone: "a", Weight: 1, Healthy: true}, {ID: "b1", Zone: "b", Weight: 1, Healthy: true}}
	p := Policy{CrossZone: false, DrainedZones: []string{"a"}}
	if got := Shares(nodes, bs, p); got["a1"] != 0 || got["b1"] != 1 {
		t.Errorf("zone a drained, b healthy: %v, want all on b1", got)
	}
	bs[1].Healthy = false
	if got := Shares(nodes, bs, p); got["a1"] != 1 || got["b1"] != 0 {
		t.Errorf("zone a drained, b down: %v, want all on a1 (last resort)", got)
	}
}
