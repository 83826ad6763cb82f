// SPDX-License-Identifier: GPL-2.0
// NAT: a flow to a backend off the LB's subnet leaves from a NAT source address and port;
// the backend's replies, and ICMP errors about the flow, are rewritten back.
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include "bpf_helpers.h"
#include "bpf_endian.h"
#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "conn.h"

#define AF_INET 2
#define AF_INET6 10

/* A rewrite: the new source and destination of a packet (addresses as 16 bytes, IPv4
 * mapped; ports in network order). */
struct rewrite {
	__u8 src[16];
	__u8 dst[16];
	__be16 sport;
	__be16 dport;
};

/* What the program reads of a NAT packet's TCP header. */
struct tcp_seg {
	__u32 seq;
	__u32 ack;
	__u32 end;  /* the sequence number after it: seq + payload + SYN + FIN */
	__u32 len;  /* payload bytes */
	__u8 syn;
	__u8 ackf;  /* the ACK flag */
	__u8 fin;
	__u8 rst;
	__u8 tcp;   /* 1: the fields above are a TCP header's; 0: not TCP */
	__u8 pad[3];
};

/* A CPU's scratch space for NAT: an XDP program's stack is 512 bytes for its whole call
 * chain, too few for these beside the forwarding path's own (a program runs to its end on
 * one CPU before the next packet there, so one slot per CPU is enough). */
struct nat_scratch {
	struct bpf_fib_lookup fib;
	struct nat_key k;
	struct nat_entry e;
	struct rewrite rw;
	struct rewrite in;
	struct flow victim; /* nat_reclaim: the flow whose hold it takes */
	/* nat_new and nat_alloc: the new flow's TCP header, and the oldest unfinished hold the
	 * port probe met. Kept here rather than in registers, which the verifier follows value
	 * by value: each case would be another path through the probe loop. */
	struct tcp_seg seg;
	__u64 oldest;
	__be16 victim_port;
	__u16 pad[3];
	struct conn nc; /* nat_new: the new flow's connection entry */
};

/* The map's value is opaque bytes: bpf_fib_lookup's anonymous unions have no Go type. */
struct nat_scratch_bytes {
	__u8 b[sizeof(struct nat_scratch)];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nat_scratch_bytes);
} nat_scratch SEC(".maps");

static __always_inline struct nat_scratch *scratch(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&nat_scratch, &zero);
}

/* l4_fix applies acc (the words a rewrite changed) to the TCP or UDP checksum at l4p, when
 * it lies within the packet (an ICMP error may quote only 8 bytes of TCP), and adds the
 * checksum's own change to *outer. An IPv4 UDP checksum of 0 (none) stays 0, and a computed 0
 * is sent as 0xffff, as UDP requires. Each protocol has its own branch: a shared pointer
 * select is more than the verifier can follow. */
static __always_inline void l4_fix(void *l4p, void *data_end, __u8 proto, int v6, __u32 acc, __u32 *outer)
{
	__u16 old, now;
	if (proto == IPPROTO_TCP) {
		struct tcphdr *t = l4p;
		if ((void *)(t + 1) > data_end)
			return;
		old = t->check;
		now = ~csum_fold((__u16)~old + acc);
		t->check = now;
	} else {
		struct udphdr *u = l4p;
		if ((void *)(u + 1) > data_end)
			return;
		old = u->check;
		if (old == 0 && !v6)
			return;
		now = ~csum_fold((__u16)~old + acc);
		if (now == 0)
			now = 0xffff;
		u->check = now;
	}
	*outer = csum_words(*outer, &old, &now, 1);
}

/* rewrite4 rewrites an IPv4 TCP/UDP packet's addresses and ports (ports at l4p) and its
 * checksums; *icmp_acc, when not NULL, collects every word changed (the ICMP checksum of an
 * error that quotes this packet covers them). Returns -1 when headers are truncated. */
static __always_inline int rewrite4(struct iphdr *ip, void *l4p, void *data_end, const struct rewrite *rw,
				    __u32 *icmp_acc)
{
	if ((void *)(ip + 1) > data_end)
		return -1;
	__be16 *ports = l4p;
	if ((void *)(ports + 2) > data_end)
		return -1;
	__u8 proto = ip->protocol;
	__u32 addrs = csum_words(0, &ip->saddr, rw->src + 12, 2);
	addrs = csum_words(addrs, &ip->daddr, rw->dst + 12, 2);
	__u32 l4acc = csum_words(addrs, &ports[0], &rw->sport, 1);
	l4acc = csum_words(l4acc, &ports[1], &rw->dport, 1);
	__u32 acc = l4acc; /* for an enclosing ICMP checksum */
	l4_fix(l4p, data_end, proto, 0, l4acc, &acc);
	__u16 oldip = ip->check;
	csum_apply(&ip->check, addrs);
	acc = csum_words(acc, &oldip, &ip->check, 1);
	__builtin_memcpy(&ip->saddr, rw->src + 12, 4);
	__builtin_memcpy(&ip->daddr, rw->dst + 12, 4);
	ports[0] = rw->sport;
	ports[1] = rw->dport;
	if (icmp_acc)
		*icmp_acc += acc;
	return 0;
}

