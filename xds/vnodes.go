package xds

import (
	"fmt"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/pools"
)

// ringSized returns s with both ring sizes set for hash.virtual_nodes from the hosts cla
// gives this node's ring, or s itself when the service has no virtual nodes.
//
// Envoy and gRPC build a ring per priority over its healthy endpoints (HEALTHY or UNKNOWN;
// UNHEALTHY and DRAINING are left out), and with our overprovisioning factor all traffic
// goes to the first priority that has one. Sizing min = max = V x W / w_min from exactly
// those hosts, with w_min the file's smallest weight, gives each of them its V x w / w_min
// points, the same points it had before a backend was added, removed or turned unhealthy,
// and the same ring a Caddy node builds over its eligible upstreams. Sizes therefore change
// with health: the cluster is re-sent with the endpoints.
func ringSized(s *pools.Service, cla *endpointv3.ClusterLoadAssignment) (*pools.Service, error) {
	if s.Balance != pools.BalanceRingHash || s.Hash.VirtualNodes == 0 {
		return s, nil
	}
	hosts := ringHosts(cla)
	if len(hosts) == 0 {
		// No host takes traffic: no ring is built; size it for every backend.
		for _, b := range s.Backends {
			hosts = append(hosts, chash.Host{ID: b.Identity(), Weight: b.Weight})
		}
	}
	size, err := chash.VirtualNodesRingSize(hosts, s.Hash.VirtualNodes, s.MinWeight())
	if err != nil {
		return nil, fmt.Errorf("ring of %d virtual nodes: %w", s.Hash.VirtualNodes, err)
	}
	sized := *s
	sized.Hash.MinRingSize, sized.Hash.MaxRingSize = max(size, 1), max(size, 1)
	return &sized, nil
}

// ringHosts returns the endpoints of the first priority with an endpoint that takes new
// traffic (HEALTHY or UNKNOWN), as Envoy and gRPC place them on the ring (weights only: the
// IDs are not needed to size it).
func ringHosts(cla *endpointv3.ClusterLoadAssignment) []chash.Host {
	var best []chash.Host
	bestPrio := uint32(0)
	for _, le := range cla.GetEndpoints() {
		var hs []chash.Host
		for _, e := range le.GetLbEndpoints() {
			if st := e.GetHealthStatus(); st != corev3.HealthStatus_HEALTHY && st != corev3.HealthStatus_UNKNOWN {
				continue
			}
			hs = append(hs, chash.Host{ID: e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress(), Weight: e.GetLoadBalancingWeight().GetValue()})
		}
		switch p := le.GetPriority(); {
		case len(hs) == 0:
		case best == nil || p < bestPrio:
			best, bestPrio = hs, p
		case p == bestPrio:
			best = append(best, hs...)
		}
	}
	return best
}
