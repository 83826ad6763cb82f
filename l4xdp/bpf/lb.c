// SPDX-License-Identifier: GPL-2.0
// stickylb L4 forwarder: direct routing (DR) for TCP/UDP VIPs.
//
// For a packet to a VIP: find the flow in the connection table, else pick a backend from the
// VIP's Maglev table (built in Go by policies/chash) by a hash of the source address
// (source_ip), the 5-tuple (none), or the QUIC connection ID (quic_cid); remember the flow;
// rewrite the MACs and send it back out (XDP_TX) or to the backend's interface. Everything
// not for a VIP passes to the stack. Every other path (fragments, ICMP errors, malformed
// headers) is counted in path_stats; the PATH_* constants below are its indexes.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include "bpf_helpers.h"
#include "bpf_endian.h"

/* ICMP headers, declared here: linux/icmp.h pulls in libc's socket headers. */
struct icmphdr {
	__u8 type;
	__u8 code;
	__u16 checksum;
	__u32 rest;
};
struct icmp6hdr {
	__u8 icmp6_type;
	__u8 icmp6_code;
	__u16 icmp6_cksum;
	__u32 rest;
};
#define ICMP_DEST_UNREACH 3
#define ICMP_TIME_EXCEEDED 11
#define ICMP_PARAMETERPROB 12

#define MAX_VIPS 256
#define MAX_BACKENDS 4096
#define MAGLEV_SIZE 65537 /* largest table; each VIP's own size is in vip_meta */
#define MAX_CID 20

/* The constants the Go side mirrors are enums, each the type of a map key or a field, so
 * that they reach the object's BTF, where l4xdp's tests compare them with the Go ones. */

enum vip_flags {
	F_SRC_IP = 1, /* affinity source_ip: hash the source address only */
	F_QUIC = 2,   /* affinity quic_cid */
};

enum backend_flags {
	B_ALIVE = 1, /* backend in the pool (draining ones stay alive: their flows hold) */
	B_DOWN = 2,  /* the loader's last health verdict (not read here): a restarted loader keeps
		      * a backend out of new flows until its own checker has seen it */
};

enum lb_path {
	PATH_PASS = 0,       /* not for a VIP */
	PATH_FORWARD = 1,    /* forwarded */
	PATH_CONN_HIT = 2,   /* flow found in the connection table */
	PATH_CONN_MISS = 3,  /* new flow, picked from Maglev */
	PATH_FRAGMENT = 4,   /* fragment, hashed by (src, dst, proto) */
	PATH_ICMP_ERROR = 5, /* ICMP error routed by its inner header */
	PATH_MALFORMED = 6,  /* truncated or invalid headers for a VIP: dropped */
	PATH_NO_BACKEND = 7, /* VIP with an empty table: dropped */
	PATH_IP_OPTIONS = 8, /* IPv4 with options, forwarded */
	PATH_TCP_RST = 9,    /* RST: forwarded, flow forgotten */
	PATH_QUIC_SERVER_ID = 10, /* QUIC CID carried a known server_id */
	PATH_MAX = 16,
};

struct vip_key {
	__u8 addr[16]; /* IPv4 as ::ffff:a.b.c.d */
	__u16 port;    /* network order; 0 in vip_addrs keys */
	__u8 proto;
	__u8 pad;
};

struct vip_meta {
	__u32 id;
	enum vip_flags flags;
	__u32 table_size;
	__u32 cid_len;
};

struct backend {
	__u8 mac[6];
	__u16 pad;
	enum backend_flags flags;
	__u32 ifindex; /* 0: XDP_TX out of the ingress interface */
};

struct flow {
	__u8 src[16];
	__u8 dst[16];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct conn {
	__u32 backend;
	__u32 vip_id;
};

struct server_key {
	__u32 vip_id;
	__u32 server_id;
};

struct counter {
	__u64 packets;
	__u64 bytes;
};

/* What a VIP id or backend slot stands for, written by the loader and never read here: a
 * restarted loader keeps the slots the connection table refers to, and `stickylb xdp stats`
 * names its counters from the pinned maps alone. */
struct name {
	char s[128];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_VIPS);
	__type(key, struct vip_key);
	__type(value, struct vip_meta);
} vips SEC(".maps");

/* One VIP per (address, protocol): fragments carry no ports. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_VIPS);
	__type(key, struct vip_key);
	__type(value, struct vip_meta);
} vip_addrs SEC(".maps");

struct maglev_table {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAGLEV_SIZE);
	__type(key, __u32);
	__type(value, __u32);
};

/* Tables are swapped whole (map-in-map), so a change never leaves a packet half-built. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, MAX_VIPS);
	__type(key, __u32);
	__array(values, struct maglev_table);
} maglev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct backend);
} backends SEC(".maps");

/* Shared by every CPU: veth delivers a flow's packets on whichever CPU sent them. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 20);
	__type(key, struct flow);
	__type(value, struct conn);
} conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_BACKENDS);
	__type(key, struct server_key);
	__type(value, __u32);
} server_ids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_VIPS);
	__type(key, __u32);
	__type(value, struct name);
} vip_names SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct name);
} backend_names SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PATH_MAX);
	__type(key, enum lb_path);
	__type(value, struct counter);
} path_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_VIPS);
	__type(key, __u32);
	__type(value, struct counter);
} vip_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct counter);
} backend_stats SEC(".maps");

static __always_inline void count(void *map, __u32 idx, __u64 bytes)
{
	struct counter *c = bpf_map_lookup_elem(map, &idx);
	if (c) {
		c->packets++;
		c->bytes += bytes;
	}
}

/* FNV-1a, 32 bits: what the Go side (l4xdp.Hash) computes for the fixtures and the plan. */
static __always_inline __u32 fnv_step(__u32 h, __u8 b)
{
	return (h ^ b) * 16777619u;
}

