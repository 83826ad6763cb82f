// The forwarder's maps as the loader writes them: VIPs and their Maglev tables, backends,
// QUIC server_ids, names.

package l4xdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
)

// Affinity flags of a VIP (mirrors F_* in bpf/consts.h).
const (
	FlagSourceIP = 1
	FlagQUIC     = 2
	// FlagPanic: every backend of the VIP is down, so its table holds them all (fail open)
	// and no flow re-picks for its backend being down.
	FlagPanic = 4
	// FlagWRR: new flows follow the VIP's Schedule (balance weighted_round_robin).
	FlagWRR = 8
	// FlagWLC: new flows go to the backend of Pool with the fewest active connections per
	// weight (balance weighted_least_conn).
	FlagWLC = 16
	// FlagTunnel: the VIP's backends are reached by tunnel, and its new flows pick from the
	// second-chance table (Table's primaries with Second's secondaries).
	FlagTunnel = 32
	// FlagSecondChance: the tunnel VIP's table names secondaries, and a TCP entry idle two
	// seconds is not followed blindly (the packet goes by the table).
	FlagSecondChance = 64
)

// pathNames names the path counters (by index: enum lb_path in bpf/consts.h) for metrics and
// `stickylb xdp stats`.
var pathNames = [...]string{"pass", "forward", "conn_hit", "conn_miss", "fragment", "icmp_error",
	"malformed", "no_backend", "ip_options", "tcp_rst", "quic_server_id", "conn_stale", "insert_refused", "panic",
	"wrr", "wlc", "midstream", "nat_forward", "nat_reply", "nat_no_port", "nat_no_route", "nat_fragment", "nat_stray",
	"nat_reclaim", "tunnel", "tunnel_second", "tunnel_too_big", "tunnel_no_route"}

const numPaths = uint32(len(pathNames))

// MaxTableSize is the largest Maglev table a VIP may use (the inner map's size).
const MaxTableSize = 65537

// Backend flags (mirror B_* in bpf/consts.h).
const (
	backendAlive = 1
	backendDown  = 2
)

// MaxVIPs bounds VIP ids: 1..MaxVIPs-1 (the program's per-VIP arrays have MaxVIPs entries).
const MaxVIPs = 256

// MaxBackends bounds backend slots: 0..MaxBackends-1.
const MaxBackends = 4096

// maxName is the longest VIP or backend name the pinned name maps hold.
const maxName = len(lbName{}.S) - 1

// emptySlot marks a table slot with no backend (an empty pool).
const emptySlot = ^uint32(0)

// Connection-table defaults (see Options).
const (
	DefaultConnTableSize = 1 << 20
	// DefaultInsertCap is Katran's MAX_CONN_RATE: new entries a CPU may make per second.
	DefaultInsertCap = 125000
	// Idle timeouts of a VIP's flows when the VIP sets none, as IPVS's.
	defaultTCPIdle = 900 * time.Second
	defaultUDPIdle = 300 * time.Second
)

// Options size the connection table and its flood guard.
type Options struct {
	// ConnTableSize is the connection table's entries (0: DefaultConnTableSize). An
	// established flow survives a flood as long as the inserts the cap lets through between
	// two of its packets stay well below this.
	ConnTableSize uint32
	// InsertCap is the new entries each CPU may make per second (0: DefaultInsertCap;
	// negative: no cap). Above it a new flow is forwarded by the table, not remembered.
	InsertCap int
	// Recount is how often the loader recounts active connections from the connection
	// table, correcting what LRU evictions (which have no callback) leave (0:
	// DefaultRecount).
	Recount time.Duration
}

func (o Options) recount() time.Duration {
	if o.Recount <= 0 {
		return DefaultRecount
	}
	return o.Recount
}

func (o Options) tableSize() uint32 {
	if o.ConnTableSize == 0 {
		return DefaultConnTableSize
	}
	return o.ConnTableSize
}

func (o Options) insertCap() uint32 {
	switch {
	case o.InsertCap == 0:
		return DefaultInsertCap
	case o.InsertCap < 0:
		return 0 // the program's "no cap"
	}
	return uint32(o.InsertCap)
}

// spec is the forwarder's object with o applied.
func (o Options) spec() (*ebpf.CollectionSpec, error) {
	spec, err := loadLb()
	if err != nil {
		return nil, fmt.Errorf("reading the forwarder's object: %w", err)
	}
	spec.Maps["conns"].MaxEntries = o.tableSize()
	spec.Maps["nat_rev"].MaxEntries = o.tableSize()
	return spec, nil
}

