// SPDX-License-Identifier: GPL-2.0
// stickylb backend agent: TC ingress on a backend of tunnel forwarding (`stickylb backend`).
//
// A UDP packet to one of the tunnel ports (tunnel_ports) from an LB (lb_sources) carries a
// client's packet in GUE (gue.h). It is decapsulated (bpf_skb_adjust_room) and handed to the
// stack, which holds the VIP on lo, unless:
//   - its inner destination is not this host's (local_addrs): dropped (not_local);
//   - it is a TCP packet that is not a SYN, its GUE header names a secondary backend, and
//     no socket here holds its connection: with hops left it is passed on to the secondary
//     (second chance: the outer destination rewritten, the hop count decremented, the LB's
//     outer source kept, sent by bpf_redirect_neigh); with none left it is decapsulated all
//     the same (no_socket: the stack answers it, as any packet of no connection).
// A tunnel-port packet from another source is dropped (refused), and GUE that does not parse
// (short, another version, a control message, flags, lengths that disagree, private data of
// another kind, an inner packet of another family) is dropped (malformed). Everything else
// passes untouched: the backend stays reachable for ARP, SSH and its own traffic. Each path
// is counted in agent_stats.

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include "bpf_helpers.h"
#include "bpf_endian.h"
#include "csum.h"
#include "gue.h"

/* The agent's paths (the Go side names them: stickylb_backend_packets_total{path}). */
enum agent_path {
	AGENT_DECAP = 0,        /* decapsulated and handed to the stack */
	AGENT_SECOND_CHANCE = 1, /* no socket here: passed on to the secondary */
	AGENT_NO_SOCKET = 2,    /* no socket here and no hop left: decapsulated all the same */
	AGENT_REFUSED = 3,      /* to a tunnel port from a source not allowed: dropped */
	AGENT_MALFORMED = 4,    /* GUE that does not parse: dropped */
	AGENT_NOT_LOCAL = 5,    /* the inner destination is not this host's: dropped */
	AGENT_PATH_MAX = 8,
};

struct agent_counter {
	__u64 packets;
	__u64 bytes;
};

/* An address of an LPM key: IPv4 as ::ffff:a.b.c.d (prefix length 96 + the IPv4 one). */
struct agent_prefix {
	__u32 prefixlen;
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __be16);
	__type(value, __u8);
} tunnel_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 256);
	__type(key, struct agent_prefix);
	__type(value, __u8);
} lb_sources SEC(".maps");

/* The host's addresses (the VIPs on lo among them), kept by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct agent_prefix);
	__type(value, __u8);
} local_addrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AGENT_PATH_MAX);
	__type(key, enum agent_path);
	__type(value, struct agent_counter);
} agent_stats SEC(".maps");

static __always_inline int count(enum agent_path p, __u64 len, int verdict)
{
	__u32 idx = p;
	struct agent_counter *c = bpf_map_lookup_elem(&agent_stats, &idx);
	if (c) {
		c->packets++;
		c->bytes += len;
	}
	return verdict;
}

static __always_inline void mapped(__u8 *dst, const void *v4)
{
	__builtin_memset(dst, 0, 10);
	dst[10] = 0xff;
	dst[11] = 0xff;
	__builtin_memcpy(dst + 12, v4, 4);
}

static __always_inline int local(const __u8 *addr)
{
	struct agent_prefix k = {.prefixlen = 128};
	__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(&local_addrs, &k) != NULL;
}

/* What parse found of a tunnel packet (offsets from the frame's start). */
struct tunnel_pkt {
	__u32 outer;    /* the outer IP header */
	__u32 udp;      /* the UDP header */
	__u32 priv;     /* the private data (0: none) */
	__u32 inner;    /* the client's packet */
	__u32 strip;    /* outer IP + UDP + GUE bytes, removed by the decap */
	__u8 v6;
	__u8 proto;     /* the inner packet's transport protocol */
	__u8 hops;
	__u8 pad;
	__u8 second[16]; /* the secondary (zeros: none), IPv4 mapped */
	__u8 src[16];    /* the inner source and destination, IPv4 mapped */
	__u8 dst[16];
};

#define MAX_HEADERS 256 /* outer headers, GUE and the inner IP and TCP headers fit in these */

/* outer reads the outer IP and UDP headers: 1 for a packet to a tunnel port (t filled), 0
 * for any other packet (it passes), -1 for a tunnel-port packet from a source not allowed,
 * -2 for one that cannot be read (a fragment, a short header). */
