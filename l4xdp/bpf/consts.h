// SPDX-License-Identifier: GPL-2.0
// Limits, flags and path counter indexes (the Go side mirrors them: consts_test.go checks).
#pragma once

#include <linux/types.h>

#define MAX_VIPS 256
#define MAX_BACKENDS 4096
#define MAGLEV_SIZE 65537 /* largest table; each VIP's own size is in vip_meta */
#define MAX_CID 20
#define NSEC_PER_SEC 1000000000ULL
/* How long an entry that has seen the client's FIN holds without a packet (a half-closed
 * connection's ACKs keep it): after that, a packet on its 5-tuple is taken for a later
 * connection's (a client reuses its port after its TIME_WAIT, a minute) and goes by the
 * table. Not NAT flows: their reply entries time their close (nat_client_seg). */
#define CLOSE_TIMEOUT_NS (10 * NSEC_PER_SEC)
#define MAX_NAT_SOURCES 16 /* IPv4 sources at 0..7, IPv6 at 8..15 */
#define NAT_PROBES 32      /* ports a new NAT flow tries before it is dropped (as Linux's
			    * NAT gives up after a bounded number of attempts) */
/* How long a NAT flow holds its port after a FIN, after a RST, and before its handshake
 * completes (or a UDP flow's first reply) is the loader's to say: lb_config's nat_hold_*. */
#define NAT_WINDOW 65536   /* how far from the sequence number the program expects a NAT flow's
			    * TCP segment may start and still be believed the flow's own (the
			    * largest window a peer can offer unscaled): a blind forger guesses
			    * within it once in 65,536 tries */
#define WLC_SCAN 16 /* weighted least connections scans pools up to this size; above it, the
		     * weighted power of two choices */

/* The constants the Go side mirrors are enums, each the type of a map key or a field, so
 * that they reach the object's BTF, where l4xdp's tests compare them with the Go ones. */

enum vip_flags {
	F_SRC_IP = 1, /* affinity source_ip: hash the source address only */
	F_QUIC = 2,   /* affinity quic_cid */
	F_PANIC = 4,  /* every backend is down: the table holds them all (fail open), and no flow
		       * re-picks for its backend being down */
	F_WRR = 8,    /* balance weighted_round_robin: new flows follow the VIP's schedule */
	F_WLC = 16,   /* balance weighted_least_conn: new flows to the least active per weight */
	F_TUNNEL = 32, /* forwarding tunnel: new flows pick from the VIP's second-chance table
			* (tunnel_tables: a primary and a secondary per row) */
	F_SECOND = 64, /* second chance: its table names secondaries, and an idle TCP entry is not
			* followed blindly (tunnel_trusts) */
};

enum backend_flags {
	B_ALIVE = 1, /* backend in the pool (draining ones stay alive: their flows hold) */
	B_DOWN = 2,  /* found down by the health checks: out of the table (unless in panic); its
		      * UDP flows re-pick, its TCP flows stay (the backend may still answer them).
		      * A restarted loader reads it back and keeps the backend out of new flows
		      * until its own checker has seen it. */
	B_NAT = 4,   /* reached by NAT: destination and source rewritten, replies come back */
	B_TUNNEL = 8, /* reached by tunnel: the packet encapsulated in GUE to addr, port */
};

/* A connection-table entry's flags. */
enum conn_flags {
	C_COUNTED = 1, /* counted in its backend's active connections (weighted least connections) */
	C_NAT = 2,     /* a NAT flow: its source is nat_sources[nat_src]:nat_port, and nat_rev
			* holds the way back */
	C_SYN = 4,     /* only the client's SYN seen so far: a SYN that finds the entry is a
			* retransmission and follows it (and counts no second time) */
	C_HS = 8,      /* a NAT flow whose client has not completed the handshake yet: each of
			* its packets is checked against its reply entry (nat_refresh) until one
			* acknowledges the backend's SYN-ACK */
	C_FIN = 16,    /* the client's FIN seen: the connection is closing, and its entry holds
			* CLOSE_TIMEOUT_NS idle at most (conn_usable) */
};

/* What a NAT flow's reply entry knows of its connection (nat_entry's state). Bit 0 is where
 * the version before kept `replied` (1), so its entries read as replied, nothing else known. */
enum nat_state {
	NS_REPLIED = 1, /* the backend has answered (TCP: with a SYN-ACK that acknowledges the
			 * client's SYN) */
	NS_EMB = 2,     /* TCP: the client has not completed the handshake (no ACK of the
			 * backend's SYN-ACK): held at most nat_hold_unreplied, and the first hold
			 * taken back when a new flow finds no free port */
	NS_ACK = 4,     /* ack_b holds the next sequence number expected from the client */
	NS_SEQ = 8,     /* seq_b holds the next sequence number expected from the backend */
	NS_FIN_C = 16,  /* a FIN from the client, believed */
	NS_FIN_B = 32,  /* a FIN from the backend, believed */
	NS_SHORT = 64,  /* a FIN's hold (nat_hold_closing) in force: a segment carrying data
			 * lifts it, unless both sides have sent their FIN */
	NS_RST = 128,   /* a RST believed: nat_hold_rst, for good */
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
	PATH_CONN_STALE = 11, /* entry found but not used: another VIP id, a reused slot, idle
			       * past the VIP's timeout, or a UDP flow of a down backend */
	PATH_INSERT_REFUSED = 12, /* new flow forwarded but not remembered: the CPU's insert budget
				   * for this second is spent (flood guard) */
	PATH_PANIC = 13,      /* forwarded for a VIP in panic (every backend down: fail open) */
	PATH_WRR = 14,        /* new flow picked by the weighted round-robin schedule */
	PATH_WLC = 15,        /* new flow picked by weighted least connections */
	PATH_MIDSTREAM = 16,  /* a TCP non-SYN miss of a WRR/WLC VIP (a flow that moved here from
			       * another LB node): forwarded by the VIP's Maglev table, on which
			       * every node agrees */
	PATH_NAT_FORWARD = 17, /* forwarded to a NAT backend: destination and source rewritten */
	PATH_NAT_REPLY = 18,   /* a NAT backend's reply, rewritten back to VIP -> client */
	PATH_NAT_NO_PORT = 19, /* new NAT flow dropped: no free source port (or nat_rev full) */
	PATH_NAT_NO_ROUTE = 20, /* NAT packet dropped: no route or no neighbour for its next hop */
	PATH_NAT_FRAGMENT = 21, /* fragment of a NAT backend's VIP: dropped (no ports to rewrite) */
	PATH_NAT_STRAY = 22,   /* TCP/UDP to a NAT source and a port of the NAT range that no NAT
				* flow holds (a reply after its flow ended): dropped, so the host
				* does not answer the backend with a RST */
	PATH_NAT_RECLAIM = 23, /* new NAT flow given the port of another whose client had not
				* completed the handshake (no free port within its probes; the oldest
				* such hold it met) */
	PATH_TUNNEL = 24,      /* forwarded to a tunnel backend, encapsulated in GUE */
	PATH_TUNNEL_SECOND = 25, /* of those, carrying a secondary (second chance) */
	PATH_TUNNEL_TOO_BIG = 26, /* encapsulated, it would exceed the path's MTU: answered with
				   * ICMP fragmentation needed / ICMPv6 packet too big */
	PATH_TUNNEL_NO_ROUTE = 27, /* tunnel packet dropped: no route or neighbour toward the
				    * backend, or no tunnel source of its family */
	PATH_MAX = 28,
};
