// Package l4xdp is stickylb's L3/L4 forwarder: a BPF XDP program (bpf/lb.c and its headers)
// that sends the TCP and UDP flows of a VIP to its backends, and the Go loader that attaches
// it and keeps its maps in step with the services it is given.
//
// The program, per packet to a VIP: the connection table first (one LRU hash shared by every
// CPU, keyed by the 5-tuple; an entry holds while its VIP id, its backend slot's generation
// and its idle timeout still match), else a pick by the service's balance, remembered within
// a per-CPU insert cap (the flood guard). The picks:
//   - maglev: the VIP's weighted Maglev table (built in Go by policies/chash, swapped whole
//     through a map of maps) at a hash of the 5-tuple, the source address (source_ip) or the
//     QUIC connection ID (quic_cid, whose server_id names a backend directly);
//   - weighted_round_robin: the next entry of the VIP's smooth weighted schedule;
//   - weighted_least_conn: the fewest active connections per weight, counted by the program
//     from the client side and recounted by the loader from the connection table.
//
// A backend is reached by direct routing (the MACs rewritten, XDP_TX or a redirect) or, off
// the LB's subnets, by NAT: the flow leaves from one of the node's NAT sources and a port of
// its range, routed by the kernel's FIB, and the backend's replies and ICMP errors are
// rewritten back. Fragments, ICMP errors, IP options, RSTs and malformed packets have paths
// of their own, each counted (Tables.Stats; Loader.Status for the status page).
//
// The loader (Loader, from Open) decides which backends take a service's new flows on this
// node: zones (cross_zone, drained_zones; the node's own zone first), health (its own
// checkers of policies/health, or the verdicts of a control plane), drain, slow start, and
// fail open when every backend is down (panic). It is fed either by a pools file
// (Loader.Apply, again at each reload) or by the view the control plane pushes
// (Loader.ApplyView, with that view's verdicts; it then probes nothing). An edit is checked
// whole before a map is written, so one that fails leaves the running config as it was.
//
// The link and the maps are pinned on a bpffs: a stopped loader leaves the program
// forwarding, and the next one adopts the maps that fit its layout, swaps its program in
// through the pinned link, and reads back every backend slot and VIP id (which the
// connection table refers to) and each backend's last health verdict, so a restart or an
// upgrade drops no flow. Detach removes it all.
//
// docs/xdp.md is the user's guide; docs/architecture.md says where to start reading.
package l4xdp