static __always_inline int outer(struct __sk_buff *skb, struct tunnel_pkt *t)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return 0;
	struct agent_prefix src = {.prefixlen = 128};
	__u32 hl, plen;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end || ip->protocol != IPPROTO_UDP || ip->ihl < 5)
			return 0;
		hl = ip->ihl * 4;
		plen = bpf_ntohs(ip->tot_len);
		if (plen < hl)
			return 0;
		plen -= hl;
		mapped(src.addr, &ip->saddr);
		t->v6 = 0;
		if (ip->frag_off & bpf_htons(0x1fff)) /* a later fragment: no UDP header to read */
			return 0;
		if (ip->frag_off & bpf_htons(0x2000))
			hl |= 1 << 16; /* the first of a fragmented datagram: malformed if to us */
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end || ip->nexthdr != IPPROTO_UDP)
			return 0;
		hl = 40;
		plen = bpf_ntohs(ip->payload_len);
		__builtin_memcpy(src.addr, &ip->saddr, 16);
		t->v6 = 1;
	} else {
		return 0;
	}
	t->outer = ETH_HLEN;
	t->udp = ETH_HLEN + (hl & 0xffff);
	struct udphdr *udp = data + t->udp;
	if ((void *)(udp + 1) > data_end)
		return 0;
	if (!bpf_map_lookup_elem(&tunnel_ports, &udp->dest))
		return 0;
	if (!bpf_map_lookup_elem(&lb_sources, &src))
		return -1;
	if ((hl >> 16) || bpf_ntohs(udp->len) != plen)
		return -2;
	t->strip = (hl & 0xffff) + bpf_ntohs(udp->len);
	return 1;
}

/* gue reads the GUE header, its private data and the inner IP header: 0, or -1 when they do
 * not parse. t->strip holds the outer IP header and the UDP datagram's length on entry. */
static __always_inline int gue(struct __sk_buff *skb, struct tunnel_pkt *t)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u32 total = t->strip; /* outer IP header + UDP length */
	struct gue_hdr *g = data + t->udp + sizeof(struct udphdr);
	if ((void *)(g + 1) > data_end)
		return -1;
	__u32 hlen = g->vchl & 0x1f;
	if ((g->vchl >> 5) != 0 || g->flags != 0 || g->proto != (t->v6 ? IPPROTO_IPV6 : IPPROTO_IPIP))
		return -1; /* another version, a control message, extension fields, another family */
	if (hlen != 0 && hlen != (t->v6 ? GUE_HLEN_V6 : GUE_HLEN_V4))
		return -1;
	t->priv = hlen ? t->udp + sizeof(struct udphdr) + sizeof(struct gue_hdr) : 0;
	t->inner = t->udp + sizeof(struct udphdr) + sizeof(struct gue_hdr) + hlen * 4;
	__u32 hdrs = t->inner - ETH_HLEN; /* outer IP, UDP, GUE */
	if (hlen) {
		struct gue_second *gs = data + t->priv;
		if ((void *)(gs + 1) > data_end || gs->kind != GUE_KIND_SECOND || gs->zero != 0)
			return -1;
		t->hops = gs->hops;
		if (t->v6) {
			__u8 *a = (void *)(gs + 1);
			if ((void *)(a + 16) > data_end)
				return -1;
			__builtin_memcpy(t->second, a, 16);
		} else {
			__u8 *a = (void *)(gs + 1);
			if ((void *)(a + 4) > data_end)
				return -1;
			if (a[0] | a[1] | a[2] | a[3])
				mapped(t->second, a);
		}
	}
	__u32 ilen;
	if (t->v6) {
		struct ipv6hdr *in = data + t->inner;
		if ((void *)(in + 1) > data_end || in->version != 6)
			return -1;
		ilen = 40 + bpf_ntohs(in->payload_len);
		t->proto = in->nexthdr;
		__builtin_memcpy(t->src, &in->saddr, 16);
		__builtin_memcpy(t->dst, &in->daddr, 16);
	} else {
		struct iphdr *in = data + t->inner;
		if ((void *)(in + 1) > data_end || in->version != 4 || in->ihl < 5)
			return -1;
		ilen = bpf_ntohs(in->tot_len);
		t->proto = in->protocol;
		mapped(t->src, &in->saddr);
		mapped(t->dst, &in->daddr);
	}
	if (total != hdrs + ilen) /* the UDP length must hold the inner packet exactly */
		return -1;
	t->strip = hdrs;
	return 0;
}

/* has_socket says whether a socket here holds the connection of the inner TCP packet: an
 * established, closing, half-open (request) or TIME_WAIT one; a listener only when the
 * packet is a valid SYN-cookie ACK. */
