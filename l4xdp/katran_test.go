//go:build katran

package l4xdp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/stickylb/stickylb/internal/testkit/netnstest"
	"github.com/stickylb/stickylb/policies/chash"
)

// BenchmarkKatran times Katran's balancer beside ours through BPF_PROG_RUN, in one process,
// on the same frames. Nothing of Katran is in this repository: bench/katran.sh builds
// Katran's balancer.bpf.o from a checkout the user supplies, with Katran's own flags, and
// names it in KATRAN_OBJ; only `go test -tags katran` compiles this file.
//
// Katran's maps are filled as its tester does: one TCP VIP (10.200.1.1:80, vip_num 0),
// three reals (10.0.0.1-3, ids 1-3), its consistent-hashing ring (RING_SIZE entries: the
// Maglev table of policies/chash over the three reals, the table our program gets too),
// its default MAC (00:00:de:ad:be:af) in ctl_array. The tester leaves lru_mapping empty, so
// Katran falls back to its 1,000-entry fallback_cache and counts it on every packet; here
// every CPU's slot holds one LRU of our connection table's size, as a Katran with
// forwarding cores runs.
//
// Paths (a frame each, the same bytes to both programs):
//
//	established: an ACK of a flow both programs hold (its SYN was forwarded first).
//	new-flow:    a SYN of a 5-tuple never seen: every packet is a new flow, inserted (both
//	             programs' insert budgets are reset before every run of at most 100,000).
//	over-cap:    a SYN of an unseen 5-tuple while the CPU's insert budget is spent (Katran's
//	             MAX_CONN_RATE, our --conn-insert-cap): picked and forwarded, not remembered.
//	pass:        TCP to an address that is no VIP: XDP_PASS.
//	tunnel:      an ACK of a flow both programs hold, to a second VIP (10.200.1.2:80, the same
//	             ring in Katran): Katran's IPIP encapsulation beside ours of a forwarding:
//	             tunnel VIP with second chance (GUE, the outer source port from the flow,
//	             the next hop from the FIB; no secondary: the entry knows the backend), its backends
//	             10.1.0.21-23 behind a router. The established path's DR arm is the
//	             reference of the tunnel's goal (at most 1.3x).
//
// Every run is in a namespace of the benchmark's own, as if the frame came in on its veth
// lb0 (BPF_PROG_RUN's ingress_ifindex): the tunnel's FIB lookup answers from that
// namespace's route to the backends, out of lb0 again, so the tunnel ends in XDP_TX as
// Katran's IPIP and our DR do.
//
// Modes:
//
//	call: one BPF_PROG_RUN with repeat=1 per packet, as Katran's perf tester runs
//	      (`katran_tester -perf_testing`): the kernel's figure for one run, its clock reads
//	      included.
//	loop: repeat=N behind a wrapper that writes the frame back (and moves the start of the
//	      packet back where Katran's encapsulation moved it) and tail-calls the program
//	      under test: Katran's output is not its input, so it cannot be repeated as is.
//	      For new-flow the wrapper also writes the next 5-tuple. impl=wrapper tail-calls a
//	      program that only returns XDP_TX: what the wrapper costs. impl=*-direct runs
//	      without the wrapper where a program's output is its next input.
//
// Before timing, each arm is run once and its verdict and output frame are compared with
// the frame built here (Katran's IPIP encapsulation toward the real its jhash picks; our
// MAC rewrite toward the backend our flow hash picks; our GUE toward the row's primary,
// which the flow's SYN took); after timing, the programs' counters must
// have moved on the arm's path only. Rounds interleave the arms; bench/katran.sh takes the
// medians.
func BenchmarkKatran(b *testing.B) {
	obj := os.Getenv("KATRAN_OBJ")
	if obj == "" {
		b.Skip("KATRAN_OBJ names no Katran object: run bench/katran.sh KATRAN_DIR")
	}
	netnstest.NeedRoot(b)
	k := newKatranRig(b, obj)
	for r := 1; r <= katranRounds; r++ {
		b.Run(fmt.Sprintf("round=%d", r), func(b *testing.B) {
			for _, a := range k.arms {
				b.Run(a.name, func(b *testing.B) {
					k.kit.MustDo("lb", func() error { k.time(b, a); return nil })
				})
			}
		})
	}
}

const (
	katranRounds = 7
	// katranChunk is the most packets one BPF_PROG_RUN (or, per call, one stretch of calls)
	// runs between two resets of the insert budgets: below both programs' caps (125,000 a
	// second), so a new-flow run never reaches them.
	katranChunk = 100000
	// katranRenew is how long the per-call arms go before renewing the insert budgets.
	katranRenew = 100 * time.Millisecond
	// katranMaxConnRate is Katran's MAX_CONN_RATE (balancer_consts.h).
	katranMaxConnRate = 125000
	// Katran's counters in its stats map, at MAX_VIPS + these (balancer_consts.h).
	kstatLRU         = 0  // v1: packets to a VIP; v2: connection-table misses
	kstatLRUMiss     = 1  // v1: TCP SYN misses; v2: non-SYN misses
	kstatNewConnRate = 2  // v1: new flows in the current second; v2: the second's start
	kstatFallbackLRU = 3  // v1: packets that found no per-CPU LRU
	kstatXDPPass     = 19 // v1: XDP_PASS verdicts
	// newFlowLoopBase is where the loop arms' new 5-tuples start, above the per-call arms'
	// (each program's table must see every new-flow tuple once).
	newFlowLoopBase = 1 << 31
	ipprotoIPIP     = 4
)

