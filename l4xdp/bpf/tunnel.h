// SPDX-License-Identifier: GPL-2.0
// Tunnel forwarding: the client's packet encapsulated in GUE (gue.h) to a backend across L3,
// with the row's secondary for second chance; the MTU answer when it would not fit.
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include "bpf_helpers.h"
#include "bpf_endian.h"
#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "gue.h"
#include "nat.h"

#define NO_SECOND 0xffffffff

/* A tunnel VIP's TCP entry idle this long is not followed blindly: the packet goes by the
 * second-chance table instead (tunnel_trusts). An active flow refreshes its entry every
 * second. */
#define TUNNEL_TRUST_NS (2 * NSEC_PER_SEC)

/* opaque keeps the compiler from seeing through v (the verifier wants it computed as it is
 * written). */
#define opaque(v) asm volatile("" : "+r"(v))

/* tunnel_pick returns the primary of the row of hash h in the VIP's second-chance table (or
 * -1), and its secondary in *second (NO_SECOND: none). */
static __always_inline int tunnel_pick(const struct vip_meta *vm, __u32 h, __u32 *second)
{
	__u32 id = vm->id;
	void *table = bpf_map_lookup_elem(&tunnel_tables, &id);
	if (!table || vm->table_size == 0)
		return -1;
	__u32 row = h % vm->table_size;
	__u64 *r = bpf_map_lookup_elem(table, &row);
	if (!r || (__u32)*r == NO_SECOND)
		return -1;
	*second = *r >> 32;
	return (__u32)*r;
}

/* tunnel_trusts says whether a packet of a tunnel VIP's flow may follow entry c (to a tunnel
 * backend): with second chance, not a TCP non-SYN whose entry has been idle TUNNEL_TRUST_NS. Such an entry may
 * be that of an earlier connection on the same 5-tuple (a node keeps an ended connection's
 * entry to its idle timeout when its FIN went elsewhere, and a client reuses its port a
 * minute later, after its TIME_WAIT; the node that saw the new SYN replaced its own entry,
 * the others did not), or
 * the table may have moved while the flow was idle: by the table, the packet reaches its
 * connection either way in one hop at most (the row's primary, then its secondary). */
static __always_inline int tunnel_trusts(const struct vip_meta *vm, const struct conn *c, const struct flow *f, int syn,
					 __u64 now)
{
	return !(vm->flags & F_SECOND) || f->proto != IPPROTO_TCP || syn || now <= c->last_seen + TUNNEL_TRUST_NS;
}

/* tunnel_hash mixes the client's address (its last 32 bits) and both ports by murmur3's
 * finalizer: the outer UDP source port and IPv6 flow label carry it, so that the network's
 * ECMP spreads tunnels as it spreads flows. Cheaper than the pick's hash (it runs on every
 * packet); the flow's other words vary little between the flows of one tunnel. */
static __always_inline __u32 tunnel_hash(const struct flow *f)
{
	const __u16 *w = (const __u16 *)f; /* a flow is 2-byte aligned */
	__u32 h = ((__u32)w[6] << 16 | w[7]) ^ ((__u32)f->sport << 16 | f->dport);
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	return h ^ (h >> 16);
}

/* What tunnel_forward needs besides the flow and backend (a BPF function takes 5 arguments). */
struct tunnel_args {
	__u32 bidx;
	__u32 vip_id;
	__u32 second; /* the secondary's slot, NO_SECOND: none */
	__u32 pad;
	__u64 len;
	__u64 now;    /* the caller's now_ns(), 0: read it here */
};

/* A CPU's scratch space for tunnel_forward and tunnel_too_big: the XDP stack of the forwarding path leaves it
 * too few bytes for these (as nat_scratch). */
struct tunnel_scratch {
	__u8 src[16]; /* tunnel_forward: the tunnel's source, for a FIB lookup */
	__u8 dst[16]; /* tunnel_too_big: the answer's addresses and MACs */
	__u8 dmac[ETH_ALEN];
	__u8 smac[ETH_ALEN];
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tunnel_scratch);
} tunnel_scratch SEC(".maps");

/* ip4_csum is the header checksum of a 20-byte IPv4 header (its check field 0). */
static __always_inline __u16 ip4_csum(const struct iphdr *ip)
{
	const __u16 *w = (const __u16 *)ip;
	__u32 s = 0;
#pragma unroll
	for (int i = 0; i < 10; i++)
		s += w[i];
	return ~csum_fold(s);
}

