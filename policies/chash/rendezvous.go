package chash

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// RendezvousHost is a backend as the second-chance table ranks it.
type RendezvousHost struct {
	// ID is the backend's identity (hash_key, else the address as written), as for Maglev.
	ID string
	// Weight is the backend's relative weight, >= 1.
	Weight uint32
	// Draining: the backend takes no new flows, so it is never a row's primary; it stays
	// the secondary of the rows where it ranks first, so that the connections it holds go
	// on through second chance while new ones go elsewhere.
	Draining bool
}

// Pair is one row of a second-chance table: the row's primary and secondary as indexes
// into the hosts given to [NewRendezvous], -1 for none.
type Pair struct {
	Primary, Secondary int32
}

// Rendezvous is a second-chance table: each of its rows holds a primary (the backend new
// flows hashed to the row go to) and a secondary (the backend a flow is passed to when the
// primary has no connection for it), by weighted rendezvous hashing (highest random weight)
// over (row, backend). Both are functions of the host set alone: every node that is given
// the same hosts builds the same rows, whatever order it got them in.
//
// A row ranks every host by score -weight/ln(u), u uniform in (0, 1) from a hash of the
// row and the host's identity (the logarithmic method of weighted rendezvous hashing: a
// host wins a row with probability weight/sum). The primary is the best host that is not
// draining; the secondary is the best of the others. So when a host joins, the only rows
// whose primary changes are those where it ranks first, and there the previous primary
// becomes the secondary: a flow that started before the change reaches its backend in one
// hop more. A host that leaves or goes down is neither.
//
// It is immutable after construction and safe for concurrent use.
type Rendezvous struct {
	rows []Pair
	n    int
}

// NewRendezvous builds a second-chance table of rows rows over hosts (rows >= 1). Hosts need
// unique, non-empty identities and weights >= 1.
func NewRendezvous(hosts []RendezvousHost, rows uint64) (*Rendezvous, error) {
	if rows == 0 || rows > math.MaxInt32 {
		return nil, fmt.Errorf("building a rendezvous table: %d rows (want 1..%d)", rows, math.MaxInt32)
	}
	plain := make([]Host, len(hosts))
	for i, h := range hosts {
		plain[i] = Host{ID: h.ID, Weight: h.Weight}
	}
	if _, err := prepare(plain, false); err != nil { // the same rules as every other table
		return nil, fmt.Errorf("building a rendezvous table: %w", err)
	}
	// Identity order, so that ties (equal 64-bit hashes: never met, but decided all the
	// same) go to the same host on every node.
	order := make([]int32, len(hosts))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int { return cmp.Compare(hosts[a].ID, hosts[b].ID) })
	r := &Rendezvous{rows: make([]Pair, rows), n: len(hosts)}
	rk := newRanker(hosts, order)
	for row := range r.rows {
		r.rows[row] = rk.rank(uint64(row))
	}
	return r, nil
}

// Rows returns the table's rows (not to be modified).
func (r *Rendezvous) Rows() []Pair { return r.rows }

// Pick returns the primary of the row hash falls in (hash modulo the rows), or -1.
func (r *Rendezvous) Pick(hash uint64) int { return int(r.rows[hash%uint64(len(r.rows))].Primary) }

// Len returns the number of hosts the table was built from.
func (r *Rendezvous) Len() int { return r.n }

// ranker scores the hosts of a table, row by row.
type ranker struct {
	order    []int32   // identity order -> caller index
	keys     []uint64  // identity order: the host's hash
	invW     []float64 // identity order: 1/weight
	draining []bool    // identity order
	weighted bool      // weights differ: scores need the logarithm
}

func newRanker(hosts []RendezvousHost, order []int32) *ranker {
	rk := &ranker{order: order, keys: make([]uint64, len(order)), invW: make([]float64, len(order)),
		draining: make([]bool, len(order))}
	for k, i := range order {
		h := hosts[i]
		rk.keys[k] = KeyHash(h.ID)
		rk.invW[k] = 1 / float64(h.Weight)
		rk.draining[k] = h.Draining
		rk.weighted = rk.weighted || h.Weight != hosts[order[0]].Weight
	}
	return rk
}