var (
	katranVIP        = netip.MustParseAddrPort("10.200.1.1:80")
	katranTunVIP     = netip.MustParseAddrPort("10.200.1.2:80") // our tunnel VIP; Katran's vip_num 1
	katranReals      = []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")}
	katranDefaultMAC = net.HardwareAddr{0x00, 0x00, 0xde, 0xad, 0xbe, 0xaf}
	katranClient     = netip.MustParseAddr("192.168.1.1")
	katranNoVIP      = netip.MustParseAddr("10.200.1.99")
	// newFlowNet: new flows come from 198.18.x.y, port p, x.y.p counting up one per packet.
	newFlowNet = netip.MustParseAddr("198.18.0.0")
)

// katranLB is Katran's balancer, loaded with its maps filled.
type katranLB struct {
	prog     *ebpf.Program
	stats    *ebpf.Map
	lru      *ebpf.Map
	maxVips  uint32
	ringSize uint32
	seed     uint32   // INIT_JHASH_SEED: CH_RINGS_SIZE
	ring     []uint32 // real id at each ring position of vip_num 0
}

type katranStat struct{ V1, V2 uint64 }

// loadKatran loads Katran's object from path and fills its maps; table is the ring (as
// 0-based real indexes).
func loadKatran(tb testing.TB, path string, table []uint32) *katranLB {
	tb.Helper()
	spec, err := ebpf.LoadCollectionSpec(path)
	if err != nil {
		tb.Fatalf("reading Katran's object %s: %v", path, err)
	}
	for _, name := range []string{"stats", "ch_rings", "lru_mapping", "vip_map", "reals", "ctl_array"} {
		if spec.Maps[name] == nil {
			tb.Fatalf("Katran's object %s has no map %q", path, name)
		}
	}
	lm := spec.Maps["lru_mapping"]
	if lm.InnerMap == nil {
		tb.Fatalf("Katran's lru_mapping has no inner map")
	}
	lm.InnerMap = lm.InnerMap.Copy()
	lm.InnerMap.MaxEntries = DefaultConnTableSize
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		tb.Fatalf("loading Katran's object: %+v", err)
	}
	tb.Cleanup(coll.Close)
	k := &katranLB{prog: coll.Programs["balancer_ingress"], stats: coll.Maps["stats"]}
	if k.prog == nil {
		tb.Fatalf("Katran's object has no program balancer_ingress")
	}
	k.maxVips = spec.Maps["stats"].MaxEntries / 2 // STATS_MAP_SIZE is MAX_VIPS * 2
	k.seed = spec.Maps["ch_rings"].MaxEntries     // CH_RINGS_SIZE is MAX_VIPS * RING_SIZE
	k.ringSize = k.seed / k.maxVips
	if k.ringSize != uint32(len(table)) {
		tb.Fatalf("Katran's RING_SIZE is %d; the benchmark's table has %d", k.ringSize, len(table))
	}
	k.lru, err = ebpf.NewMap(lm.InnerMap)
	if err != nil {
		tb.Fatalf("creating Katran's LRU: %v", err)
	}
	tb.Cleanup(func() { k.lru.Close() })
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		tb.Fatal(err)
	}
	for cpu := 0; cpu < cpus && uint32(cpu) < lm.MaxEntries; cpu++ {
		if err := coll.Maps["lru_mapping"].Put(uint32(cpu), k.lru); err != nil {
			tb.Fatalf("installing Katran's LRU for CPU %d: %v", cpu, err)
		}
	}
	put := func(m string, key, val any) {
		if err := coll.Maps[m].Put(key, val); err != nil {
			tb.Fatalf("filling Katran's %s: %v", m, err)
		}
	}
	put("vip_map", katranVIPKey(katranVIP), make([]byte, 8)) // vip_meta: flags 0, vip_num 0
	tunMeta := make([]byte, 8)
	binary.NativeEndian.PutUint32(tunMeta[4:], 1) // vip_num 1: its ring follows vip_num 0's
	put("vip_map", katranVIPKey(katranTunVIP), tunMeta)
	for i, r := range katranReals {
		v := make([]byte, 20) // real_definition: the address, flags 0 (IPv4)
		a := r.As4()
		copy(v, a[:])
		put("reals", uint32(i+1), v)
	}
	k.ring = make([]uint32, len(table))
	for i, t := range table {
		k.ring[i] = t + 1 // real ids start at 1
		put("ch_rings", uint32(i), k.ring[i])
		put("ch_rings", k.ringSize+uint32(i), k.ring[i])
	}
	mac := make([]byte, 8) // ctl_value: the default router's MAC at position 0
	copy(mac, katranDefaultMAC)
	put("ctl_array", uint32(0), mac)
	return k
}

