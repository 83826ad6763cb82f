package chash

import (
	"cmp"
	"slices"
)

// ModN is the baseline every consistent hash is measured against: hash % n over the hosts
// in identity order, ignoring weights. Changing n moves about n/(n+1) of all keys, which is
// the problem consistent hashing exists to solve; it is here for comparisons (`stickylb plan`,
// benchmarks), not for serving.
type ModN struct {
	order []int32 // identity position -> caller index
	n     fastMod
}

// NewModN builds the mod-N baseline. Hosts are sorted by ID (ties by caller index) so that,
// like Maglev and the ring, the result does not depend on input order. Unlike them it does
// not validate: weights are ignored and IDs only order the hosts.
func NewModN(hosts []Host) *ModN {
	order := make([]int32, len(hosts))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int {
		return cmp.Or(cmp.Compare(hosts[a].ID, hosts[b].ID), cmp.Compare(a, b))
	})
	return &ModN{order: order, n: newFastMod(uint64(len(order)))}
}

// Pick returns the caller index of host hash % n in identity order, or -1 with no hosts.
func (m *ModN) Pick(hash uint64) int {
	if len(m.order) == 0 {
		return -1
	}
	return int(m.order[m.n.mod(hash)])
}

// Len returns the number of hosts.
func (m *ModN) Len() int { return len(m.order) }
