// Which backends take a service's new flows on this node: health, drain, zones.

package l4xdp

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
// not see start (global). The rule is the xDS tier's (policies/zones.Localities):
//   - healthy backends outside drained zones; with crossZone off, only the node's zone's
//     while it has any (a node in no zone of the service sees every zone);
//   - else healthy backends of drained zones (a drained zone is the last resort);
//   - else, fail open (panicking), the down backends outside drained zones, else those in
//     them.
//
// Draining backends never take new flows. global ignores the node's zone, so that every
// node agrees on where a flow that moved between nodes goes.
func candidates(ms []member, nodeZone string, crossZone bool) (pick, global []member, panicking bool) {
	filter := func(keep func(m member) bool) []member {
		var out []member
		for _, m := range ms {
			if !m.drain && keep(m) {
				out = append(out, m)
			}
		}
		return out
	}
	for _, tier := range []struct {
		keep  func(m member) bool
		panic bool
	}{
		{func(m member) bool { return !m.down && !m.zoneDrained }, false},
		{func(m member) bool { return !m.down && m.zoneDrained }, false},
		{func(m member) bool { return m.down && !m.zoneDrained }, true},
		{func(m member) bool { return m.down && m.zoneDrained }, true},
	} {
		if global = filter(tier.keep); len(global) > 0 {
			panicking = tier.panic
			break
		}
	}
	pick = global
	if !crossZone && nodeZone != "" {
		var own []member
		known := false
		for _, m := range ms {
			known = known || m.zone == nodeZone
		}
		for _, m := range global {
			if m.zone == nodeZone {
				own = append(own, m)
			}
		}
		if known && len(own) > 0 {
			pick = own
		}
	}
	return pick, global, panicking
}
