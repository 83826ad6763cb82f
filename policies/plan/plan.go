// Package plan measures what a pools-file change does to sessions before it is rolled out:
// per service, the share of keys whose backend changes, beside the ideal share (the least
// any scheme could move, given the change in weights) and the share plain hash mod N would
// move. For hashing services it gives the whole disruption table of classic consistent
// hashing: mod N, the ring with the file's settings, Maglev, the ideal, and the ring gRPC
// clients build when their 4096-point cap makes it differ.
package plan

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/pools"
)

// DefaultKeys is how many keys Compare measures by default.
const DefaultKeys = 200_000

// MinKeys is the fewest keys Compare accepts: at 100k keys a share is known to about ±0.3%
// (two binomial sigmas at p = 0.5).
const MinKeys = 100_000

// Result is the effect of a change on one service.
type Result struct {
	Name      string  `json:"name"`
	Algorithm string  `json:"algorithm"`
	Moved     float64 `json:"moved"`  // share of keys (or sessions) whose backend changes
	Ideal     float64 `json:"ideal"`  // least possible: total-variation distance of the weight shares
	ModN      float64 `json:"mod_n"`  // what hash % N over the same backends would move
	Keys      int     `json:"keys"`   // keys measured (0 when the share is computed, not sampled)
	Change    string  `json:"change"` // "changed", "unchanged", "added" or "removed"
	Note      string  `json:"note,omitempty"`
	// The disruption table of a hashing service (balance maglev or ring_hash; nil otherwise):
	// what the ring with the file's settings (min/max_ring_size or virtual_nodes) and Maglev
	// (the file's table_size, else 65537) would move over the same backends.
	Ring   *float64 `json:"ring,omitempty"`
	Maglev *float64 `json:"maglev,omitempty"`
	// Rendezvous is what the second-chance table of a forwarding: tunnel vip service (the
	// table its XDP nodes use: rendezvous hashing over the file's table_size rows) moves,
	// by its primaries; it is then also Moved.
	Rendezvous *float64 `json:"rendezvous,omitempty"`
	// RingPoints are the ring's points before and after the change (Envoy's and Caddy's).
	RingPoints *[2]int `json:"ring_points,omitempty"`
	// GRPCRing is what gRPC clients' ring moves, set for grpc services whose ring gRPC caps
	// at 4096 points on either side (so those clients pick differently from Envoy and Caddy);
	// GRPCRingPoints are its points before and after.
	GRPCRing       *float64 `json:"grpc_ring,omitempty"`
	GRPCRingPoints *[2]int  `json:"grpc_ring_points,omitempty"`
}

// Compare measures every service of old and next (by name, in next's order, then the
// removed ones). keys <= 0 means DefaultKeys.
func Compare(old, next *pools.File, keys int) ([]Result, error) {
	if keys <= 0 {
		keys = DefaultKeys
	}
	if keys < MinKeys {
		return nil, fmt.Errorf("plan: %d keys is too few to measure a share; use at least %d", keys, MinKeys)
	}
	keyHashes := make([]uint64, keys)
	for i := range keyHashes {
		keyHashes[i] = chash.KeyHash("key-" + strconv.Itoa(i))
	}
	var out []Result
	for _, ns := range next.Services {
		os := old.Service(ns.Name)
		if os == nil {
			out = append(out, Result{Name: ns.Name, Algorithm: ns.Balance, Change: "added"})
			continue
		}
		r, err := compareService(os, ns, keyHashes)
		if err != nil {
			return nil, fmt.Errorf("plan: service %s: %w", ns.Name, err)
		}
		out = append(out, r.rounded())
	}
	for _, os := range old.Services {
		if next.Service(os.Name) == nil {
			out = append(out, Result{Name: os.Name, Algorithm: os.Balance, Moved: 1, Ideal: 1, ModN: 1, Change: "removed"})
		}
	}
	return out, nil
}

// hosts returns the backends that take new sessions, as the hashes see them.
func hosts(s *pools.Service) []chash.Host {
	var hs []chash.Host
	for _, b := range s.Backends {
		if b.Drain || s.ZoneDrained(b.Zone) {
			continue
		}
		hs = append(hs, chash.Host{ID: b.Identity(), Weight: b.Weight})
	}
	return hs
}

func shares(hs []chash.Host) map[string]float64 {
	total := 0.0
	for _, h := range hs {
		total += float64(h.Weight)
	}
	m := make(map[string]float64, len(hs))
	for _, h := range hs {
		m[h.ID] += float64(h.Weight) / total
	}
	return m
}

