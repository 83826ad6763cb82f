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
//   - Eviction (insert into a full shard with nothing expired there) removes
//     the shard's least recently refreshed entry - with a uniform TTL that is
//     the entry that would expire soonest - to within the table's grain
//     g = min(TTL/64, 1s): no entry of the shard was refreshed more than g
//     before the evicted one. An insert never evicts a live entry while its
//     shard holds an entry that expired more than g ago.
//   - Memory: keys longer than MaxKeyLen are stored as their SHA-256 digest,
//     so an entry costs a bounded number of bytes whatever the caller passes.
//     Keys are copied into a per-shard byte arena, so the table never pins a
//     caller's request buffers, and the per-entry structures hold no pointers,
//     so a million sessions add nothing for the garbage collector to scan.
//
// # Why it is built this way
//
// The TTL is the same for every entry of a table, so expiry order equals
// last-refresh order. Each shard keeps its entries on a recency list (index
// links inside one slice, newest at the head), which makes "sweep the expired
// tail, else evict the tail" O(1). Moving an entry to the head on every hit
// would need the shard's write lock on every request, so a hit only stores its
// time atomically under the read lock, and relinks (write lock) only when the
// entry's list position is more than the grain older than now. That is what
// bounds the ordering error by g while keeping parallel hits on a read lock.
//
// Keys are hashed with hash/maphash under a seed drawn per table, so a client
// cannot aim keys at one shard or one probe chain. Each shard indexes its
// entries with its own open-addressing table of 8-byte slots (entry index +
// 32 bits of the hash), linear probing with backward-shift deletion, so there
// are no tombstones to degrade under a flood. Backends are interned per shard
// and entries store a small id; ids are reference counted and reused, so
// backends removed by a reload do not accumulate.
package sessions
