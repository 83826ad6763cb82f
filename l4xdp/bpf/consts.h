// SPDX-License-Identifier: GPL-2.0
// Limits, flags and path counter indexes (the Go side mirrors them: consts_test.go checks).
#pragma once

#include <linux/types.h>

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