// katranVIPKey is Katran's vip_definition of an IPv4 VIP: the address, the port as the
// packet carries it, the protocol.
func katranVIPKey(v netip.AddrPort) []byte {
	key := make([]byte, 20)
	a := v.Addr().As4()
	copy(key, a[:])
	binary.BigEndian.PutUint16(key[16:], v.Port())
	key[18] = 6
	return key
}

// stat sums Katran's per-CPU counter MAX_VIPS + idx; max is its largest v1 on one CPU.
func (k *katranLB) stat(tb testing.TB, idx uint32) (sum katranStat, max uint64) {
	tb.Helper()
	var per []katranStat
	if err := k.stats.Lookup(k.maxVips+idx, &per); err != nil {
		tb.Fatalf("reading Katran's stats: %v", err)
	}
	for _, s := range per {
		sum.V1 += s.V1
		sum.V2 += s.V2
		if s.V1 > max {
			max = s.V1
		}
	}
	return sum, max
}

// setNewConnRate writes Katran's new-connection count for the second starting now, on every
// CPU.
func (k *katranLB) setNewConnRate(tb testing.TB, count uint64) {
	tb.Helper()
	per := make([]katranStat, possibleCPUs(tb))
	for i := range per {
		per[i] = katranStat{V1: count, V2: monotonic(tb, unix.CLOCK_MONOTONIC)}
	}
	if err := k.stats.Put(k.maxVips+kstatNewConnRate, per); err != nil {
		tb.Fatalf("writing Katran's connection rate: %v", err)
	}
}

// real returns the real Katran's ring gives a TCP flow: jhash_2words of the source address
// and the ports (as loaded from the packet, on a little-endian machine) into the ring.
func (k *katranLB) real(src netip.Addr, sport, dport uint16) netip.Addr {
	s := src.As4()
	var ports [4]byte
	binary.BigEndian.PutUint16(ports[:], sport)
	binary.BigEndian.PutUint16(ports[2:], dport)
	h := jhash2Words(binary.LittleEndian.Uint32(s[:]), binary.LittleEndian.Uint32(ports[:]), k.seed)
	return katranReals[k.ring[h%k.ringSize]-1]
}

// jhash2Words is the Linux kernel's jhash_2words (Bob Jenkins' lookup3 final mix), which
// Katran hashes IPv4 flows with; written here from its definition.
func jhash2Words(a, b, initval uint32) uint32 {
	iv := initval + 0xdeadbeef + 2<<2
	a, b, c := a+iv, b+iv, iv
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return c
}

// katranEncap is what Katran sends for frame in toward real: a new Ethernet header (to the
// default MAC, from the frame's destination), an outer IPv4 header (IPIP, from
// 172.16.0.0/16 xor'd with the source port, TTL 64, the inner TOS), the frame's IP packet.
func katranEncap(in []byte, src netip.Addr, sport uint16, real netip.Addr) []byte {
	out := make([]byte, 0, len(in)+20)
	out = append(out, katranDefaultMAC...)
	out = append(out, in[0:6]...)
	out = append(out, 0x08, 0x00)
	ip := make([]byte, 20)
	ip[0], ip[1] = 0x45, in[15]
	binary.BigEndian.PutUint16(ip[2:], binary.BigEndian.Uint16(in[16:])+20)
	ip[8], ip[9] = 64, ipprotoIPIP
	s := src.As4()
	suffix := (uint32(sport)<<16 ^ binary.LittleEndian.Uint32(s[:])) & 0xffff0000
	binary.LittleEndian.PutUint32(ip[12:], suffix|4268) // IPIP_V4_PREFIX: 172.16
	d := real.As4()
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[10:], ipv4Checksum(ip))
	out = append(out, ip...)
	return append(out, in[14:]...)
}

// katranRig holds both programs, the floors and the arms, and the namespace they run in.
type katranRig struct {
	ours    *Tables
	table   []uint32
	tun     tunTable // our tunnel VIP's table (slots katranTunSlot..)
	kt      *katranLB
	arms    []*katranArm
	kit     *netnstest.Kit
	ifindex uint32 // lb0's: every run's ingress
}

// katranTunSlot is our first tunnel backend's slot (tunA, tunB, tunC follow the DR ones).
const katranTunSlot = 3

