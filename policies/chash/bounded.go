package chash

import "math"

// Walker is a [Picker] whose hosts bounded load can probe: it knows each host's normalized
// weight and the identity order of its hosts. [Maglev] and [Ring] implement it.
type Walker interface {
	Picker
	// Weight returns host i's normalized weight: its weight over the sum of all weights.
	Weight(i int) float64
	// Nth returns the caller index of the k-th host in identity order, 0 <= k < Len(). This
	// is the order Envoy's bounded load shuffles over (its host list is EDS order, and our
	// xDS server sorts EDS by identity).
	Nth(k int) int
}

// LoadFunc returns the current load of host i (caller index): Envoy uses the host's active
// requests, rq_active.
type LoadFunc func(i int) int64

// PickBounded is Pick with Envoy's bounded load (consistent_hashing_lb_config
// hash_balance_factor; ThreadAwareLoadBalancerBase::BoundedLoadHashingLoadBalancer), the
// "consistent hashing with bounded loads" of Mirrokni et al. It is off when balanceFactor
// <= 0, and then returns p.Pick(hash) without calling load.
//
// balanceFactor is the factor as a multiplier: 1.5 is Envoy's hash_balance_factor 150. It is
// converted to Envoy's integer percent (rounded); values in (0, 1) count as 1 (100, the
// least Envoy accepts). total is the number of requests active across all hosts
// (upstream_rq_active). With those, as Envoy computes them in integers:
//
//	totalSlots = ceil((total+1) * percent / 100)
//	slots(i)   = max(ceil(totalSlots * weight(i)), 1)
//
// host i is acceptable while load(i) <= slots(i). If the hashed host is not, Envoy does not
// walk to the next ring point or table slot (neighbours would inherit the overflow in a
// cascade); it probes the other hosts in a pseudo-random order that depends only on the hash
// (a Fisher-Yates shuffle driven by std::mt19937 seeded with the hash, Chen et al.'s "random
// jumps"), and takes the first acceptable one. When every host is overloaded it returns the
// least overloaded (load/slots), the hashed host winning ties.
//
// This is Envoy's rule rather than the textbook "walk to the next host below
// ceil(balance*(total+1)/n)": load (not load+1) is compared, slots follow the weights, and
// the probe order is Envoy's shuffle, so an Envoy and a Caddy node with the same loads make
// the same choice. Envoy multiplies (total+1)*percent in uint32 and would wrap beyond about
// 28M active requests at 150; we use uint64. Envoy's retry attempts (which perturb the hash
// before the lookup) are not modelled: callers pass the hash they look up.
//
// PickBounded allocates nothing when the hashed host is acceptable, and nothing for up to 256
// hosts otherwise.
func PickBounded(p Walker, hash uint64, balanceFactor float64, load LoadFunc, total int64) int {
	first := p.Pick(hash)
	if first < 0 || balanceFactor <= 0 || load == nil {
		return first
	}
	percent := uint64(math.Round(balanceFactor * 100))
	if percent < 100 {
		percent = 100
	}
	if total < 0 {
		total = 0
	}
	b := bounds{p: p, load: load, totalSlots: ((uint64(total)+1)*percent + 99) / 100}
	f := b.overload(first)
	if f <= 1.0 {
		return first
	}
	return b.probe(hash, first, f)
}

// bounds holds what Envoy's hostOverloadFactor needs.
type bounds struct {
	p          Walker
	load       LoadFunc
	totalSlots uint64
}

// overload is Envoy's hostOverloadFactor: active requests over the host's slots.
func (b *bounds) overload(i int) float64 {
	slots := math.Max(math.Ceil(float64(b.totalSlots)*b.p.Weight(i)), 1)
	active := b.load(i)
	if active < 0 {
		active = 0
	}
	return float64(active) / slots
}

// probe is the slow path, kept out of PickBounded so its 3 KiB of generator state and
// shuffle buffer are not in the fast path's stack frame.
//
//go:noinline
func (b *bounds) probe(hash uint64, first int, f float64) int {
	n := b.p.Len()
	var buf [256]int32
	idx := buf[:0]
	if n > len(buf) {
		idx = make([]int32, 0, n)
	}
	for k := range n {
		idx = append(idx, int32(k))
	}
	var rng mt19937
	rng.seed(uint32(hash))
	best, bestF := first, f
	for i := range n {
		j := int(rng.uniform(uint32(n - i)))
		idx[i], idx[i+j] = idx[i+j], idx[i]
		alt := b.p.Nth(int(idx[i]))
		if alt == first {
			continue
		}
		af := b.overload(alt)
		if af <= 1.0 {
			return alt
		}
		if bestF > af {
			best, bestF = alt, af
		}
	}
	return best
}