// configure writes o and the NAT sources and ports into the loaded program's config.
func (f *Tables) configure(o Options, n NAT) error {
	cfg := lbLbConfig{InsertCap: o.insertCap()}
	if err := f.configureNAT(&cfg, n); err != nil {
		return err
	}
	if err := f.objs.Config.Put(uint32(0), cfg); err != nil {
		return fmt.Errorf("writing the forwarder's config: %w", err)
	}
	return nil
}

// Tables is the loaded forwarder program and the maps it reads: the loader writes VIPs,
// Maglev tables and backends through it (bpf/lb.c does the forwarding), and reads its
// counters.
type Tables struct {
	objs lbObjects
}

// Close releases the program and maps held by this process (pinned ones stay).
func (f *Tables) Close() error { return f.objs.Close() }

// Program is the forwarder's XDP program.
func (f *Tables) Program() *ebpf.Program { return f.objs.StickylbXdp }

// LoadPass loads the XDP_PASS program of `stickylb xdp pass` (for the peers of veths that
// XDP_TX into), from its own small object; Close releases it.
func LoadPass() (*ebpf.Program, error) {
	var objs passObjects
	if err := loadPassObjects(&objs, nil); err != nil {
		return nil, fmt.Errorf("loading the XDP_PASS program (needs root or CAP_BPF): %w", err)
	}
	return objs.PassXdp, nil
}

func addr16(a netip.Addr) [16]byte { return a.As16() }

