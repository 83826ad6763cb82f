package chash

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// Ring-size bounds, as Envoy and gRPC define them, and the defaults every stickylb tier
// (Caddy, the pools file, and so Envoy and gRPC through xDS) uses when none is configured.
const (
	// DefaultMinRingSize is Envoy's and gRPC's default minimum_ring_size.
	DefaultMinRingSize = 1024
	// GRPCRingSizeCap is grpc-go's default cap (env GRPC_RING_HASH_CAP): gRPC clamps both
	// bounds to it, so a fleet mixing gRPC clients with Envoy agrees only when the sizes
	// served stay at or below it.
	GRPCRingSizeCap = 4096
	// DefaultMaxRingSize is stickylb's default maximum_ring_size for every tier: gRPC's cap,
	// not Envoy's 8M, so that Caddy, Envoy and gRPC nodes given no sizes build the same ring.
	DefaultMaxRingSize = GRPCRingSizeCap
	// MaxRingSize is the largest ring size Envoy accepts (its default maximum, 8M
	// entries); larger values are rejected.
	MaxRingSize = 8 * 1024 * 1024
)

// Ring is Envoy's and gRPC's ring hash ("ketama"): each host owns points on a 64-bit circle
// and a hash belongs to the first point at or after it, wrapping past the top. It is
// immutable after construction and safe for concurrent use.
type Ring struct {
	hashes []uint64  // ring points, ascending
	owner  []int32   // ring point -> caller index
	order  []int32   // identity position -> caller index
	w      []float64 // caller index -> normalized weight
	// bucket[b] is the first point whose hash has top bits >= b (bucket[len-1] = len(hashes)),
	// so a lookup scans only the points of one bucket instead of binary-searching the ring:
	// a binary search over thousands of points is a chain of a dozen dependent cache misses.
	bucket []uint32
	shift  uint // 64 - log2(number of buckets)
}

// maxBucketBits bounds the lookup index at 4M buckets (16 MiB) for the largest rings.
const maxBucketBits = 22

// ringVariant selects deliberate deviations from the Envoy/gRPC ring. Production code always
// passes the zero value; tests use the others to prove the grpc-go comparison notices them.
type ringVariant struct {
	sep      string // separator between ID and entry number; "" means Envoy's "_"
	firstIdx int    // number of a host's first entry; Envoy and gRPC start at 0
	unsorted bool   // walk hosts in the caller's order instead of identity order
}

// NewRing builds the ring Envoy's RingHashLoadBalancer::Ring and grpc-go's newRing build.
//
// minSize and maxSize are Envoy's minimum_ring_size and maximum_ring_size: both in
// 1..[MaxRingSize] and minSize <= maxSize (Envoy's error otherwise). There is no implicit
// default; pass [DefaultMinRingSize] and [DefaultMaxRingSize] for stickylb's (Envoy's own
// default maximum is [MaxRingSize]). For gRPC clients keep both at or below [GRPCRingSizeCap].
//
// The build, step by step as Envoy does it:
//
//   - scale = min(ceil(minW*minSize)/minW, maxSize), where minW is the smallest normalized
//     weight, so the lightest host gets a whole number of entries and the ring has about
//     ceil(scale) entries.
//   - Hosts are walked in identity order. Envoy walks them in EDS order and gRPC sorts them by
//     hash key; our xDS server emits EDS sorted by identity, so all three agree. The order
//     matters because entry counts are not whole numbers: a running target
//     (target += scale*w) and a running count decide how many entries each host gets, and
//     which host receives a fractional leftover depends on who comes first.
//   - Host entries are XXH64("ID_0"), XXH64("ID_1"), ...: the number is per host, so a host
//     keeps its points when other hosts come and go, as long as its own count stays. With a
//     fixed minSize it does not: each of n equal hosts gets ceil(minSize/n) points, so adding
//     a host takes points from all the others and moves about 1.4x the ideal share of keys
//     (3 -> 4 hosts: 34% instead of 25%). Scaling minSize with the host count keeps the
//     ideal.
//   - Points are sorted by hash; lookups find the first point >= hash (Envoy's port of
//     ketama_get_server, gRPC's sort.Search), wrapping to the first point.
func NewRing(hosts []Host, minSize, maxSize uint64) (*Ring, error) {
	return newRing(hosts, minSize, maxSize, ringVariant{})
}

