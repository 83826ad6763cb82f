package chash

import (
	"errors"
	"fmt"
	"math"
)

// ErrVirtualNodes classifies a virtual-node setting that cannot be served: zero nodes, or a
// ring larger than Envoy accepts.
var ErrVirtualNodes = errors.New("invalid virtual nodes")

// VirtualNodesRingSize returns the ring size that gives every host vnodes points per
// minWeight of weight: ceil(vnodes × W / minWeight), W the sum of the hosts' weights.
// minWeight is the smallest weight the service can have (its pools file's lightest backend),
// or 0 for the smallest weight among hosts.
//
// Served as both minimum_ring_size and maximum_ring_size, this size makes Envoy's, gRPC's
// and [NewRing]'s build give host h about vnodes × w(h) / minWeight points, whatever the
// other hosts are: scale = min(ceil(minW×S)/minW, S) is S itself because the lightest host's
// share minW×S is already a whole number (or rounds up past it), and each host then takes
// S × w(h)/W = vnodes × w(h)/minWeight entries. Exact when minWeight divides vnodes × w(h)
// for every host (equal weights always); otherwise the fractional leftovers go to the hosts
// in identity order, one point more or less. A host that keeps its weight thus keeps its
// points ("ID_0" .. "ID_k", numbered per host) when others are added, removed, or turn
// unhealthy, so only the keys of the hosts that change move: the fixed-virtual-node ring of
// classic consistent hashing, where a fixed total ring size takes points from every host.
//
// The size must be recomputed whenever the set of hosts changes (the xDS server does it per
// snapshot). It fails when the ring would exceed [MaxRingSize]; gRPC clients cap it at
// [GRPCRingSizeCap] and then build a ring of that total size, which no longer agrees.
func VirtualNodesRingSize(hosts []Host, vnodes uint64, minWeight uint32) (uint64, error) {
	if vnodes == 0 {
		return 0, fmt.Errorf("sizing ring: %w: virtual nodes must be >= 1", ErrVirtualNodes)
	}
	if len(hosts) == 0 {
		return 0, nil
	}
	var sum uint64
	least := uint32(math.MaxUint32)
	for i, h := range hosts {
		if h.Weight == 0 {
			return 0, fmt.Errorf("sizing ring: host %d (%q): %w", i, h.ID, ErrZeroWeight)
		}
		sum += uint64(h.Weight)
		least = min(least, h.Weight)
	}
	if minWeight == 0 {
		minWeight = least
	}
	if minWeight > least {
		return 0, fmt.Errorf("sizing ring: %w: minimum weight %d is above the lightest host's %d",
			ErrVirtualNodes, minWeight, least)
	}
	// vnodes × sum in 128 bits would be exact; bound vnodes first so the product fits.
	if vnodes > MaxRingSize || sum > math.MaxUint32 {
		return 0, fmt.Errorf("sizing ring: %w: %d virtual nodes over weights summing to %d exceed %d points",
			ErrVirtualNodes, vnodes, sum, MaxRingSize)
	}
	size := (vnodes*sum + uint64(minWeight) - 1) / uint64(minWeight)
	if size > MaxRingSize {
		return 0, fmt.Errorf("sizing ring: %w: %d virtual nodes x weight %d / smallest weight %d = %d points, above Envoy's limit %d",
			ErrVirtualNodes, vnodes, sum, minWeight, size, MaxRingSize)
	}
	return size, nil
}

// NewVirtualNodesRing builds the ring of [VirtualNodesRingSize]: [NewRing] with both sizes
// set to it, so it is the ring Envoy and gRPC build from those sizes.
func NewVirtualNodesRing(hosts []Host, vnodes uint64, minWeight uint32) (*Ring, error) {
	size, err := VirtualNodesRingSize(hosts, vnodes, minWeight)
	if err != nil {
		return nil, fmt.Errorf("building ring: %w", err)
	}
	if len(hosts) == 0 {
		return NewRing(hosts, 1, 1)
	}
	return NewRing(hosts, size, size)
}
