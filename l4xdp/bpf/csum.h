// SPDX-License-Identifier: GPL-2.0
// Checksums, updated incrementally as a rewrite changes a packet's words.
#pragma once

#include <linux/types.h>

/* Checksums are updated incrementally (RFC 1624: HC' = ~(~HC + ~m + m')), word by word in
 * the packet's own byte order, which a ones'-complement sum does not care about. */

static __always_inline __u32 csum_words(__u32 acc, const void *from, const void *to, int words)
{
	const __u16 *o = from, *n = to;
#pragma unroll
	for (int i = 0; i < 8; i++) {
		if (i >= words)
			break;
		acc += (__u16)~o[i];
		acc += n[i];
	}
	return acc;
}

static __always_inline __u16 csum_fold(__u32 s)
{
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)s;
}

/* csum_apply folds the changes summed in acc into the checksum at *c. */
static __always_inline void csum_apply(__u16 *c, __u32 acc)
{
	*c = ~csum_fold((__u16)~*c + acc);
}
