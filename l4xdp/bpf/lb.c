// SPDX-License-Identifier: GPL-2.0
// stickylb L4 forwarder: direct routing (DR), NAT and tunnels for TCP/UDP VIPs.
//
// For a packet to a VIP: find the flow in the connection table, else pick a backend from the
// VIP's Maglev table (built in Go by policies/chash) by a hash of the source address
// (source_ip), the 5-tuple (none), or the QUIC connection ID (quic_cid); remember the flow
// (within the per-CPU insert cap);
// rewrite the MACs and send it back out (XDP_TX) or to the backend's interface; a backend
// off the LB's subnet is reached by NAT (nat.h), its replies rewritten back, or by a GUE
// tunnel (tunnel.h), the backend replying directly. Everything
// else passes to the stack. Every other path (fragments, ICMP errors, malformed
// headers) is counted in path_stats (enum lb_path in consts.h).
//
// Headers by concern, as in Katran: consts.h, structs.h, maps.h (the maps and their counters),
// parse.h (header parsing), pick.h (hash and Maglev pick), conn.h (connection entries, the
// insert cap, active-connection counts), csum.h (incremental checksums), route.h (the
// forwarding decision, DR rewrite), nat.h (NAT: new flows, translation, ports, replies),
// tunnel.h (GUE encapsulation, second chance, the MTU answer; gue.h the format), icmp.h
// (ICMP errors).

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include "bpf_helpers.h"
#include "bpf_endian.h"
#include "consts.h"
#include "structs.h"
#include "maps.h"
#include "parse.h"
#include "pick.h"
#include "route.h"
#include "icmp.h"

/* fragment sends an IPv4 or IPv6 fragment (the first too: non-first ones carry no ports) by
 * a hash of (source, destination, protocol) among the backends of its VIP address; for a
 * source_ip VIP by the source alone, exactly as its unfragmented packets are hashed. */
static __always_inline int fragment(struct xdp_md *ctx, struct ethhdr *eth, struct flow *f, __u64 len)
{
	struct vip_key ak = {.proto = f->proto};
	__builtin_memcpy(ak.addr, f->dst, 16);
	struct vip_meta *vm = bpf_map_lookup_elem(&vip_addrs, &ak);
	if (!vm) {
		count(&path_stats, PATH_PASS, len);
		return XDP_PASS;
	}
	count(&path_stats, PATH_FRAGMENT, len);
	f->sport = 0;
	f->dport = 0;
	int p = pick(vm, hash_flow(f, vm->flags & F_SRC_IP));
	if (p < 0) {
		count(&path_stats, PATH_NO_BACKEND, len);
		return XDP_DROP;
	}
	__u32 bidx = p;
	struct backend *b = bpf_map_lookup_elem(&backends, &bidx);
	if (!b || !(b->flags & B_ALIVE)) {
		count(&path_stats, PATH_NO_BACKEND, len);
		return XDP_DROP;
	}
	if (b->flags & B_NAT) { /* no ports in most fragments: nothing to translate by */
		count(&path_stats, PATH_NAT_FRAGMENT, len);
		return XDP_DROP;
	}
	return deliver(ctx, eth, f, b, bidx, vm->id, NO_SECOND, len, 0);
}

static __always_inline int vip_lookup_and_route(struct xdp_md *ctx, struct ethhdr *eth, struct flow *f, void *l4p,
						__u64 len, int icmp_inner)
{
	void *data_end = (void *)(long)ctx->data_end;
	int tflags = 0;
	__u8 *payload = l4(l4p, data_end, f, &tflags);
	if (!payload) {
		if (icmp_inner) { /* an ICMP error quotes at least 8 bytes: ports are there for UDP/TCP */
			count(&path_stats, PATH_MALFORMED, len);
			return XDP_DROP;
		}
		struct vip_key k = {.proto = f->proto};
		__builtin_memcpy(k.addr, f->dst, 16);
		if (bpf_map_lookup_elem(&vip_addrs, &k)) {
			count(&path_stats, PATH_MALFORMED, len);
			return XDP_DROP;
		}
		count(&path_stats, PATH_PASS, len);
		return XDP_PASS;
	}
	struct vip_key k = {.port = f->dport, .proto = f->proto};
	__builtin_memcpy(k.addr, f->dst, 16);
	struct vip_meta *vm = bpf_map_lookup_elem(&vips, &k);
	if (!vm) {
		int r = nat_reply(ctx, f, tflags, len);
		if (r >= 0)
			return r;
		count(&path_stats, PATH_PASS, len);
		return XDP_PASS;
	}
	if (icmp_inner)
		tflags = 0;
	return route(ctx, eth, f, vm, icmp_inner ? NULL : payload, tflags, len);
}