/* rewrite6 is rewrite4 for IPv6 (no header checksum; the pseudo-header is in TCP/UDP's). */
static __always_inline int rewrite6(struct ipv6hdr *ip, void *l4p, void *data_end, __u8 proto,
				    const struct rewrite *rw, __u32 *icmp_acc)
{
	if ((void *)(ip + 1) > data_end)
		return -1;
	__be16 *ports = l4p;
	if ((void *)(ports + 2) > data_end)
		return -1;
	__u32 acc = csum_words(0, &ip->saddr, rw->src, 8);
	acc = csum_words(acc, &ip->daddr, rw->dst, 8);
	acc = csum_words(acc, &ports[0], &rw->sport, 1);
	acc = csum_words(acc, &ports[1], &rw->dport, 1);
	__u32 all = acc;
	l4_fix(l4p, data_end, proto, 1, acc, &all);
	__builtin_memcpy(&ip->saddr, rw->src, 16);
	__builtin_memcpy(&ip->daddr, rw->dst, 16);
	ports[0] = rw->sport;
	ports[1] = rw->dport;
	if (icmp_acc)
		*icmp_acc += all;
	return 0;
}

/* rewrite_packet rewrites the TCP/UDP packet after eth (IPv4 or IPv6) to rw. */
static __always_inline int rewrite_packet(struct ethhdr *eth, void *data_end, int v6, __u8 proto,
					  const struct rewrite *rw)
{
	if (v6) {
		struct ipv6hdr *ip = (void *)(eth + 1);
		return rewrite6(ip, ip + 1, data_end, proto, rw, NULL);
	}
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end)
		return -1;
	return rewrite4(ip, (void *)ip + ip->ihl * 4, data_end, rw, NULL);
}

/* fib_next_hop finds the next hop of a packet from src to dst in the kernel's FIB, kept in nh
 * for a second (and the route's MTU in *mtu, when not NULL), so that a routed packet costs
 * one FIB lookup a second per backend or flow, not one each. When the FIB knows the route
 * but not the neighbour (the kernel drops neighbour entries nobody uses, and XDP sends past
 * them), a next hop already known holds: a backend's last one, or the way a flow came in for
 * its replies. Returns -1 with none (no route, or no neighbour ever known; the loader keeps
 * the next hops of routed backends resolved). A route or neighbour change is seen within a
 * second. */
static __always_inline int fib_next_hop(struct xdp_md *ctx, int v6, const __u8 *src, const __u8 *dst,
					struct next_hop *nh, __u32 *mtu)
{
	__u64 now = now_ns();
	if (nh->at && now <= nh->at + NSEC_PER_SEC)
		return 0;
	struct nat_scratch *sc = scratch();
	if (!sc)
		return -1;
	struct bpf_fib_lookup *p = &sc->fib;
	__builtin_memset(p, 0, sizeof(*p));
	p->ifindex = ctx->ingress_ifindex;
	if (v6) {
		p->family = AF_INET6;
		__builtin_memcpy(p->ipv6_src, src, 16);
		__builtin_memcpy(p->ipv6_dst, dst, 16);
	} else {
		p->family = AF_INET;
		__builtin_memcpy(&p->ipv4_src, src + 12, 4);
		__builtin_memcpy(&p->ipv4_dst, dst + 12, 4);
	}
	long rc = bpf_fib_lookup(ctx, p, sizeof(*p), 0);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		/* CPUs racing here write the same answer; a reader between two writes of a
		 * changed next hop may send one packet to a mixed MAC, as after any neighbour
		 * change. */
		__builtin_memcpy(nh->dmac, p->dmac, ETH_ALEN);
		__builtin_memcpy(nh->smac, p->smac, ETH_ALEN);
		nh->ifindex = p->ifindex;
		if (mtu)
			*mtu = p->mtu_result; /* with no tot_len given, the route's MTU */
	} else if (rc != BPF_FIB_LKUP_RET_NO_NEIGH || !nh->ifindex) {
		return -1;
	}
	nh->at = now;
	return 0;
}

/* nat_send sends a rewritten packet to its next hop nh (fib_next_hop): out of the ingress
 * interface (XDP_TX) or redirected to another; with none the packet is dropped and counted. */
static __always_inline int nat_send(struct xdp_md *ctx, struct ethhdr *eth, int v6, const __u8 *src, const __u8 *dst,
				    struct next_hop *nh, __u64 len)
{
	if (fib_next_hop(ctx, v6, src, dst, nh, NULL) < 0) {
		count(&path_stats, PATH_NAT_NO_ROUTE, len);
		return XDP_DROP;
	}
	__builtin_memcpy(eth->h_dest, nh->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, nh->smac, ETH_ALEN);
	if (nh->ifindex == ctx->ingress_ifindex)
		return XDP_TX;
	return bpf_redirect(nh->ifindex, 0);
}

static __always_inline struct lb_config *lb_config(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&config, &zero);
}