/* tunnel_too_big answers a packet that would exceed the path's MTU once encapsulated: ICMP
 * "fragmentation needed" (IPv4) or ICMPv6 "packet too big" from the VIP to the client, with
 * the MTU the client may send (the path's less the tunnel's overhead), quoting the packet's
 * first bytes, sent back out of the interface it came in on. TCP and UDP alike. */
static __noinline int tunnel_too_big(struct xdp_md *ctx, int v6, __u32 mtu, __u64 len)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	count(&path_stats, PATH_TUNNEL_TOO_BIG, len);
	/* The quote: the IPv4 header with room for options and the transport's first 28 bytes;
	 * IPv6's header and 88 bytes. Multiples of 4, for bpf_csum_diff. */
	int quote = v6 ? 128 : 88;
	int head = v6 ? 40 + 8 : 20 + 8;
	__u32 zero = 0;
	struct tunnel_scratch *sc = bpf_map_lookup_elem(&tunnel_scratch, &zero);
	if (!sc || data + ETH_HLEN + quote > data_end)
		return XDP_DROP;
	__u8 *smac = sc->smac, *dmac = sc->dmac, *src = sc->src, *dst = sc->dst;
	__builtin_memcpy(smac, eth->h_dest, ETH_ALEN); /* the LB answers from the MAC it was sent to */
	__builtin_memcpy(dmac, eth->h_source, ETH_ALEN);
	__be16 proto = eth->h_proto;
	if (v6) {
		struct ipv6hdr *ip = (void *)(eth + 1);
		__builtin_memcpy(src, &ip->daddr, 16);
		__builtin_memcpy(dst, &ip->saddr, 16);
	} else {
		struct iphdr *ip = (void *)(eth + 1);
		__builtin_memcpy(src, &ip->daddr, 4);
		__builtin_memcpy(dst, &ip->saddr, 4);
	}
	long frame = data_end - data;
	opaque(frame); /* a scalar: folded into 32-bit pointer arithmetic, it would be refused */
	if (bpf_xdp_adjust_tail(ctx, (int)((long)(ETH_HLEN + quote) - frame)) || bpf_xdp_adjust_head(ctx, -head))
		return XDP_DROP;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	if (data + ETH_HLEN + head + quote > data_end)
		return XDP_DROP;
	__builtin_memcpy(eth->h_dest, dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, smac, ETH_ALEN);
	eth->h_proto = proto;
	if (v6) {
		struct ipv6hdr *ip = (void *)(eth + 1);
		struct icmp6hdr *ic = (void *)(ip + 1);
		__builtin_memset(ip, 0, sizeof(*ip));
		ip->version = 6;
		ip->payload_len = bpf_htons(8 + quote);
		ip->nexthdr = IPPROTO_ICMPV6;
		ip->hop_limit = 64;
		__builtin_memcpy(&ip->saddr, src, 16);
		__builtin_memcpy(&ip->daddr, dst, 16);
		ic->icmp6_type = 2; /* packet too big */
		ic->icmp6_code = 0;
		ic->icmp6_cksum = 0;
		ic->rest = bpf_htonl(mtu);
		/* The checksum covers the pseudo-header: addresses, length, next header. */
		__be32 pseudo[2] = {bpf_htonl(8 + quote), bpf_htonl(IPPROTO_ICMPV6)};
		__s64 s = bpf_csum_diff(NULL, 0, (__be32 *)&ip->saddr, 32, 0);
		s = bpf_csum_diff(NULL, 0, pseudo, sizeof(pseudo), s);
		s = bpf_csum_diff(NULL, 0, (__be32 *)ic, 8 + quote, s);
		if (s < 0)
			return XDP_DROP;
		ic->icmp6_cksum = ~csum_fold((__u32)s);
		return XDP_TX;
	}
	struct iphdr *ip = (void *)(eth + 1);
	struct icmphdr *ic = (void *)(ip + 1);
	__builtin_memset(ip, 0, sizeof(*ip));
	ip->version = 4;
	ip->ihl = 5;
	ip->tot_len = bpf_htons(20 + 8 + quote);
	ip->ttl = 64;
	ip->protocol = IPPROTO_ICMP;
	__builtin_memcpy(&ip->saddr, src, 4);
	__builtin_memcpy(&ip->daddr, dst, 4);
	ip->check = ip4_csum(ip);
	ic->type = ICMP_DEST_UNREACH;
	ic->code = 4; /* fragmentation needed and DF set */
	ic->checksum = 0;
	ic->rest = bpf_htonl(mtu & 0xffff); /* unused (16 bits), next-hop MTU (16 bits) */
	__s64 s = bpf_csum_diff(NULL, 0, (__be32 *)ic, 8 + quote, 0);
	if (s < 0)
		return XDP_DROP;
	ic->checksum = ~csum_fold((__u32)s);
	return XDP_TX;
}

