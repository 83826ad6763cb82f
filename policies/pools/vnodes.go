package pools

import "github.com/stickylb/stickylb/policies/chash"

// MinWeight returns the smallest weight among the service's backends (draining ones
// included), the unit of hash.virtual_nodes: a backend of weight w gets
// VirtualNodes × w / MinWeight ring points. Taking it from the file, not from the backends
// healthy at the moment, keeps every backend's points when the lightest one turns unhealthy.
// It is 0 for a service without backends.
func (s *Service) MinWeight() uint32 {
	var least uint32
	for _, b := range s.Backends {
		if b.Weight != 0 && (least == 0 || b.Weight < least) {
			least = b.Weight
		}
	}
	return least
}

// decodeVirtualNodes reads hash.virtual_nodes (fs are the hash block's fields).
func (d *decoder) decodeVirtualNodes(st *svcState, fs map[string]field) {
	f, ok := fs["virtual_nodes"]
	if !ok {
		return
	}
	v, ok := d.integer(f)
	switch {
	case !ok:
		st.bad["hash.virtual_nodes"] = true
	case v < 1 || v > MaxRingSize:
		d.errorf(f.val, "virtual_nodes %d out of range 1..%d (150-200 is the usual choice)", v, MaxRingSize)
		st.bad["hash.virtual_nodes"] = true
	default:
		st.s.Hash.VirtualNodes = uint64(v)
	}
}

// checkVirtualNodes applies the rules of hash.virtual_nodes, after defaults: ring_hash only,
// exclusive with the ring sizes it replaces, and a ring Envoy accepts (gRPC's cap warns).
func (d *decoder) checkVirtualNodes(st *svcState) {
	s := st.s
	if !st.has("hash.virtual_nodes") || !st.good("hash.virtual_nodes") {
		return
	}
	vLine := st.keyPos("hash.virtual_nodes").Line
	if st.good("balance") && s.Balance == BalanceMaglev {
		d.errorf(st.keyPos("hash.virtual_nodes"), "hash virtual_nodes applies to balance ring_hash, not maglev (Maglev balances by table_size; its ring fallback uses min_ring_size and max_ring_size)")
	}
	for _, name := range []string{"min_ring_size", "max_ring_size"} {
		if st.has("hash." + name) {
			d.errorf(st.keyPos("hash."+name), "hash %s and virtual_nodes (line %d) are exclusive: virtual_nodes sets both ring sizes from the backends; remove one", name, vLine)
		}
	}
	if s.Balance != BalanceRingHash || len(s.Backends) == 0 {
		return
	}
	hosts := make([]chash.Host, 0, len(s.Backends))
	var sum uint64
	for _, b := range s.Backends {
		if b.Weight == 0 {
			return // reported with the backend
		}
		hosts = append(hosts, chash.Host{ID: b.Identity(), Weight: b.Weight})
		sum += uint64(b.Weight)
	}
	v, least := s.Hash.VirtualNodes, s.MinWeight()
	size, err := chash.VirtualNodesRingSize(hosts, v, least)
	if err != nil {
		d.errorf(st.pos("hash.virtual_nodes"), "virtual_nodes %d: %d x total weight %d / smallest weight %d is more than Envoy's largest ring (%d points)", v, v, sum, least, MaxRingSize)
		return
	}
	if s.Protocol == ProtocolGRPC && size > GRPCMaxRingSize {
		d.warnf(st.pos("hash.virtual_nodes"), "virtual_nodes %d makes a ring of %d points (%d x total weight %d / smallest weight %d); gRPC caps rings at %d, so gRPC clients will build a smaller ring than Envoy and Caddy and pick other backends for some keys (stickylb plan shows both)", v, size, v, sum, least, GRPCMaxRingSize)
	}
}