static __always_inline int has_socket(struct __sk_buff *skb, const struct tunnel_pkt *t)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct bpf_sock_tuple tu = {};
	struct bpf_sock *sk;
	void *iph = data + t->inner;
	__u32 iph_len;
	struct tcphdr *th;
	if (t->v6) {
		struct ipv6hdr *in = iph;
		th = (void *)(in + 1);
		if ((void *)(th + 1) > data_end)
			return 1;
		__builtin_memcpy(tu.ipv6.saddr, &in->saddr, 16);
		__builtin_memcpy(tu.ipv6.daddr, &in->daddr, 16);
		tu.ipv6.sport = th->source;
		tu.ipv6.dport = th->dest;
		iph_len = sizeof(*in);
		sk = bpf_skc_lookup_tcp(skb, &tu, sizeof(tu.ipv6), BPF_F_CURRENT_NETNS, 0);
	} else {
		struct iphdr *in = iph;
		if ((void *)(in + 1) > data_end)
			return 1;
		iph_len = in->ihl * 4;
		if (iph_len < sizeof(*in) || iph_len > 60)
			return 1;
		th = iph + iph_len;
		if ((void *)(th + 1) > data_end)
			return 1;
		tu.ipv4.saddr = in->saddr;
		tu.ipv4.daddr = in->daddr;
		tu.ipv4.sport = th->source;
		tu.ipv4.dport = th->dest;
		iph_len = sizeof(*in); /* what bpf_tcp_check_syncookie reads */
		sk = bpf_skc_lookup_tcp(skb, &tu, sizeof(tu.ipv4), BPF_F_CURRENT_NETNS, 0);
	}
	if (!sk)
		return 0;
	int held = 1;
	if (sk->state == BPF_TCP_LISTEN)
		held = bpf_tcp_check_syncookie(sk, iph, iph_len, th, sizeof(*th)) == 0;
	bpf_sk_release(sk);
	return held;
}

/* second_chance passes the packet on to t's secondary: the outer destination rewritten, the
 * hop count decremented (checksums updated: IPv4's header; UDP's when the LB sent one), the
 * LB's outer source kept; the neighbour resolved by the kernel (bpf_redirect_neigh routes
 * the new destination out of this interface, and queues the packet while the neighbour is
 * unresolved). */
static __always_inline int second_chance(struct __sk_buff *skb, const struct tunnel_pkt *t)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct udphdr *udp = data + t->udp;
	struct gue_second *gs = data + t->priv;
	if ((void *)(udp + 1) > data_end || (void *)(gs + 1) > data_end)
		return TC_ACT_SHOT;
	__u16 oldw = *(__u16 *)gs; /* kind and hops, the word the checksum sees */
	gs->hops = t->hops - 1;
	__u32 acc = csum_words(0, &oldw, gs, 1);
	if (t->v6) {
		struct ipv6hdr *ip = data + t->outer;
		if ((void *)(ip + 1) > data_end)
			return TC_ACT_SHOT;
		acc = csum_words(acc, &ip->daddr, t->second, 8);
		__builtin_memcpy(&ip->daddr, t->second, 16);
	} else {
		struct iphdr *ip = data + t->outer;
		if ((void *)(ip + 1) > data_end)
			return TC_ACT_SHOT;
		__u32 a = csum_words(0, &ip->daddr, t->second + 12, 2);
		csum_apply(&ip->check, a);
		acc += a;
		__builtin_memcpy(&ip->daddr, t->second + 12, 4);
	}
	if (udp->check) {
		__u16 c = ~csum_fold((__u16)~udp->check + acc);
		udp->check = c ? c : 0xffff;
	}
	return bpf_redirect_neigh(skb->ifindex, NULL, 0, 0);
}

SEC("tc")
int stickylb_backend(struct __sk_buff *skb)
{
	__u64 len = skb->len;
	struct tunnel_pkt t = {};
	__u32 want = len < MAX_HEADERS ? len : MAX_HEADERS;
	if ((void *)(long)skb->data + want > (void *)(long)skb->data_end)
		bpf_skb_pull_data(skb, want); /* the headers in reach of direct access */
	int r = outer(skb, &t);
	if (r == 0)
		return TC_ACT_OK;
	if (r == -1)
		return count(AGENT_REFUSED, len, TC_ACT_SHOT);
	if (r < 0 || gue(skb, &t) < 0)
		return count(AGENT_MALFORMED, len, TC_ACT_SHOT);
	if (!local(t.dst))
		return count(AGENT_NOT_LOCAL, len, TC_ACT_SHOT);
	enum agent_path path = AGENT_DECAP;
	if (t.proto == IPPROTO_TCP && (((__u64 *)t.second)[0] | ((__u64 *)t.second)[1])) {
		void *data = (void *)(long)skb->data;
		void *data_end = (void *)(long)skb->data_end;
		__u32 hl = t.v6 ? 40 : 20;
		if (!t.v6) {
			struct iphdr *in = data + t.inner;
			if ((void *)(in + 1) > data_end)
				return count(AGENT_MALFORMED, len, TC_ACT_SHOT);
			hl = in->ihl * 4;
		}
		struct tcphdr *th = data + t.inner + (hl & 0x3f);
		if ((void *)(th + 1) > data_end)
			return count(AGENT_MALFORMED, len, TC_ACT_SHOT);
		if (!th->syn && !has_socket(skb, &t)) {
			if (t.hops > 0 && !local(t.second))
				return count(AGENT_SECOND_CHANCE, len, second_chance(skb, &t));
			path = AGENT_NO_SOCKET;
		}
	}
	if (bpf_skb_adjust_room(skb, -(int)t.strip, BPF_ADJ_ROOM_MAC, 0))
		return count(AGENT_MALFORMED, len, TC_ACT_SHOT);
	return count(path, len, TC_ACT_OK);
}

char _license[] SEC("license") = "GPL";