/* nat_key_of is the reply key of a NAT flow leaving from src:port to backend b. */
static __always_inline void nat_key_of(struct nat_key *k, const __u8 *src, __be16 port, const struct backend *b, __u8 proto)
{
	__builtin_memcpy(k->lb, src, 16);
	__builtin_memcpy(k->backend, b->addr, 16);
	k->lb_port = port;
	k->backend_port = b->port;
	k->proto = proto;
}

/* words_eq compares n 16-bit words (no memcmp in BPF; n is a constant, so the loop unrolls). */
static __always_inline int words_eq(const void *a, const void *b, int n)
{
	const __u16 *x = a, *y = b;
	__u16 d = 0;
#pragma unroll
	for (int i = 0; i < 20; i++) {
		if (i >= n)
			break;
		d |= x[i] ^ y[i];
	}
	return d == 0;
}

/* addr_eq compares two 16-byte addresses. */
static __always_inline int addr_eq(const __u8 *a, const __u8 *b)
{
	return words_eq(a, b, 8);
}

/* flow_eq compares two flow keys (a flow is 2-byte aligned). */
static __always_inline int flow_eq(const struct flow *a, const struct flow *b)
{
	return words_eq(a, b, sizeof(struct flow) / 2);
}

/* tcp_seg_of reads the TCP header of the packet in ctx (IPv4 with or without options, IPv6
 * with none: what the forwarder hands NAT); the payload's length comes from the IP header,
 * not the frame, which may be padded. Returns -1 when it is not TCP or is truncated. */
static __always_inline int tcp_seg_of(struct xdp_md *ctx, struct tcp_seg *s)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return -1;
	struct tcphdr *t;
	__u32 l3len; /* IP payload: the TCP header and its data */
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end || ip->nexthdr != IPPROTO_TCP)
			return -1;
		t = (void *)(ip + 1);
		l3len = bpf_ntohs(ip->payload_len);
	} else {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end || ip->protocol != IPPROTO_TCP || ip->ihl < 5)
			return -1;
		t = (void *)ip + ip->ihl * 4;
		__u32 tot = bpf_ntohs(ip->tot_len), hl = ip->ihl * 4;
		l3len = tot > hl ? tot - hl : 0;
	}
	if ((void *)(t + 1) > data_end)
		return -1;
	__u32 doff = t->doff * 4;
	s->seq = bpf_ntohl(t->seq);
	s->ack = bpf_ntohl(t->ack_seq);
	s->len = l3len > doff ? l3len - doff : 0;
	s->syn = t->syn;
	s->ackf = t->ack;
	s->fin = t->fin;
	s->rst = t->rst;
	s->end = s->seq + s->len + s->syn + s->fin;
	s->tcp = 1;
	return 0;
}

/* nat_hold is how long, in seconds, entry e holds its port idle: the VIP's idle timeout,
 * shortened after a RST or a FIN believed, and before the handshake completes (a UDP flow:
 * before the backend answers). */
static __always_inline __u64 nat_hold(const struct lb_config *cfg, const struct nat_entry *e)
{
	__u32 st = e->state, h = e->idle;
	if ((st & NS_RST) && h > cfg->nat_hold_rst)
		h = cfg->nat_hold_rst;
	else if ((st & NS_SHORT) && h > cfg->nat_hold_closing)
		h = cfg->nat_hold_closing;
	if (((st & NS_EMB) || !(st & NS_REPLIED)) && h > cfg->nat_hold_unreplied)
		h = cfg->nat_hold_unreplied;
	return h;
}

/* nat_state_set and nat_state_clear change bits of e's state atomically, and only when they
 * would change it: the client's and the backend's packets of one flow may run on two CPUs at
 * once, and a lost update could leave an established flow taken for an unfinished one. */
static __always_inline void nat_state_set(struct nat_entry *e, __u32 bits)
{
	if ((e->state & bits) != bits)
		__sync_fetch_and_or((__u32 *)&e->state, bits);
}

static __always_inline void nat_state_clear(struct nat_entry *e, __u32 bits)
{
	if (e->state & bits)
		__sync_fetch_and_and((__u32 *)&e->state, ~bits);
}

/* nat_probe looks at the port at k, which an insert found held, for the new flow f (fresh:
 * its entry). It returns 1 when the hold is f's own (its connection entry was evicted or
 * reset: the flow keeps its port, another would be another connection to the backend), then
 * refreshed: a flow that starts again (a TCP SYN on the 5-tuple, or UDP: restart) takes
 * fresh's state, a new handshake, unreplied until the backend answers; a TCP segment of the
 * same connection keeps what is known of it. It returns 2 when the hold is idle past its
 * end and this CPU claimed it by compare-and-swap (of CPUs racing for it only one does; the
 * caller removes it, and whoever inserts first then takes the port). Otherwise 0, after
 * noting the hold in the scratch space when it is the oldest unfinished one met so far. */