// katranArm is one sub-benchmark: mode=/path=/impl=.
type katranArm struct {
	name string
	prog *ebpf.Program
	in   []byte
	want uint32
	// perCall: one BPF_PROG_RUN per packet; else repeat, at most katranChunk a call.
	perCall bool
	// vary (per call): the next new 5-tuple, numbered from varyNext, written into in
	// before each call.
	vary     bool
	varyNext uint32
	// wrap is the loop wrapper prog is (nil: the program itself runs).
	wrap *wrapper
	// prepare runs before each chunk (the insert budgets).
	prepare func(tb testing.TB)
	// verify checks one run's verdict and output (before timing); after checks the
	// counters against those read before timing, for n packets.
	verify func(tb testing.TB, a *katranArm)
	before func(tb testing.TB) any
	after  func(tb testing.TB, before any, n int)
}

func newKatranRig(b *testing.B, obj string) *katranRig {
	kit, ifindex := katranNetns(b)
	ours, err := loadTables(Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ours.Close() })
	hosts := make([]chash.Host, len(katranReals))
	for i, r := range katranReals {
		hosts[i] = chash.Host{ID: r.String(), Weight: 1}
	}
	table := maglevSlots(b, hosts...)
	for i := range katranReals {
		if err := ours.SetBackend(uint32(i), Backend{MAC: backMACs[i], Alive: true}); err != nil {
			b.Fatal(err)
		}
	}
	if err := ours.SetVIP(VIP{ID: 1, Addr: katranVIP, Proto: 6, Table: table}); err != nil {
		b.Fatal(err)
	}
	tun := katranTunnel(b, ours)
	k := &katranRig{ours: ours, table: table, tun: tun, kt: loadKatran(b, obj, table), kit: kit, ifindex: ifindex}
	k.establish(b)
	k.arms = k.makeArms(b)
	return k
}

// katranNetns makes the namespace every run is in: veth lb0 (lbMAC, natLB4/24) with the
// route to our tunnel backends (10.1.0.0/24) via natRouter4, a permanent neighbour, and
// forwarding on (bpf_fib_lookup answers only where it is). It returns lb0's index.
func katranNetns(b *testing.B) (*netnstest.Kit, uint32) {
	kit := netnstest.New(b, "kt")
	kit.AddNS("lb")
	ns := kit.Name("lb")
	kit.Run("ip", "-n", ns, "link", "add", "lb0", "address", lbMAC.String(), "type", "veth", "peer", "name", "lb0p")
	kit.Run("ip", "-n", ns, "link", "set", "lb0", "up")
	kit.Run("ip", "-n", ns, "link", "set", "lb0p", "up")
	kit.Run("ip", "-n", ns, "address", "add", natLB4.String()+"/24", "dev", "lb0")
	kit.Run("ip", "-n", ns, "route", "add", "10.1.0.0/24", "via", natRouter4.String(), "dev", "lb0")
	kit.Run("ip", "-n", ns, "neigh", "replace", natRouter4.String(), "lladdr", routerMAC.String(), "nud", "permanent", "dev", "lb0")
	kit.In("lb", "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
	var ifindex uint32
	kit.MustDo("lb", func() error {
		ifc, err := net.InterfaceByName("lb0")
		if err == nil {
			ifindex = uint32(ifc.Index)
		}
		return err
	})
	return kit, ifindex
}

// katranTunnel gives ours the tunnel VIP katranTunVIP over tunA, tunB and tunC (slots
// katranTunSlot..), with second chance, the tunnel's source natLB4; it returns the VIP's
// table.
func katranTunnel(b *testing.B, ours *Tables) tunTable {
	if err := ours.configureTunnel(natLB4, netip.Addr{}); err != nil {
		b.Fatal(err)
	}
	hosts := []tunHost{{addr: tunA}, {addr: tunB}, {addr: tunC}}
	for i, h := range hosts {
		slot := uint32(katranTunSlot + i)
		if err := ours.SetBackend(slot, Backend{MAC: backMACs[0], Alive: true, Tunnel: true, Addr: netip.AddrPortFrom(h.addr, tunnelPort)}); err != nil {
			b.Fatal(err)
		}
		if err := ours.SetWeight(slot, 1); err != nil {
			b.Fatal(err)
		}
	}
	tt := newTunTable(b, true, hosts...) // slots 0.. as tunSlot numbers them: moved up
	for i := range tt.primary {
		for _, s := range []*uint32{&tt.primary[i], &tt.second[i]} {
			if *s != emptySlot {
				*s += katranTunSlot
			}
		}
	}
	if err := ours.SetVIP(tunVIP(2, katranTunVIP, 6, tt)); err != nil {
		b.Fatal(err)
	}
	return tt
}

// establish forwards the established flows' SYNs through both programs, below their caps.
func (k *katranRig) establish(tb testing.TB) {
	k.resetBudgets(tb, false)
	k.kit.MustDo("lb", func() error {
		for _, vip := range []netip.Addr{katranVIP.Addr(), katranTunVIP.Addr()} {
			syn := tcp4(tb, katranClient, vip, 31337, 80, "S", nil, nil)
			for _, p := range []*ebpf.Program{k.ours.Program(), k.kt.prog} {
				if ret, _, _ := k.run(tb, p, syn, 1); ret != xdpTX {
					tb.Fatalf("establishing the flow to %v: action %d", vip, ret)
				}
			}
		}
		return nil
	})
}

// katranTunFrame is the tunnel arm's ACK, as tcp4 builds the others' but with 6 bytes of
// payload: 60 bytes without Ethernet's padding, which the tunnel would cut (it sends the IP
// packet) and the loop's wrapper, which gives back only what was added in front, could not
// put back.
func katranTunFrame(tb testing.TB) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: katranClient.AsSlice(), DstIP: katranTunVIP.Addr().AsSlice(), Id: 7}
	tc := &layers.TCP{SrcPort: 31337, DstPort: 80, Seq: 1, Window: 65535, ACK: true}
	tc.SetNetworkLayerForChecksum(ip)
	f := serialize(tb, eth(lbMAC, clientMAC, layers.EthernetTypeIPv4), ip, tc, gopacket.Payload("hello!"))
	if len(f) != 60 {
		tb.Fatalf("the tunnel arm's frame is %d bytes, want 60", len(f))
	}
	return f
}