// totalVariation is half the L1 distance between two share maps: the least share of keys
// that must change backend to go from one distribution to the other.
func totalVariation(a, b map[string]float64) float64 {
	d := 0.0
	for id, p := range a {
		d += math.Abs(p - b[id])
	}
	for id, q := range b {
		if _, ok := a[id]; !ok {
			d += q
		}
	}
	return d / 2
}

func picker(s *pools.Service, hs []chash.Host) (chash.Picker, error) {
	if len(hs) == 0 {
		return nil, nil
	}
	switch s.Balance {
	case pools.BalanceMaglev:
		if tunnel(s) {
			return rendezvous(s, hs)
		}
		return chash.NewMaglev(hs, s.Hash.TableSize)
	case pools.BalanceRingHash:
		return ring(s, hs, false)
	}
	return nil, nil
}

func hashing(s *pools.Service) bool {
	return s.Balance == pools.BalanceMaglev || s.Balance == pools.BalanceRingHash
}

// ring builds the ring s's settings give over hs, as every tier builds it (Envoy, Caddy, and
// gRPC below its cap); grpc applies gRPC's cap to both sizes, as grpc-go does. The sizes of
// virtual_nodes follow hs, as the xDS server sets them per snapshot.
func ring(s *pools.Service, hs []chash.Host, grpc bool) (*chash.Ring, error) {
	lo, hi := s.Hash.MinRingSize, s.Hash.MaxRingSize
	if s.Hash.VirtualNodes != 0 {
		size, err := chash.VirtualNodesRingSize(hs, s.Hash.VirtualNodes, s.MinWeight())
		if err != nil {
			return nil, err
		}
		lo, hi = max(size, 1), max(size, 1)
	}
	if grpc {
		lo, hi = min(lo, chash.GRPCRingSizeCap), min(hi, chash.GRPCRingSizeCap)
	}
	return chash.NewRing(hs, lo, hi)
}

// tunnel says whether s's XDP table is the second-chance table of forwarding: tunnel.
func tunnel(s *pools.Service) bool {
	return s.VIP != "" && s.Forwarding == pools.ForwardingTunnel
}

// rendezvous builds s's second-chance table over hs (the backends that take new flows: a
// draining backend is never a row's primary, so leaving it out gives the same primaries).
func rendezvous(s *pools.Service, hs []chash.Host) (*chash.Rendezvous, error) {
	size := s.Hash.TableSize
	if size == 0 {
		size = chash.DefaultMaglevTableSize
	}
	rh := make([]chash.RendezvousHost, len(hs))
	for i, h := range hs {
		rh[i] = chash.RendezvousHost{ID: h.ID, Weight: h.Weight}
	}
	return chash.NewRendezvous(rh, size)
}

// maglev builds s's Maglev table over hs, at the file's table size or Envoy's default.
func maglev(s *pools.Service, hs []chash.Host) (*chash.Maglev, error) {
	size := s.Hash.TableSize
	if size == 0 {
		size = chash.DefaultMaglevTableSize
	}
	return chash.NewMaglev(hs, size)
}

// table fills r's disruption table: the ring (each side with its own file's settings, or
// next's when that side does not hash), Maglev, and gRPC's ring when its cap bites.
func table(r *Result, os, ns *pools.Service, ho, hn []chash.Host, keyHashes []uint64) error {
	if tunnel(ns) && len(ho) > 0 && len(hn) > 0 {
		ro, err := rendezvous(os, ho)
		if err != nil {
			return fmt.Errorf("building the current rendezvous table: %w", err)
		}
		rn, err := rendezvous(ns, hn)
		if err != nil {
			return fmt.Errorf("building the next rendezvous table: %w", err)
		}
		m := movedShare(ro, rn, ho, hn, keyHashes)
		r.Rendezvous = &m
	}
	if !hashing(ns) || len(ho) == 0 || len(hn) == 0 {
		return nil
	}
	oh := os
	if !hashing(os) {
		oh = ns
	}
	share := func(a, b chash.Picker) *float64 {
		m := movedShare(a, b, ho, hn, keyHashes)
		return &m
	}
	ro, err := ring(oh, ho, false)
	if err != nil {
		return fmt.Errorf("building the current ring: %w", err)
	}
	rn, err := ring(ns, hn, false)
	if err != nil {
		return fmt.Errorf("building the next ring: %w", err)
	}
	r.Ring, r.RingPoints = share(ro, rn), &[2]int{ro.Size(), rn.Size()}
	mo, err := maglev(oh, ho)
	if err != nil {
		return fmt.Errorf("building the current Maglev table: %w", err)
	}
	mn, err := maglev(ns, hn)
	if err != nil {
		return fmt.Errorf("building the next Maglev table: %w", err)
	}
	r.Maglev = share(mo, mn)
	if ns.Protocol != pools.ProtocolGRPC {
		return nil
	}
	go1, err := ring(oh, ho, true)
	if err != nil {
		return fmt.Errorf("building the current gRPC ring: %w", err)
	}
	gn, err := ring(ns, hn, true)
	if err != nil {
		return fmt.Errorf("building the next gRPC ring: %w", err)
	}
	if go1.Size() != ro.Size() || gn.Size() != rn.Size() {
		r.GRPCRing, r.GRPCRingPoints = share(go1, gn), &[2]int{go1.Size(), gn.Size()}
	}
	return nil
}