static __noinline int nat_probe(struct nat_key *k, const struct flow *f, const struct nat_entry *fresh, int restart)
{
	struct nat_entry *o = bpf_map_lookup_elem(&nat_rev, k);
	struct nat_scratch *sc = scratch();
	struct lb_config *cfg = lb_config();
	if (!o || !sc || !cfg)
		return 0;
	__u64 now = fresh->last_seen, seen = o->last_seen;
	if (flow_eq(&o->client, f)) {
		o->last_seen = now;
		if (restart) {
			o->ack_b = fresh->ack_b;
			o->seq_b = 0;
			o->state = fresh->state;
		}
		return 1;
	}
	if (now > seen && now - seen > nat_hold(cfg, o) * NSEC_PER_SEC)
		return __sync_val_compare_and_swap(&o->last_seen, seen, now) == seen ? 2 : 0;
	if ((o->state & NS_EMB) && (!sc->victim_port || seen < sc->oldest)) {
		sc->victim_port = k->lb_port;
		sc->oldest = seen;
	}
	return 0;
}

/* nat_reclaim takes over the port at k, held by a flow whose client has not completed the
 * handshake and last seen at seen, for the new flow's entry e: the hold is claimed by
 * compare-and-swap (of CPUs racing for it only one wins), the old flow's connection entry is
 * forgotten (its next packet re-picks) and the port is e's. Returns 0 when it is. */
static __noinline int nat_reclaim(struct nat_key *k, const struct nat_entry *e, __u64 seen)
{
	struct nat_entry *o = bpf_map_lookup_elem(&nat_rev, k);
	struct nat_scratch *sc = scratch();
	if (!o || !sc || !(o->state & NS_EMB) ||
	    __sync_val_compare_and_swap(&o->last_seen, seen, e->last_seen) != seen)
		return -1;
	__builtin_memcpy(&sc->victim, &o->client, sizeof(sc->victim));
	struct conn *c = bpf_map_lookup_elem(&conns, &sc->victim);
	if (c && (c->flags & C_NAT) && c->nat_port == k->lb_port) {
		__u32 slot = c->backend;
		uncount(c, bpf_map_lookup_elem(&backends, &slot));
		bpf_map_delete_elem(&conns, &sc->victim);
	}
	bpf_map_delete_elem(&nat_rev, k);
	return bpf_map_update_elem(&nat_rev, k, e, BPF_NOEXIST) == 0 ? 0 : -1;
}

/* nat_alloc gives a new flow f to backend b a source address and port: the address by a hash
 * of the flow among the sources of b's family, the port by probing from a hashed start; an
 * entry idle past its hold is taken over on the way. When no port is free within NAT_PROBES
 * tries (or nat_rev is full), the oldest hold met whose client has not completed the
 * handshake is taken back (a SYN flood's, which a listening backend answers, so "replied" is
 * no test). The scratch space's seg is the packet's TCP header (seg.tcp 0: UDP). Returns 0
 * (1: a hold was taken back) and fills *src_idx, *port, or -1 when no port is to be had. */
static __always_inline int nat_alloc(struct xdp_md *ctx, struct ethhdr *eth, const struct flow *f, const struct backend *b,
				     const struct vip_meta *vm, __u32 h, __u64 now, __u8 *src_idx, __be16 *port)
{
	struct lb_config *cfg = lb_config();
	if (!cfg)
		return -1;
	/* A NAT backend is of its VIP's family (the loader checks it). */
	int v6 = eth->h_proto == bpf_htons(ETH_P_IPV6);
	__u32 n = v6 ? cfg->nat_v6 : cfg->nat_v4;
	if (n == 0 || n > MAX_NAT_SOURCES / 2)
		return -1;
	__u32 idx = (h % n) + (v6 ? MAX_NAT_SOURCES / 2 : 0);
	struct nat_source *ns = bpf_map_lookup_elem(&nat_sources, &idx);
	if (!ns)
		return -1;
	__u32 lo = cfg->nat_port_lo, hi = cfg->nat_port_hi;
	if (lo == 0 || hi < lo)
		return -1;
	__u32 span = hi - lo + 1;
	__u32 start = (h >> 7) % span;
	struct nat_scratch *sc = scratch();
	if (!sc)
		return -1;
	struct nat_entry *e = &sc->e;
	__builtin_memset(e, 0, sizeof(*e));
	e->nh.ifindex = ctx->ingress_ifindex; /* the way in: at 0, so the first reply asks the FIB */
	e->idle = vm->idle_timeout;
	e->last_seen = now;
	/* TCP: a handshake to complete; after a SYN, the client's next sequence number known.
	 * Without branches: see nat_scratch. */
	__u32 tcp = sc->seg.tcp & 1, syn = sc->seg.syn & tcp;
	e->state = (NS_EMB | (syn * NS_ACK)) * tcp;
	e->ack_b = sc->seg.end * syn;
	int restart = (tcp ^ 1) | syn; /* a SYN or UDP: the flow starts again */
	__builtin_memcpy(&e->client, f, sizeof(e->client));
	__builtin_memcpy(e->nh.dmac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(e->nh.smac, eth->h_dest, ETH_ALEN);
	struct nat_key *k = &sc->k;
	__builtin_memset(k, 0, sizeof(*k));
	nat_key_of(k, ns->addr, 0, b, f->proto);
	sc->victim_port = 0;
	*src_idx = idx;
#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < NAT_PROBES && i < span; i++) {
		k->lb_port = bpf_htons(lo + (start + i) % span);
		*port = k->lb_port;
		if (bpf_map_update_elem(&nat_rev, k, e, BPF_NOEXIST) == 0)
			return 0;
		int p = nat_probe(k, f, e, restart);
		if (p == 1)
			return 0;
		if (p == 2) {
			bpf_map_delete_elem(&nat_rev, k);
			if (bpf_map_update_elem(&nat_rev, k, e, BPF_NOEXIST) == 0)
				return 0;
		}
	}
	if (!sc->victim_port)
		return -1;
	k->lb_port = sc->victim_port;
	*port = sc->victim_port;
	return nat_reclaim(k, e, sc->oldest) == 0 ? 1 : -1;
}