/* tunnel_forward encapsulates the packet of flow f in GUE to backend b (slot a->bidx): outer
 * IP from the node's tunnel source of the packet's family to the backend, UDP to the
 * backend's tunnel port from a port of the flow's hash, the GUE header with the secondary
 * (a->second) and one hop, or none; the next hop from the FIB, as NAT's. A packet that would
 * exceed the route's MTU is answered instead (tunnel_too_big). Not inlined, as nat_forward:
 * its stack is not added to every path's. */
static __noinline int tunnel_forward(struct xdp_md *ctx, const struct flow *f, struct backend *b,
				     const struct tunnel_args *a)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u64 len = a->len;
	__u32 h = tunnel_hash(f);
	opaque(h); /* one register, not the flow's words kept on the stack until used */
	if ((void *)(eth + 1) > data_end)
		return XDP_DROP;
	int v6 = eth->h_proto == bpf_htons(ETH_P_IPV6);
	__u32 ilen, overhead = v6 ? TUNNEL_OVERHEAD_V6 : TUNNEL_OVERHEAD_V4;
	__u8 tos;
	if (v6) {
		struct ipv6hdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end)
			return XDP_DROP;
		ilen = 40 + bpf_ntohs(ip->payload_len);
		tos = (ip->priority << 4) | (ip->flow_lbl[0] >> 4);
	} else {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end)
			return XDP_DROP;
		ilen = bpf_ntohs(ip->tot_len);
		tos = ip->tos;
	}
	long frame = data_end - data;
	opaque(frame);
	if ((long)ilen + ETH_HLEN > frame) {
		count(&path_stats, PATH_MALFORMED, len);
		return XDP_DROP;
	}
	struct lb_config *cfg = lb_config();
	if (!cfg)
		return XDP_DROP;
	const __u32 *s6 = (const __u32 *)cfg->tunnel_v6;
	if (v6 ? !(s6[0] | s6[1] | s6[2] | s6[3]) : !*(const __u32 *)cfg->tunnel_v4) {
		count(&path_stats, PATH_TUNNEL_NO_ROUTE, len); /* no source of the family */
		return XDP_DROP;
	}
	__u64 now = a->now ? a->now : now_ns();
	if (!b->nh.at || now > b->nh.at + NSEC_PER_SEC) {
		/* The FIB's answer is a second old (the only time the source is needed mapped). */
		__u32 zero = 0;
		struct tunnel_scratch *sc = bpf_map_lookup_elem(&tunnel_scratch, &zero);
		if (!sc)
			return XDP_DROP;
		if (v6) {
			__builtin_memcpy(sc->src, cfg->tunnel_v6, 16);
		} else {
			__builtin_memset(sc->src, 0, 10);
			sc->src[10] = 0xff;
			sc->src[11] = 0xff;
			__builtin_memcpy(sc->src + 12, cfg->tunnel_v4, 4);
		}
		if (fib_next_hop(ctx, v6, sc->src, b->addr, &b->nh, &b->mtu) < 0) {
			count(&path_stats, PATH_TUNNEL_NO_ROUTE, len);
			return XDP_DROP;
		}
	}
	if (b->mtu && ilen + overhead > b->mtu)
		return tunnel_too_big(ctx, v6, b->mtu > overhead ? b->mtu - overhead : 0, len);
	struct backend *sb = NULL; /* the secondary */
	if (a->second != NO_SECOND && a->second != a->bidx) {
		__u32 sidx = a->second;
		sb = bpf_map_lookup_elem(&backends, &sidx);
		if (sb && (!(sb->flags & B_ALIVE) || !(sb->flags & B_TUNNEL)))
			sb = NULL;
	}
	/* Ethernet padding of a short frame would ride inside the tunnel: cut it. */
	if (frame > (long)ilen + ETH_HLEN && bpf_xdp_adjust_tail(ctx, (int)((long)ilen + ETH_HLEN - frame)))
		return XDP_DROP;
	if (bpf_xdp_adjust_head(ctx, -(int)overhead))
		return XDP_DROP;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return XDP_DROP;
	/* Map values stay where they were across the adjustment: the MACs, addresses and
	 * port are read from them, not copied ahead. */
	__builtin_memcpy(eth->h_dest, b->nh.dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, b->nh.smac, ETH_ALEN);
	struct udphdr *udp;
	if (v6) {
		eth->h_proto = bpf_htons(ETH_P_IPV6);
		struct ipv6hdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end)
			return XDP_DROP;
		ip->version = 6;
		ip->priority = tos >> 4;
		ip->flow_lbl[0] = (tos << 4) | ((h >> 16) & 0x0f);
		ip->flow_lbl[1] = h >> 8;
		ip->flow_lbl[2] = h;
		ip->payload_len = bpf_htons(ilen + overhead - 40);
		ip->nexthdr = IPPROTO_UDP;
		ip->hop_limit = 64;
		__builtin_memcpy(&ip->saddr, cfg->tunnel_v6, 16);
		__builtin_memcpy(&ip->daddr, b->addr, 16);
		udp = (void *)(ip + 1);
	} else {
		eth->h_proto = bpf_htons(ETH_P_IP);
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end)
			return XDP_DROP;
		/* Whole words, not bitfields: version 4, IHL 5, the inner TOS; no id; DF (the
		 * path's MTU is the LB's to answer); TTL 64, UDP. */
		__u16 *w = (__u16 *)ip;
		w[0] = bpf_htons(0x4500 | tos);
		w[1] = bpf_htons(ilen + overhead);
		w[2] = 0;
		w[3] = bpf_htons(0x4000);
		w[4] = bpf_htons(64 << 8 | IPPROTO_UDP);
		w[5] = 0;
		__builtin_memcpy(&ip->saddr, cfg->tunnel_v4, 4);
		__builtin_memcpy(&ip->daddr, b->addr + 12, 4);
		ip->check = ip4_csum(ip);
		udp = (void *)(ip + 1);
	}
	struct gue_hdr *g = (void *)(udp + 1);
	struct gue_second *gs = (void *)(g + 1);
	__u8 *saddr = (void *)(gs + 1);
	if ((void *)saddr > data_end)
		return XDP_DROP;
	udp->source = bpf_htons(0xc000 | (h & 0x3fff)); /* the ephemeral range 49152-65535 */
	udp->dest = b->port;
	udp->len = bpf_htons(ilen + overhead - (v6 ? 40 : 20));
	udp->check = 0;
	g->vchl = v6 ? GUE_HLEN_V6 : GUE_HLEN_V4;
	g->proto = v6 ? IPPROTO_IPV6 : IPPROTO_IPIP;
	g->flags = 0;
	gs->kind = GUE_KIND_SECOND;
	gs->hops = sb ? GUE_HOPS : 0;
	gs->zero = 0;
	if (v6) {
		if ((void *)(saddr + 16) > data_end)
			return XDP_DROP;
		if (sb)
			__builtin_memcpy(saddr, sb->addr, 16);
		else
			__builtin_memset(saddr, 0, 16);
	} else {
		if ((void *)(saddr + 4) > data_end)
			return XDP_DROP;
		if (sb)
			__builtin_memcpy(saddr, sb->addr + 12, 4);
		else
			__builtin_memset(saddr, 0, 4);
	}
	count(&path_stats, PATH_FORWARD, len);
	count(&path_stats, PATH_TUNNEL, len);
	if (sb)
		count(&path_stats, PATH_TUNNEL_SECOND, len);
	count(&vip_stats, a->vip_id, len);
	count(&backend_stats, a->bidx, len);
	if (b->nh.ifindex == ctx->ingress_ifindex)
		return XDP_TX;
	return bpf_redirect(b->nh.ifindex, 0);
}
