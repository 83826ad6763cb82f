package caddymodule

import (
	"hash/maphash"
	"strings"
	"sync/atomic"
	"time"
)

// openCacheSlots is the number of cookie values an openCache remembers (a power of two).
// Each costs a pointer, plus about 300 bytes while filled.
const openCacheSlots = 8192

// openCache remembers what recently opened cookie values hold, so the hit path of a
// sealed cookie does not decode and decrypt on every request (both allocate). It is keyed
// by the whole cookie value and filled only after the codec opened that exact value, so a
// value that was tampered with, in any byte, is another key: it misses and is opened, and
// fails, as without the cache. The expiry it holds is checked on every request. It is
// direct-mapped under a per-instance seed: an insert replaces whatever shared its slot
// (bounded, lock-free, and a client cannot aim values at one slot), and a policy instance
// (so a codec, so a set of secrets) has its own.
type openCache struct {
	seed  maphash.Seed
	slots []atomic.Pointer[openedValue]
}

type openedValue struct {
	value   string
	backend string
	expires time.Time // zero: none (an Envoy cookie without one)
}

func newOpenCache() *openCache {
	return &openCache{seed: maphash.MakeSeed(), slots: make([]atomic.Pointer[openedValue], openCacheSlots)}
}

func (c *openCache) slot(v string) *atomic.Pointer[openedValue] {
	return &c.slots[maphash.String(c.seed, v)&(openCacheSlots-1)]
}

// get returns what v held when it was opened, or nil.
func (c *openCache) get(v string) *openedValue {
	if e := c.slot(v).Load(); e != nil && e.value == v {
		return e
	}
	return nil
}

// put remembers that v opened to backend and expires, and returns the entry. The value is
// copied: it is usually a slice of the request's Cookie header, which the cache must not
// keep alive.
func (c *openCache) put(v, backend string, expires time.Time) *openedValue {
	e := &openedValue{value: strings.Clone(v), backend: strings.Clone(backend), expires: expires}
	c.slot(v).Store(e)
	return e
}
