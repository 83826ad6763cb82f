// Package l4bgp announces the VIPs an L4 node forwards to its routers over BGP, so that
// ECMP spreads flows over the nodes and a node that stops, drains or can no longer forward
// leaves the routers' tables. It runs GoBGP (github.com/osrg/gobgp/v4) in process as an
// announcer only: it originates a /32 or /128 per VIP address, to the peers of the VIP's
// family, with the node's own next hop, and keeps nothing the routers send.
//
// The forwarder never waits on it: the node tells the Speaker what it serves (SetServed),
// whether it is drained (Drain) and whether it can forward (SetForwarding), and a goroutine
// of the Speaker brings GoBGP's table to that. Only a VIP that leaves waits, briefly, for
// its withdrawal to be handed to GoBGP before its tables are deleted.
package l4bgp
