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

// A shard's entries are in two segments (segmented LRU), each a recency list: a new mapping
// enters probation; a Get that finds it live promotes it to the protected segment, which
// holds at most protectedCap of the shard and, when a promotion overflows it, pushes its
// least recently refreshed entry back to probation's old end. Inserts evict from probation
// first, so keys seen once (a flood of them) evict only one another.
const (
	probation = 0
	protected = 1
)

// protectedBit marks, in entry.keyOff, an entry of the protected segment. Arena offsets
// stay below it: a shard holds at most maxShardCap keys of at most MaxKeyLen+2 bytes, and
// its arena grows to at most 1.25 times its live bytes plus one key.
const protectedBit = 1 << 31

// protectedCap is how many entries of a shard of capacity c the protected segment holds:
// all but a fifth (at least one), which stays for probation, so new mappings always have
// room to be seen a second time.
func protectedCap(c int) int { return c - max(1, c/5) }

// entry is one mapping. It holds no pointers (the key lives in the shard's
// arena, the backend is an interned id) so the GC never scans the entries.
type entry struct {
	// touched is the last refresh, in nanoseconds since the table's epoch.
	// Hits store it under the read lock, hence atomic.
	touched atomic.Int64
	// linked is the time the entry was last moved to the head of its segment's
	// recency list. Each list is sorted by linked, and linked <= touched;
	// touched-linked < grain for every entry but those the protected segment
	// pushed back (their link is lowered to probation's old end), which is
	// what bounds the eviction-order error.
	linked int64
	// keyOff is the offset of the key's 2-byte length prefix in the arena, with
	// protectedBit set for an entry of the protected segment.
	keyOff uint32
	// backend is the interned backend id; 0 marks a free entry.
	backend uint32
	newer   int32 // toward the head (most recently refreshed); free list link otherwise unused
	older   int32 // toward the tail; also the free-list link of free entries
}

// off is the arena offset of the entry's key.
func (e *entry) off() uint32 { return e.keyOff &^ protectedBit }

// seg is the entry's segment.
func (e *entry) seg() int { return int(e.keyOff >> 31) }

// recency is a segment's list: head the most recently refreshed entry, tail the least.
type recency struct{ head, tail int32 }

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

	entries   []entry
	freeEntry int32
	lists     [2]recency // by segment
	nprot     int        // entries in the protected segment, at most pcap
	pcap      int        // protectedCap(cap)

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
		pcap:      protectedCap(capacity),
		freeEntry: noEntry,
		lists:     [2]recency{{noEntry, noEntry}, {noEntry, noEntry}},
		names:     []string{""},
		refs:      []int32{0},
	}
}

// setCap changes the shard's capacity in place (growing only: shrinking rebuilds).
func (d *shardData) setCap(c int) {
	d.cap = c
	d.pcap = protectedCap(c)
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
	off := d.entries[i].off()
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
			off := e.off()
			n := uint32(d.arena[off]) | uint32(d.arena[off+1])<<8
			e.keyOff = uint32(len(a)) | e.keyOff&protectedBit
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
	off := int(d.entries[i].off())
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
	l := &d.lists[e.seg()]
	if e.newer != noEntry {
		d.entries[e.newer].older = e.older
	} else {
		l.head = e.older
	}
	if e.older != noEntry {
		d.entries[e.older].newer = e.newer
	} else {
		l.tail = e.newer
	}
}

// pushHead links i as the newest entry of its segment; linked must be >= the head's.
func (d *shardData) pushHead(i int32) {
	e := &d.entries[i]
	l := &d.lists[e.seg()]
	e.newer = noEntry
	e.older = l.head
	if l.head != noEntry {
		d.entries[l.head].newer = i
	} else {
		l.tail = i
	}
	l.head = i
}

// pushTail links i as the oldest entry of its segment, its link time lowered to keep the
// list sorted (it stays <= touched, as every entry's).
func (d *shardData) pushTail(i int32) {
	e := &d.entries[i]
	l := &d.lists[e.seg()]
	e.older = noEntry
	e.newer = l.tail
	if l.tail != noEntry {
		t := &d.entries[l.tail]
		t.older = i
		e.linked = min(e.linked, t.linked)
	} else {
		l.head = i
	}
	l.tail = i
}

