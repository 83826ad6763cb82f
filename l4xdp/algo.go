// Weighted round robin and weighted least connections: the schedules, pools, weights and
// active-connection counts the program reads.

package l4xdp

import (
	"errors"
	"fmt"
	"math"

	"github.com/cilium/ebpf"

	"github.com/stickylb/stickylb/policies/balance"
)

// WLCScan is the largest pool weighted least connections scans whole (WLC_SCAN in
// bpf/consts.h); a larger pool is the weighted power of two choices.
const WLCScan = 16

// weightScale turns a weight ramped by slow start into the integer the program compares:
// hundredths of a weight unit.
const weightScale = 100

// setSchedule installs v's schedule (a fresh inner map swapped in whole, as tables are),
// then its length and least-connections pool. The schedule fills its whole map, repeated,
// so a packet that reads the new schedule with the old length (or the reverse) between the
// two writes still finds one of the VIP's backends.
func (f *Tables) setSchedule(v VIP) error {
	if len(v.Schedule) > MaxTableSize {
		return fmt.Errorf("vip %s: schedule of %d entries (at most %d)", v.Addr, len(v.Schedule), MaxTableSize)
	}
	pool := lbWlcPool{SchedLen: uint32(len(v.Schedule))}
	if len(v.Pool) <= WLCScan {
		pool.N = uint32(len(v.Pool))
		copy(pool.Slots[:], v.Pool)
	}
	if len(v.Schedule) == 0 {
		if err := f.objs.WlcPools.Put(v.ID, pool); err != nil {
			return fmt.Errorf("vip %s: its least-connections pool: %w", v.Addr, err)
		}
		if err := f.objs.Schedules.Delete(v.ID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("vip %s: removing its schedule: %w", v.Addr, err)
		}
		return nil
	}
	inner, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: MaxTableSize})
	if err != nil {
		return fmt.Errorf("vip %s: creating its schedule: %w", v.Addr, err)
	}
	defer inner.Close()
	keys, vals := make([]uint32, MaxTableSize), make([]uint32, MaxTableSize)
	for i := range keys {
		keys[i], vals[i] = uint32(i), v.Schedule[i%len(v.Schedule)]
	}
	if _, err := inner.BatchUpdate(keys, vals, nil); err != nil {
		return fmt.Errorf("vip %s: filling its schedule: %w", v.Addr, err)
	}
	if err := f.objs.Schedules.Put(v.ID, inner); err != nil {
		return fmt.Errorf("vip %s: installing its schedule: %w", v.Addr, err)
	}
	if err := f.objs.WlcPools.Put(v.ID, pool); err != nil {
		return fmt.Errorf("vip %s: its least-connections pool: %w", v.Addr, err)
	}
	return nil
}

// SetWeight sets backend slot idx's weight as weighted least connections compares it
// (0: the backend takes no new flows; a retransmitted SYN to it re-picks).
func (f *Tables) SetWeight(idx, w uint32) error { return f.objs.Weights.Put(idx, w) }

// Active is backend slot idx's active-connection count.
func (f *Tables) Active(idx uint32) (int64, error) {
	var n int64
	err := f.objs.Active.Lookup(idx, &n)
	return n, err
}

// setZone records backend slot idx's zone for the per-zone counts of `stickylb xdp stats`.
func (f *Tables) setZone(idx uint32, zone string) error {
	n, err := toName(zone)
	if err != nil {
		return err
	}
	return f.objs.BackendZones.Put(idx, n)
}

// Schedule is the smooth weighted round robin over weights (>= 1 each), reduced by their
// greatest common divisor and scaled down to at most MaxTableSize entries: entry i is an
// index into weights. Over any run of its entries each index's count is within the
// largest weight of its share.
func Schedule(weights []uint32) []int {
	if len(weights) == 0 {
		return nil
	}
	ws := reduce(weights)
	n := 0
	iw := make([]int, len(ws))
	for i, w := range ws {
		iw[i] = int(w)
		n += int(w)
	}
	var rr balance.SmoothWRR
	out := make([]int, n)
	for i := range out {
		out[i] = rr.Next(iw)
	}
	return out
}

// reduce divides weights by their gcd and, when they still sum past MaxTableSize, scales
// them down in proportion (each at least 1).
func reduce(weights []uint32) []uint32 {
	g := uint64(0)
	for _, w := range weights {
		g = gcd(g, uint64(max(w, 1)))
	}
	out := make([]uint32, len(weights))
	var sum uint64
	for i, w := range weights {
		out[i] = uint32(uint64(max(w, 1)) / g)
		sum += uint64(out[i])
	}
	if sum <= MaxTableSize {
		return out
	}
	// Leave room for the floor of 1 each.
	scale := float64(MaxTableSize-len(out)) / float64(sum)
	for i, w := range out {
		out[i] = max(1, uint32(math.Floor(float64(w)*scale)))
	}
	return out
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