/* nat_rev_of finds the reply entry of NAT flow c (to backend b), NULL if gone; *kp is left
 * pointing at its key. */
static __always_inline struct nat_entry *nat_rev_of(const struct conn *c, const struct backend *b, __u8 proto,
						    struct nat_key **kp)
{
	__u32 idx = c->nat_src;
	struct nat_source *ns = bpf_map_lookup_elem(&nat_sources, &idx);
	struct nat_scratch *sc = scratch();
	if (!ns || !sc)
		return NULL;
	struct nat_key *k = &sc->k;
	__builtin_memset(k, 0, sizeof(*k));
	nat_key_of(k, ns->addr, c->nat_port, b, proto);
	*kp = k;
	return bpf_map_lookup_elem(&nat_rev, k);
}

/* nat_release frees the port of NAT flow c (its reply entry), if it is still the flow's. */
static __noinline void nat_release(const struct conn *c, const struct backend *b, const struct flow *f)
{
	if (!(c->flags & C_NAT) || !b)
		return;
	struct nat_key *k = NULL;
	struct nat_entry *e = nat_rev_of(c, b, f->proto, &k);
	if (e && k && flow_eq(&e->client, f))
		bpf_map_delete_elem(&nat_rev, k);
}

/* What nat_refresh tells route about a packet of a NAT flow. */
enum {
	NAT_STALE = 0, /* its reply entry is no longer its own: re-pick */
	NAT_OK = 1,
	NAT_KEEP = 2,  /* a RST not believed: the flow keeps its entries (the backend judges the
			* RST; were it the client's, the backend goes silent and the hold ends
			* by idling) */
};

/* nat_client_seg folds the client's TCP segment s into e. A RST or FIN is believed when its
 * sequence number lies within NAT_WINDOW from the next one the backend expects (its latest
 * acknowledgement: RFC 5961's RCV.NXT, which the backend checks a RST against exactly, and
 * the LB sees only as of the backend's last segment); the handshake completes with an ACK of
 * what the backend has sent (its SYN-ACK) within NAT_WINDOW; data lifts a FIN's short hold
 * unless both sides have sent theirs. */
static __always_inline int nat_client_seg(struct nat_entry *e, struct conn *c, const struct tcp_seg *s)
{
	__u32 st = e->state;
	int near = (st & NS_ACK) && s->seq - e->ack_b < NAT_WINDOW;
	if (s->rst) {
		if (!near)
			return NAT_KEEP;
		nat_state_set(e, NS_RST);
		return NAT_OK;
	}
	if ((st & NS_EMB) && !s->syn && s->ackf && (st & NS_SEQ) && e->seq_b - s->ack < NAT_WINDOW)
		nat_state_clear(e, NS_EMB);
	if (!(e->state & NS_EMB) && (c->flags & C_HS))
		__sync_fetch_and_and((__u32 *)&c->flags, ~(__u32)C_HS);
	if (s->len && (st & NS_SHORT) && (st & (NS_FIN_C | NS_FIN_B)) != (NS_FIN_C | NS_FIN_B))
		nat_state_clear(e, NS_SHORT);
	if (s->fin && near)
		nat_state_set(e, NS_FIN_C | NS_SHORT);
	return NAT_OK;
}

/* nat_refresh is the connection-table refresh of a NAT flow (at most once a second; at each
 * FIN or RST; at each packet until its handshake completes): its reply entry must still be
 * the flow's (a port idle past its hold may have gone to another flow; then the entry is
 * stale: NAT_STALE), and is refreshed too; a TCP segment's RST, FIN, data and acknowledgement
 * tell what the connection does (nat_client_seg). */
static __noinline int nat_refresh(struct xdp_md *ctx, struct conn *c, const struct backend *b, const struct flow *f,
				  __u64 now)
{
	struct nat_key *k = NULL;
	struct nat_entry *e = nat_rev_of(c, b, f->proto, &k);
	if (!e || !flow_eq(&e->client, f))
		return NAT_STALE;
	e->last_seen = now;
	struct tcp_seg s;
	if (f->proto != IPPROTO_TCP || tcp_seg_of(ctx, &s) < 0)
		return NAT_OK;
	return nat_client_seg(e, c, &s);
}

/* nat_backend_seg folds the backend's TCP segment s into e (every one: nat_reply has e at
 * hand). The backend's sequence starts at its SYN-ACK, believed when it acknowledges the
 * client's SYN; after it, a segment is the backend's own when it starts within NAT_WINDOW of
 * the next sequence number expected (then it moves that on, and its acknowledgement tells
 * what the backend expects from the client). A RST is believed only at exactly the next
 * sequence number (what the client's stack accepts, RFC 5961), or before the SYN-ACK when it
 * acknowledges the client's SYN (a refused connection). An entry of the version before
 * learns its sequence numbers from the backend's next segment. */
