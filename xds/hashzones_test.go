package xds

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// hashZonesPools has one service per balance over three zones (zone-c drained in the
// second half), so each node zone and cross_zone setting gives priorities of one and of
// several zones.
func hashZonesPools(t *testing.T) *pools.File {
	t.Helper()
	var b strings.Builder
	b.WriteString("services:\n")
	for _, cz := range []bool{true, false} {
		for _, bal := range []string{"ring_hash", "maglev", "weighted_least_conn", "weighted_round_robin"} {
			for _, drained := range []string{"", "[zone-c]"} {
				name := fmt.Sprintf("%s-%t-%t", strings.ReplaceAll(bal, "_", "-"), cz, drained != "")
				fmt.Fprintf(&b, "  - name: %s\n    protocol: grpc\n    balance: %s\n    cross_zone: %t\n", name, bal, cz)
				if drained != "" {
					fmt.Fprintf(&b, "    drained_zones: %s\n", drained)
				}
				// Identities out of zone order: zone-b's backend sorts before zone-a's.
				b.WriteString("    backends:\n" +
					"      - {address: 10.0.0.9:80, weight: 3, zone: zone-a}\n" +
					"      - {address: 10.0.0.3:80, weight: 1, zone: zone-a}\n" +
					"      - {address: 10.0.0.1:80, weight: 2, zone: zone-b}\n" +
					"      - {address: 10.0.0.5:80, weight: 5, zone: zone-c}\n" +
					"      - {address: 10.0.0.7:80, weight: 4, zone: zone-d}\n")
			}
		}
	}
	return poolstest.Parse(t, b.String())
}

// TestHashServicesOneLocalityPerPriority: for ring_hash and maglev services every priority
// is one locality holding all its zones' endpoints, sorted by identity across zones, with
// the sum of their weights and a zone name unique in the assignment; other services keep
// one locality per zone. Endpoints, priorities, statuses and weights are those of the
// per-zone form, and the resources pass go-control-plane's validation.
func TestHashServicesOneLocalityPerPriority(t *testing.T) {
	f := hashZonesPools(t)
	view := func(_ string, b *pools.Backend) health.State {
		if b.Address == "10.0.0.3:80" {
			return health.Unhealthy
		}
		return health.Healthy
	}
	// endpoint is what must not change: an endpoint's priority, status and weight.
	type endpoint struct {
		prio   uint32
		status string
		weight uint32
	}
	flat := func(cla *endpointv3.ClusterLoadAssignment) map[string]endpoint {
		out := map[string]endpoint{}
		for _, le := range cla.GetEndpoints() {
			for _, e := range le.GetLbEndpoints() {
				a := e.GetEndpoint().GetAddress().GetSocketAddress()
				out[fmt.Sprintf("%s:%d", a.GetAddress(), a.GetPortValue())] = endpoint{le.GetPriority(), e.GetHealthStatus().String(), e.GetLoadBalancingWeight().GetValue()}
			}
		}
		return out
	}
	checked := 0
	for _, zone := range []string{"zone-a", "zone-c", "", "zone-q"} {
		r, err := Translate(f, Node{ID: "n", Zone: zone}, view)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.ValidateAll(); err != nil {
			t.Fatalf("node zone %q: %v", zone, err)
		}
		for i, m := range r.Endpoints {
			cla := m.(*endpointv3.ClusterLoadAssignment)
			s := f.Services[i]
			// The per-zone form, as before, for comparison.
			perZone := loadAssignmentPerZone(s, Node{Zone: zone}, view)
			if got, want := flat(cla), flat(perZone); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("%s, node zone %q: endpoints %v, want those of the per-zone form %v", s.Name, zone, got, want)
			}
			if !hashes(s) {
				if fmt.Sprint(cla.GetEndpoints()) != fmt.Sprint(perZone.GetEndpoints()) {
					t.Fatalf("%s, node zone %q: a non-hash service changed its localities", s.Name, zone)
				}
				continue
			}
			zonesOf := map[uint32][]string{}
			sums := map[uint32]uint32{}
			for _, le := range perZone.GetEndpoints() {
				zonesOf[le.GetPriority()] = append(zonesOf[le.GetPriority()], le.GetLocality().GetZone())
				sums[le.GetPriority()] += le.GetLoadBalancingWeight().GetValue()
			}
			if len(cla.GetEndpoints()) != len(zonesOf) {
				t.Fatalf("%s, node zone %q: %d localities for %d priorities", s.Name, zone, len(cla.GetEndpoints()), len(zonesOf))
			}
			seen := map[string]bool{}
			for p, le := range cla.GetEndpoints() {
				if le.GetPriority() != uint32(p) {
					t.Fatalf("%s, node zone %q: locality %d at priority %d", s.Name, zone, p, le.GetPriority())
				}
				if want := strings.Join(zonesOf[uint32(p)], "+"); le.GetLocality().GetZone() != want {
					t.Fatalf("%s, node zone %q, priority %d: zone %q, want %q", s.Name, zone, p, le.GetLocality().GetZone(), want)
				}
				if seen[le.GetLocality().GetZone()] {
					t.Fatalf("%s, node zone %q: locality %q twice", s.Name, zone, le.GetLocality().GetZone())
				}
				seen[le.GetLocality().GetZone()] = true
				if w := le.GetLoadBalancingWeight().GetValue(); w != sums[uint32(p)] {
					t.Fatalf("%s, node zone %q, priority %d: locality weight %d, want %d", s.Name, zone, p, w, sums[uint32(p)])
				}
				var ids []string
				for _, e := range le.GetLbEndpoints() {
					ids = append(ids, e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
				}
				if !slices.IsSorted(ids) {
					t.Fatalf("%s, node zone %q, priority %d: endpoints %v not in identity order", s.Name, zone, p, ids)
				}
			}
			checked++
		}
	}
	if checked != 4*8 {
		t.Fatalf("checked %d hash assignments, want 32", checked)
	}
}

// TestHashServiceLocalityNames: the merged locality of a priority with several zones is
// named after them; a priority of one zone keeps its zone, so single-zone services do not
// change.
func TestHashServiceLocalityNames(t *testing.T) {
	f := hashZonesPools(t)
	r, err := Translate(f, Node{ID: "n", Zone: "zone-a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, m := range r.Endpoints {
		cla := m.(*endpointv3.ClusterLoadAssignment)
		for _, le := range cla.GetEndpoints() {
			got[cla.GetClusterName()] = append(got[cla.GetClusterName()], fmt.Sprintf("P%d %s", le.GetPriority(), le.GetLocality().GetZone()))
		}
	}
	for name, want := range map[string]string{
		"ring-hash-true-false":           "[P0 zone-a+zone-b+zone-c+zone-d]",
		"ring-hash-true-true":            "[P0 zone-a+zone-b+zone-d P1 zone-c]",
		"maglev-false-false":             "[P0 zone-a P1 zone-b+zone-c+zone-d]",
		"maglev-false-true":              "[P0 zone-a P1 zone-b+zone-d P2 zone-c]",
		"weighted-least-conn-true-false": "[P0 zone-a P0 zone-b P0 zone-c P0 zone-d]",
	} {
		if fmt.Sprint(got[name]) != want {
			t.Errorf("%s: localities %v, want %s", name, got[name], want)
		}
	}
}

// loadAssignmentPerZone is the assignment with one locality per zone and priority, the
// form hash services had before.
func loadAssignmentPerZone(s *pools.Service, node Node, view HealthView) *endpointv3.ClusterLoadAssignment {
	return assignment(s, node, view, false)
}
