// SPDX-License-Identifier: GPL-2.0
// Programs for l4xdp's tests and benchmarks only (built into testprogs_bpfel_test.o, which
// only test binaries embed): the benchmarks' floors, the live-frames traffic generator and
// the backends' sink.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include "bpf_helpers.h"
#include "structs.h"

/* The floor of the benchmarks: MAC swap and XDP_TX, nothing else. */
SEC("xdp")
int floor_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return XDP_DROP;
	__u8 tmp[ETH_ALEN];
	__builtin_memcpy(tmp, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, tmp, ETH_ALEN);
	return XDP_TX;
}

/* Where redirect_floor_xdp sends every frame: one backend's MAC and interface. */
struct floor_target {
	__u8 mac[6];
	__u16 pad;
	__u32 ifindex;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct floor_target);
} floor_cfg SEC(".maps");

/* The floor of the live-frames benchmark: what the forwarder does for a backend with an
 * interface of its own (MAC rewrite, redirect), with no parsing, lookup or counting. */
SEC("xdp")
int redirect_floor_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u32 zero = 0;
	struct floor_target *b = bpf_map_lookup_elem(&floor_cfg, &zero);
	if ((void *)(eth + 1) > data_end || !b)
		return XDP_DROP;
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, b->mac, ETH_ALEN);
	return bpf_redirect(b->ifindex, 0);
}

/* Benchmark traffic (the live-frames benchmark): run by BPF_PROG_RUN with
 * BPF_F_TEST_XDP_LIVE_FRAMES, whose XDP_TX transmits out of the given interface. Live frames
 * are recycled without being reset, so everything that varies is written every time: both
 * MACs, and a 16-bit field (a source port) taken in turn from gen_config.flows values. */
struct gen_config {
	__u8 dst[6];
	__u8 src[6];
	__u32 flows;
	__u32 port_off;
	__u32 base_port;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gen_config);
} gen_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} gen_seq SEC(".maps");

SEC("xdp")
int gen_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 zero = 0;
	struct gen_config *cfg = bpf_map_lookup_elem(&gen_cfg, &zero);
	__u64 *seq = bpf_map_lookup_elem(&gen_seq, &zero);
	struct ethhdr *eth = data;
	if (!cfg || !seq || (void *)(eth + 1) > data_end || cfg->flows == 0)
		return XDP_ABORTED;
	__builtin_memcpy(eth->h_dest, cfg->dst, ETH_ALEN);
	__builtin_memcpy(eth->h_source, cfg->src, ETH_ALEN);
	__u8 *p = data + (cfg->port_off & 0xff); /* bounded, for the verifier */
	if (p + 2 > (__u8 *)data_end)
		return XDP_ABORTED;
	__u16 port = cfg->base_port + (*seq)++ % cfg->flows;
	p[0] = port >> 8;
	p[1] = port & 0xff;
	return XDP_TX;
}

/* The backends' side of the live-frames benchmark: counts frames by the last byte of their
 * destination MAC (one per backend) and drops them. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct counter);
} sink_stats SEC(".maps");

SEC("xdp")
int sink_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return XDP_DROP;
	__u32 idx = eth->h_dest[5];
	struct counter *c = bpf_map_lookup_elem(&sink_stats, &idx);
	if (c) {
		c->packets++;
		c->bytes += data_end - data;
	}
	return XDP_DROP;
}

/* The floor of tunnel encapsulation (BenchmarkProgRunTunnel): the least a GUE encapsulator
 * does per packet, with nothing looked up: room for the outer headers (IPv4, UDP, the GUE
 * header and stickylb's 8 bytes of private data), written from a template with this
 * packet's lengths and the outer header's checksum, and XDP_TX. */
#define ENCAP_HDRS (14 + 20 + 8 + 12)

struct encap_template {
	__u8 b[56]; /* the outer frame's first ENCAP_HDRS bytes */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct encap_template);
} encap_tmpl SEC(".maps");

SEC("xdp")
int encap_floor_xdp(struct xdp_md *ctx)
{
	long len = (long)ctx->data_end - (long)ctx->data;
	asm volatile("" : "+r"(len)); /* a scalar: the verifier refuses 32-bit pointer arithmetic */
	__u32 zero = 0;
	struct encap_template *t = bpf_map_lookup_elem(&encap_tmpl, &zero);
	if (!t || len < ETH_HLEN || bpf_xdp_adjust_head(ctx, -(ENCAP_HDRS - ETH_HLEN)))
		return XDP_DROP;
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	if (data + ENCAP_HDRS > data_end)
		return XDP_DROP;
	__builtin_memcpy(data, t->b, ENCAP_HDRS);
	__u16 ilen = len - ETH_HLEN;
	__u16 *ip = data + ETH_HLEN;
	ip[1] = __builtin_bswap16(ilen + ENCAP_HDRS - ETH_HLEN); /* total length */
	ip[5] = 0;
	__u32 s = 0;
#pragma unroll
	for (int i = 0; i < 10; i++)
		s += ip[i];
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	ip[5] = ~s;
	__u16 *udp = data + ETH_HLEN + 20;
	udp[2] = __builtin_bswap16(ilen + ENCAP_HDRS - ETH_HLEN - 20); /* UDP length */
	return XDP_TX;
}

char _license[] SEC("license") = "GPL";