static __always_inline void nat_backend_seg(struct nat_entry *e, const struct tcp_seg *s)
{
	__u32 st = e->state;
	if (s->rst) {
		if ((st & NS_SEQ) ? s->seq == e->seq_b : ((st & NS_ACK) && s->ackf && s->ack == e->ack_b))
			nat_state_set(e, NS_RST);
		return;
	}
	if (!(st & NS_SEQ)) {
		int synack = s->syn && s->ackf && (st & NS_ACK) && s->ack == e->ack_b;
		if (!synack && (st & NS_EMB))
			return; /* no handshake seen to check it against */
		e->seq_b = s->end;
		if (s->ackf)
			e->ack_b = s->ack;
		nat_state_set(e, NS_SEQ | NS_REPLIED | (s->ackf ? NS_ACK : 0));
		return;
	}
	if (s->seq - e->seq_b + NAT_WINDOW >= 2 * NAT_WINDOW)
		return; /* not in sequence: not the backend's, as far as the LB can tell */
	if ((__s32)(s->end - e->seq_b) > 0)
		e->seq_b = s->end;
	if (s->ackf && (__s32)(s->ack - e->ack_b) > 0)
		e->ack_b = s->ack;
	if (s->len && (st & NS_SHORT) && (st & (NS_FIN_C | NS_FIN_B)) != (NS_FIN_C | NS_FIN_B))
		nat_state_clear(e, NS_SHORT);
	if (s->fin)
		nat_state_set(e, NS_FIN_B | NS_SHORT);
}

/* icmp_translate rewrites an ICMP error about a NAT flow: the outer header to osrc -> odst,
 * the packet it quotes to rw (its ports included), with every checksum on the way (outer IP,
 * quoted IP, quoted TCP/UDP when quoted in full, and the ICMP one, which covers them all and,
 * for ICMPv6, the outer addresses). Returns -1 when headers are truncated. */
static __always_inline int icmp_translate(struct xdp_md *ctx, struct ethhdr *eth, const __u8 *osrc, const __u8 *odst,
					  const struct rewrite *rw)
{
	void *data_end = (void *)(long)ctx->data_end;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end || ip->ihl < 5)
			return -1;
		struct icmphdr *ic = (void *)ip + ip->ihl * 4;
		if ((void *)(ic + 1) > data_end)
			return -1;
		struct iphdr *in = (void *)(ic + 1);
		if ((void *)(in + 1) > data_end || in->ihl < 5)
			return -1;
		__u32 acc = 0;
		if (rewrite4(in, (void *)in + in->ihl * 4, data_end, rw, &acc) < 0)
			return -1;
		csum_apply(&ic->checksum, acc);
		__u32 o = csum_words(0, &ip->saddr, osrc + 12, 2);
		o = csum_words(o, &ip->daddr, odst + 12, 2);
		csum_apply(&ip->check, o);
		__builtin_memcpy(&ip->saddr, osrc + 12, 4);
		__builtin_memcpy(&ip->daddr, odst + 12, 4);
		return 0;
	}
	struct ipv6hdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end)
		return -1;
	struct icmp6hdr *ic = (void *)(ip + 1);
	if ((void *)(ic + 1) > data_end)
		return -1;
	struct ipv6hdr *in = (void *)(ic + 1);
	if ((void *)(in + 1) > data_end)
		return -1;
	__u32 acc = csum_words(0, &ip->saddr, osrc, 8);
	acc = csum_words(acc, &ip->daddr, odst, 8);
	if (rewrite6(in, in + 1, data_end, in->nexthdr, rw, &acc) < 0)
		return -1;
	csum_apply(&ic->icmp6_cksum, acc);
	__builtin_memcpy(&ip->saddr, osrc, 16);
	__builtin_memcpy(&ip->daddr, odst, 16);
	return 0;
}

/* What nat_forward needs besides the flow and backend (a BPF function takes 5 arguments). */
struct nat_args {
	__u32 bidx;
	__u32 vip_id;
	__u32 src_idx;
	__be16 port;
	__u16 pad;
	int tflags;
	__u32 hash; /* the flow's 5-tuple hash (nat_new: where its port search starts) */
	__u64 len;
};

/* nat_forward sends a packet of NAT flow f (source nat_sources[a->src_idx]:a->port) to
 * backend b: a data packet is rewritten to source -> backend; an ICMP error from the client's
 * side (T_ICMP: it quotes VIP -> client) to source -> backend quoting backend -> source. A
 * function of its own (not inlined): its stack is not added to every path's. */
