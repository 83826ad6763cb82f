// Which backends take a service's new flows on this node: health, drain, zones.

package l4xdp

import (
	"slices"

	"github.com/stickylb/stickylb/policies/zones"
)

// member is one backend of a service as the table builder sees it.
type member struct {
	slot        uint32
	id          string // identity: what Maglev hashes
	zone        string
	weight      uint32 // effective weight in weightScale units (slow start applied), >= 1
	ramping     bool   // slow start holds its weight down
	down        bool   // found down by the health checks
	drain       bool   // the backend drains: no new flows, ever (not even in panic)
	zoneDrained bool   // its zone is in drained_zones: a last resort
}

// candidates splits a service's members into the backends new flows go to on a node of
// nodeZone (pick) and the backends the node's Maglev table spreads over for flows it did
// not see start (global), by the zone rule every tier applies (zones.Eligible): pick is
// its Local, global its Fleet (the same on every node, so that every node agrees on where a
// flow that moved between nodes goes), panicking its FailOpen.
func candidates(ms []member, nodeZone string, crossZone bool) (pick, global []member, panicking bool) {
	bs := make([]zones.Backend, len(ms))
	p := zones.Policy{CrossZone: crossZone}
	for i, m := range ms {
		bs[i] = zones.Backend{ID: m.id, Zone: m.zone, Weight: float64(m.weight), Healthy: !m.down, Drain: m.drain}
		if m.zoneDrained && !slices.Contains(p.DrainedZones, m.zone) {
			p.DrainedZones = append(p.DrainedZones, m.zone)
		}
	}
	e := zones.Eligible(nodeZone, bs, p)
	return membersAt(ms, e.Local), membersAt(ms, e.Fleet), e.FailOpen
}

// membersAt returns the members at the indexes.
func membersAt(ms []member, at []int) []member {
	if len(at) == 0 {
		return nil
	}
	out := make([]member, len(at))
	for i, k := range at {
		out[i] = ms[k]
	}
	return out
}

// draining returns the members of ms that are healthy, not in taking (the backends new flows
// go to) and drain, themselves or by their zone: they take no new flows but may hold
// connections (the second-chance table's secondaries).
func draining(ms, taking []member) []member {
	in := map[uint32]bool{}
	for _, m := range taking {
		in[m.slot] = true
	}
	var out []member
	for _, m := range ms {
		if !in[m.slot] && !m.down && (m.drain || m.zoneDrained) {
			out = append(out, m)
		}
	}
	return out
}
