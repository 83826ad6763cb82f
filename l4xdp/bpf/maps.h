// SPDX-License-Identifier: GPL-2.0
// The maps (the loader pins every one) and the counters kept in them.
#pragma once

#include <linux/bpf.h>
#include "bpf_helpers.h"
#include "structs.h"

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

/* A row of a VIP's second-chance table (F_TUNNEL): primary | secondary << 32, backend slots
 * (0xffffffff: none), one 8-byte value so that a packet reads both from one table. */
struct tunnel_table {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAGLEV_SIZE);
	__type(key, __u32);
	__type(value, __u64);
};

/* The second-chance tables of F_TUNNEL VIPs (the maglev map holds their primaries too, for
 * the paths that pick by primary alone), swapped whole as the Maglev tables are. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, MAX_VIPS);
	__type(key, __u32);
	__array(values, struct tunnel_table);
} tunnel_tables SEC(".maps");

/* Weighted round-robin schedules (F_WRR, F_WLC): slot sequences built by the loader with
 * the smooth weighted round robin, swapped whole as the Maglev tables are. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, MAX_VIPS);
	__type(key, __u32);
	__array(values, struct maglev_table);
} schedules SEC(".maps");

/* Each CPU's position in each VIP's schedule: no shared cache line on the new-flow path;
 * over any run of new flows the counts follow the weights within CPUs x the largest
 * weight. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_VIPS);
	__type(key, __u32);
	__type(value, __u32);
} sched_pos SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_VIPS);
	__type(key, __u32);
	__type(value, struct wlc_pool);
} wlc_pools SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct backend);
} backends SEC(".maps");

/* A backend's effective weight (slow start applied), for weighted least connections. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_BACKENDS);
	__type(key, __u32);
	__type(value, __u32);
} weights SEC(".maps");

/* Active connections per backend slot, shared by every CPU (atomic adds): +1 when a flow's
 * entry is made counted (C_COUNTED), -1 when the flag is taken back (client FIN or RST, idle
 * timeout, a SYN that replaces the entry). LRU evictions have no callback: the loader
 * recounts from the table now and then. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_BACKENDS);
	__type(key, __u32);
	__type(value, __s64);
} active SEC(".maps");

/* A backend slot's zone (written by the loader, never read here): `stickylb xdp stats` sums
 * active connections per zone from the pinned maps alone. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct name);
} backend_zones SEC(".maps");

/* Shared by every CPU: veth delivers a flow's packets on whichever CPU sent them. Its size is
 * the loader's --conn-table-size (this is the default). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 20);
	__type(key, struct flow);
	__type(value, struct conn);
} conns SEC(".maps");

/* NAT flows by their reply (LB address and port, backend, protocol): a plain hash, not an
 * LRU, so a live NAT flow is never evicted; entries idle past their timeout are taken over
 * by a new flow's port probe and swept by the loader. Sized as conns, allocated as flows
 * come (a loader with no NAT backend pays no memory for it). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1 << 20);
	__type(key, struct nat_key);
	__type(value, struct nat_entry);
} nat_rev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, struct port_range);
} nat_reserved SEC(".maps");

/* Written by the loader at start-up from --nat-source (not pinned). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_NAT_SOURCES);
	__type(key, __u32);
	__type(value, struct nat_source);
} nat_sources SEC(".maps");

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

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct insert_budget);
} insert_budget SEC(".maps");

/* Each CPU's last reading of the coarse clock (now_ns). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cpu_clock);
} cpu_clock SEC(".maps");

/* now_ns is bpf_ktime_get_coarse_ns(), read once per jiffy on each CPU: the coarse clock only
 * moves at the tick, which moves jiffies too, and reading it (a seqcount loop over the
 * timekeeper) cost about a fifth of an established packet, where jiffies is one load. */
static __always_inline __u64 now_ns(void)
{
	__u32 zero = 0;
	struct cpu_clock *c = bpf_map_lookup_elem(&cpu_clock, &zero);
	__u64 j = bpf_jiffies64();
	if (!c)
		return bpf_ktime_get_coarse_ns();
	if (c->jiffies != j || c->ns == 0) {
		c->jiffies = j;
		c->ns = bpf_ktime_get_coarse_ns();
	}
	return c->ns;
}

static __always_inline void count(void *map, __u32 idx, __u64 bytes)
{
	struct counter *c = bpf_map_lookup_elem(map, &idx);
	if (c) {
		c->packets++;
		c->bytes += bytes;
	}
}
