// SPDX-License-Identifier: GPL-2.0
// Forwarding a VIP flow: the connection table first, then the pick; the DR rewrite.
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include "maps.h"
#include "parse.h"
#include "pick.h"

static __always_inline int forward(struct xdp_md *ctx, struct ethhdr *eth, __u32 bidx, __u32 vip_id, __u64 len)
{
	struct backend *b = bpf_map_lookup_elem(&backends, &bidx);
	if (!b || !(b->flags & B_ALIVE)) {
		count(&path_stats, PATH_NO_BACKEND, len);
		return XDP_DROP;
	}
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

/* route sends a flow of a VIP: connection table first, then Maglev. A SYN skips the table,
 * as in Katran: a new connection that reuses a 5-tuple must not follow a stale entry to a
 * backend that has left the table (found dead, say); a retransmitted SYN hashes the same. */
static __always_inline int route(struct xdp_md *ctx, struct ethhdr *eth, struct flow *f, const struct vip_meta *vm,
				 __u8 *payload, int tflags, __u64 len)
{
	void *data_end = (void *)(long)ctx->data_end;
	int rst = tflags & T_RST;
	struct conn *c = (tflags & T_SYN) ? NULL : bpf_map_lookup_elem(&conns, f);
	if (c) {
		struct backend *b = bpf_map_lookup_elem(&backends, &c->backend);
		if (b && (b->flags & B_ALIVE)) {
			__u32 bidx = c->backend;
			count(&path_stats, PATH_CONN_HIT, len);
			if (rst) {
				count(&path_stats, PATH_TCP_RST, len);
				bpf_map_delete_elem(&conns, f);
			}
			return forward(ctx, eth, bidx, vm->id, len);
		}
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
		int b = pick(vm, h);
		if (b < 0) {
			count(&path_stats, PATH_NO_BACKEND, len);
			return XDP_DROP;
		}
		bidx = b;
	}
	if (!rst) {
		struct conn nc = {.backend = bidx, .vip_id = vm->id};
		bpf_map_update_elem(&conns, f, &nc, BPF_ANY);
	} else {
		count(&path_stats, PATH_TCP_RST, len);
	}
	return forward(ctx, eth, bidx, vm->id, len);
}