// touchTunnelFlow marks the tunnel arm's entry seen now: with second chance, an entry idle
// 2 s is not followed (tunnel_trusts), and the arms of a round run longer than that apart.
func (k *katranRig) touchTunnelFlow(tb testing.TB) {
	tb.Helper()
	key := lbFlow{Src: katranClient.As16(), Dst: katranTunVIP.Addr().As16(), Proto: 6}
	key.Sport, key.Dport = netOrder(31337), netOrder(80)
	var c lbConn
	if err := k.ours.objs.Conns.Lookup(&key, &c); err != nil {
		tb.Fatalf("the tunnel flow's entry: %v", err)
	}
	c.LastSeen = monoNow()
	if err := k.ours.objs.Conns.Put(&key, &c); err != nil {
		tb.Fatal(err)
	}
}

// progTestRun is struct bpf_attr as BPF_PROG_TEST_RUN takes it.
type progTestRun struct {
	ProgFD, Retval, DataSizeIn, DataSizeOut uint32
	DataIn, DataOut                         uint64
	Repeat, Duration, CtxSizeIn, CtxSizeOut uint32
	CtxIn, CtxOut                           uint64
	Flags, CPU, BatchSize, _                uint32
}

// run runs p on in, repeat times, as if in came in on lb0 (cilium/ebpf's Benchmark takes no
// context): the verdict, the last output frame and the kernel's time per run. The caller
// is in the rig's namespace. An interrupted run is run again.
func (k *katranRig) run(tb testing.TB, p *ebpf.Program, in []byte, repeat int) (uint32, []byte, time.Duration) {
	tb.Helper()
	out := make([]byte, len(in)+256)
	ctx := xdpMD{DataEnd: uint32(len(in)), IngressIfindex: k.ifindex}
	attr := progTestRun{ProgFD: uint32(p.FD()), DataSizeIn: uint32(len(in)), DataSizeOut: uint32(len(out)),
		DataIn: uint64(uintptr(unsafe.Pointer(&in[0]))), DataOut: uint64(uintptr(unsafe.Pointer(&out[0]))),
		Repeat: uint32(repeat), CtxSizeIn: uint32(unsafe.Sizeof(ctx)), CtxIn: uint64(uintptr(unsafe.Pointer(&ctx)))}
	for {
		_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_TEST_RUN, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
		runtime.KeepAlive(in)
		runtime.KeepAlive(out)
		runtime.KeepAlive(&ctx)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			tb.Fatalf("BPF_PROG_TEST_RUN: %v", errno)
		}
		return attr.Retval, out[:attr.DataSizeOut], time.Duration(attr.Duration)
	}
}

// resetBudgets starts a new second of both programs' insert budgets on every CPU: empty,
// or spent (a flood above the cap).
func (k *katranRig) resetBudgets(tb testing.TB, spent bool) {
	tb.Helper()
	count := uint64(0)
	if spent {
		count = 1 << 40
	}
	k.kt.setNewConnRate(tb, count)
	setInsertBudget(tb, k.ours, count)
}

// newFlow returns frame in with new 5-tuple number c written in: source 198.18.x.y port p,
// where x.y.p is c.
func newFlow(in []byte, c uint32) []byte {
	out := append([]byte(nil), in...)
	binary.BigEndian.PutUint16(out[14+14:], uint16(c>>16))
	binary.BigEndian.PutUint16(out[14+20:], uint16(c))
	return out
}

// newFlowTuple is the source of new 5-tuple number c.
func newFlowTuple(c uint32) (netip.Addr, uint16) {
	a := newFlowNet.As4()
	a[2], a[3] = byte(c>>24), byte(c>>16)
	return netip.AddrFrom4(a), uint16(c)
}

