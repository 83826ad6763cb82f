package sessions

import (
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// noEntry terminates the index-linked lists and marks "not found".
const noEntry int32 = -1

// entry is one mapping. It holds no pointers (the key lives in the shard's
// arena, the backend is an interned id) so the GC never scans the entries.
type entry struct {
	// touched is the last refresh, in nanoseconds since the table's epoch.
	// Hits store it under the read lock, hence atomic.
	touched atomic.Int64
	// linked is the time the entry was last moved to the head of the recency
	// list. The list is sorted by linked; touched-linked < grain for every
	// entry, which is what bounds the eviction-order error.
	linked int64
	keyOff uint32 // offset of the key's 2-byte length prefix in the arena
	// backend is the interned backend id; 0 marks a free entry.
	backend uint32
	newer   int32 // toward the head (most recently refreshed); free list link otherwise unused
	older   int32 // toward the tail; also the free-list link of free entries
}

// shardData is everything a shard holds, guarded by the shard's lock.
// Kept apart from the lock and counters so that a shard can be rebuilt by
// replacing it as one value.
type shardData struct {
	seed maphash.Seed
	cap  int // this shard's share of MaxEntries
	n    int // entries held (live or expired but not yet removed)

	// slots is the open-addressing index: 0 = empty, else
	// (entry index + 1) << 32 | low 32 bits of the key's hash.
	slots []uint64

	entries    []entry
	freeEntry  int32
	head, tail int32

	// arena holds keys as [len lo][len hi][bytes...]; garbage counts bytes
	// of removed keys still in it, reclaimed by compaction when it grows.
	arena   []byte
	garbage int

	// Backend interning: names[id], refs[id] entries using it; id 0 unused.
	ids     map[string]uint32
	names   []string
	refs    []int32
	freeIDs []uint32
}

func newShardData(seed maphash.Seed, capacity int) shardData {
	return shardData{
		seed:      seed,
		cap:       capacity,
		freeEntry: noEntry,
		head:      noEntry,
		tail:      noEntry,
		names:     []string{""},
		refs:      []int32{0},
	}
}

// shardFields is a shard without its padding.
type shardFields struct {
	mu     sync.RWMutex
	hits   atomic.Uint64 // updated under the read lock
	misses atomic.Uint64
	// retired is set (under the write lock) when a rebuild has moved this
	// shard's entries into a new shard set; whoever locks it then retries.
	retired bool
	// Counters updated under the write lock.
	inserts, updates, expired, evicted, invalidated, deleted uint64
	d                                                        shardData
}

// shard is padded to a multiple of 128 bytes (two cache lines, the adjacent
// line prefetcher's unit) so that shards' locks do not share cache lines.
type shard struct {
	shardFields
	_ [(128 - unsafe.Sizeof(shardFields{})%128) % 128]byte
}

// home maps a 32-bit hash onto [0, size) without division (Lemire's
// multiply-shift), so slot tables need not be powers of two and can be sized
// to their shard's capacity.
func home(h32 uint32, size uint64) uint64 { return uint64(h32) * size >> 32 }

func (d *shardData) keyBytes(i int32) []byte {
	off := d.entries[i].keyOff
	n := uint32(d.arena[off]) | uint32(d.arena[off+1])<<8
	return d.arena[off+2 : off+2+n]
}

// find returns the index of key's entry, or noEntry.
func (d *shardData) find(key string, h uint64) int32 {
	size := uint64(len(d.slots))
	if size == 0 {
		return noEntry
	}
	h32 := uint32(h)
	for i := home(h32, size); ; {
		s := d.slots[i]
		if s == 0 {
			return noEntry
		}
		if uint32(s) == h32 {
			idx := int32(s>>32) - 1
			if string(d.keyBytes(idx)) == key {
				return idx
			}
		}
		if i++; i == size {
			i = 0
		}
	}
}

// findSlot returns the slot position that points at entry idx.
func (d *shardData) findSlot(idx int32, h32 uint32) uint64 {
	size := uint64(len(d.slots))
	want := uint64(idx + 1)
	for i := home(h32, size); ; {
		if d.slots[i]>>32 == want {
			return i
		}
		if i++; i == size {
			i = 0
		}
	}
}

// insertSlot indexes entry idx; the key must not be indexed already.
func (d *shardData) insertSlot(idx int32, h32 uint32) {
	if 4*(d.n+1) > 3*len(d.slots) {
		d.growSlots()
	}
	d.placeSlot(uint64(idx+1)<<32 | uint64(h32))
}

func (d *shardData) placeSlot(s uint64) {
	size := uint64(len(d.slots))
	i := home(uint32(s), size)
	for d.slots[i] != 0 {
		if i++; i == size {
			i = 0
		}
	}
	d.slots[i] = s
}

// growSlots doubles the index, but never beyond what the shard's capacity
// needs at a 3/4 load, so a full shard's index is not twice its need.
func (d *shardData) growSlots() {
	limit := d.cap*4/3 + 1
	size := max(8, 2*len(d.slots))
	size = min(size, limit)
	if need := (4*(d.n+1)+2)/3 + 1; size < need {
		size = need
	}
	old := d.slots
	d.slots = make([]uint64, size)
	for _, s := range old {
		if s != 0 {
			d.placeSlot(s)
		}
	}
}

// deleteSlot empties slot i with backward-shift deletion: later members of
// the probe run move back, so lookups never wade through tombstones.
func (d *shardData) deleteSlot(i uint64) {
	size := uint64(len(d.slots))
	j := i
	for {
		if j++; j == size {
			j = 0
		}
		s := d.slots[j]
		if s == 0 {
			d.slots[i] = 0
			return
		}
		k := home(uint32(s), size)
		// s may move back to i only if its home is not in (i, j].
		if i <= j {
			if i < k && k <= j {
				continue
			}
		} else if i < k || k <= j {
			continue
		}
		d.slots[i] = s
		i = j
	}
}

// allocEntry takes a free entry, growing the slice by doubling but never past
// the shard's capacity.
func (d *shardData) allocEntry() int32 {
	if i := d.freeEntry; i != noEntry {
		d.freeEntry = d.entries[i].older
		return i
	}
	if len(d.entries) == cap(d.entries) {
		nc := min(max(16, 2*cap(d.entries)), d.cap)
		nc = max(nc, len(d.entries)+1)
		grown := make([]entry, len(d.entries), nc)
		copy(grown, d.entries)
		d.entries = grown
	}
	d.entries = append(d.entries, entry{})
	return int32(len(d.entries) - 1)
}

func appendKey[K string | []byte](d *shardData, key K) uint32 {
	need := 2 + len(key)
	if len(d.arena)+need > cap(d.arena) {
		d.growArena(need)
	}
	off := len(d.arena)
	d.arena = append(d.arena, byte(len(key)), byte(len(key)>>8))
	d.arena = append(d.arena, key...)
	return uint32(off)
}

// growArena makes room for need more bytes: by compaction when a quarter or
// more of the arena is garbage, else by growing 25% (doubling while small).
// In steady churn the arena thus stays within about 1.25x its live bytes.
func (d *shardData) growArena(need int) {
	live := len(d.arena) - d.garbage
	if d.garbage > 0 && d.garbage >= live/4 {
		size := live + need
		a := make([]byte, 0, max(256, size+size/4))
		for i := range d.entries {
			e := &d.entries[i]
			if e.backend == 0 {
				continue
			}
			off := e.keyOff
			n := uint32(d.arena[off]) | uint32(d.arena[off+1])<<8
			e.keyOff = uint32(len(a))
			a = append(a, d.arena[off:off+2+n]...)
		}
		d.arena = a
		d.garbage = 0
		return
	}
	size := len(d.arena) + need
	if len(d.arena) < 64<<10 {
		size = max(256, 2*size)
	} else {
		size += size / 4
	}
	a := make([]byte, len(d.arena), size)
	copy(a, d.arena)
	d.arena = a
}

func (d *shardData) releaseKey(i int32) {
	off := int(d.entries[i].keyOff)
	n := 2 + (int(d.arena[off]) | int(d.arena[off+1])<<8)
	if off+n == len(d.arena) {
		d.arena = d.arena[:off]
		return
	}
	d.garbage += n
}

func (d *shardData) intern(b string) uint32 {
	if id, ok := d.ids[b]; ok {
		d.refs[id]++
		return id
	}
	if d.ids == nil {
		d.ids = make(map[string]uint32)
	}
	b = strings.Clone(b) // never pin the caller's memory
	var id uint32
	if n := len(d.freeIDs); n > 0 {
		id = d.freeIDs[n-1]
		d.freeIDs = d.freeIDs[:n-1]
		d.names[id] = b
		d.refs[id] = 1
	} else {
		id = uint32(len(d.names))
		d.names = append(d.names, b)
		d.refs = append(d.refs, 1)
	}
	d.ids[b] = id
	return id
}

func (d *shardData) unref(id uint32) {
	if d.refs[id]--; d.refs[id] == 0 {
		delete(d.ids, d.names[id])
		d.names[id] = ""
		d.freeIDs = append(d.freeIDs, id)
	}
}

func (d *shardData) unlink(i int32) {
	e := &d.entries[i]
	if e.newer != noEntry {
		d.entries[e.newer].older = e.older
	} else {
		d.head = e.older
	}
	if e.older != noEntry {
		d.entries[e.older].newer = e.newer
	} else {
		d.tail = e.newer
	}
}

// pushHead links i as the newest entry; linked must be >= the head's.
func (d *shardData) pushHead(i int32) {
	e := &d.entries[i]
	e.newer = noEntry
	e.older = d.head
	if d.head != noEntry {
		d.entries[d.head].newer = i
	} else {
		d.tail = i
	}
	d.head = i
}

// headTime is the time to link a new head at: now, unless the clock went
// backwards (a test clock), in which case the list must stay sorted.
func (d *shardData) headTime(now int64) int64 {
	if d.head != noEntry && d.entries[d.head].linked > now {
		return d.entries[d.head].linked
	}
	return now
}

// relink moves i to the head as refreshed at now.
func (d *shardData) relink(i int32, now int64) {
	d.unlink(i)
	d.entries[i].linked = d.headTime(now)
	d.pushHead(i)
}

// insert adds a new mapping at the head; the shard must have room and the key
// must be absent. linked must be >= the head's linked.
func insert[K string | []byte](d *shardData, key K, h32 uint32, backend string, touched, linked int64) {
	i := d.allocEntry()
	e := &d.entries[i]
	e.keyOff = appendKey(d, key)
	e.backend = d.intern(backend)
	e.touched.Store(touched)
	e.linked = linked
	d.pushHead(i)
	d.insertSlot(i, h32)
	d.n++
}

// remove deletes entry i; h32 is its key's hash.
func (d *shardData) removeHashed(i int32, h32 uint32) {
	d.deleteSlot(d.findSlot(i, h32))
	d.unlink(i)
	d.releaseKey(i)
	e := &d.entries[i]
	d.unref(e.backend)
	e.backend = 0
	e.newer = noEntry
	e.older = d.freeEntry
	d.freeEntry = i
	d.n--
}

func (d *shardData) remove(i int32) {
	d.removeHashed(i, uint32(maphash.Bytes(d.seed, d.keyBytes(i))))
}

// sweep removes expired entries from the old end of the list, visiting at
// most limit entries (limit < 0: no limit). Any expired entry has
// linked <= touched <= now-ttl, and the list is sorted by linked, so the walk
// stops at the first entry linked after now-ttl: it skips only live entries
// whose position is stale by less than the grain. Returns the number removed.
func (d *shardData) sweep(now, ttl int64, limit int) int {
	cutoff := now - ttl
	removed := 0
	i := d.tail
	for steps := 0; i != noEntry && steps != limit && d.entries[i].linked <= cutoff; steps++ {
		next := d.entries[i].newer
		if d.entries[i].touched.Load() <= cutoff {
			d.remove(i)
			removed++
		}
		i = next
	}
	return removed
}

// countLive counts entries that are not expired at now.
func (d *shardData) countLive(now, ttl int64) int {
	live := 0
	for i := d.head; i != noEntry; i = d.entries[i].older {
		if now-d.entries[i].touched.Load() < ttl {
			live++
		}
	}
	return live
}

// invalidate removes every entry mapped to backend and returns how many of
// them were live (the others are counted as expired by the caller).
func (d *shardData) invalidate(backend string, now, ttl int64) (live, expired int) {
	id, ok := d.ids[backend]
	if !ok {
		return 0, 0
	}
	remaining := d.refs[id]
	for i := range d.entries {
		if d.entries[i].backend != id {
			continue
		}
		if now-d.entries[i].touched.Load() < ttl {
			live++
		} else {
			expired++
		}
		d.remove(int32(i))
		if remaining--; remaining == 0 {
			break // the id is free now and may not be compared against
		}
	}
	return live, expired
}