// headTime is the time to link a new head of segment seg at: now, unless the clock went
// backwards (a test clock), in which case the list must stay sorted.
func (d *shardData) headTime(seg int, now int64) int64 {
	if h := d.lists[seg].head; h != noEntry && d.entries[h].linked > now {
		return d.entries[h].linked
	}
	return now
}

// relink moves i to the head of its segment as refreshed at now.
func (d *shardData) relink(i int32, now int64) {
	d.unlink(i)
	d.entries[i].linked = d.headTime(d.entries[i].seg(), now)
	d.pushHead(i)
}

// moveTo puts i at the head of segment seg as refreshed at now (a promotion, or a mapping
// that starts over in probation); a protected segment it overflows pushes its oldest entry
// back to probation's old end, the next one an insert evicts.
func (d *shardData) moveTo(i int32, seg int, now int64) {
	d.unlink(i)
	d.setSeg(i, seg)
	d.entries[i].linked = d.headTime(seg, now)
	d.pushHead(i)
	d.overflow()
}

// setSeg marks i (unlinked) as an entry of segment seg, counting the protected ones.
func (d *shardData) setSeg(i int32, seg int) {
	e := &d.entries[i]
	if e.seg() == protected {
		d.nprot--
	}
	e.keyOff = e.off()
	if seg == protected {
		e.keyOff |= protectedBit
		d.nprot++
	}
}

// overflow pushes the protected segment's oldest entries back to probation while it holds
// more than pcap.
func (d *shardData) overflow() {
	for d.nprot > d.pcap {
		t := d.lists[protected].tail
		d.unlink(t)
		d.setSeg(t, probation)
		d.pushTail(t)
	}
}

// insert adds a new mapping at the head of segment seg; the shard must have room and the
// key must be absent. linked must be >= that segment's head's linked.
func insert[K string | []byte](d *shardData, key K, h32 uint32, backend string, touched, linked int64, seg int) {
	i := d.allocEntry()
	e := &d.entries[i]
	e.keyOff = appendKey(d, key)
	e.backend = d.intern(backend)
	e.touched.Store(touched)
	e.linked = linked
	d.setSeg(i, seg)
	d.pushHead(i)
	d.insertSlot(i, h32)
	d.n++
	d.overflow()
}

// remove deletes entry i; h32 is its key's hash.
func (d *shardData) removeHashed(i int32, h32 uint32) {
	d.deleteSlot(d.findSlot(i, h32))
	d.unlink(i)
	d.releaseKey(i)
	d.setSeg(i, probation)
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

// sweep removes expired entries from the old end of each segment's list, probation's
// first, visiting at most limit entries in all (limit < 0: no limit). Any expired entry has
// linked <= touched <= now-ttl, and each list is sorted by linked, so a walk stops at the
// first entry linked after now-ttl: it skips only live entries whose position is older than
// their last refresh (by less than the grain, or pushed back from the protected segment).
// Returns the number removed.
func (d *shardData) sweep(now, ttl int64, limit int) int {
	cutoff := now - ttl
	removed, steps := 0, 0
	for seg := range d.lists {
		i := d.lists[seg].tail
		for ; i != noEntry && steps != limit && d.entries[i].linked <= cutoff; steps++ {
			next := d.entries[i].newer
			if d.entries[i].touched.Load() <= cutoff {
				d.remove(i)
				removed++
			}
			i = next
		}
	}
	return removed
}

// victim is the entry an insert into the full shard removes: an expired entry at the old
// end of either segment, else probation's oldest, else the protected segment's.
func (d *shardData) victim(now, ttl int64) int32 {
	for _, l := range d.lists {
		if l.tail != noEntry && now-d.entries[l.tail].touched.Load() >= ttl {
			return l.tail
		}
	}
	if t := d.lists[probation].tail; t != noEntry {
		return t
	}
	return d.lists[protected].tail
}

// countLive counts entries that are not expired at now.
func (d *shardData) countLive(now, ttl int64) int {
	live := 0
	for _, l := range d.lists {
		for i := l.head; i != noEntry; i = d.entries[i].older {
			if now-d.entries[i].touched.Load() < ttl {
				live++
			}
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
