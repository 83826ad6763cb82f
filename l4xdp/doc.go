// Package l4xdp is stickylb's L3/L4 forwarder: a BPF XDP program that sends TCP and UDP
// flows to a VIP's backends by direct routing (MAC rewrite, XDP_TX or redirect), with
// Maglev tables built by policies/chash, a connection table shared by every CPU, and
// defined paths for fragments, ICMP errors, IP options and malformed packets; and the Go
// loader that fills its maps from a pools file.
package l4xdp
