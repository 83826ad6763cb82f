// SPDX-License-Identifier: GPL-2.0
// Forwarding a VIP flow: the connection table first, then the pick; the DR rewrite.
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include "maps.h"
#include "parse.h"
#include "pick.h"
#include "conn.h"
#include "nat.h"
#include "tunnel.h"

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

/* deliver sends a packet of flow f to backend b (slot bidx) the way b is reached: by tunnel
 * (with secondary second, NO_SECOND: none; now, the clock the caller read, or 0) or by
 * direct routing. */
static __always_inline int deliver(struct xdp_md *ctx, struct ethhdr *eth, const struct flow *f, struct backend *b,
				   __u32 bidx, __u32 vip_id, __u32 second, __u64 len, __u64 now)
{
	if (b->flags & B_TUNNEL) {
		struct tunnel_args a = {.bidx = bidx, .vip_id = vip_id, .second = second, .len = len, .now = now};
		return tunnel_forward(ctx, f, b, &a);
	}
	return forward(ctx, eth, b, bidx, vip_id, len);
}

/* route sends a flow of a VIP: connection table first, then the pick. A SYN uses its entry
 * only while that entry holds a handshake in progress (C_SYN) to a backend that still takes
 * new flows: a retransmitted SYN; a new connection that reuses a 5-tuple re-picks, as in Katran, so it
 * never follows a stale entry to a backend that has left the table. An entry a packet finds
 * unusable is taken out of the counts and removed, and the new one inserted only if absent,
 * so each connection is counted once however many CPUs see its SYN. A TCP non-SYN miss of a
 * WRR or WLC VIP goes by the Maglev table (a flow that moved here from another node).
 * ICMP errors and RSTs never insert; other inserts are capped per CPU. */
