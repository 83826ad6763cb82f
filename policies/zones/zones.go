// Package zones spreads traffic across availability zones: with cross-zone balancing on, a
// load-balancer node spreads over the healthy backends of every zone; off, only over its own
// zone's, failing over to the others when its zone has none left. Drained zones (a zone
// shift) take no new traffic while another zone has a healthy backend (they are the last
// resort), and keep their existing sessions. When no backend that takes new traffic is
// healthy, the service fails open to the down ones, in the same order.
//
// The rule is written once, in rank and Eligible; every tier applies it through them:
// Eligible gives the backends a node sends new traffic to (the XDP and Caddy nodes),
// Localities gives the same order as Envoy localities and priorities (the form the xDS
// server publishes per node, for clients that apply health themselves), and Shares the
// resulting share of all traffic per backend (what an operator checks, and what the tests
// check on a two-zone example).
package zones

import (
	"slices"
	"strings"
)

// Backend is one backend as zone weighting sees it.
type Backend struct {
	ID      string // backend identity
	Zone    string
	Weight  float64 // > 0 takes traffic (Shares; Eligible does not weigh)
	Healthy bool    // not known down (a backend not probed yet counts as healthy)
	Drain   bool    // takes no new traffic (keeps its sessions), whatever its zone
}

// Traffic is the share of all client traffic that enters the fleet in a zone, through its
// load-balancer nodes (in a two-zone fleet with even DNS weights, half each).
type Traffic struct {
	Zone  string
	Share float64
}

// Policy is the zone policy of a service.
type Policy struct {
	CrossZone    bool
	DrainedZones []string
}

// ranker orders zones for one node (see rank).
type ranker struct {
	// own is the node's zone when it keeps to it (cross_zone off); "" when every zone is
	// the node's own (cross_zone on, or a node of no zone).
	own     string
	drained map[string]bool
}

func (p Policy) ranker(nodeZone string) ranker {
	r := ranker{drained: make(map[string]bool, len(p.DrainedZones))}
	for _, z := range p.DrainedZones {
		r.drained[z] = true
	}
	if !p.CrossZone {
		r.own = nodeZone
	}
	return r
}

// rank is the rule: the order in which a node turns to a backend's zone for new traffic,
// the lowest first.
//
//	0  the node's zone (cross_zone off), or every zone (cross_zone on, a node of no zone)
//	1  the other zones (failover)
//	2  the node's zone when drained
//	3  the other drained zones (the last resort)
//
// A node whose zone no backend is in has no rank 0 (nor 2) to turn to, so it spreads over
// every zone as a node of no zone does.
func (r ranker) rank(zone string) int {
	n := 0
	if r.own != "" && zone != r.own {
		n = 1
	}
	if r.drained[zone] {
		n += 2
	}
	return n
}

// Eligibility is where a service's new traffic goes, as indexes into the backends given to
// Eligible, in their order.
type Eligibility struct {
	// Local are the backends the node sends new traffic to.
	Local []int
	// Fleet are those a node of no zone sends it to: the same whatever the node's zone, so
	// every node agrees on them (XDP's table for flows that started on another node).
	Fleet []int
	// FailOpen: no backend that takes new traffic is healthy; Local and Fleet hold the down
	// ones, which every tier routes to rather than to nothing.
	FailOpen bool
	// LastResort: Fleet is in drained zones, which take new traffic as no other zone can.
	LastResort bool
	// OwnZone: Local is the node's zone's part of the backends it could turn to (cross_zone
	// off, and its zone has one), not every zone's.
	OwnZone bool
}