func newRing(hosts []Host, minSize, maxSize uint64, v ringVariant) (*Ring, error) {
	if minSize == 0 || maxSize == 0 {
		return nil, fmt.Errorf("building ring: ring sizes must be >= 1 (min %d, max %d)", minSize, maxSize)
	}
	if minSize > MaxRingSize || maxSize > MaxRingSize {
		return nil, fmt.Errorf("building ring: ring sizes must be <= %d (min %d, max %d)",
			MaxRingSize, minSize, maxSize)
	}
	if minSize > maxSize {
		// Envoy's own wording, so an operator recognises it.
		return nil, fmt.Errorf("building ring: minimum_ring_size (%d) > maximum_ring_size (%d)",
			minSize, maxSize)
	}
	s, err := prepare(hosts, v.unsorted)
	if err != nil {
		return nil, fmt.Errorf("building ring: %w", err)
	}
	r := &Ring{order: s.order, w: s.byIdx}
	if len(hosts) == 0 {
		return r, nil
	}

	scale := math.Min(math.Ceil(s.minW*float64(minSize))/s.minW, float64(maxSize))
	ringSize := uint64(math.Ceil(scale))

	type point struct {
		hash uint64
		pos  int32 // identity position
	}
	points := make([]point, 0, ringSize)
	sep := v.sep
	if sep == "" {
		sep = "_"
	}
	var buf []byte
	var current, target float64
	for k, id := range s.ids {
		// The explicit conversion forbids the compiler from fusing the multiply and the add
		// into one FMA (the Go spec allows fusion otherwise, and arm64 does it): Envoy and
		// gRPC round the product first, and one entry more or less would move keys.
		target += float64(scale * s.weight[k])
		buf = append(buf[:0], id...)
		buf = append(buf, sep...)
		prefix := len(buf)
		for i := v.firstIdx; current < target; i++ {
			buf = strconv.AppendInt(buf[:prefix], int64(i), 10)
			points = append(points, point{hash: xxhash.Sum64(buf), pos: int32(k)})
			current++
		}
	}
	// Envoy and gRPC sort by hash alone (unstable); two hosts sharing a 64-bit point is
	// practically impossible, but break the tie by identity so we are at least deterministic.
	slices.SortFunc(points, func(a, b point) int {
		return cmp.Or(cmp.Compare(a.hash, b.hash), cmp.Compare(a.pos, b.pos))
	})
	r.hashes = make([]uint64, len(points))
	r.owner = make([]int32, len(points))
	for i, p := range points {
		r.hashes[i] = p.hash
		r.owner[i] = s.order[p.pos]
	}
	r.index()
	return r, nil
}

// index builds the bucket table: about one bucket per point, so a bucket holds one point on
// average and, the points being hashes, rarely more than a handful.
func (r *Ring) index() {
	n := len(r.hashes)
	if n == 0 {
		return
	}
	k := uint(min(bits.Len(uint(n)), maxBucketBits))
	r.shift = 64 - k
	r.bucket = make([]uint32, 1<<k+1)
	p := 0
	for b := range r.bucket {
		for p < n && r.hashes[p]>>r.shift < uint64(b) {
			p++
		}
		r.bucket[b] = uint32(p)
	}
}

// Pick returns the caller index of the host owning hash: the owner of the first ring point
// >= hash, or of the first point when hash is above them all. It returns -1 for an empty
// ring (no hosts). Envoy's ketama loop and gRPC's sort.Search both compute exactly this
// lower bound; we find it within the hash's bucket (all points before the bucket are
// smaller than hash, all points after it larger).
func (r *Ring) Pick(hash uint64) int {
	if len(r.hashes) == 0 {
		return -1
	}
	b := hash >> r.shift
	i, end := r.bucket[b], r.bucket[b+1]
	for i < end && r.hashes[i] < hash {
		i++
	}
	if int(i) == len(r.hashes) {
		i = 0
	}
	return int(r.owner[i])
}

// Len returns the number of hosts.
func (r *Ring) Len() int { return len(r.order) }

// Size returns the number of points on the ring (Envoy's ring_hash_lb.size).
func (r *Ring) Size() int { return len(r.hashes) }

// Weight returns host i's normalized weight (its weight over the sum of all weights).
func (r *Ring) Weight(i int) float64 { return r.w[i] }

// Nth returns the caller index of the k-th host in identity order.
func (r *Ring) Nth(k int) int { return int(r.order[k]) }