func (k *katranRig) makeArms(b *testing.B) []*katranArm {
	vip := katranVIP.Addr()
	est := tcp4(b, katranClient, vip, 31337, 80, "A", nil, nil)
	over := tcp4(b, katranClient, vip, 31338, 80, "S", nil, nil)
	fresh := tcp4(b, newFlowNet, vip, 0, 80, "S", nil, nil)
	pass := tcp4(b, katranClient, katranNoVIP, 31337, 80, "A", nil, nil)
	tun := katranTunFrame(b)
	tp := loadTestProgs(b)
	nop := nopXDP(b)

	// What each program must answer for a frame (its source and port given).
	oursOut := func(in []byte, src netip.Addr, sport uint16) []byte {
		slot := k.table[flowHash(src, vip, sport, 80, 6, false)%uint32(len(k.table))]
		out := append([]byte(nil), in...)
		copy(out[0:6], backMACs[slot])
		copy(out[6:12], lbMAC)
		return out
	}
	ktOut := func(in []byte, src netip.Addr, sport uint16) []byte {
		return katranEncap(in, src, sport, k.kt.real(src, sport, 80))
	}
	// Ours through the tunnel: GUE to the backend of the flow's entry, the row's primary when
	// its SYN came; a packet that hits its entry carries no secondary (its backend is known).
	tunOut := func(in []byte, src netip.Addr, sport uint16) []byte {
		pri, _ := k.tun.pair(flowHash(src, katranTunVIP.Addr(), sport, 80, 6, false))
		return tunneledIP(b, in[14:], src, sport, 80, pri, netip.Addr{})
	}
	fixed := func(in []byte, src netip.Addr, sport uint16, want func([]byte, netip.Addr, uint16) []byte) func(testing.TB, *katranArm) {
		return func(tb testing.TB, a *katranArm) { k.expectRun(tb, a.prog, in, a.want, want(in, src, sport)) }
	}
	passOut := func(tb testing.TB, a *katranArm) { k.expectRun(tb, a.prog, a.in, xdpPass, a.in) }
	anyTX := func(tb testing.TB, a *katranArm) { k.expectRun(tb, a.prog, a.in, xdpTX, nil) }
	// New flows: per call, the next tuple the arm will send; in the loop, the one the
	// wrapper writes next (its counter sits after the frame in its template).
	varied := func(want func([]byte, netip.Addr, uint16) []byte) func(testing.TB, *katranArm) {
		return func(tb testing.TB, a *katranArm) {
			c := a.varyNext
			if a.wrap != nil {
				c = a.wrap.next(tb)
			}
			in := newFlow(fresh, c)
			src, sport := newFlowTuple(c)
			k.expectRun(tb, a.prog, in, xdpTX, want(in, src, sport))
			if a.wrap == nil {
				a.varyNext++
			}
		}
	}
	budget := func(spent bool) func(testing.TB) { return func(tb testing.TB) { k.resetBudgets(tb, spent) } }
	var arms []*katranArm
	for _, mode := range []string{"call", "loop"} {
		perCall := mode == "call"
		// arm makes one arm of this mode: target run directly per call; in the loop behind
		// a wrapper of its own unless direct.
		arm := func(path, impl string, in []byte, target *ebpf.Program, direct bool, a katranArm) {
			a.name, a.in, a.prog, a.perCall = "mode="+mode+"/path="+path+"/impl="+impl, in, target, perCall
			if a.want == 0 {
				a.want = xdpTX
			}
			fresh := path == "new-flow"
			a.vary = perCall && fresh
			if !perCall && !direct {
				a.wrap = restoringWrapper(b, in, target, fresh, newFlowLoopBase)
				a.prog = a.wrap.prog
			}
			arms = append(arms, &a)
		}
		oursHit := katranArm{before: k.oursCounts, after: k.oursAfter("conn_hit", "conn_miss", "insert_refused")}
		oursOver := katranArm{prepare: budget(true), before: k.oursCounts, after: k.oursAfter("insert_refused", "conn_hit")}
		if perCall {
			arm("floor", "floor", est, tp.FloorXdp, true, katranArm{verify: anyTX})
		} else {
			arm("floor", "floor-direct", est, tp.FloorXdp, true, katranArm{verify: anyTX})
			arm("floor", "wrapper", est, nop, false, katranArm{verify: anyTX})
			arm("new-flow", "wrapper", fresh, nop, false, katranArm{verify: anyTX})
		}
		oursHit.verify = fixed(est, katranClient, 31337, oursOut)
		arm("established", "stickylb", est, k.ours.Program(), false, oursHit)
		arm("established", "katran", est, k.kt.prog, false, katranArm{verify: fixed(est, katranClient, 31337, ktOut),
			before: k.ktCounts, after: k.ktAfter("established")})
		if !perCall {
			arm("established", "stickylb-direct", est, k.ours.Program(), true, oursHit)
		}
		arm("new-flow", "stickylb", fresh, k.ours.Program(), false, katranArm{prepare: budget(false), verify: varied(oursOut),
			before: k.oursCounts, after: k.oursAfter("conn_miss", "conn_hit", "insert_refused", "conn_stale")})
		arm("new-flow", "katran", fresh, k.kt.prog, false, katranArm{prepare: budget(false), verify: varied(ktOut),
			before: k.ktCounts, after: k.ktAfter("new-flow")})
		oursOver.verify = fixed(over, katranClient, 31338, oursOut)
		arm("over-cap", "stickylb", over, k.ours.Program(), false, oursOver)
		arm("over-cap", "katran", over, k.kt.prog, false, katranArm{prepare: budget(true), verify: fixed(over, katranClient, 31338, ktOut),
			before: k.ktCounts, after: k.ktAfter("over-cap")})
		if !perCall {
			arm("over-cap", "stickylb-direct", over, k.ours.Program(), true, oursOver)
		}
		arm("pass", "stickylb", pass, k.ours.Program(), false, katranArm{want: xdpPass, verify: passOut,
			before: k.oursCounts, after: k.oursAfter("pass", "forward")})
		arm("pass", "katran", pass, k.kt.prog, false, katranArm{want: xdpPass, verify: passOut,
			before: k.ktCounts, after: k.ktAfter("pass")})
		arm("tunnel", "stickylb", tun, k.ours.Program(), false, katranArm{prepare: k.touchTunnelFlow,
			verify: fixed(tun, katranClient, 31337, tunOut), before: k.oursCounts,
			after: k.oursAfter("conn_hit", "conn_miss", "conn_stale", "insert_refused", "tunnel_second", "tunnel_no_route", "tunnel_too_big")})
		arm("tunnel", "katran", tun, k.kt.prog, false, katranArm{verify: fixed(tun, katranClient, 31337, ktOut),
			before: k.ktCounts, after: k.ktAfter("established")})
	}
	return arms
}

