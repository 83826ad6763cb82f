// Package zones spreads traffic across availability zones: with cross-zone balancing on, a
// load-balancer node spreads over the healthy backends of every zone; off, only over its own
// zone's, failing over to the others when its zone has none left. Drained zones (a zone
// shift) take no new traffic while another zone has a healthy backend (they are the last
// resort), and keep their existing sessions.
//
// Shares computes the resulting share of all traffic per backend (what an operator checks,
// and what the tests check on a two-zone example). Localities gives the same policy as Envoy
// localities and priorities, the form the xDS server publishes per node.
package zones

import (
	"slices"
	"strings"
)

// Backend is one backend as zone weighting sees it.
type Backend struct {
	ID      string // backend identity
	Zone    string
	Weight  float64 // > 0 takes traffic
	Healthy bool
	Drain   bool // takes no new traffic (keeps its sessions)
}

func (b Backend) takesNew(drained map[string]bool) bool {
	return b.usable() && !drained[b.Zone]
}

// usable: the backend could take new traffic, its zone's drain aside (a drained zone is
// the last resort).
func (b Backend) usable() bool { return b.Healthy && !b.Drain && b.Weight > 0 }

// Node is a zone's group of load-balancer nodes and the share of all client traffic that
// reaches them (in a two-zone fleet with even DNS weights, half each).
type Node struct {
	Zone    string
	Traffic float64
}

// Policy is the zone policy of a service.
type Policy struct {
	CrossZone    bool
	DrainedZones []string
}

func (p Policy) drained() map[string]bool {
	m := make(map[string]bool, len(p.DrainedZones))
	for _, z := range p.DrainedZones {
		m[z] = true
	}
	return m
}

// Shares returns, per backend ID, the share of the total traffic it receives when each
// node group spreads its traffic by weight over the backends its policy allows. Traffic
// with nowhere to go (no backend takes new traffic anywhere) is left out, so the shares then
// sum to less than the total.
func Shares(nodes []Node, backends []Backend, p Policy) map[string]float64 {
	drained := p.drained()
	out := make(map[string]float64, len(backends))
	for _, b := range backends {
		out[b.ID] = 0
	}
	spread := func(traffic float64, pick func(Backend) bool) bool {
		total := 0.0
		for _, b := range backends {
			if pick(b) {
				total += b.Weight
			}
		}
		if total == 0 {
			return false
		}
		for _, b := range backends {
			if pick(b) {
				out[b.ID] += traffic * b.Weight / total
			}
		}
		return true
	}
	for _, n := range nodes {
		// Own zone first (cross-zone off), then every other zone (failover), then, as a
		// last resort on every tier, the drained zones.
		if !p.CrossZone && spread(n.Traffic, func(b Backend) bool { return b.takesNew(drained) && b.Zone == n.Zone }) {
			continue
		}
		if spread(n.Traffic, func(b Backend) bool { return b.takesNew(drained) }) {
			continue
		}
		spread(n.Traffic, func(b Backend) bool { return b.usable() && drained[b.Zone] })
	}
	return out
}

// Endpoint is a backend inside a Locality.
type Endpoint struct {
	ID       string
	Weight   float64
	Healthy  bool
	Draining bool // drained backend or drained zone: keeps sessions, takes no new ones
}

// Locality is a zone at a priority, as Envoy's LocalityLbEndpoints.
type Locality struct {
	Zone      string
	Priority  uint32
	Weight    float64 // the sum of its endpoints' weights
	Endpoints []Endpoint
}

// Localities groups backends into localities for a node in zone nodeZone:
//   - cross-zone on: every zone at priority 0;
//   - off: the node's zone at priority 0, the other zones at priority 1 (failover only);
//     a node in no zone of the service ("" or unknown) sees every zone at priority 0;
//   - drained zones go below all of them, at the lowest priority, with every endpoint
//     Draining: they take no new traffic unless nothing else is left;
//   - priorities are then renumbered from 0 without gaps, as Envoy and gRPC require.
//
// Localities are ordered by priority, then zone; endpoints by ID (Envoy walks EDS in order,
// so every node must see one order).
func Localities(nodeZone string, backends []Backend, p Policy) []Locality {
	drained := p.drained()
	known := false
	for _, b := range backends {
		if b.Zone == nodeZone {
			known = true
		}
	}
	byZone := map[string]*Locality{}
	var maxPrio uint32
	for _, b := range backends {
		l := byZone[b.Zone]
		if l == nil {
			l = &Locality{Zone: b.Zone}
			if !p.CrossZone && known && b.Zone != nodeZone {
				l.Priority = 1
			}
			byZone[b.Zone] = l
		}
		if !drained[b.Zone] && l.Priority > maxPrio {
			maxPrio = l.Priority
		}
		l.Endpoints = append(l.Endpoints, Endpoint{ID: b.ID, Weight: b.Weight, Healthy: b.Healthy, Draining: b.Drain || drained[b.Zone]})
		l.Weight += b.Weight
	}
	out := make([]Locality, 0, len(byZone))
	for z, l := range byZone {
		if drained[z] {
			l.Priority = maxPrio + 1
		}
		slices.SortFunc(l.Endpoints, func(a, b Endpoint) int { return strings.Compare(a.ID, b.ID) })
		out = append(out, *l)
	}
	// Envoy and gRPC need priorities numbered from 0 without gaps (a drained own zone leaves
	// priority 0 empty otherwise).
	var prios []uint32
	for _, l := range out {
		prios = append(prios, l.Priority)
	}
	slices.Sort(prios)
	prios = slices.Compact(prios)
	for i := range out {
		out[i].Priority = uint32(slices.Index(prios, out[i].Priority))
	}
	slices.SortFunc(out, func(a, b Locality) int {
		if a.Priority != b.Priority {
			return int(a.Priority) - int(b.Priority)
		}
		return strings.Compare(a.Zone, b.Zone)
	})
	return out
}
