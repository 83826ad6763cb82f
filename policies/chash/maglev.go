package chash

import (
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// DefaultMaglevTableSize is Envoy's default Maglev table size: the prime the Maglev paper
// recommends (section 5.3) for up to a few hundred backends.
const DefaultMaglevTableSize = 65537

// MaxMaglevTableSize is the largest table size Envoy accepts (MaglevLbConfig.table_size is
// validated lte 5000011). A larger table would be one Envoy rejects, so we reject it too.
const MaxMaglevTableSize = 5000011

// Maglev is a weighted Maglev lookup table built exactly as Envoy's MaglevTable builds it.
// It is immutable after construction and safe for concurrent use.
type Maglev struct {
	table []int32   // slot -> caller index
	size  fastMod   // len(table)
	order []int32   // identity position -> caller index
	w     []float64 // caller index -> normalized weight
}

// maglevVariant selects deliberate deviations from Envoy's table build. Production code
// always passes the zero value (Envoy's algorithm); tests use the others to prove that the
// golden-table tests notice a change this small.
type maglevVariant struct {
	skipSeed0      bool // derive the skip from XXH64 seed 0 instead of seed 1
	swapOffsetSkip bool // use the skip hash for the offset and the offset hash for the skip
	unsorted       bool // fill in the caller's order instead of identity order
	noValidate     bool // skip the hosts <= table size check (to observe Envoy's behaviour)
}

// NewMaglev builds a weighted Maglev table of tableSize slots over hosts.
//
// tableSize must be prime (Envoy throws "The table size of maglev must be prime number"
// otherwise) and at most [MaxMaglevTableSize]. It must also be at least len(hosts): Envoy
// builds such a table anyway, but then the hosts that come last in identity order get no slot
// at all and silently receive no traffic, so we reject it as a configuration error.
//
// The build is Envoy's (maglev_lb.cc, MaglevTable::constructMaglevTableInternal and
// OriginalMaglevTable::constructImplementationInternals):
//
//   - Hosts are sorted by identity first. Envoy does this too (it sorts its
//     (key, host, weight) tuples), because the fill order decides which host wins a contested
//     slot: without the sort, the same host set delivered in another order would give another
//     table, and two proxies would disagree.
//   - offset = XXH64(id, seed 0) % size and skip = XXH64(id, seed 1) % (size-1) + 1. The
//     paper takes offset and skip from two different hash functions so that each host's
//     permutation (offset + j*skip) % size is an independent pseudo-random one; Envoy gets
//     the second function by reseeding XXH64 with 1. Taking both from one hash would
//     correlate them (and hosts with equal seed-0 hashes modulo size*(size-1) would walk the
//     very same permutation).
//   - Weights: each host's normalized weight w (weight/sum as float64) is compared with a
//     running target that grows by max_normalized_weight each time the host takes a slot;
//     on iteration i the host takes its next preferred free slot when i*w >= target. A host
//     with the largest weight takes a slot every iteration, one with a third of it every
//     third iteration, so table shares follow the weights.
func NewMaglev(hosts []Host, tableSize uint64) (*Maglev, error) {
	return newMaglev(hosts, tableSize, maglevVariant{})
}

func newMaglev(hosts []Host, tableSize uint64, v maglevVariant) (*Maglev, error) {
	if !IsPrime(tableSize) {
		return nil, fmt.Errorf("building maglev table: table size %d is not prime", tableSize)
	}
	if tableSize > MaxMaglevTableSize {
		return nil, fmt.Errorf("building maglev table: table size %d exceeds %d (Envoy's limit)",
			tableSize, MaxMaglevTableSize)
	}
	if !v.noValidate && uint64(len(hosts)) > tableSize {
		return nil, fmt.Errorf("building maglev table: %d hosts do not fit in a table of %d slots",
			len(hosts), tableSize)
	}
	s, err := prepare(hosts, v.unsorted)
	if err != nil {
		return nil, fmt.Errorf("building maglev table: %w", err)
	}
	m := &Maglev{order: s.order, w: s.byIdx}
	if len(hosts) == 0 {
		return m, nil
	}
	m.table = buildMaglevTable(s, tableSize, v)
	m.size = newFastMod(tableSize)
	return m, nil
}

type maglevEntry struct {
	offset, skip uint64
	weight       float64
	target       float64
	next         uint64
}

func buildMaglevTable(s *sortedHosts, size uint64, v maglevVariant) []int32 {
	entries := make([]maglevEntry, len(s.ids))
	var d xxhash.Digest
	for k, id := range s.ids {
		h0 := xxhash.Sum64String(id)
		var h1 uint64
		if v.skipSeed0 {
			h1 = h0
		} else {
			d.ResetWithSeed(1)
			_, _ = d.WriteString(id)
			h1 = d.Sum64()
		}
		if v.swapOffsetSkip {
			h0, h1 = h1, h0
		}
		entries[k] = maglevEntry{offset: h0 % size, skip: h1%(size-1) + 1, weight: s.weight[k]}
	}

	const free = -1
	table := make([]int32, size)
	for i := range table {
		table[i] = free
	}
	filled := uint64(0)
	// Envoy counts iterations in a uint32 and multiplies it, converted to double, by the
	// weight; float64(iteration) of a uint32 is exact, so the comparisons are the same.
	for iteration := uint32(1); filled < size; iteration++ {
		for k := 0; k < len(entries) && filled < size; k++ {
			e := &entries[k]
			if float64(iteration)*e.weight < e.target {
				continue
			}
			e.target += s.maxW
			// Envoy's permutation: (offset + skip*next) % size, in uint64.
			c := (e.offset + e.skip*e.next) % size
			for table[c] != free {
				e.next++
				c = (e.offset + e.skip*e.next) % size
			}
			table[c] = int32(k)
			e.next++
			filled++
		}
	}
	for i, k := range table {
		table[i] = s.order[k]
	}
	return table
}

// Pick returns the caller index of the host owning hash: table[hash % size], as Envoy's
// chooseHost does on the first attempt (the remainder computed without a divide). It
// returns -1 when the table has no hosts.
func (m *Maglev) Pick(hash uint64) int {
	if len(m.table) == 0 {
		return -1
	}
	return int(m.table[m.size.mod(hash)])
}

// Len returns the number of hosts.
func (m *Maglev) Len() int { return len(m.order) }

// Table returns a copy of the lookup table: slot -> index into the hosts given to
// [NewMaglev]. It is what the XDP forwarder installs, so the kernel and Pick agree slot for
// slot. It is empty when there are no hosts.
func (m *Maglev) Table() []int32 {
	out := make([]int32, len(m.table))
	copy(out, m.table)
	return out
}

// Weight returns host i's normalized weight (its weight over the sum of all weights).
func (m *Maglev) Weight(i int) float64 { return m.w[i] }

// Nth returns the caller index of the k-th host in identity order.
func (m *Maglev) Nth(k int) int { return int(m.order[k]) }