static __noinline int nat_forward(struct xdp_md *ctx, const struct flow *f, struct backend *b,
				  const struct nat_args *a)
{
	void *data = (void *)(long)ctx->data;
	struct ethhdr *eth = data;
	__u64 len = a->len;
	__u32 src_idx = a->src_idx, bidx = a->bidx, vip_id = a->vip_id;
	__be16 port = a->port;
	int tflags = a->tflags;
	void *data_end = (void *)(long)ctx->data_end;
	if ((void *)(eth + 1) > data_end)
		return XDP_DROP;
	struct nat_source *ns = bpf_map_lookup_elem(&nat_sources, &src_idx);
	if (!ns || !(((__u64 *)ns->addr)[0] | ((__u64 *)ns->addr)[1])) {
		/* The flow's source is gone (a loader restarted with fewer --nat-source): never
		 * sent from an empty address; its next refresh finds it stale and it re-picks. */
		count(&path_stats, PATH_NAT_NO_PORT, len);
		return XDP_DROP;
	}
	int v6 = eth->h_proto == bpf_htons(ETH_P_IPV6);
	struct nat_scratch *sc = scratch();
	if (!sc)
		return XDP_DROP;
	struct rewrite *rw = &sc->rw;
	__builtin_memcpy(rw->src, ns->addr, 16);
	__builtin_memcpy(rw->dst, b->addr, 16);
	rw->sport = port;
	rw->dport = b->port;
	int r;
	if (tflags & T_ICMP) {
		struct rewrite *in = &sc->in;
		__builtin_memcpy(in->src, b->addr, 16);
		__builtin_memcpy(in->dst, ns->addr, 16);
		in->sport = b->port;
		in->dport = port;
		r = icmp_translate(ctx, eth, rw->src, rw->dst, in);
	} else {
		r = rewrite_packet(eth, data_end, v6, f->proto, rw);
	}
	if (r < 0) {
		count(&path_stats, PATH_MALFORMED, len);
		return XDP_DROP;
	}
	int act = nat_send(ctx, eth, v6, rw->src, rw->dst, &b->nh, len);
	if (act == XDP_DROP) /* no next hop: counted as such, not as forwarded */
		return act;
	count(&path_stats, PATH_FORWARD, len);
	count(&path_stats, PATH_NAT_FORWARD, len);
	count(&vip_stats, vip_id, len);
	count(&backend_stats, bidx, len);
	return act;
}

/* nat_stray says whether f (to the LB, on a port of the NAT range) is addressed to a NAT
 * source: a reply of no NAT flow (one that ended, or was never ours). The host holds no socket
 * there (the range is reserved from its own ports), so passed to it such a packet would get
 * the backend a RST or a port unreachable for a flow the LB just let go. */
static __always_inline int nat_stray(const struct lb_config *cfg, const struct flow *f)
{
	int v6 = !(f->dst[10] == 0xff && f->dst[11] == 0xff);
	__u32 base = v6 ? MAX_NAT_SOURCES / 2 : 0, n = v6 ? cfg->nat_v6 : cfg->nat_v4;
	for (__u32 i = 0; i < MAX_NAT_SOURCES / 2; i++) {
		if (i >= n)
			break;
		__u32 idx = base + i;
		struct nat_source *ns = bpf_map_lookup_elem(&nat_sources, &idx);
		if (ns && addr_eq(ns->addr, f->dst))
			return 1;
	}
	return 0;
}

/* nat_reply rewrites a NAT backend's packet (f: backend -> NAT source) back to VIP -> client;
 * for an ICMP error from the backend's side (T_ICMP in tflags: it quotes source -> backend;
 * f is the quoted packet swapped) the error goes to the client quoting client -> VIP.
 * Returns -1 when f is no NAT flow (the packet is the stack's). Not inlined, as nat_forward. */
