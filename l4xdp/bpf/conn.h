// SPDX-License-Identifier: GPL-2.0
// The connection table: whether an entry still holds, the per-CPU insert cap, and the
// backends' active-connection counts.
#pragma once

#include <linux/bpf.h>
#include <linux/in.h>
#include "bpf_helpers.h"
#include "maps.h"

/* conn_usable says whether entry c still holds for a packet of VIP vm: same VIP id, the
 * slot still the backend's it was pinned to (generation), not idle past the VIP's timeout
 * (past CLOSE_TIMEOUT_NS once the client's FIN was seen), and not a UDP flow of a down
 * backend outside panic. A closing entry kept to the VIP's timeout would send a later
 * connection on the same 5-tuple, whose SYN another node saw, to the old connection's
 * backend when that flow moves here. */
static __always_inline int conn_usable(const struct conn *c, const struct backend *b, const struct vip_meta *vm,
				       __u8 proto, __u64 now)
{
	if (!b || !(b->flags & B_ALIVE) || c->vip_id != vm->id || c->gen != b->gen)
		return 0;
	if (now > c->last_seen && now - c->last_seen > (__u64)vm->idle_timeout * NSEC_PER_SEC)
		return 0;
	if ((c->flags & (C_FIN | C_NAT)) == C_FIN && now > c->last_seen && now - c->last_seen > CLOSE_TIMEOUT_NS)
		return 0;
	if (proto == IPPROTO_UDP && (b->flags & B_DOWN) && !(vm->flags & F_PANIC))
		return 0;
	return 1;
}

/* insert_allowed spends one of this CPU's inserts for the current second: above the cap a
 * new flow is forwarded by the table without being remembered (Katran's answer to floods),
 * so a flood cannot evict established flows faster than the cap allows. */
static __always_inline int insert_allowed(__u64 now)
{
	__u32 zero = 0;
	struct lb_config *cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg || cfg->insert_cap == 0)
		return 1;
	struct insert_budget *ib = bpf_map_lookup_elem(&insert_budget, &zero);
	if (!ib)
		return 1;
	if (now - ib->window >= NSEC_PER_SEC) {
		ib->window = now;
		ib->used = 0;
	}
	if (ib->used >= cfg->insert_cap)
		return 0;
	ib->used++;
	return 1;
}

/* budget_spent says, without spending any, whether this CPU's inserts for the current second
 * are spent: a new flow will not be remembered. */
static __always_inline int budget_spent(__u64 now)
{
	__u32 zero = 0;
	struct lb_config *cfg = bpf_map_lookup_elem(&config, &zero);
	struct insert_budget *ib = bpf_map_lookup_elem(&insert_budget, &zero);
	return cfg && ib && cfg->insert_cap != 0 && now - ib->window < NSEC_PER_SEC && ib->used >= cfg->insert_cap;
}

/* uncount takes entry c out of its backend's active connections, once: of every CPU that
 * sees the flag set, only the one whose atomic clear found it set subtracts. A slot that
 * changed hands since (another generation) had its count reset by the loader. */
static __always_inline void uncount(struct conn *c, const struct backend *b)
{
	if (!(c->flags & C_COUNTED))
		return;
	__u32 old = __sync_fetch_and_and((__u32 *)&c->flags, ~(__u32)C_COUNTED);
	if (!(old & C_COUNTED) || !b || c->gen != b->gen)
		return;
	__u32 slot = c->backend;
	__s64 *a = bpf_map_lookup_elem(&active, &slot);
	if (a)
		__sync_fetch_and_add(a, -1);
}

static __always_inline void count_active(__u32 slot)
{
	__s64 *a = bpf_map_lookup_elem(&active, &slot);
	if (a)
		__sync_fetch_and_add(a, 1);
}
