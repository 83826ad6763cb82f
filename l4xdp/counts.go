// Recounting active connections from the connection table.

package l4xdp

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Connection-table entry flags (mirror C_* in bpf/consts.h).
const (
	connCounted = 1
	connSYN     = 4
)

// recountBatch is how many connection-table entries a recount reads per system call.
const recountBatch = 4096

// monoNow is bpf_ktime_get_coarse_ns()'s clock.
func monoNow() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		return 0
	}
	return uint64(ts.Nano())
}

// Recount sets every backend's active-connection count to the entries of the connection
// table counted for it, so that what the program cannot see (an LRU eviction, an entry
// idle past its VIP's timeout that no packet touches again) does not make counts drift.
// An idle entry loses its flag here, so no later packet takes it off a second time. A
// count that moved while the table was read (a connection opened or closed meanwhile) is
// left to the next recount.
func (f *Tables) Recount() error {
	idle := map[uint32]uint64{} // VIP id -> idle timeout, ns
	var vk lbVipKey
	var vm lbVipMeta
	it := f.objs.Vips.Iterate()
	for it.Next(&vk, &vm) {
		idle[vm.Id] = uint64(vm.IdleTimeout) * 1e9
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("listing VIPs: %w", err)
	}
	before, err := f.activeCounts()
	if err != nil {
		return err
	}
	gens := map[uint32]uint32{}
	alive := map[uint32]bool{}
	var b lbBackend
	for slot := range before {
		if err := f.objs.Backends.Lookup(slot, &b); err == nil {
			gens[slot], alive[slot] = b.Gen, b.Flags&backendAlive != 0
		}
	}
	now := monoNow()
	counted := map[uint32]int64{}
	var expired []lbFlow
	var expiredConn []lbConn
	err = eachEntry(f.objs.Conns, func(k lbFlow, c lbConn) {
		if c.Flags&connCounted == 0 {
			return
		}
		to, ok := idle[uint32(c.VipId)]
		if !ok || !alive[uint32(c.Backend)] || gens[uint32(c.Backend)] != c.Gen {
			return // the program would not use it: its count was reset with its slot
		}
		if now > c.LastSeen && now-c.LastSeen > to {
			expired, expiredConn = append(expired, k), append(expiredConn, c)
			return
		}
		counted[uint32(c.Backend)]++
	})
	if err != nil {
		return fmt.Errorf("reading the connection table: %w", err)
	}
	for i, k := range expired {
		c := expiredConn[i]
		c.Flags &^= connCounted | connSYN
		// BPF_EXIST: an entry the program replaced or removed meanwhile is its own.
		if err := f.objs.Conns.Update(k, c, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("uncounting an idle flow: %w", err)
		}
	}
	after, err := f.activeCounts()
	if err != nil {
		return err
	}
	var errs []error
	for slot, n := range after {
		if before[slot] != n {
			continue // moved while the table was read
		}
		if counted[slot] != n {
			errs = append(errs, f.objs.Active.Put(slot, counted[slot]))
		}
	}
	return errors.Join(errs...)
}

// eachEntry calls fn for every entry of m, read in batches: a million entries one lookup at
// a time would cost seconds of system time. Entries the program adds or removes meanwhile
// may be seen or not.
func eachEntry[K, V any](m *ebpf.Map, fn func(K, V)) error {
	keys, vals := make([]K, recountBatch), make([]V, recountBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n; i++ {
			fn(keys[i], vals[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// activeCounts reads every non-zero or named slot's active count.
func (f *Tables) activeCounts() (map[uint32]int64, error) {
	out := map[uint32]int64{}
	var slot uint32
	var n int64
	it := f.objs.Active.Iterate()
	for it.Next(&slot, &n) {
		out[slot] = n
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading active connections: %w", err)
	}
	return out, nil
}
