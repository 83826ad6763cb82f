// Backend slots and VIP ids: stable across edits and restarts (the connection table refers
// to them), read back from the pinned names.

package l4xdp

import (
	"fmt"
	"net"

	"github.com/stickylb/stickylb/policies/pools"
)

// restore reads back what a previous loader pinned: the slot and VIP id of every name (the
// connection table refers to slots) and which backends it had found down.
func (l *Loader) restore() error {
	ids, err := names(l.maps.objs.VipNames)
	if err != nil {
		return fmt.Errorf("reading the pinned VIP names: %w", err)
	}
	for id, n := range ids {
		l.vipIDs[n] = id
	}
	slots, err := names(l.maps.objs.BackendNames)
	if err != nil {
		return fmt.Errorf("reading the pinned backend names: %w", err)
	}
	for slot, n := range slots {
		l.slots[n] = slot
		var b lbBackend
		if err := l.maps.objs.Backends.Lookup(slot, &b); err == nil && b.Flags&backendDown != 0 {
			l.lastDown[n] = true
		}
	}
	return nil
}

// allocator hands out indexes lo..hi-1 for names: a name keeps its index, a new one gets
// the lowest free index.
type allocator struct {
	m      map[string]uint32
	used   map[uint32]bool
	next   uint32 // no free index below it
	lo, hi uint32
}

func newAllocator(m map[string]uint32, lo, hi uint32) *allocator {
	a := &allocator{m: m, used: make(map[uint32]bool, len(m)), next: lo, lo: lo, hi: hi}
	for _, v := range m {
		a.used[v] = true
	}
	return a
}

func (a *allocator) get(name string) (uint32, bool) {
	if v, ok := a.m[name]; ok {
		return v, true
	}
	for ; a.next < a.hi; a.next++ {
		if !a.used[a.next] {
			a.m[name], a.used[a.next] = a.next, true
			return a.next, true
		}
	}
	return 0, false
}

type plannedBackend struct {
	key  string
	slot uint32
	b    *pools.Backend
	mac  net.HardwareAddr
}

// newIndex says whether name got its index in this edit (its counters start from zero).
func newIndex(before map[string]uint32, name string, idx uint32) bool {
	v, ok := before[name]
	return !ok || v != idx
}
