// Package zonecases is the zone rule's cases (policies/zones.Eligible): a node, a service's
// backends and zone policy, and where the node sends new traffic. The rule's own tests check
// Eligible against them, and each tier's tests check that the tier sends new traffic where
// Eligible says for every case (the xDS tier through the priorities and health statuses it
// publishes, the Caddy nodes through the upstreams they return, the XDP nodes through the
// tables they build).
package zonecases

import (
	"fmt"
	"strings"

	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/zones"
)

// Case is one situation of the zone rule.
type Case struct {
	Name     string
	NodeZone string
	Policy   zones.Policy
	Backends []zones.Backend
	// Local and Fleet are the IDs of Eligible's Local and Fleet, in the backends' order;
	// FailOpen and LastResort are its flags.
	Local, Fleet         []string
	FailOpen, LastResort bool
}

// Address is the address of a case's backend i (from 0) in its PoolsFile.
func Address(i int) string { return fmt.Sprintf("10.0.0.%d:80", i+1) }

// PoolsFile is the case as a pools file: service api, protocol grpc, balance bal, over
// the case's backends at Address(i), with its zone policy.
func (c Case) PoolsFile(bal string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "services:\n  - name: api\n    protocol: grpc\n    balance: %s\n    cross_zone: %t\n", bal, c.Policy.CrossZone)
	if len(c.Policy.DrainedZones) > 0 {
		fmt.Fprintf(&b, "    drained_zones: [%s]\n", strings.Join(c.Policy.DrainedZones, ", "))
	}
	b.WriteString("    backends:\n")
	for i, zb := range c.Backends {
		fmt.Fprintf(&b, "      - {address: %q", Address(i))
		if zb.Zone != "" {
			fmt.Fprintf(&b, ", zone: %s", zb.Zone)
		}
		if zb.Drain {
			b.WriteString(", drain: true")
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// ID is the ID of the case's backend at addr ("" for none).
func (c Case) ID(addr string) string {
	for i, b := range c.Backends {
		if Address(i) == addr {
			return b.ID
		}
	}
	return ""
}

// State is the health checker's verdict on the case's backend at addr.
func (c Case) State(addr string) health.State {
	for i, b := range c.Backends {
		if Address(i) == addr && !b.Healthy {
			return health.Unhealthy
		}
	}
	return health.Healthy
}

// backend is a healthy backend of weight 1; down and drain set the others.
func backend(id, zone string) zones.Backend {
	return zones.Backend{ID: id, Zone: zone, Weight: 1, Healthy: true}
}

func down(b zones.Backend) zones.Backend  { b.Healthy = false; return b }
func drain(b zones.Backend) zones.Backend { b.Drain = true; return b }

// twoZones is the classic cross-zone example: zone A has 2 backends (a0, a1), zone B 8
// (b0..b7), all healthy. edit, when set, changes backends by index.
func twoZones(edit func(bs []zones.Backend)) []zones.Backend {
	bs := []zones.Backend{backend("a0", "A"), backend("a1", "A")}
	for _, id := range bZone {
		bs = append(bs, backend(id, "B"))
	}
	if edit != nil {
		edit(bs)
	}
	return bs
}

var bZone = []string{"b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7"}

func ids(groups ...[]string) []string {
	var out []string
	for _, g := range groups {
		out = append(out, g...)
	}
	return out
}

var aZone = []string{"a0", "a1"}

// mixed is five backends: 1 in zone a, 2 in zone a and down, 3 in zone b, 4 in the drained
// zone c, 5 in zone b and draining.
var mixed = []zones.Backend{backend("1", "a"), down(backend("2", "a")), backend("3", "b"), backend("4", "c"), drain(backend("5", "b"))}

// pick returns the backends of bs at the given indexes.
func pick(bs []zones.Backend, at ...int) []zones.Backend {
	out := make([]zones.Backend, len(at))
	for i, k := range at {
		out[i] = bs[k]
	}
	return out
}

var drainedC = zones.Policy{DrainedZones: []string{"c"}}

func crossOn(p zones.Policy) zones.Policy { p.CrossZone = true; return p }

// Cases are the zone tests' situations, each with the answer the tiers agree on. Read
// them only: cases share backends.
var Cases = []Case{
	// Five backends over three zones, c drained (the XDP loader's first table).
	{Name: "cross-zone on", NodeZone: "a", Policy: crossOn(drainedC), Backends: mixed,
		Local: []string{"1", "3"}, Fleet: []string{"1", "3"}},
	{Name: "own zone", NodeZone: "a", Policy: drainedC, Backends: mixed,
		Local: []string{"1"}, Fleet: []string{"1", "3"}},
	{Name: "a node in no zone of the service", NodeZone: "z", Policy: drainedC, Backends: mixed,
		Local: []string{"1", "3"}, Fleet: []string{"1", "3"}},
	{Name: "a node of no zone", NodeZone: "", Policy: drainedC, Backends: mixed,
		Local: []string{"1", "3"}, Fleet: []string{"1", "3"}},
	{Name: "own zone down: the others", NodeZone: "a", Policy: drainedC, Backends: pick(mixed, 1, 2, 3),
		Local: []string{"3"}, Fleet: []string{"3"}},
	{Name: "only the drained zone left", NodeZone: "a", Policy: drainedC, Backends: pick(mixed, 1, 3, 4),
		Local: []string{"4"}, Fleet: []string{"4"}, LastResort: true},
	{Name: "down, and a draining one: fail open, never to the draining", NodeZone: "a", Policy: crossOn(drainedC), Backends: pick(mixed, 1, 4),
		Local: []string{"2"}, Fleet: []string{"2"}, FailOpen: true},
	{Name: "all down, none drained: fail open", NodeZone: "a", Policy: drainedC, Backends: pick(mixed, 1),
		Local: []string{"2"}, Fleet: []string{"2"}, FailOpen: true},
	{Name: "draining only: nowhere", NodeZone: "a", Policy: drainedC, Backends: pick(mixed, 4)},

	// The two-zone example: 2 backends in A, 8 in B.
	{Name: "two zones, cross-zone on", NodeZone: "A", Policy: zones.Policy{CrossZone: true}, Backends: twoZones(nil),
		Local: ids(aZone, bZone), Fleet: ids(aZone, bZone)},
	{Name: "two zones, cross-zone off, from A", NodeZone: "A", Backends: twoZones(nil),
		Local: aZone, Fleet: ids(aZone, bZone)},
	{Name: "two zones, cross-zone off, from B", NodeZone: "B", Backends: twoZones(nil),
		Local: bZone, Fleet: ids(aZone, bZone)},
	{Name: "two zones, A down: failover to B", NodeZone: "A",
		Backends: twoZones(func(bs []zones.Backend) { bs[0].Healthy, bs[1].Healthy = false, false }),
		Local:    bZone, Fleet: bZone},
	{Name: "zone shift away from B", NodeZone: "B", Policy: zones.Policy{CrossZone: true, DrainedZones: []string{"B"}},
		Backends: twoZones(nil), Local: aZone, Fleet: aZone},
	{Name: "a drained backend", NodeZone: "A", Policy: zones.Policy{CrossZone: true},
		Backends: twoZones(func(bs []zones.Backend) { bs[2].Drain = true }),
		Local:    ids(aZone, bZone[1:]), Fleet: ids(aZone, bZone[1:])},
	{Name: "own zone drained: the others", NodeZone: "A", Policy: zones.Policy{DrainedZones: []string{"A"}},
		Backends: twoZones(nil), Local: bZone, Fleet: bZone},
	{Name: "drained own zone, the other down: the last resort", NodeZone: "A", Policy: zones.Policy{DrainedZones: []string{"A"}},
		Backends: twoZones(func(bs []zones.Backend) {
			for i := 2; i < len(bs); i++ {
				bs[i].Healthy = false
			}
		}),
		Local: aZone, Fleet: aZone, LastResort: true},

	// The Caddy source's cases (a Caddy node also keeps draining upstreams for their
	// sessions: the rule says only where new ones go).
	{Name: "own zone only", NodeZone: "z1",
		Backends: []zones.Backend{backend("a", "z1"), backend("b", "z2"), drain(backend("c", "z1"))},
		Local:    []string{"a"}, Fleet: []string{"a", "b"}},
	{Name: "own zone has only draining or down: every zone", NodeZone: "z1",
		Backends: []zones.Backend{down(backend("a", "z1")), drain(backend("c", "z1")), backend("b", "z2")},
		Local:    []string{"b"}, Fleet: []string{"b"}},
	{Name: "drained zone while another zone is up", NodeZone: "", Policy: zones.Policy{CrossZone: true, DrainedZones: []string{"z2"}},
		Backends: []zones.Backend{backend("1", "z1"), backend("2", "z2"), drain(backend("3", "z2"))},
		Local:    []string{"1"}, Fleet: []string{"1"}},
	{Name: "drained zone, the other down: the last resort", NodeZone: "", Policy: zones.Policy{CrossZone: true, DrainedZones: []string{"z2"}},
		Backends: []zones.Backend{down(backend("1", "z1")), backend("2", "z2"), drain(backend("3", "z2"))},
		Local:    []string{"2"}, Fleet: []string{"2"}, LastResort: true},

	// Where the tiers disagreed before the rule was written once.
	{Name: "last resort: the node's drained zone before the others", NodeZone: "a", Policy: zones.Policy{DrainedZones: []string{"a", "c"}},
		Backends: []zones.Backend{backend("1", "a"), down(backend("3", "b")), backend("4", "c")},
		Local:    []string{"1"}, Fleet: []string{"1", "4"}, LastResort: true},
	{Name: "fail open: the node's zone first", NodeZone: "a",
		Backends: []zones.Backend{down(backend("1", "a")), down(backend("3", "b"))},
		Local:    []string{"1"}, Fleet: []string{"1", "3"}, FailOpen: true},
	{Name: "fail open: live zones before drained ones", NodeZone: "a", Policy: crossOn(drainedC),
		Backends: []zones.Backend{down(backend("1", "a")), down(backend("4", "c"))},
		Local:    []string{"1"}, Fleet: []string{"1"}, FailOpen: true},
	{Name: "fail open in the drained zone when it is all there is", NodeZone: "a", Policy: drainedC,
		Backends: []zones.Backend{down(backend("4", "c")), drain(backend("5", "b"))},
		Local:    []string{"4"}, Fleet: []string{"4"}, FailOpen: true, LastResort: true},
	{Name: "a node of no zone with backends of no zone", NodeZone: "",
		Backends: []zones.Backend{backend("1", ""), backend("3", "b")},
		Local:    []string{"1", "3"}, Fleet: []string{"1", "3"}},
}
