// Package l4bgp announces the VIPs an L4 node forwards to its routers over BGP, so that
// ECMP spreads flows over the nodes and a node that stops, drains or can no longer forward
// leaves the routers' tables. It runs GoBGP (github.com/osrg/gobgp/v4) in process as an
// announcer only: it originates a /32 or /128 per VIP address, to the peers of the VIP's
// family, with the node's own next hop. Routers should send the node nothing: its import
// policy drops whatever they send, but GoBGP stores a peer's routes before the policy runs,
// so a peer that sends more than a handful (16 per family) has its session ended with a
// Cease (maximum number of prefixes reached), and is dialled again 30 s later.
//
// The forwarder never waits on it: the node tells the Speaker what it serves (SetServed),
// whether it is drained (Drain) and whether it can forward (SetForwarding), and a goroutine
// of the Speaker brings GoBGP's table to that. Only a VIP that leaves waits, briefly, for
// its withdrawal to be handed to GoBGP before its tables are deleted.
package l4bgp
