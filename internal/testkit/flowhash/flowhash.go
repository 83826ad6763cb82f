// Package flowhash is the XDP program's flow hash (hash_flow in l4xdp/bpf/pick.h), written
// in Go from its definition, so that tests can say which backend a flow's packets go to
// without asking the program.
package flowhash

import (
	"encoding/binary"
	"net/netip"
)

// Sum is the program's hash of a flow: the flow's key (source and destination, 16 bytes
// each, IPv4 mapped; the ports as they sit in the packet; the protocol; zero padding to 40
// bytes) read as little-endian 64-bit words, the source's two when srcOnly (source_ip
// stickiness) and all five otherwise, each folded in by xor, multiply and a fold of the
// high half, then a last multiply and fold (splitmix64's constants).
func Sum(src, dst netip.Addr, sport, dport uint16, proto uint8, srcOnly bool) uint32 {
	var k [40]byte
	s, d := src.As16(), dst.As16()
	copy(k[0:], s[:])
	copy(k[16:], d[:])
	binary.BigEndian.PutUint16(k[32:], sport)
	binary.BigEndian.PutUint16(k[34:], dport)
	k[36] = proto
	words := 5
	if srcOnly {
		words = 2
	}
	h := uint64(0x9e3779b97f4a7c15)
	for i := range words {
		h = (h ^ binary.LittleEndian.Uint64(k[8*i:])) * 0xbf58476d1ce4e5b9
		h ^= h >> 31
	}
	h *= 0x94d049bb133111eb
	return uint32(h ^ h>>32)
}