// time runs arm a for b.N packets and reports the kernel's ns per packet.
func (k *katranRig) time(b *testing.B, a *katranArm) {
	onOneCPU(b)
	if a.prepare != nil {
		a.prepare(b)
	}
	a.verify(b, a)
	var before any
	if a.before != nil {
		before = a.before(b)
	}
	var total time.Duration
	in := a.in
	for done := 0; done < b.N; {
		if a.prepare != nil {
			a.prepare(b)
		}
		n := min(katranChunk, b.N-done)
		if a.perCall {
			// Calls are slower than runs of a loop, the more so on a busy machine: the
			// budgets are renewed well inside their second, by time as well as by count.
			start := time.Now()
			for i := 0; i < n; i++ {
				if a.prepare != nil && i%64 == 63 && time.Since(start) > katranRenew {
					a.prepare(b)
					start = time.Now()
				}
				if a.vary {
					in = newFlow(a.in, a.varyNext)
					a.varyNext++
				}
				ret, _, d := k.run(b, a.prog, in, 1)
				if ret != a.want {
					b.Fatalf("action %d, want %d", ret, a.want)
				}
				total += d
			}
		} else {
			ret, _, d := k.run(b, a.prog, in, n)
			if ret != a.want {
				b.Fatalf("action %d, want %d", ret, a.want)
			}
			total += d * time.Duration(n)
		}
		done += n
	}
	if a.after != nil {
		a.after(b, before, b.N)
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/packet")
}

// expectRun runs p once on in and checks the verdict and, when want is not nil, the output.
func (k *katranRig) expectRun(tb testing.TB, p *ebpf.Program, in []byte, wantRet uint32, want []byte) {
	tb.Helper()
	ret, out, _ := k.run(tb, p, in, 1)
	if ret != wantRet {
		tb.Fatalf("action %d, want %d", ret, wantRet)
	}
	if want != nil && !bytes.Equal(out, want) {
		tb.Fatalf("output\n%x\nwant\n%x", out, want)
	}
}

func (k *katranRig) oursCounts(tb testing.TB) any { return pathCounts(tb, k.ours) }

// oursAfter checks that our counter grew moved by at least n packets and that none of
// still moved.
func (k *katranRig) oursAfter(grew string, still ...string) func(testing.TB, any, int) {
	return func(tb testing.TB, before any, n int) {
		tb.Helper()
		was, now := before.(map[string]uint64), pathCounts(tb, k.ours)
		if d := now[grew] - was[grew]; d < uint64(n) {
			tb.Fatalf("stickylb's %s counter moved %d for %d packets: not the timed path (%v -> %v)", grew, d, n, was, now)
		}
		for _, s := range still {
			if now[s] != was[s] {
				tb.Fatalf("stickylb's %s counter moved %d: not the timed path (%v -> %v)", s, now[s]-was[s], was, now)
			}
		}
	}
}

// katranCounts are the Katran counters the arms check.
type katranCounts struct {
	lru, lruMiss, fallback, pass katranStat
}

func (k *katranRig) ktCounts(tb testing.TB) any {
	var c katranCounts
	c.lru, _ = k.kt.stat(tb, kstatLRU)
	c.lruMiss, _ = k.kt.stat(tb, kstatLRUMiss)
	c.fallback, _ = k.kt.stat(tb, kstatFallbackLRU)
	c.pass, _ = k.kt.stat(tb, kstatXDPPass)
	return c
}

// ktAfter checks Katran's counters after n packets of path.
func (k *katranRig) ktAfter(path string) func(testing.TB, any, int) {
	return func(tb testing.TB, before any, n int) {
		tb.Helper()
		was, now := before.(katranCounts), k.ktCounts(tb).(katranCounts)
		vipPkts, misses := now.lru.V1-was.lru.V1, now.lru.V2-was.lru.V2
		synMisses := now.lruMiss.V1 - was.lruMiss.V1
		fail := func(what string) {
			tb.Fatalf("Katran, %s, %d packets: %s (counters %+v -> %+v)", path, n, what, was, now)
		}
		if now.fallback != was.fallback {
			fail("packets used the fallback LRU")
		}
		_, rate := k.kt.stat(tb, kstatNewConnRate)
		switch path {
		case "established":
			if vipPkts < uint64(n) || misses != 0 {
				fail("not every packet hit the LRU")
			}
		case "new-flow":
			if synMisses < uint64(n) || rate > katranChunk {
				fail(fmt.Sprintf("not every packet a SYN inserted below the cap (this second's new flows: %d)", rate))
			}
		case "over-cap":
			if synMisses < uint64(n) || rate <= katranMaxConnRate {
				fail("not above the cap")
			}
		case "pass":
			if now.pass.V1-was.pass.V1 < uint64(n) || vipPkts != 0 {
				fail("not every packet passed")
			}
		}
	}
}

// wrapper is a loop arm's program: restoringWrapper's, with the template it writes from.
type wrapper struct {
	prog *ebpf.Program
	tmpl *ebpf.Map
	cnt  int // offset of the 5-tuple counter in the template
}

// next reads the wrapper's next new 5-tuple number.
func (w *wrapper) next(tb testing.TB) uint32 {
	tb.Helper()
	var val []byte
	if err := w.tmpl.Lookup(uint32(0), &val); err != nil {
		tb.Fatal(err)
	}
	return binary.NativeEndian.Uint32(val[w.cnt:])
}

// restoringWrapper returns a program that puts the start of the packet back where it was
// (bpf_xdp_adjust_head by the length the program under test added), writes pkt over it,
// with vary the next new 5-tuple too (numbered from base, a counter after the frame in the
// template), and tail-calls target. Every arm of a path pays the same.
func restoringWrapper(tb testing.TB, pkt []byte, target *ebpf.Program, vary bool, base uint32) *wrapper {
	tb.Helper()
	n := int16(len(pkt) &^ 1)
	cnt := int16((len(pkt) + 7) &^ 7)
	tmpl, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: uint32(cnt) + 8, MaxEntries: 1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tmpl.Close() })
	val := make([]byte, tmpl.ValueSize())
	copy(val, pkt)
	binary.NativeEndian.PutUint64(val[cnt:], uint64(base))
	if err := tmpl.Put(uint32(0), val); err != nil {
		tb.Fatal(err)
	}
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
		asm.Sub.Reg(asm.R3, asm.R2),
		asm.Sub.Imm(asm.R3, int32(len(pkt))), // what the last run added at the front
		asm.Mov.Reg(asm.R2, asm.R3),
		asm.FnXdpAdjustHead.Call(),
		asm.JNE.Imm(asm.R0, 0, "abort"),
		asm.Mov.Reg(asm.R1, asm.R6),
	}
	insns = append(insns, writeBytes(tmpl, n)...)
	if vary {
		insns = append(insns,
			asm.LoadMem(asm.R5, asm.R7, cnt, asm.Word),
			asm.Mov.Reg(asm.R4, asm.R5),
			asm.Add.Imm(asm.R4, 1),
			asm.StoreMem(asm.R7, cnt, asm.R4, asm.Word),
			asm.Mov.Reg(asm.R4, asm.R5),
			asm.HostTo(asm.BE, asm.R4, asm.Half),
			asm.StoreMem(asm.R2, 14+20, asm.R4, asm.Half), // the source port
			asm.RSh.Imm(asm.R5, 16),
			asm.HostTo(asm.BE, asm.R5, asm.Half),
			asm.StoreMem(asm.R2, 14+14, asm.R5, asm.Half), // the source address's last two bytes
		)
	}
	p := tailCalling(tb, "the wrapper", insns, target)
	return &wrapper{prog: p, tmpl: tmpl, cnt: int(cnt)}
}

// nopXDP returns XDP_TX and does nothing else: what a wrapper's tail call lands on to
// measure the wrapper.
func nopXDP(tb testing.TB) *ebpf.Program {
	tb.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, AttachType: ebpf.AttachXDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, xdpTX), asm.Return()}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

func monotonic(tb testing.TB, clock int32) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(clock, &ts); err != nil {
		tb.Fatal(err)
	}
	return uint64(ts.Nano())
}

func possibleCPUs(tb testing.TB) int {
	n, err := ebpf.PossibleCPU()
	if err != nil {
		tb.Fatal(err)
	}
	return n
}