// movedShare is the share of keys whose host identity differs between a and b (a key with
// no host on one side counts as moved).
func movedShare(a, b chash.Picker, ha, hb []chash.Host, keyHashes []uint64) float64 {
	moved := 0
	for _, h := range keyHashes {
		ia, ib := -1, -1
		if a != nil {
			ia = a.Pick(h)
		}
		if b != nil {
			ib = b.Pick(h)
		}
		if ia < 0 || ib < 0 || ha[ia].ID != hb[ib].ID {
			moved++
		}
	}
	return float64(moved) / float64(len(keyHashes))
}

func compareService(os, ns *pools.Service, keyHashes []uint64) (Result, error) {
	ho, hn := hosts(os), hosts(ns)
	r := Result{Name: ns.Name, Algorithm: ns.Balance, Ideal: totalVariation(shares(ho), shares(hn))}
	mo, mn := chash.NewModN(ho), chash.NewModN(hn)
	if len(ho) == 0 || len(hn) == 0 {
		r.ModN = 1
	} else {
		r.ModN = movedShare(mo, mn, ho, hn, keyHashes)
	}
	po, err := picker(os, ho)
	if err != nil {
		return r, fmt.Errorf("building the current %s: %w", os.Balance, err)
	}
	pn, err := picker(ns, hn)
	if err != nil {
		return r, fmt.Errorf("building the next %s: %w", ns.Balance, err)
	}
	switch {
	case pn != nil && (po != nil || len(ho) == 0):
		r.Moved = movedShare(po, pn, ho, hn, keyHashes)
		r.Keys = len(keyHashes)
		if os.Balance != ns.Balance {
			r.Note = fmt.Sprintf("balance changes from %s", os.Balance)
		}
		if ns.Hash.BoundedLoad != 0 {
			r.Note = "bounded load moves more keys under load; measured without it"
		}
	case pn != nil:
		// From a non-hashing balance to a hash: existing pins are kept by tables and cookies,
		// hashed keys land wherever the new hash says.
		r.Moved = movedShare(mo, pn, ho, hn, keyHashes)
		r.Keys = len(keyHashes)
		r.Note = fmt.Sprintf("balance changes from %s; compared with the old backends' mod-N spread", os.Balance)
	default:
		// Sessions pinned by cookies or tables stay where they are; only those on backends
		// that no longer take sessions move: the old share of those backends.
		sh := shares(ho)
		keep := map[string]bool{}
		for _, b := range ns.Backends {
			if !b.Drain && !ns.ZoneDrained(b.Zone) {
				keep[b.Identity()] = true
			}
		}
		for id, p := range sh {
			if !keep[id] {
				r.Moved += p
			}
		}
		r.Note = "pinned sessions stay; the share moved is that of backends leaving"
	}
	if err := table(&r, os, ns, ho, hn, keyHashes); err != nil {
		return r, err
	}
	if tunnel(ns) {
		r.Note = strings.TrimPrefix(r.Note+"; forwarding tunnel: the XDP table is rendezvous, a primary and a secondary per row", "; ")
	}
	if slices.EqualFunc(ho, hn, func(a, b chash.Host) bool { return a == b }) && os.Balance == ns.Balance && os.Hash == ns.Hash {
		r.Change = "unchanged"
	} else {
		r.Change = "changed"
	}
	return r, nil
}

// rounded keeps six decimals: the shares are sampled to about 1e-3, and operators compare
// figures such as 0.25 with 0.25, not 0.24999999999999997.
func (r Result) rounded() Result {
	round := func(x float64) float64 { return math.Round(x*1e6) / 1e6 }
	r.Moved, r.Ideal, r.ModN = round(r.Moved), round(r.Ideal), round(r.ModN)
	for _, p := range []**float64{&r.Ring, &r.Maglev, &r.Rendezvous, &r.GRPCRing} {
		if *p != nil {
			v := round(**p)
			*p = &v
		}
	}
	return r
}
