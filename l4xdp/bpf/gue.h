// SPDX-License-Identifier: GPL-2.0
// The tunnel's format: GUE (draft-ietf-intarea-gue) variant 0 with stickylb's private data.
// The forwarder writes it (tunnel.h), the backend agent reads it (backend.c); docs/xdp.md
// describes it byte by byte.
//
//  outer IPv4 or IPv6 header (the LB's tunnel source -> the backend; the inner packet's family)
//  UDP header (source port: from the flow's hash; destination: the service's tunnel_port;
//              checksum 0, as GUE allows, RFC 6935 for IPv6)
//  GUE header, 4 bytes:
//    byte 0: version (2 bits, 0), C (1 bit, 0: data), Hlen (5 bits: the 32-bit words of
//            private data that follow: GUE_HLEN_V4 or GUE_HLEN_V6)
//    byte 1: Proto, the inner packet's IP protocol number (4: IPv4, 41: IPv6)
//    bytes 2-3: Flags, 0 (no extension fields: the kernel's fou accepts it and skips the
//            private data)
//  private data, Hlen x 4 bytes:
//    byte 0: kind, GUE_KIND_SECOND (stickylb's second chance)
//    byte 1: hops: how many times a backend may still pass the packet on (1 from the LB;
//            0: never)
//    bytes 2-3: 0
//    the secondary backend's address: 4 bytes for IPv4 outer, 16 for IPv6 (zeros: none)
//  the client's packet, unchanged
#pragma once

#include <linux/types.h>

struct gue_hdr {
	__u8 vchl;   /* version << 6 | C << 5 | Hlen */
	__u8 proto;
	__be16 flags;
};

struct gue_second {
	__u8 kind;
	__u8 hops;
	__u16 zero;
};

#define GUE_KIND_SECOND 0x53 /* 'S' */
#define GUE_HLEN_V4 2        /* 4 bytes of kind and hops, 4 of address */
#define GUE_HLEN_V6 5        /* 4 bytes of kind and hops, 16 of address */
#define GUE_HOPS 1           /* hops the LB gives a packet: one pass to the secondary */

/* Bytes a tunnel adds to the client's packet: outer IP, UDP, GUE and its private data. */
#define TUNNEL_OVERHEAD_V4 (20 + 8 + 4 + GUE_HLEN_V4 * 4) /* 40 */
#define TUNNEL_OVERHEAD_V6 (40 + 8 + 4 + GUE_HLEN_V6 * 4) /* 72 */
