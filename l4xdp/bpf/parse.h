// SPDX-License-Identifier: GPL-2.0
// Header parsing: the flow key from IPv4/IPv6 and TCP/UDP headers, the ICMP headers.
#pragma once

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include "structs.h"

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
#define IPV6_FRAGMENT 44

struct frag6 {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off;
	__be32 id;
};

static __always_inline void v4_mapped(__u8 *dst, __be32 addr)
{
	__builtin_memset(dst, 0, 10);
	dst[10] = 0xff;
	dst[11] = 0xff;
	__builtin_memcpy(dst + 12, &addr, 4);
}

#define T_RST 1 /* TCP RST: forwarded, flow forgotten */
#define T_SYN 2 /* TCP SYN without ACK: a new connection */
#define T_ICMP 4 /* an ICMP error about the flow: routed, never inserted, no refresh */
#define T_FIN 8  /* TCP FIN from the client: the connection stops counting as active */

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
		*tflags = (t->rst ? T_RST : 0) | (t->syn && !t->ack ? T_SYN : 0) | (t->fin ? T_FIN : 0);
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
