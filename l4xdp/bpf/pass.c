// SPDX-License-Identifier: GPL-2.0
// `stickylb xdp pass`: an XDP program that passes every frame. XDP_TX out of a veth delivers
// only when its peer runs an XDP program, so test rigs put this one on the peers.

#include <linux/bpf.h>
#include "bpf_helpers.h"

SEC("xdp")
int pass_xdp(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char _license[] SEC("license") = "GPL";