// VIP is one (address, port, protocol) the forwarder serves.
type VIP struct {
	ID        uint32
	Addr      netip.AddrPort
	Proto     uint8 // 6 tcp, 17 udp
	Flags     uint32
	CIDLength uint32
	// IdleTimeout is how long a flow may send nothing and keep its entry (0: 900 s for TCP,
	// 300 s for UDP); whole seconds.
	IdleTimeout time.Duration
	// Table is the Maglev table: slot -> backend index (see SetBackend). Its length is the
	// table size, a prime up to MaxTableSize.
	Table []uint32
	// Schedule is the weighted round-robin sequence of backend indexes new flows follow
	// (FlagWRR), or from which weighted least connections draws its candidates (FlagWLC);
	// at most MaxTableSize entries.
	Schedule []uint32
	// Pool is the backends weighted least connections compares (FlagWLC); above
	// WLCScan of them a pick compares two candidates drawn from Schedule.
	Pool []uint32
	// Second is the second-chance table's secondaries, row by row beside Table's primaries
	// (FlagTunnel; emptySlot: none).
	Second []uint32
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
func (f *Tables) SetVIP(v VIP) error {
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
	if err := f.setTunnelTable(v); err != nil {
		return err
	}
	if err := f.objs.Maglev.Put(v.ID, inner); err != nil {
		return fmt.Errorf("vip %s: installing its table: %w", v.Addr, err)
	}
	if err := f.setSchedule(v); err != nil {
		return err
	}
	idle := v.IdleTimeout
	if idle <= 0 {
		idle = defaultTCPIdle
		if v.Proto == 17 {
			idle = defaultUDPIdle
		}
	}
	meta := lbVipMeta{Id: v.ID, Flags: v.Flags, TableSize: uint32(len(v.Table)), CidLen: v.CIDLength,
		IdleTimeout: uint32(max(idle/time.Second, 1))}
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
	// Down records the health verdict: the backend is out of the tables (unless its VIP is
	// in panic), its UDP flows re-pick; a restarted loader reads it back.
	Down bool
	// Gen is the slot's generation: a connection-table entry made for another generation
	// (the slot's previous backend) is a miss.
	Gen uint32
	// NAT: the backend is reached by NAT, at Addr (MAC and Ifindex are then unused: the
	// next hop comes from the kernel's FIB).
	NAT bool
	// Tunnel: the backend is reached by tunnel, at Addr's address and to its port (the
	// tunnel's UDP port); the next hop comes from the FIB, as NAT's.
	Tunnel bool
	Addr   netip.AddrPort
}

// SetBackend installs backend slot idx.
func (f *Tables) SetBackend(idx uint32, b Backend) error {
	var v lbBackend
	if len(b.MAC) != 6 {
		return fmt.Errorf("backend %d: MAC %q is not 6 bytes", idx, b.MAC)
	}
	copy(v.Mac[:], b.MAC)
	v.Ifindex, v.Gen = b.Ifindex, b.Gen
	if b.NAT || b.Tunnel {
		v.Addr = b.Addr.Addr().Unmap().As16() // IPv4 as ::ffff:a.b.c.d, as the program's flows
		v.Port = netOrder(b.Addr.Port())
	}
	if b.NAT {
		v.Flags |= backendNAT
	}
	if b.Tunnel {
		v.Flags |= backendTunnel
	}
	if b.Alive {
		v.Flags |= backendAlive
	}
	if b.Down {
		v.Flags |= backendDown
	}
	return f.objs.Backends.Put(idx, v)
}

// netOrder is port p as the program holds it: network order in memory.
func netOrder(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

// slotReach is how slot idx's backend is reached now: by NAT, at which address (a change
// is a change of hands: the slot's flows re-pick).
func (f *Tables) slotReach(idx uint32) (nat bool, addr [16]byte, port uint16) {
	var b lbBackend
	if err := f.objs.Backends.Lookup(idx, &b); err != nil {
		return false, addr, 0
	}
	return b.Flags&backendNAT != 0, b.Addr, b.Port
}

// slotMAC is the MAC slot idx's backend is reached at, nil when it has none (never
// written, reached by NAT, removed).
func (f *Tables) slotMAC(idx uint32) net.HardwareAddr {
	var b lbBackend
	if err := f.objs.Backends.Lookup(idx, &b); err != nil || b.Flags&backendNAT != 0 || b.Mac == [6]byte{} {
		return nil
	}
	return net.HardwareAddr(b.Mac[:])
}

// slotGen is slot idx's current generation (0 for a slot never written).
func (f *Tables) slotGen(idx uint32) uint32 {
	var b lbBackend
	if err := f.objs.Backends.Lookup(idx, &b); err != nil {
		return 0
	}
	return b.Gen
}

// PruneServerIDs removes every QUIC server_id mapping not in keep.
func (f *Tables) PruneServerIDs(keep map[lbServerKey]uint32) error {
	var k lbServerKey
	var v uint32
	var stale []lbServerKey
	it := f.objs.ServerIds.Iterate()
	for it.Next(&k, &v) {
		if w, ok := keep[k]; !ok || w != v {
			stale = append(stale, k)
		}
	}
	errs := []error{it.Err()}
	for _, k := range stale {
		if err := f.objs.ServerIds.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// zeroCounter resets one per-CPU counter (a slot or id taken by a new name).
func (f *Tables) zeroCounter(m *ebpf.Map, idx uint32) error {
	return m.Put(idx, make([]lbCounter, ebpf.MustPossibleCPU()))
}

// PruneVIPs removes every VIP not in keep: its (address, port, protocol) and address
// entries, and the tables of ids no VIP in keep uses. A VIP whose address changed loses its
// old address here.
func (f *Tables) PruneVIPs(keep []VIP) error {
	wantVIP, wantAddr, wantID := map[lbVipKey]bool{}, map[lbVipKey]bool{}, map[uint32]bool{}
	for _, v := range keep {
		wantVIP[v.key(true)], wantAddr[v.key(false)], wantID[v.ID] = true, true, true
	}
	var errs []error
	for _, m := range []struct {
		m    *ebpf.Map
		want map[lbVipKey]bool
	}{{f.objs.Vips, wantVIP}, {f.objs.VipAddrs, wantAddr}} {
		var k lbVipKey
		var meta lbVipMeta
		var stale []lbVipKey
		it := m.m.Iterate()
		for it.Next(&k, &meta) {
			if !m.want[k] {
				stale = append(stale, k)
			}
		}
		if err := it.Err(); err != nil {
			errs = append(errs, fmt.Errorf("listing VIPs: %w", err))
		}
		for _, k := range stale {
			if err := m.m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("removing a VIP: %w", err))
			}
		}
	}
	for id := uint32(1); id < MaxVIPs; id++ {
		if !wantID[id] {
			if err := f.objs.Maglev.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("removing the table of VIP %d: %w", id, err))
			}
			if err := f.objs.Schedules.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("removing the schedule of VIP %d: %w", id, err))
			}
			if err := f.objs.TunnelTables.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("removing the second-chance table of VIP %d: %w", id, err))
			}
		}
	}
	return errors.Join(errs...)
}

func toName(s string) (lbName, error) {
	var n lbName
	if len(s) > maxName {
		return n, fmt.Errorf("name %q is longer than %d bytes", s, maxName)
	}
	for i := 0; i < len(s); i++ {
		n.S[i] = int8(s[i])
	}
	return n, nil
}

func fromName(n lbName) string {
	b := make([]byte, 0, len(n.S))
	for _, c := range n.S {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// names reads a name map: index -> name, for the set entries.
func names(m *ebpf.Map) (map[uint32]string, error) {
	out := map[uint32]string{}
	var k uint32
	var n lbName
	it := m.Iterate()
	for it.Next(&k, &n) {
		if s := fromName(n); s != "" {
			out[k] = s
		}
	}
	return out, it.Err()
}

// SetServerID maps a QUIC server_id of a VIP to a backend slot.
func (f *Tables) SetServerID(vipID uint32, serverID uint16, idx uint32) error {
	return f.objs.ServerIds.Put(lbServerKey{VipId: vipID, ServerId: uint32(serverID)}, idx)
}