static __always_inline int handle_v4(struct xdp_md *ctx, struct ethhdr *eth, struct iphdr *ip, __u64 len)
{
	void *data_end = (void *)(long)ctx->data_end;
	if ((void *)(ip + 1) > data_end) { /* truncated: the stack decides (and drops it) */
		count(&path_stats, PATH_MALFORMED, len);
		return XDP_PASS;
	}
	if (ip->ihl < 5) {
		count(&path_stats, PATH_MALFORMED, len);
		return XDP_DROP;
	}
	__u32 hl = ip->ihl * 4;
	void *l4p = (void *)ip + hl;
	if (l4p > data_end) {
		count(&path_stats, PATH_MALFORMED, len);
		return XDP_PASS;
	}
	struct flow f = {.proto = ip->protocol};
	v4_mapped(f.src, ip->saddr);
	v4_mapped(f.dst, ip->daddr);
	if (ip->frag_off & bpf_htons(0x3fff)) { /* MF or a fragment offset */
		if (f.proto != IPPROTO_TCP && f.proto != IPPROTO_UDP) {
			count(&path_stats, PATH_PASS, len);
			return XDP_PASS;
		}
		return fragment(ctx, eth, &f, len);
	}
	if (hl > 20)
		count(&path_stats, PATH_IP_OPTIONS, len);
	if (f.proto == IPPROTO_ICMP) {
		struct icmphdr *ic = l4p;
		if ((void *)(ic + 1) > data_end) {
			count(&path_stats, PATH_PASS, len);
			return XDP_PASS;
		}
		if (ic->type != ICMP_DEST_UNREACH && ic->type != ICMP_TIME_EXCEEDED && ic->type != ICMP_PARAMETERPROB) {
			count(&path_stats, PATH_PASS, len);
			return XDP_PASS; /* echo and the rest: the stack's */
		}
		struct iphdr *in = (void *)(ic + 1);
		if ((void *)(in + 1) > data_end || in->ihl < 5) {
			count(&path_stats, PATH_PASS, len);
			return XDP_PASS;
		}
		void *inl4 = (void *)in + in->ihl * 4;
		if (inl4 > data_end || (in->protocol != IPPROTO_TCP && in->protocol != IPPROTO_UDP)) {
			count(&path_stats, PATH_PASS, len);
			return XDP_PASS;
		}
		struct flow inf = {.proto = in->protocol};
		v4_mapped(inf.src, in->saddr);
		v4_mapped(inf.dst, in->daddr);
		return icmp_error(ctx, eth, &inf, inl4, len);
	}
	if (f.proto != IPPROTO_TCP && f.proto != IPPROTO_UDP) {
		count(&path_stats, PATH_PASS, len);
		return XDP_PASS;
	}
	return vip_lookup_and_route(ctx, eth, &f, l4p, len, 0);
}

static __always_inline int handle_v6(struct xdp_md *ctx, struct ethhdr *eth, struct ipv6hdr *ip, __u64 len)
{
	void *data_end = (void *)(long)ctx->data_end;
	if ((void *)(ip + 1) > data_end) {
		count(&path_stats, PATH_MALFORMED, len);
		return XDP_PASS;
	}
	struct flow f = {.proto = ip->nexthdr};
	__builtin_memcpy(f.src, &ip->saddr, 16);
	__builtin_memcpy(f.dst, &ip->daddr, 16);
	void *l4p = ip + 1;
	if (f.proto == IPV6_FRAGMENT) {
		struct frag6 *fh = l4p;
		if ((void *)(fh + 1) > data_end) {
			count(&path_stats, PATH_MALFORMED, len);
			return XDP_PASS;
		}
		f.proto = fh->nexthdr;
		if (f.proto != IPPROTO_TCP && f.proto != IPPROTO_UDP) {
			count(&path_stats, PATH_PASS, len);
			return XDP_PASS;
		}
		return fragment(ctx, eth, &f, len);
	}
	if (f.proto == IPPROTO_ICMPV6) {
		struct icmp6hdr *ic = l4p;
		if ((void *)(ic + 1) > data_end) {
			count(&path_stats, PATH_PASS, len);
			return XDP_PASS;
		}
		if (ic->icmp6_type < 1 || ic->icmp6_type > 4) {
			count(&path_stats, PATH_PASS, len); /* neighbour discovery, echo: the stack's */
			return XDP_PASS;
		}
		struct ipv6hdr *in = (void *)(ic + 1);
		if ((void *)(in + 1) > data_end || (in->nexthdr != IPPROTO_TCP && in->nexthdr != IPPROTO_UDP)) {
			count(&path_stats, PATH_PASS, len);
			return XDP_PASS;
		}
		struct flow inf = {.proto = in->nexthdr};
		__builtin_memcpy(inf.src, &in->saddr, 16);
		__builtin_memcpy(inf.dst, &in->daddr, 16);
		return icmp_error(ctx, eth, &inf, in + 1, len);
	}
	if (f.proto != IPPROTO_TCP && f.proto != IPPROTO_UDP) {
		count(&path_stats, PATH_PASS, len); /* other extension headers: the stack's */
		return XDP_PASS;
	}
	return vip_lookup_and_route(ctx, eth, &f, l4p, len, 0);
}

SEC("xdp")
int stickylb_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u64 len = data_end - data;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end) {
		count(&path_stats, PATH_MALFORMED, len);
		return XDP_PASS;
	}
	if (eth->h_proto == bpf_htons(ETH_P_IP))
		return handle_v4(ctx, eth, (void *)(eth + 1), len);
	if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		return handle_v6(ctx, eth, (void *)(eth + 1), len);
	count(&path_stats, PATH_PASS, len);
	return XDP_PASS;
}

char _license[] SEC("license") = "GPL";