// rank returns row's pair.
func (rk *ranker) rank(row uint64) Pair {
	seed := mix64(row + 1)
	var best, second, live int
	if rk.weighted {
		best, second, live = rk.rankWeighted(seed)
	} else {
		best, second, live = rk.rankEqual(seed)
	}
	p := Pair{Primary: -1, Secondary: -1}
	switch {
	case best < 0:
	case !rk.draining[best]:
		p.Primary = rk.order[best]
		if second >= 0 {
			p.Secondary = rk.order[second]
		}
	default: // the best host drains: the best live one serves, the draining one is second
		if live >= 0 {
			p.Primary = rk.order[live]
		}
		p.Secondary = rk.order[best]
	}
	return p
}

// rankEqual ranks hosts of equal weights: the highest hash wins (-1/ln(u) grows with u, so
// no logarithm is needed and the comparison is exact; on equal hashes the first in identity
// order wins). It returns the best and second hosts and the best that is not draining
// (identity order, -1: none).
func (rk *ranker) rankEqual(seed uint64) (best, second, live int) {
	best, second, live = -1, -1, -1
	var bestH, secondH, liveH uint64
	for k, key := range rk.keys {
		h := mix64(key ^ seed)
		if !rk.draining[k] && (live < 0 || h > liveH) {
			live, liveH = k, h
		}
		switch {
		case best < 0 || h > bestH:
			second, secondH = best, bestH
			best, bestH = k, h
		case second < 0 || h > secondH:
			second, secondH = k, h
		}
	}
	return best, second, live
}

// rankWeighted ranks weighted hosts by -ln(u)/weight, the smallest first (the reciprocal of
// the score -weight/ln(u)). The logarithm is taken only for a host that may place: its
// lower bound (1-u)/weight (-ln(u) >= 1-u) must be below a score it could beat.
func (rk *ranker) rankWeighted(seed uint64) (best, second, live int) {
	best, second, live = -1, -1, -1
	inf := math.Inf(1)
	bestS, secondS, liveS := inf, inf, inf
	for k, key := range rk.keys {
		h := mix64(key ^ seed)
		bound := secondS
		if !rk.draining[k] {
			bound = max(bound, liveS)
		}
		u := (float64(h>>11) + 0.5) / (1 << 53)
		if float64((1-u)*rk.invW[k]) > bound {
			continue
		}
		s := float64(-lnUnit(h) * rk.invW[k])
		if !rk.draining[k] && s < liveS {
			live, liveS = k, s
		}
		switch {
		case s < bestS:
			second, secondS = best, bestS
			best, bestS = k, s
		case s < secondS:
			second, secondS = k, s
		}
	}
	return best, second, live
}

// mix64 is SplitMix64's finalizer: every bit of x moves every bit of the result.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// lnUnit is ln(u) for u = (h>>11 + 0.5) / 2^53, uniform in (0, 1). It is computed with one
// rounding per operation (the explicit conversions keep the compiler from fusing a multiply
// and an add, which it may do on some architectures and not others; math.Log is assembly on
// some), so that nodes of every architecture rank hosts bit for bit alike. Its error, about
// 1e-16 relative, biases no host.
func lnUnit(h uint64) float64 {
	u := (float64(h>>11) + 0.5) / (1 << 53) // exact: a 53-bit integer plus a half, scaled
	m, e := math.Frexp(u)                   // exact: u = m * 2^e, m in [0.5, 1)
	if m < math.Sqrt2/2 {
		m, e = m*2, e-1 // m in [sqrt(1/2), sqrt(2))
	}
	// ln(m) = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.172: the series to s^23 is within 1e-18.
	s := float64((m - 1) / (m + 1))
	z := float64(s * s)
	p := 1.0 / 23
	for _, c := range [...]float64{1.0 / 21, 1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13, 1.0 / 11, 1.0 / 9, 1.0 / 7, 1.0 / 5, 1.0 / 3, 1} {
		p = float64(p*z) + c
	}
	return float64(float64(2*s)*p) + float64(float64(e)*math.Ln2)
}
