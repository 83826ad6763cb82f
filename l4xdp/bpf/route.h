// SPDX-License-Identifier: GPL-2.0
// Forwarding a VIP flow: the connection table first, then the pick; the DR rewrite.
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include "maps.h"
#include "parse.h"
#include "pick.h"

/* forward rewrites the frame for backend b (slot bidx) and sends it. */
static __always_inline int forward(struct xdp_md *ctx, struct ethhdr *eth, const struct backend *b, __u32 bidx,
				   __u32 vip_id, __u64 len)
{
	/* DR: the LB's MAC (the frame's destination) becomes the source. */
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, b->mac, ETH_ALEN);
	count(&path_stats, PATH_FORWARD, len);
	count(&vip_stats, vip_id, len);
	count(&backend_stats, bidx, len);
	if (b->ifindex)
		return bpf_redirect(b->ifindex, 0);
	return XDP_TX;
}

/* conn_usable says whether entry c still holds for a packet of VIP vm: same VIP id, the
 * slot still the backend's it was pinned to (generation), not idle past the VIP's timeout,
 * and not a UDP flow of a down backend outside panic. */
static __always_inline int conn_usable(const struct conn *c, const struct backend *b, const struct vip_meta *vm,
				       __u8 proto, __u64 now)
{
	if (!b || !(b->flags & B_ALIVE) || c->vip_id != vm->id || c->gen != b->gen)
		return 0;
	if (now > c->last_seen && now - c->last_seen > (__u64)vm->idle_timeout * NSEC_PER_SEC)
		return 0;
	if (proto == IPPROTO_UDP && (b->flags & B_DOWN) && !(vm->flags & F_PANIC))
		return 0;
	return 1;
}

/* insert_allowed spends one of this CPU's inserts for the current second: above the cap a
 * new flow is forwarded by the table without being remembered (Katran's answer to floods),
 * so a flood cannot evict established flows faster than the cap allows. */
static __always_inline int insert_allowed(__u64 now)
{
	__u32 zero = 0;
	struct lb_config *cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg || cfg->insert_cap == 0)
		return 1;
	struct insert_budget *ib = bpf_map_lookup_elem(&insert_budget, &zero);
	if (!ib)
		return 1;
	if (now - ib->window >= NSEC_PER_SEC) {
		ib->window = now;
		ib->used = 0;
	}
	if (ib->used >= cfg->insert_cap)
		return 0;
	ib->used++;
	return 1;
}

/* route sends a flow of a VIP: connection table first, then Maglev. A SYN skips the table,
 * as in Katran: a new connection that reuses a 5-tuple must not follow a stale entry to a
 * backend that has left the table (found dead, say); a retransmitted SYN hashes the same.
 * ICMP errors and RSTs never insert; other inserts are capped per CPU. */
static __always_inline int route(struct xdp_md *ctx, struct ethhdr *eth, struct flow *f, const struct vip_meta *vm,
				 __u8 *payload, int tflags, __u64 len)
{
	void *data_end = (void *)(long)ctx->data_end;
	int rst = tflags & T_RST;
	__u64 now = bpf_ktime_get_coarse_ns();
	struct conn *c = (tflags & T_SYN) ? NULL : bpf_map_lookup_elem(&conns, f);
	struct backend *b;
	if (c) {
		__u32 bidx = c->backend;
		b = bpf_map_lookup_elem(&backends, &bidx);
		if (b && conn_usable(c, b, vm, f->proto, now)) {
			count(&path_stats, PATH_CONN_HIT, len);
			if (rst) {
				count(&path_stats, PATH_TCP_RST, len);
				bpf_map_delete_elem(&conns, f);
			} else if (!(tflags & T_ICMP) && now > c->last_seen + NSEC_PER_SEC) {
				c->last_seen = now;
			}
			if (vm->flags & F_PANIC)
				count(&path_stats, PATH_PANIC, len);
			return forward(ctx, eth, b, bidx, vm->id, len);
		}
		count(&path_stats, PATH_CONN_STALE, len);
	}
	count(&path_stats, PATH_CONN_MISS, len);
	__u32 h = 0, bidx = 0;
	int decided = -1;
	if ((vm->flags & F_QUIC) && payload) {
		decided = quic_pick(data_end, payload, vm, &bidx, &h);
		if (decided == 1)
			count(&path_stats, PATH_QUIC_SERVER_ID, len);
	}
	if (decided < 0)
		h = hash_flow(f, vm->flags & F_SRC_IP);
	if (decided != 1) {
		int p = pick(vm, h);
		if (p < 0) {
			count(&path_stats, PATH_NO_BACKEND, len);
			return XDP_DROP;
		}
		bidx = p;
	}
	b = bpf_map_lookup_elem(&backends, &bidx);
	if (!b || !(b->flags & B_ALIVE)) {
		count(&path_stats, PATH_NO_BACKEND, len);
		return XDP_DROP;
	}
	if (rst) {
		count(&path_stats, PATH_TCP_RST, len);
	} else if (!(tflags & T_ICMP)) {
		if (insert_allowed(now)) {
			struct conn nc = {.backend = bidx, .gen = b->gen, .vip_id = vm->id, .last_seen = now};
			bpf_map_update_elem(&conns, f, &nc, BPF_ANY);
		} else {
			count(&path_stats, PATH_INSERT_REFUSED, len);
		}
	}
	if (vm->flags & F_PANIC)
		count(&path_stats, PATH_PANIC, len);
	return forward(ctx, eth, b, bidx, vm->id, len);
}