// Eligible applies the rule for a node of nodeZone: new traffic goes to the healthy
// backends that do not drain, of the lowest rank that has any; when none is healthy (fail
// open), to the down ones that do not drain, of the lowest rank that has any. A draining
// backend never takes new traffic, not even in fail open.
func Eligible(nodeZone string, bs []Backend, p Policy) Eligibility {
	var e Eligibility
	live := false
	e.FailOpen = true
	for _, b := range bs {
		if !b.Drain {
			live = true
			if b.Healthy {
				e.FailOpen = false
				break
			}
		}
	}
	if !live {
		return Eligibility{}
	}
	node, fleet := p.ranker(nodeZone), p.ranker("")
	lowest := func(r ranker) []int {
		best := 4
		var out []int
		for i, b := range bs {
			if b.Drain || !b.Healthy && !e.FailOpen {
				continue
			}
			switch k := r.rank(b.Zone); {
			case k < best:
				best, out = k, append(out[:0], i)
			case k == best:
				out = append(out, i)
			}
		}
		return out
	}
	e.Local, e.Fleet = lowest(node), lowest(fleet)
	e.LastResort = fleet.drained[bs[e.Fleet[0]].Zone]
	e.OwnZone = node.own != "" && bs[e.Local[0]].Zone == node.own
	return e
}

// Shares returns, per backend ID, the share of the total traffic it receives when each
// zone's nodes spread their traffic by weight over the backends Eligible gives them.
// Traffic with nowhere to go (no backend takes new traffic anywhere: Eligible would fail
// open) is left out, so the shares then sum to less than the total. A backend of weight 0
// takes nothing.
func Shares(traffic []Traffic, backends []Backend, p Policy) map[string]float64 {
	out := make(map[string]float64, len(backends))
	takes := make([]Backend, len(backends))
	for i, b := range backends {
		out[b.ID] = 0
		b.Healthy = b.Healthy && b.Weight > 0
		takes[i] = b
	}
	for _, t := range traffic {
		e := Eligible(t.Zone, takes, p)
		if e.FailOpen {
			continue
		}
		total := 0.0
		for _, i := range e.Local {
			total += takes[i].Weight
		}
		for _, i := range e.Local {
			out[takes[i].ID] += t.Share * takes[i].Weight / total
		}
	}
	return out
}

// Endpoint is a backend inside a Locality.
type Endpoint struct {
	ID      string
	Weight  float64
	Healthy bool
	// Draining: takes no new traffic, keeps its sessions: the backend drains, or its zone
	// is drained and not the last resort (see Eligibility.LastResort).
	Draining bool
}

// Locality is a zone at a priority, as Envoy's LocalityLbEndpoints.
type Locality struct {
	Zone      string
	Priority  uint32
	Weight    float64 // the sum of its endpoints' weights
	Endpoints []Endpoint
}

// Localities groups backends into localities for a node in zone nodeZone, at the priority
// of their zone's rank: cross-zone on, every zone at priority 0; off, the node's zone at 0
// and the others at 1 (failover only), a node in no zone of the service ("" or unknown)
// seeing every zone at 0; drained zones below all of them, the node's own first with
// cross-zone off. Priorities are then renumbered from 0 without gaps, as Envoy and gRPC
// require. A client that takes the lowest priority with a healthy endpoint, as Envoy and
// gRPC do, so sends new traffic where Eligible does (the drained zones' endpoints take new
// traffic only as the last resort: Draining otherwise).
//
// Localities are ordered by priority, then zone; endpoints by ID (Envoy walks EDS in order,
// so every node must see one order).
func Localities(nodeZone string, backends []Backend, p Policy) []Locality {
	r := p.ranker(nodeZone)
	lastResort := Eligible("", backends, p).LastResort
	byZone := map[string]*Locality{}
	for _, b := range backends {
		l := byZone[b.Zone]
		if l == nil {
			l = &Locality{Zone: b.Zone, Priority: uint32(r.rank(b.Zone))}
			byZone[b.Zone] = l
		}
		l.Endpoints = append(l.Endpoints, Endpoint{ID: b.ID, Weight: b.Weight, Healthy: b.Healthy,
			Draining: b.Drain || r.drained[b.Zone] && !lastResort})
		l.Weight += b.Weight
	}
	out := make([]Locality, 0, len(byZone))
	var prios []uint32
	for _, l := range byZone {
		slices.SortFunc(l.Endpoints, func(a, b Endpoint) int { return strings.Compare(a.ID, b.ID) })
		out = append(out, *l)
		prios = append(prios, l.Priority)
	}
	// Envoy and gRPC need priorities numbered from 0 without gaps (a drained own zone leaves
	// priority 0 empty otherwise).
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
