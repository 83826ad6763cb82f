package l4xdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
)

// Affinity flags of a VIP (mirrors F_* in bpf/lb.c).
const (
	FlagSourceIP = 1
	FlagQUIC     = 2
)

// Path counter indexes (mirrors enum lb_path in bpf/lb.c).
const (
	PathPass = iota
	PathForward
	PathConnHit
	PathConnMiss
	PathFragment
	PathICMPError
	PathMalformed
	PathNoBackend
	PathIPOptions
	PathTCPRST
	PathQUICServerID
	numPaths
)

// PathNames names the path counters for metrics and `stickylb xdp stats`.
var PathNames = [numPaths]string{"pass", "forward", "conn_hit", "conn_miss", "fragment", "icmp_error",
	"malformed", "no_backend", "ip_options", "tcp_rst", "quic_server_id"}

// MaxTableSize is the largest Maglev table a VIP may use (the inner map's size).
const MaxTableSize = 65537

const backendAlive = 1

// emptySlot marks a table slot with no backend (an empty pool).
const emptySlot = ^uint32(0)

// Forwarder holds the loaded program and its maps.
type Forwarder struct {
	objs lbObjects
}

// Load loads the program into the kernel (nothing attached yet).
func Load() (*Forwarder, error) {
	f := &Forwarder{}
	if err := loadLbObjects(&f.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("loading the XDP program: %+v", ve)
		}
		return nil, fmt.Errorf("loading the XDP program (needs root or CAP_BPF): %w", err)
	}
	return f, nil
}

// Close releases the program and maps held by this process (pinned ones stay).
func (f *Forwarder) Close() error { return f.objs.Close() }

// Program is the forwarder's XDP program.
func (f *Forwarder) Program() *ebpf.Program { return f.objs.StickylbXdp }

// FloorProgram is a MAC-swap XDP_TX program, the floor of the benchmarks.
func (f *Forwarder) FloorProgram() *ebpf.Program { return f.objs.FloorXdp }

// PassProgram returns XDP_PASS (for the peers of veths that XDP_TX into).
func (f *Forwarder) PassProgram() *ebpf.Program { return f.objs.PassXdp }

func addr16(a netip.Addr) [16]byte { return a.As16() }

// VIP is one (address, port, protocol) the forwarder serves.
type VIP struct {
	ID        uint32
	Addr      netip.AddrPort
	Proto     uint8 // 6 tcp, 17 udp
	Flags     uint32
	CIDLength uint32
	// Table is the Maglev table: slot -> backend index (see SetBackend). Its length is the
	// table size, a prime up to MaxTableSize.
	Table []uint32
}

func (v VIP) key(withPort bool) lbVipKey {
	k := lbVipKey{Addr: addr16(v.Addr.Addr()), Proto: v.Proto}
	if withPort {
		var p [2]byte
		binary.BigEndian.PutUint16(p[:], v.Addr.Port())
		k.Port = binary.NativeEndian.Uint16(p[:]) // network order in memory
	}
	return k
}

// SetVIP installs or replaces a VIP and its table. The table goes into a fresh inner map
// that is swapped in whole, so a packet sees the old table or the new one, never a mix.
func (f *Forwarder) SetVIP(v VIP) error {
	if len(v.Table) == 0 || len(v.Table) > MaxTableSize {
		return fmt.Errorf("vip %s: table of %d slots (want 1..%d)", v.Addr, len(v.Table), MaxTableSize)
	}
	inner, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: MaxTableSize})
	if err != nil {
		return fmt.Errorf("vip %s: creating its table: %w", v.Addr, err)
	}
	defer inner.Close()
	keys := make([]uint32, len(v.Table))
	for i := range keys {
		keys[i] = uint32(i)
	}
	if _, err := inner.BatchUpdate(keys, v.Table, nil); err != nil {
		return fmt.Errorf("vip %s: filling its table: %w", v.Addr, err)
	}
	if err := f.objs.Maglev.Put(v.ID, inner); err != nil {
		return fmt.Errorf("vip %s: installing its table: %w", v.Addr, err)
	}
	meta := lbVipMeta{Id: v.ID, Flags: v.Flags, TableSize: uint32(len(v.Table)), CidLen: v.CIDLength}
	if err := f.objs.Vips.Put(v.key(true), meta); err != nil {
		return fmt.Errorf("vip %s: %w", v.Addr, err)
	}
	if err := f.objs.VipAddrs.Put(v.key(false), meta); err != nil {
		return fmt.Errorf("vip %s: %w", v.Addr, err)
	}
	return nil
}

// Backend is one backend slot.
type Backend struct {
	MAC     net.HardwareAddr
	Ifindex uint32 // 0: XDP_TX out of the interface the packet came in on
	Alive   bool   // false: flows to it re-pick
}

// SetBackend installs backend slot idx.
func (f *Forwarder) SetBackend(idx uint32, b Backend) error {
	var v lbBackend
	if len(b.MAC) != 6 {
		return fmt.Errorf("backend %d: MAC %q is not 6 bytes", idx, b.MAC)
	}
	copy(v.Mac[:], b.MAC)
	v.Ifindex = b.Ifindex
	if b.Alive {
		v.Flags = backendAlive
	}
	return f.objs.Backends.Put(idx, v)
}

// SetServerID maps a QUIC server_id of a VIP to a backend slot.
func (f *Forwarder) SetServerID(vipID uint32, serverID uint16, idx uint32) error {
	return f.objs.ServerIds.Put(lbServerKey{VipId: vipID, ServerId: uint32(serverID)}, idx)
}

// PathCounts sums the per-CPU path counters.
func (f *Forwarder) PathCounts() (map[string]uint64, error) {
	out := map[string]uint64{}
	for i := uint32(0); i < numPaths; i++ {
		var per []lbCounter
		if err := f.objs.PathStats.Lookup(i, &per); err != nil {
			return nil, err
		}
		var n uint64
		for _, c := range per {
			n += c.Packets
		}
		out[PathNames[i]] = n
	}
	return out, nil
}

// Hash is FNV-1a over b, the hash the program computes (hash_flow, the QUIC DCID hash).
func Hash(b []byte) uint32 {
	h := uint32(2166136261)
	for _, x := range b {
		h = (h ^ uint32(x)) * 16777619
	}
	return h
}

// FlowHashInput returns the bytes the program hashes for a flow: the source address (16
// bytes, IPv4 mapped) for source_ip, else source, destination, ports (as they sit in the
// packet) and protocol.
func FlowHashInput(src, dst netip.Addr, sport, dport uint16, proto uint8, srcOnly bool) []byte {
	s, d := src.As16(), dst.As16()
	b := append([]byte{}, s[:]...)
	if srcOnly {
		return b
	}
	b = append(b, d[:]...)
	b = binary.BigEndian.AppendUint16(b, sport)
	b = binary.BigEndian.AppendUint16(b, dport)
	return append(b, proto)
}
