// Package chash holds the consistent-hashing algorithms that every stickylb tier shares:
// weighted Maglev (Caddy, Envoy, XDP), the ketama ring hash (Caddy, Envoy, gRPC), a mod-N
// baseline, and Envoy's bounded-load probe.
//
// The algorithms are bit-compatible with Envoy (source/extensions/load_balancing_policies/
// {maglev,ring_hash,common}) and, for the ring, with grpc-go's ring_hash_experimental: the same
// host set and the same request hash select the same backend in every tier, with no shared
// state. That is why the details below follow Envoy to the last rounding step rather than any
// textbook variant:
//
//   - keys are hashed with XXH64, seed 0 ([KeyHash]);
//   - a host is hashed by its identity string (hash_key, else the address as written);
//   - weights are normalized as Envoy does: weight/sum as float64;
//   - hosts are placed in identity order (see [NewMaglev] and [NewRing] for why).
package chash

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// Host is one backend as the hashing algorithms see it.
type Host struct {
	// ID is the backend's identity: its hash_key when set, else its address as written. It is
	// the string Envoy and gRPC hash to place the host, so it must be spelled exactly as the
	// xDS endpoint (or the Caddy upstream) spells it.
	ID string
	// Weight is the backend's relative weight, >= 1 (Envoy rejects endpoint weight 0).
	Weight uint32
}

// Picker maps a request hash to a host.
type Picker interface {
	// Pick returns an index into the hosts slice given to the constructor, or -1 when the
	// picker has no hosts.
	Pick(hash uint64) int
	// Len returns the number of hosts the picker was built from.
	Len() int
}

// KeyHash hashes a request key the way Envoy's hash policies and gRPC's ring_hash do: XXH64
// with seed 0 over the key's bytes. Every tier must use it, or the tiers stop agreeing.
func KeyHash(key string) uint64 { return xxhash.Sum64String(key) }

// ErrNoHostID, ErrZeroWeight, ErrDuplicateID and ErrWeightSum classify host-set errors, so a
// config validator can point at the offending backend.
var (
	ErrNoHostID    = errors.New("host has an empty ID")
	ErrZeroWeight  = errors.New("host weight is 0 (must be >= 1)")
	ErrDuplicateID = errors.New("duplicate host ID")
	ErrWeightSum   = errors.New("sum of host weights exceeds 4294967295")
)

// sortedHosts is the host set in identity order, with everything the builders derive from it.
type sortedHosts struct {
	ids    []string  // identity order
	order  []int32   // identity position -> caller index
	weight []float64 // identity position -> normalized weight (weight/sum), as Envoy computes it
	minW   float64   // Envoy's min_normalized_weight (starts at 1.0)
	maxW   float64   // Envoy's max_normalized_weight (starts at 0.0)
	byIdx  []float64 // caller index -> normalized weight
}

// prepare validates hosts and sorts a copy by ID. When unsorted is set (test-only variants)
// the caller's order is kept, which is what Envoy's ring does with unsorted EDS.
func prepare(hosts []Host, unsorted bool) (*sortedHosts, error) {
	n := len(hosts)
	if n > math.MaxInt32 {
		return nil, fmt.Errorf("validating hosts: %d hosts is more than %d", n, math.MaxInt32)
	}
	order := make([]int32, n)
	var sum uint64
	for i, h := range hosts {
		order[i] = int32(i)
		if h.ID == "" {
			return nil, fmt.Errorf("validating host %d: %w", i, ErrNoHostID)
		}
		if h.Weight == 0 {
			return nil, fmt.Errorf("validating host %d (%q): %w", i, h.ID, ErrZeroWeight)
		}
		sum += uint64(h.Weight)
	}
	// Envoy's validateEndpoints rejects a sum that does not fit in uint32 (gRPC would silently
	// wrap its uint32 sum), so such a host set cannot be served to either.
	if sum > math.MaxUint32 {
		return nil, fmt.Errorf("validating hosts: %w (%d)", ErrWeightSum, sum)
	}
	// Sorting also finds duplicates, so do it even for the unsorted variant.
	sorted := slices.Clone(order)
	slices.SortFunc(sorted, func(a, b int32) int {
		return cmp.Or(cmp.Compare(hosts[a].ID, hosts[b].ID), cmp.Compare(a, b))
	})
	for k := 1; k < n; k++ {
		if hosts[sorted[k]].ID == hosts[sorted[k-1]].ID {
			return nil, fmt.Errorf("validating hosts %d and %d: %w %q",
				sorted[k-1], sorted[k], ErrDuplicateID, hosts[sorted[k]].ID)
		}
	}
	if !unsorted {
		order = sorted
	}
	s := &sortedHosts{
		ids:    make([]string, n),
		order:  order,
		weight: make([]float64, n),
		minW:   1.0,
		maxW:   0.0,
		byIdx:  make([]float64, n),
	}
	for k, i := range order {
		// Envoy: host->weight() * normalized_locality_weight / sum, with the locality weight
		// 1.0 when locality weighting is off; w*1.0 is exact, so this is the same double.
		w := float64(hosts[i].Weight) / float64(sum)
		s.ids[k] = hosts[i].ID
		s.weight[k] = w
		s.byIdx[i] = w
		s.minW = math.Min(s.minW, w)
		s.maxW = math.Max(s.maxW, w)
	}
	return s, nil
}

// IsPrime reports whether n is prime. Maglev needs a prime table size so that every skip
// (1..size-1) is coprime with it and each host's permutation visits every slot.
func IsPrime(n uint64) bool {
	if n < 2 {
		return false
	}
	for _, p := range [...]uint64{2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37} {
		if n%p == 0 {
			return n == p
		}
	}
	// Miller-Rabin with the first 12 primes as bases is exact for every n < 3.3e24, so for
	// all of uint64.
	d, r := n-1, 0
	for d%2 == 0 {
		d /= 2
		r++
	}
	for _, a := range [...]uint64{2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37} {
		x := powMod(a, d, n)
		if x == 1 || x == n-1 {
			continue
		}
		composite := true
		for i := 1; i < r; i++ {
			x = mulMod(x, x, n)
			if x == n-1 {
				composite = false
				break
			}
		}
		if composite {
			return false
		}
	}
	return true
}

func mulMod(a, b, m uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return bits.Rem64(hi, lo, m)
}

func powMod(b, e, m uint64) uint64 {
	r := uint64(1)
	b %= m
	for e > 0 {
		if e&1 == 1 {
			r = mulMod(r, b, m)
		}
		b = mulMod(b, b, m)
		e >>= 1
	}
	return r
}

// Hash algorithm names, as the pools file, the Caddyfile and Caddy's JSON config write them.
const (
	// AlgorithmMaglev is Envoy's MAGLEV (gRPC falls back to the ring).
	AlgorithmMaglev = "maglev"
	// AlgorithmRingHash is the ring hash Caddy, Envoy and gRPC share; the canonical name is
	// Envoy's and gRPC's.
	AlgorithmRingHash = "ring_hash"
)

// ParseAlgorithm returns the canonical name of a hash algorithm: [AlgorithmMaglev] for
// "maglev", [AlgorithmRingHash] for "ring_hash" and for "ring" (the short name the Caddyfile
// used first). ok is false for any other name. Every tier parses names here, so the two
// spellings of the ring are one ring everywhere.
func ParseAlgorithm(name string) (canonical string, ok bool) {
	switch name {
	case AlgorithmMaglev:
		return AlgorithmMaglev, true
	case AlgorithmRingHash, "ring":
		return AlgorithmRingHash, true
	}
	return "", false
}
