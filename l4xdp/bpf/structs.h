// SPDX-License-Identifier: GPL-2.0
// Map keys and values.
#pragma once

#include <linux/types.h>
#include "consts.h"

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
	__u32 idle_timeout; /* seconds a flow of this VIP may send nothing and keep its entry */
};

/* A VIP's schedule length and weighted-least-connections pool: the slots new flows may go to
 * (n <= WLC_SCAN; 0: the pool is larger, so picks sample the schedule twice: weighted power
 * of two choices). Kept apart from vip_meta, whose layout a restarted loader adopts. */
struct wlc_pool {
	__u32 sched_len; /* entries of the VIP's weighted round-robin schedule (F_WRR, F_WLC) */
	__u32 n;
	__u32 slots[WLC_SCAN];
};

/* A next hop as the FIB gave it (or, for a NAT flow's replies, as its first frame came in),
 * cached for a second so that a NAT packet costs one FIB lookup a second per backend or
 * flow, not one each. at 0: not from the FIB yet. */
struct next_hop {
	__u8 dmac[6];
	__u8 smac[6];
	__u32 ifindex; /* 0: none known */
	__u64 at;      /* bpf_ktime_get_coarse_ns() of the lookup */
};

struct backend {
	__u8 mac[6];
	__be16 port;   /* B_NAT: the backend's port */
	enum backend_flags flags;
	__u32 ifindex; /* 0: XDP_TX out of the ingress interface */
	__u32 gen;     /* bumped by the loader each time the slot changes hands */
	__u8 addr[16]; /* B_NAT, B_TUNNEL: the backend's address (IPv4 as ::ffff:a.b.c.d);
			* B_TUNNEL: port is the tunnel's UDP port */
	__u32 mtu;     /* B_TUNNEL: the MTU of the route toward addr, from the FIB with nh (0:
			* not known yet) */
	struct next_hop nh; /* B_NAT, B_TUNNEL: the next hop toward addr (written by the
			     * program; the loader's writes of the slot clear it) */
};

/* Aligned to 8: hash_flow reads it as five 64-bit words. */
struct flow {
	__u8 src[16];
	__u8 dst[16];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 pad[3];
} __attribute__((aligned(8)));

/* A connection-table entry: usable only while its VIP id is the VIP's, its generation the
 * slot's, and it has been idle less than the VIP's idle_timeout (else a miss: the flow
 * re-picks). 24 bytes, laid out so that entries of the loader before NAT (a 32-bit slot and
 * VIP id, both small) read the same on little-endian. */
struct conn {
	__u16 backend;         /* slot */
	__u8 nat_src;          /* C_NAT: index in nat_sources */
	__u8 pad;
	__u32 gen;             /* the slot's generation when the flow was pinned to it */
	__u16 vip_id;
	__be16 nat_port;       /* C_NAT: the flow's source port toward the backend */
	enum conn_flags flags;
	__u64 last_seen;       /* bpf_ktime_get_coarse_ns() of a recent packet (refreshed at most
				* once a second: a write dirties a line every CPU reads) */
};

/* nat_rev's key: a NAT flow as the backend's replies carry it. Ports are allocated per
 * (LB address, backend, protocol): the same port serves flows to different backends. */
struct nat_key {
	__u8 lb[16];
	__u8 backend[16];
	__be16 lb_port;
	__be16 backend_port;
	__u8 proto;
	__u8 pad[3];
};

/* The way back of a NAT flow, and what the program knows of its TCP connection. 88 bytes,
 * as in the version before, whose entries read sanely: its `timeout` lies where ack_b is
 * (not NS_ACK: unknown), its `replied` is NS_REPLIED, its padding seq_b (not NS_SEQ). How
 * long the port is held is not stored: nat_hold derives it from idle and state. */
struct nat_entry {
	struct flow client;   /* the flow as the client sent it (client -> VIP) */
	struct next_hop nh;   /* toward the client: first the way the flow came in (its first
			       * frame's MACs and interface, used while the FIB has no neighbour
			       * for the client), then the FIB's */
	__u32 ack_b;          /* TCP (NS_ACK): the next sequence number expected from the client:
			       * the backend's latest acknowledgement, at first the client's SYN + 1 */
	__u32 idle;           /* the VIP's idle timeout, seconds */
	enum nat_state state;
	__u32 seq_b;          /* TCP (NS_SEQ): the next sequence number expected from the backend */
	__u64 last_seen;      /* either direction, refreshed at most once a second */
};

/* Ports the loader added to the host's ip_local_reserved_ports (inclusive; lo 0: unused),
 * kept with the pinned state so that Detach gives back exactly those. Never read here. */
struct port_range {
	__u16 lo;
	__u16 hi;
};

/* A NAT source address. */
struct nat_source {
	__u8 addr[16];
};

/* Written by the loader at start-up (not pinned: each loader writes its own flags). */
struct lb_config {
	__u32 insert_cap; /* connection-table inserts a CPU may make per second; 0: no cap */
	__u16 nat_port_lo; /* NAT source ports, host order, inclusive */
	__u16 nat_port_hi;
	__u32 nat_v4;     /* IPv4 NAT sources (nat_sources[0..nat_v4-1]) */
	__u32 nat_v6;     /* IPv6 NAT sources (nat_sources[8..8+nat_v6-1]) */
	__u8 tunnel_v4[4];  /* the tunnel's outer source address, IPv4 (0: none) */
	__u8 tunnel_v6[16]; /* and IPv6 */
	/* Seconds a NAT flow holds its port idle, at most: once a FIN was believed; after a RST
	 * believed from either side (conntrack's CLOSE); and before its client completes the
	 * handshake (a UDP flow: before the backend's first reply), so that a flood of SYNs,
	 * which a listening backend answers, does not hold ports the VIP's idle timeout. */
	__u16 nat_hold_closing;
	__u16 nat_hold_rst;
	__u16 nat_hold_unreplied;
	__u16 pad;
};

/* A CPU's reading of the coarse clock and the jiffy it was read in (see now_ns). */
struct cpu_clock {
	__u64 jiffies;
	__u64 ns;
};

/* A CPU's insert budget: inserts made in the current one-second window. */
struct insert_budget {
	__u64 window;
	__u64 used;
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
