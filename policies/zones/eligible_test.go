package zones_test

import (
	"slices"
	"testing"

	"github.com/stickylb/stickylb/internal/testkit/zonecases"
	"github.com/stickylb/stickylb/policies/zones"
)

// idsAt names the backends at the indexes.
func idsAt(bs []zones.Backend, at []int) []string {
	var out []string
	for _, i := range at {
		out = append(out, bs[i].ID)
	}
	return out
}

// TestEligibleCases: the rule gives each case's answer.
func TestEligibleCases(t *testing.T) {
	for _, c := range zonecases.Cases {
		e := zones.Eligible(c.NodeZone, c.Backends, c.Policy)
		local, fleet := idsAt(c.Backends, e.Local), idsAt(c.Backends, e.Fleet)
		if !slices.Equal(local, c.Local) || !slices.Equal(fleet, c.Fleet) || e.FailOpen != c.FailOpen || e.LastResort != c.LastResort {
			t.Errorf("%s: local %v fleet %v fail open %v last resort %v; want %v %v %v %v", c.Name,
				local, fleet, e.FailOpen, e.LastResort, c.Local, c.Fleet, c.FailOpen, c.LastResort)
		}
		if e.OwnZone {
			for _, i := range e.Local {
				if c.Backends[i].Zone != c.NodeZone {
					t.Errorf("%s: OwnZone with %s of zone %q in Local", c.Name, c.Backends[i].ID, c.Backends[i].Zone)
				}
			}
		}
	}
}

// TestLocalitiesFollowEligible: a client that sends new traffic to the healthy, not
// draining endpoints of the lowest priority that has any (Envoy and gRPC with the control
// plane's overprovisioning factor) sends it where Eligible does, for every case that does
// not fail open (in fail open the xDS tier republishes the down backends; its tests check
// that).
func TestLocalitiesFollowEligible(t *testing.T) {
	for _, c := range zonecases.Cases {
		if c.FailOpen {
			continue
		}
		var got []string
		prio := uint32(0)
		for _, l := range zones.Localities(c.NodeZone, c.Backends, c.Policy) { // by priority
			if got != nil && l.Priority != prio {
				break
			}
			prio = l.Priority
			for _, e := range l.Endpoints {
				if e.Healthy && !e.Draining {
					got = append(got, e.ID)
				}
			}
		}
		slices.Sort(got)
		want := slices.Sorted(slices.Values(c.Local))
		if !slices.Equal(got, want) {
			t.Errorf("%s: the first priority with a healthy endpoint holds %v, want %v", c.Name, got, want)
		}
	}
}
