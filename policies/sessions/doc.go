// Package sessions holds bounded key -> backend tables with a sliding TTL: the
// session tables behind sticky_url, sticky_header, app_cookie (learn) and
// sticky_ip. Every request of those modes goes through a table and every key
// comes from a client, so the table is built for a hostile, parallel hot path.
//
// # Guarantees
//
//   - Bound: Len() <= MaxEntries at every instant. The table is split into
//     shards whose capacities sum exactly to MaxEntries, and an insert into a
//     full shard removes an entry before it adds one. The cost of that
//     exactness: eviction can begin while the table as a whole is a little
//     below MaxEntries (the first shard to fill evicts while others still have
//     room). Shards hold at least 1024 entries each, so with seeded hashing the
//     table is about 97% full when eviction starts at 1M entries, and tables
//     below 2048 entries have a single shard and no slack at all.
//   - Expiry is exact: Get never returns a mapping idle for TTL or longer and
//     never drops one idle for less. Idle time counts from the last hit or Put.
//     Expired entries are removed lazily: by the Get that finds them, and by
//     inserts, which first sweep a few expired entries off the old end of their
//     shard.
//   - Segments (segmented LRU): a new mapping is in probation; a Get that
//     finds it live (it is seen a second time) promotes it to the protected
//     segment, which holds at most four fifths of the shard. A promotion that
//     overflows it pushes the protected segment's least recently refreshed
//     entry back to probation's old end. So a flood of keys seen once - new
//     sessions nobody comes back with - evicts only keys seen once, and the
//     sessions clients came back with stay until they idle out, or until more
//     keys seen twice than the protected segment holds push them back.
//   - Eviction (insert into a full shard with nothing expired at the old end
//     of either segment) removes probation's oldest: an entry the protected
//     segment pushed back, else probation's least recently refreshed entry -
//     with a uniform TTL the one that would expire soonest - to within the
//     table's grain g = min(TTL/64, 1s): no entry of probation was refreshed
//     more than g before the evicted one. A protected entry is evicted only
//     when probation is empty. An insert never evicts a live entry while its
//     shard holds an entry that expired more than g ago (unless more than a
//     sweep's worth of entries pushed back sit at probation's old end).
//   - Memory: keys longer than MaxKeyLen are stored as their SHA-256 digest,
//     so an entry costs a bounded number of bytes whatever the caller passes.
//     Keys are copied into a per-shard byte arena, so the table never pins a
//     caller's request buffers, and the per-entry structures hold no pointers,
//     so a million sessions add nothing for the garbage collector to scan.
//
// # Why it is built this way
//
// The TTL is the same for every entry of a table, so expiry order equals
// last-refresh order. Each shard keeps each segment's entries on a recency list
// (index links inside one slice, newest at the head), which makes "sweep the
// expired tails, else evict probation's tail" O(1). Moving an entry to the head
// on every hit would need the shard's write lock on every request, so a hit on
// a protected entry only stores its time atomically under the read lock, and
// relinks (write lock) only when the entry's list position is more than the
// grain older than now. That is what bounds the ordering error by g while
// keeping parallel hits on a read lock; a hit on an entry in probation takes
// the write lock once, to promote it. An entry pushed back from the protected
// segment keeps its refresh time but is linked at probation's old end (its
// link time lowered to keep the list sorted), the next one evicted.
//
// Keys seen twice are protected rather than counted by frequency (TinyLFU's
// admission): a new session must be admitted at once to be kept at all, and an
// admission filter refuses exactly the keys a table full of established
// sessions most needs to take in. What a protected segment cannot stop - a
// client that comes back twice with each key it floods - ClientCap bounds per
// client address, for the owners (app_cookie's learn mode) that know one.
//
// Keys are hashed with hash/maphash under a seed drawn per table, so a client
// cannot aim keys at one shard or one probe chain. Each shard indexes its
// entries with its own open-addressing table of 8-byte slots (entry index +
// 32 bits of the hash), linear probing with backward-shift deletion, so there
// are no tombstones to degrade under a flood. Backends are interned per shard
// and entries store a small id; ids are reference counted and reused, so
// backends removed by a reload do not accumulate.
package sessions
