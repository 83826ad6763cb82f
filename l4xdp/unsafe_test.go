package l4xdp

import "unsafe"

// unsafeSlice views a uint16 field as its two bytes, to write it in network order.
func unsafeSlice(p *uint16) *[2]byte { return (*[2]byte)(unsafe.Pointer(p)) }