static __always_inline __u32 hash_flow(const struct flow *f, int src_only)
{
	__u32 h = 2166136261u;
#pragma unroll
	for (int i = 0; i < 16; i++)
		h = fnv_step(h, f->src[i]);
	if (src_only)
		return h;
#pragma unroll
	for (int i = 0; i < 16; i++)
		h = fnv_step(h, f->dst[i]);
	h = fnv_step(h, f->sport & 0xff);
	h = fnv_step(h, f->sport >> 8);
	h = fnv_step(h, f->dport & 0xff);
	h = fnv_step(h, f->dport >> 8);
	return fnv_step(h, f->proto);
}

static __always_inline void v4_mapped(__u8 *dst, __be32 addr)
{
	__builtin_memset(dst, 0, 10);
	dst[10] = 0xff;
	dst[11] = 0xff;
	__builtin_memcpy(dst + 12, &addr, 4);
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

#define T_RST 1 /* TCP RST: forwarded, flow forgotten */
#define T_SYN 2 /* TCP SYN without ACK: a new connection */

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

/* l4 fills the flow's ports from a TCP or UDP header at l4; returns the payload, or NULL
 * when the header is truncated. */
static __always_inline __u8 *l4(void *l4p, void *data_end, struct flow *f, int *tflags)
{
	if (f->proto == IPPROTO_TCP) {
		struct tcphdr *t = l4p;
		if ((void *)(t + 1) > data_end)
			return NULL;
		f->sport = t->source;
		f->dport = t->dest;
		*tflags = (t->rst ? T_RST : 0) | (t->syn && !t->ack ? T_SYN : 0);
		return (__u8 *)(t + 1);
	}
	struct udphdr *u = l4p;
	if ((void *)(u + 1) > data_end)
		return NULL;
	f->sport = u->source;
	f->dport = u->dest;
	return (__u8 *)(u + 1);
}

/* ports reads the ports of a quoted TCP or UDP header: an ICMP error quotes only the first
 * 8 bytes of it, where both keep their ports. */
static __always_inline int ports(void *l4p, void *data_end, struct flow *f)
{
	struct udphdr *u = l4p; /* TCP's first 4 bytes are its ports too */
	if ((void *)(u + 1) > data_end)
		return 0;
	f->sport = u->source;
	f->dport = u->dest;
	return 1;
}

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
	struct flow hf = *f; /* (src, dst, proto) only */
	int b = pick(vm, hash_flow(&hf, 0));
	if (b < 0) {
		count(&path_stats, PATH_NO_BACKEND, len);
		return XDP_DROP;
	}
	return forward(ctx, eth, b, vm->id, len);
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
		count(&path_stats, PATH_PASS, len);
		return XDP_PASS;
	}
	if (icmp_inner)
		tflags = 0;
	return route(ctx, eth, f, vm, icmp_inner ? NULL : payload, tflags, len);
}

/* swap turns the quoted packet's header (VIP -> client) into the flow's key (client -> VIP). */
static __always_inline void swap(struct flow *f)
{
	__u8 tmp[16];
	__builtin_memcpy(tmp, f->src, 16);
	__builtin_memcpy(f->src, f->dst, 16);
	__builtin_memcpy(f->dst, tmp, 16);
	__u16 p = f->sport;
	f->sport = f->dport;
	f->dport = p;
}

/* icmp_error routes an ICMP error by the packet it quotes (inf holds the quoted addresses and
 * protocol, inl4 its transport header): the quoted packet went VIP -> client, so its flow is
 * the swap. Errors about no VIP flow pass to the stack. */
static __always_inline int icmp_error(struct xdp_md *ctx, struct ethhdr *eth, struct flow *inf, void *inl4, __u64 len)
{
	void *data_end = (void *)(long)ctx->data_end;
	if (!ports(inl4, data_end, inf)) {
		count(&path_stats, PATH_PASS, len);
		return XDP_PASS;
	}
	swap(inf);
	struct vip_key k = {.port = inf->dport, .proto = inf->proto};
	__builtin_memcpy(k.addr, inf->dst, 16);
	struct vip_meta *vm = bpf_map_lookup_elem(&vips, &k);
	if (!vm) {
		count(&path_stats, PATH_PASS, len);
		return XDP_PASS;
	}
	count(&path_stats, PATH_ICMP_ERROR, len);
	return route(ctx, eth, inf, vm, NULL, 0, len);
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

#define IPV6_FRAGMENT 44

struct frag6 {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off;
	__be32 id;
};

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
