// SPDX-License-Identifier: GPL-2.0
// The pick: a flow hash (or a QUIC server_id) to a backend slot through the VIP's Maglev table.
#pragma once

#include <linux/bpf.h>
#include "maps.h"

/* FNV-1a, 32 bits: the QUIC connection ID's hash (the fixtures compute it from its
 * definition to know each ID's backend). */
static __always_inline __u32 fnv_step(__u32 h, __u8 b)
{
	return (h ^ b) * 16777619u;
}

/* mix_word folds one 64-bit word of a flow into h: xor, multiply, fold the high half down. */
static __always_inline __u64 mix_word(__u64 h, __u64 w)
{
	h = (h ^ w) * 0xbf58476d1ce4e5b9ULL;
	return h ^ (h >> 31);
}

/* hash_flow is the flow's hash: its key read as 64-bit words (source; then destination,
 * ports, protocol and the zero padding), each folded in by a multiply, and a last multiply
 * and fold (splitmix64's constants). Five multiplies where FNV-1a took one per byte (37):
 * the pick of a new flow, and of every SYN above the insert cap, pays it. The fixtures
 * compute it from this definition to know each flow's backend. */
static __always_inline __u32 hash_flow(const struct flow *f, int src_only)
{
	const __u64 *w = (const __u64 *)f;
	__u64 h = 0x9e3779b97f4a7c15ULL;
	h = mix_word(h, w[0]);
	h = mix_word(h, w[1]);
	if (!src_only) {
		h = mix_word(h, w[2]);
		h = mix_word(h, w[3]);
		h = mix_word(h, w[4]);
	}
	h *= 0x94d049bb133111ebULL;
	return (__u32)(h ^ (h >> 32));
}

/* pick returns the backend index of hash h in the VIP's table, or -1. */
static __always_inline int pick(const struct vip_meta *vm, __u32 h)
{
	__u32 id = vm->id;
	void *table = bpf_map_lookup_elem(&maglev, &id);
	if (!table || vm->table_size == 0)
		return -1;
	__u32 slot = h % vm->table_size;
	__u32 *b = bpf_map_lookup_elem(table, &slot);
	if (!b || *b == 0xffffffff)
		return -1;
	return *b;
}

/* quic_hash: a known server_id in the DCID picks its backend (*bidx), else the DCID is
 * hashed. Returns 1 when a server_id decided, 0 when *h holds a hash, -1 when the payload
 * holds no usable CID (the caller hashes the flow). */
static __always_inline int quic_pick(void *data_end, __u8 *payload, const struct vip_meta *vm, __u32 *bidx, __u32 *h)
{
	__u8 *cid;
	__u32 len;
	if (payload + 1 > (__u8 *)data_end)
		return -1;
	if (payload[0] & 0x80) { /* long header: version (4), DCID length (1), DCID */
		if (payload + 6 > (__u8 *)data_end)
			return -1;
		len = payload[5];
		cid = payload + 6;
	} else { /* short header: DCID of the VIP's length */
		len = vm->cid_len;
		cid = payload + 1;
	}
	if (len == 0 || len > MAX_CID)
		return -1;
	if (len >= 3 && cid + 3 <= (__u8 *)data_end) {
		struct server_key sk = {.vip_id = vm->id, .server_id = ((__u32)cid[1] << 8) | cid[2]};
		__u32 *b = bpf_map_lookup_elem(&server_ids, &sk);
		if (b) {
			struct backend *be = bpf_map_lookup_elem(&backends, b);
			if (be && (be->flags & B_ALIVE)) {
				*bidx = *b;
				return 1;
			}
		}
	}
	__u32 hh = 2166136261u;
	for (int i = 0; i < MAX_CID; i++) { /* a bounded loop: the verifier walks it */
		if (i >= len || cid + i + 1 > (__u8 *)data_end)
			break;
		hh = fnv_step(hh, cid[i]);
	}
	*h = hh;
	return 0;
}

/* sched_at is entry i of the VIP's schedule (of pool->sched_len entries), or -1. */
static __always_inline int sched_at(const struct vip_meta *vm, const struct wlc_pool *pool, __u32 i)
{
	__u32 id = vm->id;
	void *table = bpf_map_lookup_elem(&schedules, &id);
	if (!table || pool->sched_len == 0)
		return -1;
	__u32 slot = i % pool->sched_len;
	__u32 *b = bpf_map_lookup_elem(table, &slot);
	if (!b || *b == 0xffffffff)
		return -1;
	return *b;
}

/* wrr_next takes this CPU's next entry of the VIP's schedule. */
static __always_inline int wrr_next(const struct vip_meta *vm, const struct wlc_pool *pool)
{
	__u32 id = vm->id;
	__u32 *pos = bpf_map_lookup_elem(&sched_pos, &id);
	if (!pos)
		return -1;
	__u32 i = *pos;
	*pos = pool->sched_len ? (i + 1) % pool->sched_len : 0;
	return sched_at(vm, pool, i);
}

static __always_inline __s64 active_of(__u32 slot)
{
	__s64 *a = bpf_map_lookup_elem(&active, &slot);
	return a && *a > 0 ? *a : 0;
}

static __always_inline __u64 weight_of(__u32 slot)
{
	__u32 *w = bpf_map_lookup_elem(&weights, &slot);
	return w ? *w : 0;
}

/* lighter says whether slot a's active connections per weight are below b's (cross-multiplied:
 * a/wa < b/wb). A weight of 0 never wins. */
static __always_inline int lighter(__u32 a, __u32 b)
{
	__u64 wa = weight_of(a), wb = weight_of(b);
	if (wa == 0)
		return 0;
	if (wb == 0)
		return 1;
	return (__u64)active_of(a) * wb < (__u64)active_of(b) * wa;
}

/* wrr_pick: weighted round robin, this CPU's next schedule entry. */
static __always_inline int wrr_pick(const struct vip_meta *vm)
{
	__u32 id = vm->id;
	struct wlc_pool *pool = bpf_map_lookup_elem(&wlc_pools, &id);
	if (!pool)
		return -1;
	return wrr_next(vm, pool);
}

/* wlc_pick: weighted least connections. The first candidate is this CPU's next schedule
 * entry, so ties (every count equal, as between sequential connections) follow the weights
 * in a smooth order. A pool of up to WLC_SCAN backends is scanned whole; a larger one is
 * the weighted power of two choices: a second candidate sampled from the schedule (so in
 * proportion to weight) at random, the lighter of the two wins. Either way a pick looks at
 * WLC_SCAN backends at most. */
static __always_inline int wlc_pick(const struct vip_meta *vm)
{
	__u32 id = vm->id;
	struct wlc_pool *pool = bpf_map_lookup_elem(&wlc_pools, &id);
	if (!pool)
		return -1;
	int first = wrr_next(vm, pool);
	if (first < 0)
		return -1;
	__u32 best = first;
	if (pool->n == 0) {
		int other = sched_at(vm, pool, bpf_get_prandom_u32());
		if (other >= 0 && lighter(other, best))
			best = other;
		return best;
	}
#pragma unroll
	for (int i = 0; i < WLC_SCAN; i++) {
		if (i >= pool->n)
			break;
		__u32 s = pool->slots[i];
		if (lighter(s, best))
			best = s;
	}
	return best;
}
