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
