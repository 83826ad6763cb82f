// SPDX-License-Identifier: GPL-2.0
// ICMP errors: routed by the flow they quote.
#pragma once

#include "route.h"

/* icmp_error routes an ICMP error by the packet it quotes (inf holds the quoted addresses and
 * protocol, inl4 its transport header): the quoted packet went VIP -> client, so its flow is
 * the swap; or NAT source -> backend, so the swap is the NAT flow's reply key. Errors about
 * no VIP or NAT flow pass to the stack. */
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
		/* Or about a NAT flow, from the backend's side (it quotes NAT source -> backend). */
		int r = nat_reply(ctx, inf, T_ICMP, len);
		if (r >= 0)
			return r;
		count(&path_stats, PATH_PASS, len);
		return XDP_PASS;
	}
	count(&path_stats, PATH_ICMP_ERROR, len);
	return route(ctx, eth, inf, vm, NULL, T_ICMP, len);
}