static __noinline int nat_reply(struct xdp_md *ctx, const struct flow *f, int tflags, __u64 len)
{
	int icmp = tflags & T_ICMP;
	struct ethhdr *eth = (void *)(long)ctx->data;
	if ((void *)(eth + 1) > (void *)(long)ctx->data_end)
		return -1;
	struct lb_config *cfg = lb_config();
	if (!cfg || (cfg->nat_v4 == 0 && cfg->nat_v6 == 0))
		return -1;
	/* Every NAT flow's LB port is in the range: the host's own traffic, on other ports,
	 * passes without a table lookup. */
	__u16 port = bpf_ntohs(f->dport);
	if (port < cfg->nat_port_lo || port > cfg->nat_port_hi)
		return -1;
	struct nat_scratch *sc = scratch();
	if (!sc)
		return -1;
	struct nat_key *k = &sc->k;
	__builtin_memset(k, 0, sizeof(*k));
	k->lb_port = f->dport;
	k->backend_port = f->sport;
	k->proto = f->proto;
	__builtin_memcpy(k->lb, f->dst, 16);
	__builtin_memcpy(k->backend, f->src, 16);
	struct nat_entry *e = bpf_map_lookup_elem(&nat_rev, k);
	if (!e) {
		if (!icmp && nat_stray(cfg, f)) {
			count(&path_stats, PATH_NAT_STRAY, len);
			return XDP_DROP;
		}
		return -1;
	}
	void *data_end = (void *)(long)ctx->data_end;
	int v6 = eth->h_proto == bpf_htons(ETH_P_IPV6);
	__u64 now = now_ns();
	if (!icmp && now > e->last_seen + NSEC_PER_SEC) {
		/* The flow lives while either side speaks: refresh its connection entry too. */
		e->last_seen = now;
		struct conn *c = bpf_map_lookup_elem(&conns, &e->client);
		if (c && (c->flags & C_NAT) && c->nat_port == k->lb_port && now > c->last_seen + NSEC_PER_SEC)
			c->last_seen = now;
	}
	if (!icmp) {
		struct tcp_seg s;
		if (f->proto != IPPROTO_TCP)
			nat_state_set(e, NS_REPLIED); /* the backend answered: idle as the VIP allows */
		else if (tcp_seg_of(ctx, &s) == 0)
			nat_backend_seg(e, &s);
	}
	struct rewrite *rw = &sc->rw;
	int r;
	if (icmp) {
		__builtin_memcpy(rw->src, e->client.src, 16);
		__builtin_memcpy(rw->dst, e->client.dst, 16);
		rw->sport = e->client.sport;
		rw->dport = e->client.dport;
		r = icmp_translate(ctx, eth, e->client.dst, e->client.src, rw);
		count(&path_stats, PATH_ICMP_ERROR, len);
	} else {
		__builtin_memcpy(rw->src, e->client.dst, 16);
		__builtin_memcpy(rw->dst, e->client.src, 16);
		rw->sport = e->client.dport;
		rw->dport = e->client.sport;
		r = rewrite_packet(eth, data_end, v6, f->proto, rw);
	}
	if (r < 0) {
		count(&path_stats, PATH_MALFORMED, len);
		return XDP_DROP;
	}
	/* A RST the backend sent (nat_backend_seg believed it) frees the port nat_hold_rst
	 * seconds after the flow's last packet; a forged one changes nothing. */
	if (tflags & T_RST)
		count(&path_stats, PATH_TCP_RST, len);
	int act = nat_send(ctx, eth, v6, e->client.dst, e->client.src, &e->nh, len);
	if (act != XDP_DROP)
		count(&path_stats, PATH_NAT_REPLY, len);
	return act;
}

/* nat_new starts NAT flow f to backend a->bidx: a port, then the connection entry, both
 * remembered before the first packet leaves (a NAT flow cannot be forwarded unremembered:
 * above the insert cap it is dropped). A RST or ICMP error of no known NAT flow has nothing
 * to be translated by: dropped. Returns -1 with a filled for nat_forward (a->bidx changed
 * when another CPU started the flow first), or the XDP action of a drop. Not inlined, and
 * it does not call nat_forward itself: the stack of a call chain is what counts. */
static __noinline int nat_new(struct xdp_md *ctx, const struct flow *f, const struct vip_meta *vm, const struct backend *b,
			      struct nat_args *a)
{
	struct ethhdr *eth = (void *)(long)ctx->data;
	if ((void *)(eth + 1) > (void *)(long)ctx->data_end)
		return XDP_DROP;
	int tflags = a->tflags;
	__u64 len = a->len, now = now_ns();
	if (tflags & T_RST) {
		count(&path_stats, PATH_TCP_RST, len);
		return XDP_DROP;
	}
	if (tflags & T_ICMP)
		return XDP_DROP;
	if (!insert_allowed(now)) {
		count(&path_stats, PATH_INSERT_REFUSED, len);
		return XDP_DROP;
	}
	__u8 src_idx = 0;
	__be16 port = 0;
	struct nat_scratch *sc = scratch();
	if (!sc)
		return XDP_DROP;
	sc->seg.tcp = 0;
	if (f->proto == IPPROTO_TCP)
		tcp_seg_of(ctx, &sc->seg);
	int r = nat_alloc(ctx, eth, f, b, vm, a->hash, now, &src_idx, &port);
	if (r < 0) {
		count(&path_stats, PATH_NAT_NO_PORT, len);
		return XDP_DROP;
	}
	if (r > 0)
		count(&path_stats, PATH_NAT_RECLAIM, len);
	struct conn *nc = &sc->nc;
	*nc = (struct conn){.backend = a->bidx, .gen = b->gen, .vip_id = vm->id, .last_seen = now, .nat_src = src_idx,
			    .nat_port = port,
			    .flags = C_NAT | (sc->seg.tcp & 1) * C_HS | ((tflags & T_FIN) ? 0 : C_COUNTED | ((tflags & T_SYN) ? C_SYN : 0))};
	if (bpf_map_update_elem(&conns, f, nc, BPF_NOEXIST) != 0) {
		/* Another CPU started the flow first (the same SYN twice): give the port back,
		 * unless it is the one that CPU took (our probe found its entry, the flow's own),
		 * and go where it went. */
		struct conn *o = bpf_map_lookup_elem(&conns, f);
		if (!o || o->nat_src != src_idx || o->nat_port != port)
			nat_release(nc, b, f);
		if (!o || !(o->flags & C_NAT)) {
			count(&path_stats, PATH_NAT_NO_PORT, len);
			return XDP_DROP;
		}
		a->bidx = o->backend;
		a->src_idx = o->nat_src;
		a->port = o->nat_port;
		return -1;
	}
	if (nc->flags & C_COUNTED)
		count_active(a->bidx);
	a->src_idx = src_idx;
	a->port = port;
	return -1;
}