static __always_inline int route(struct xdp_md *ctx, struct ethhdr *eth, struct flow *f, const struct vip_meta *vm,
				 __u8 *payload, int tflags, __u64 len)
{
	void *data_end = (void *)(long)ctx->data_end;
	int rst = tflags & T_RST;
	int syn = tflags & T_SYN;
	__u64 now = now_ns();
	struct conn *c = bpf_map_lookup_elem(&conns, f);
	struct backend *b;
	if (c) {
		__u32 bidx = c->backend;
		b = bpf_map_lookup_elem(&backends, &bidx);
		int usable = b && conn_usable(c, b, vm, f->proto, now);
		/* A SYN follows only a handshake in progress (a retransmission) to a backend that
		 * still takes new flows; on an established entry it is a new connection. */
		if (usable && syn &&
		    (!(c->flags & C_SYN) || !(c->flags & C_COUNTED) || weight_of(bidx) == 0 ||
		     ((b->flags & B_DOWN) && !(vm->flags & F_PANIC))))
			usable = 0;
		/* A NAT flow's entry holds while the backend is still reached by NAT and, checked at
		 * each refresh (a port idle past its hold may have gone to another flow), its reply
		 * entry is still its own. */
		if (usable && !(c->flags & C_NAT) != !(b->flags & B_NAT))
			usable = 0;
		if (usable && (b->flags & B_TUNNEL) && !tunnel_trusts(vm, c, f, syn, now))
			usable = 0;
		int nr = NAT_OK;
		if (usable && (c->flags & C_NAT) && !(tflags & T_ICMP) &&
		    ((tflags & (T_FIN | T_RST)) || (c->flags & C_HS) || now > c->last_seen + NSEC_PER_SEC)) {
			nr = nat_refresh(ctx, c, b, f, now);
			if (nr == NAT_STALE)
				usable = 0;
		}
		if (usable) {
			count(&path_stats, PATH_CONN_HIT, len);
			__u32 nat_src = c->nat_src;
			__be16 nat_port = c->nat_port;
			int nat = c->flags & C_NAT;
			if (rst)
				count(&path_stats, PATH_TCP_RST, len);
			/* A RST ends the flow's entry, except a NAT flow's RST that nat_refresh does not
			 * believe (NAT_KEEP: forwarded, nothing changed). A NAT flow's port outlives a
			 * RST believed by nat_hold_rst seconds, so that even a forged one the backend
			 * ignores never hands a live flow's port to another flow at once. */
			if (rst && nr != NAT_KEEP) {
				uncount(c, b);
				bpf_map_delete_elem(&conns, f);
			} else if (!(tflags & T_ICMP)) {
				if (tflags & T_FIN) {
					uncount(c, b);
					if (!(c->flags & C_FIN))
						__sync_fetch_and_or((__u32 *)&c->flags, C_FIN);
				}
				if (!syn && (c->flags & C_SYN))
					__sync_fetch_and_and((__u32 *)&c->flags, ~(__u32)C_SYN);
				if (now > c->last_seen + NSEC_PER_SEC)
					c->last_seen = now;
			}
			if (vm->flags & F_PANIC)
				count(&path_stats, PATH_PANIC, len);
			if (nat) {
				struct nat_args a = {.bidx = bidx, .vip_id = vm->id, .src_idx = nat_src, .port = nat_port,
						     .tflags = tflags, .len = len};
				return nat_forward(ctx, f, b, &a);
			}
			return deliver(ctx, eth, f, b, bidx, vm->id, NO_SECOND, len, now);
		}
		count(&path_stats, PATH_CONN_STALE, len);
		if (!(tflags & T_ICMP)) {
			nat_release(c, b, f);
			uncount(c, b);
			bpf_map_delete_elem(&conns, f);
		}
	}
	count(&path_stats, PATH_CONN_MISS, len);
	__u32 h = 0, bidx = 0;
	int decided = -1;
	int algo = vm->flags & (F_WRR | F_WLC);
	if (algo && ((tflags & T_ICMP) || (f->proto == IPPROTO_TCP && !syn))) {
		count(&path_stats, PATH_MIDSTREAM, len);
		algo = 0;
	}
	/* Above the CPU's insert cap a new flow is forwarded without being remembered: its next
	 * packets will miss and go by the Maglev table, so it goes there too. */
	if (algo && budget_spent(now))
		algo = 0;
	if (algo) {
		int p = (vm->flags & F_WLC) ? wlc_pick(vm) : wrr_pick(vm);
		if (p < 0) {
			count(&path_stats, PATH_NO_BACKEND, len);
			return XDP_DROP;
		}
		count(&path_stats, (vm->flags & F_WLC) ? PATH_WLC : PATH_WRR, len);
		bidx = p;
		decided = 1;
	}
	if (decided < 0 && (vm->flags & F_QUIC) && payload) {
		decided = quic_pick(data_end, payload, vm, &bidx, &h);
		if (decided == 1)
			count(&path_stats, PATH_QUIC_SERVER_ID, len);
	}
	if (decided < 0)
		h = hash_flow(f, vm->flags & F_SRC_IP);
	__u32 second = NO_SECOND;
	if (decided != 1) {
		int p = (vm->flags & F_TUNNEL) ? tunnel_pick(vm, h, &second) : pick(vm, h);
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
	if (b->flags & B_NAT) {
		struct nat_args a = {.bidx = bidx, .vip_id = vm->id, .tflags = tflags, .len = len,
				     .hash = (vm->flags & (F_SRC_IP | F_QUIC | F_WRR | F_WLC)) ? hash_flow(f, 0) : h};
		int r = nat_new(ctx, f, vm, b, &a);
		if (r >= 0)
			return r;
		if (a.bidx != bidx) {
			bidx = a.bidx;
			b = bpf_map_lookup_elem(&backends, &bidx);
			if (!b || !(b->flags & B_NAT)) {
				count(&path_stats, PATH_NAT_NO_PORT, len);
				return XDP_DROP;
			}
		}
		if (vm->flags & F_PANIC)
			count(&path_stats, PATH_PANIC, len);
		return nat_forward(ctx, f, b, &a);
	}
	if (rst) {
		count(&path_stats, PATH_TCP_RST, len);
	} else if (!(tflags & T_ICMP) && (second == NO_SECOND || f->proto != IPPROTO_TCP || syn)) {
		/* A TCP non-SYN miss that carries a secondary (a flow that moved here, or whose
		 * entry went) is not remembered: its entry would hold the primary alone, and the
		 * flow's backend may be the secondary. Every packet of it takes the table. */
		if (insert_allowed(now)) {
			/* A FIN opens no connection to count: its flow is closing. */
			struct conn nc = {.backend = bidx, .gen = b->gen, .vip_id = vm->id, .last_seen = now,
					  .flags = (tflags & T_FIN) ? C_FIN : C_COUNTED | (syn ? C_SYN : 0)};
			if (bpf_map_update_elem(&conns, f, &nc, BPF_NOEXIST) == 0) {
				if (nc.flags & C_COUNTED)
					count_active(bidx);
			} else {
				/* Another CPU inserted the flow first (the same SYN twice): go where it went. */
				struct conn *o = bpf_map_lookup_elem(&conns, f);
				if (o) {
					__u32 oidx = o->backend;
					struct backend *ob = bpf_map_lookup_elem(&backends, &oidx);
					if (ob && (ob->flags & B_ALIVE)) {
						bidx = oidx;
						b = ob;
					}
				}
			}
		} else {
			count(&path_stats, PATH_INSERT_REFUSED, len);
		}
	}
	if (vm->flags & F_PANIC)
		count(&path_stats, PATH_PANIC, len);
	return deliver(ctx, eth, f, b, bidx, vm->id, second, len, now);
}
