package l4xdp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// DefaultPinRoot is where the loader pins its link and maps (one directory per interface).
const DefaultPinRoot = "/sys/fs/bpf/stickylb"

// Mode is the XDP attach mode.
type Mode string

// Attach modes.
const (
	ModeNative  Mode = "native"
	ModeGeneric Mode = "generic"
)

// Config configures a Loader.
type Config struct {
	Iface   string
	Mode    Mode
	PinRoot string // default DefaultPinRoot
	// HealthOptions are passed to every health checker (tests allow short intervals).
	HealthOptions []health.Option
}

// pinned maps: the state a restarted loader adopts.
var pinnedMaps = []string{"vips", "vip_addrs", "maglev", "backends", "conns", "server_ids", "path_stats", "vip_stats",
	"backend_stats", "vip_names", "backend_names"}

// Loader attaches the forwarder to an interface and keeps its maps in step with a pools
// file and the health of its backends.
type Loader struct {
	cfg   Config
	log   *zap.Logger
	iface *net.Interface
	fw    *Forwarder
	lnk   link.Link
	dir   string

	mu     sync.Mutex
	file   *pools.File
	slots  map[string]uint32 // "service/identity" -> backend slot (pinned in backend_names)
	vipIDs map[string]uint32 // service -> VIP id (pinned in vip_names)
	// lastDown: each backend's last health verdict, read back from the pinned flags by a
	// restarted loader. Until a (re)started checker has a verdict of its own, this one holds:
	// a dead backend does not get new flows back for a restart or a pools-file edit.
	lastDown map[string]bool
	health   *health.Monitor // one checker per VIP service with a health_check
}

func (c Config) pinDir() string {
	root := c.PinRoot
	if root == "" {
		root = DefaultPinRoot
	}
	return filepath.Join(root, c.Iface)
}

// Open loads the program and attaches it to the interface, adopting the maps and link a
// previous loader pinned (so a restart drops no flow), or pinning fresh ones.
func Open(cfg Config, log *zap.Logger) (*Loader, error) {
	ifc, err := net.InterfaceByName(cfg.Iface)
	if err != nil {
		return nil, fmt.Errorf("interface %q: %w", cfg.Iface, err)
	}
	l := &Loader{cfg: cfg, log: log, iface: ifc, dir: cfg.pinDir(), slots: map[string]uint32{}, vipIDs: map[string]uint32{},
		lastDown: map[string]bool{}}
	l.health = health.NewMonitor(l.onTransition, cfg.HealthOptions...)
	if err := os.MkdirAll(l.dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s (is bpffs mounted at %s?): %w", l.dir, filepath.Dir(l.dir), err)
	}
	spec, err := loadLb()
	if err != nil {
		return nil, err
	}
	repl := map[string]*ebpf.Map{}
	adopted := false
	for _, name := range pinnedMaps {
		m, err := ebpf.LoadPinnedMap(filepath.Join(l.dir, name), nil)
		if err != nil {
			break
		}
		repl[name] = m
	}
	if len(repl) == len(pinnedMaps) {
		adopted = true
	} else {
		for _, m := range repl {
			m.Close()
		}
		repl = nil
	}
	fw := &Forwarder{}
	if err := spec.LoadAndAssign(&fw.objs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		if errors.Is(err, os.ErrPermission) {
			return nil, fmt.Errorf("loading the XDP program: no BPF permission (run as root or with CAP_BPF and CAP_NET_ADMIN): %w", err)
		}
		return nil, fmt.Errorf("loading the XDP program: %w", err)
	}
	l.fw = fw
	if adopted {
		if err := l.restore(); err != nil {
			fw.Close()
			return nil, err
		}
	} else {
		for _, name := range pinnedMaps {
			if err := mapByName(fw, name).Pin(filepath.Join(l.dir, name)); err != nil {
				fw.Close()
				return nil, fmt.Errorf("pinning map %s: %w", name, err)
			}
		}
	}
	linkPath := filepath.Join(l.dir, "link")
	if old, err := link.LoadPinnedLink(linkPath, nil); err == nil {
		// A previous loader's link: swap our program in, atomically, under the same maps.
		if err := old.Update(fw.Program()); err != nil {
			old.Close()
			fw.Close()
			return nil, fmt.Errorf("updating the pinned XDP link on %s: %w", cfg.Iface, err)
		}
		l.lnk = old
		log.Info("adopted the running forwarder", zap.String("iface", cfg.Iface), zap.Bool("maps", adopted))
		return l, nil
	}
	flags := link.XDPDriverMode
	if cfg.Mode == ModeGeneric {
		flags = link.XDPGenericMode
	}
	lnk, err := link.AttachXDP(link.XDPOptions{Program: fw.Program(), Interface: ifc.Index, Flags: flags})
	if err != nil {
		fw.Close()
		return nil, fmt.Errorf("attaching XDP (%s mode) to %s: %w", cfg.Mode, cfg.Iface, err)
	}
	if err := lnk.Pin(linkPath); err != nil {
		lnk.Close()
		fw.Close()
		return nil, fmt.Errorf("pinning the XDP link: %w", err)
	}
	l.lnk = lnk
	return l, nil
}

func mapByName(fw *Forwarder, name string) *ebpf.Map {
	m := fw.objs.lbMaps
	return map[string]*ebpf.Map{"vips": m.Vips, "vip_addrs": m.VipAddrs, "maglev": m.Maglev, "backends": m.Backends,
		"conns": m.Conns, "server_ids": m.ServerIds, "path_stats": m.PathStats, "vip_stats": m.VipStats, "backend_stats": m.BackendStats,
		"vip_names": m.VipNames, "backend_names": m.BackendNames}[name]
}

// Forwarder returns the loaded forwarder (its counters).
func (l *Loader) Forwarder() *Forwarder { return l.fw }

// Close stops the health checkers and releases this process's handles. The link and maps
// stay pinned, so the program keeps forwarding until Detach.
func (l *Loader) Close() error {
	l.health.Stop() // not under l.mu: a transition being handled takes it
	err := l.lnk.Close()
	return errors.Join(err, l.fw.Close())
}

// Detach removes the program and the pinned state of iface.
func Detach(cfg Config) error {
	dir := cfg.pinDir()
	lnk, err := link.LoadPinnedLink(filepath.Join(dir, "link"), nil)
	if err != nil {
		return fmt.Errorf("no stickylb forwarder pinned for %s: %w", cfg.Iface, err)
	}
	errs := []error{lnk.Unpin(), lnk.Close()}
	for _, name := range pinnedMaps {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, os.Remove(dir))
	return errors.Join(errs...)
}

// resolveMACs returns the MAC of every backend: from the pools file, else the neighbour
// table of the interface, read once a round for all of them, asking the kernel to resolve
// the missing ones (a datagram each) for up to 3 s.
func (l *Loader) resolveMACs(bs []*pools.Backend) (map[*pools.Backend]net.HardwareAddr, error) {
	out := make(map[*pools.Backend]net.HardwareAddr, len(bs))
	var missing []*pools.Backend
	for _, b := range bs {
		if hw := b.HardwareAddr(); hw != nil {
			out[b] = hw
		} else {
			missing = append(missing, b)
		}
	}
	const usable = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_PERMANENT | netlink.NUD_DELAY | netlink.NUD_PROBE
	deadline := time.Now().Add(3 * time.Second)
	for len(missing) > 0 {
		neighs, err := netlink.NeighList(l.iface.Index, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("reading the neighbour table of %s: %w", l.cfg.Iface, err)
		}
		known := make(map[netip.Addr]net.HardwareAddr, len(neighs))
		for _, n := range neighs {
			if a, ok := netip.AddrFromSlice(n.IP); ok && len(n.HardwareAddr) == 6 && n.State&usable != 0 {
				known[a.Unmap()] = n.HardwareAddr
			}
		}
		still := missing[:0]
		for _, b := range missing {
			if hw, ok := known[b.AddrPort().Addr().Unmap()]; ok {
				out[b] = hw
			} else {
				still = append(still, b)
			}
		}
		missing = still
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			var errs []error
			for _, b := range missing {
				errs = append(errs, fmt.Errorf("backend %s: no MAC in the neighbour table of %s; set mac: in the pools file or make it reachable", b.Address, l.cfg.Iface))
			}
			return nil, errors.Join(errs...)
		}
		for _, b := range missing { // a datagram makes the kernel resolve the neighbour
			if c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.AddrPort().Addr(), 9))); err == nil {
				c.Write([]byte{0})
				c.Close()
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return out, nil
}

// Apply installs f: backends, VIPs and their Maglev tables over the backends that may take
// new flows (alive, healthy or not yet checked, not draining). Flows already in the
// connection table keep their backend while it stays in the pool.
func (l *Loader) Apply(ctx context.Context, f *pools.File) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.applyLocked(f); err != nil {
		return err
	}
	l.file = f
	if err := l.health.Apply(ctx, pools.HealthServices(vipServices(f))); err != nil {
		return fmt.Errorf("health checks: %w", err)
	}
	return nil
}

// vipServices are the services of f the forwarder serves, by name.
func vipServices(f *pools.File) []*pools.Service {
	var out []*pools.Service
	for _, s := range f.Services {
		if s.VIP != "" {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// restore reads back what a previous loader pinned: the slot and VIP id of every name (the
// connection table refers to slots) and which backends it had found down.
func (l *Loader) restore() error {
	ids, err := names(l.fw.objs.VipNames)
	if err != nil {
		return fmt.Errorf("reading the pinned VIP names: %w", err)
	}
	for id, n := range ids {
		l.vipIDs[n] = id
	}
	slots, err := names(l.fw.objs.BackendNames)
	if err != nil {
		return fmt.Errorf("reading the pinned backend names: %w", err)
	}
	for slot, n := range slots {
		l.slots[n] = slot
		var b lbBackend
		if err := l.fw.objs.Backends.Lookup(slot, &b); err == nil && b.Flags&backendDown != 0 {
			l.lastDown[n] = true
		}
	}
	return nil
}

// allocator hands out indexes lo..hi-1 for names: a name keeps its index, a new one gets
// the lowest free index.
type allocator struct {
	m      map[string]uint32
	used   map[uint32]bool
	next   uint32 // no free index below it
	lo, hi uint32
}

func newAllocator(m map[string]uint32, lo, hi uint32) *allocator {
	a := &allocator{m: m, used: make(map[uint32]bool, len(m)), next: lo, lo: lo, hi: hi}
	for _, v := range m {
		a.used[v] = true
	}
	return a
}

func (a *allocator) get(name string) (uint32, bool) {
	if v, ok := a.m[name]; ok {
		return v, true
	}
	for ; a.next < a.hi; a.next++ {
		if !a.used[a.next] {
			a.m[name], a.used[a.next] = a.next, true
			return a.next, true
		}
	}
	return 0, false
}

type plannedBackend struct {
	key  string
	slot uint32
	b    *pools.Backend
	mac  net.HardwareAddr
}

// applyLocked brings the maps to f in two steps: first everything that can fail (MACs,
// names, ids), touching no map, so a bad edit leaves the running config whole; then the
// writes. Slots and ids survive edits and restarts, so the connection table stays right.
func (l *Loader) applyLocked(f *pools.File) error {
	served := vipServices(f)
	slots, ids := map[string]uint32{}, map[string]uint32{}
	for k, v := range l.slots {
		slots[k] = v
	}
	for k, v := range l.vipIDs {
		ids[k] = v
	}
	// Names that leave go first, so their slots and ids are free for newcomers.
	inFile := map[string]bool{}
	for _, s := range served {
		inFile[s.Name] = true
		for _, b := range s.Backends {
			inFile[s.Name+"/"+b.Identity()] = true
		}
	}
	for k := range slots {
		if !inFile[k] {
			delete(slots, k)
		}
	}
	for k := range ids {
		if !inFile[k] {
			delete(ids, k)
		}
	}
	plan := map[string][]plannedBackend{}
	idAlloc, slotAlloc := newAllocator(ids, 1, MaxVIPs), newAllocator(slots, 0, MaxBackends)
	var all []*pools.Backend
	for _, s := range served {
		if _, ok := idAlloc.get(s.Name); !ok {
			return fmt.Errorf("service %s: more than %d VIP services", s.Name, MaxVIPs-1)
		}
		for _, b := range s.Backends {
			key := s.Name + "/" + b.Identity()
			if len(key) > maxName {
				return fmt.Errorf("service %s: backend %s: %q is longer than the forwarder's %d-byte names", s.Name, b.Address, key, maxName)
			}
			slot, ok := slotAlloc.get(key)
			if !ok {
				return fmt.Errorf("service %s: more than %d backends in all", s.Name, MaxBackends)
			}
			plan[s.Name] = append(plan[s.Name], plannedBackend{key: key, slot: slot, b: b})
			all = append(all, b)
		}
	}
	macs, err := l.resolveMACs(all)
	if err != nil {
		return err
	}
	for name, ps := range plan {
		for i := range ps {
			ps[i].mac = macs[ps[i].b]
		}
		plan[name] = ps
	}
	var errs []error
	put := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	var vips []VIP
	serverIDs := map[lbServerKey]uint32{}
	for _, s := range served {
		id := ids[s.Name]
		n, _ := toName(s.Name)
		put("naming VIP "+s.Name, l.fw.objs.VipNames.Put(id, n))
		if newIndex(l.vipIDs, s.Name, id) {
			put("zeroing the counters of VIP "+s.Name, l.fw.zeroCounter(l.fw.objs.VipStats, id))
		}
		var hosts []chash.Host
		var hostSlots []uint32
		for _, p := range plan[s.Name] {
			down := l.unhealthyLocked(s, p.key, p.b)
			bn, _ := toName(p.key)
			put("naming backend "+p.key, l.fw.objs.BackendNames.Put(p.slot, bn))
			if newIndex(l.slots, p.key, p.slot) {
				put("zeroing the counters of "+p.key, l.fw.zeroCounter(l.fw.objs.BackendStats, p.slot))
			}
			put("backend "+p.key, l.fw.SetBackend(p.slot, Backend{MAC: p.mac, Alive: true, Down: down}))
			if p.b.ServerID != 0 {
				put("server_id of "+p.key, l.fw.SetServerID(id, p.b.ServerID, p.slot))
				serverIDs[lbServerKey{VipId: id, ServerId: uint32(p.b.ServerID)}] = p.slot
			}
			if p.b.Drain || s.ZoneDrained(p.b.Zone) || down {
				continue
			}
			hosts = append(hosts, chash.Host{ID: p.b.Identity(), Weight: p.b.Weight})
			hostSlots = append(hostSlots, p.slot)
		}
		vip, err := l.vipOf(s, id, hosts, hostSlots)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		put("VIP "+s.Name, l.fw.SetVIP(vip))
		vips = append(vips, vip)
	}
	put("removing VIPs no longer in the file", l.fw.PruneVIPs(vips))
	put("removing server_ids no longer in the file", l.fw.PruneServerIDs(serverIDs))
	// Backends no longer in the file leave the pool: their flows re-pick. A slot or id a
	// newcomer took over in this same edit is the newcomer's now.
	for key, slot := range l.slots {
		if _, ok := slots[key]; !ok && !slotAlloc.used[slot] {
			put("removing backend "+key, l.fw.SetBackend(slot, Backend{MAC: make(net.HardwareAddr, 6), Alive: false}))
			put("unnaming backend "+key, l.fw.objs.BackendNames.Put(slot, lbName{}))
		}
		if _, ok := slots[key]; !ok {
			delete(l.lastDown, key)
		}
	}
	for name, id := range l.vipIDs {
		if _, ok := ids[name]; !ok && !idAlloc.used[id] {
			put("unnaming VIP "+name, l.fw.objs.VipNames.Put(id, lbName{}))
		}
	}
	l.slots, l.vipIDs = slots, ids
	return errors.Join(errs...)
}

// newIndex says whether name got its index in this edit (its counters start from zero).
func newIndex(before map[string]uint32, name string, idx uint32) bool {
	v, ok := before[name]
	return !ok || v != idx
}

// vipOf builds service s's VIP: its key, affinity and Maglev table over hosts.
func (l *Loader) vipOf(s *pools.Service, id uint32, hosts []chash.Host, hostSlots []uint32) (VIP, error) {
	vip, _ := s.VIPAddrPort()
	proto := uint8(6)
	if s.Protocol == pools.ProtocolUDP {
		proto = 17
	}
	size := s.Hash.TableSize
	if size == 0 || size > MaxTableSize {
		size = MaxTableSize
	}
	table := make([]uint32, size)
	if len(hosts) == 0 {
		for i := range table {
			table[i] = emptySlot
		}
	} else {
		m, err := chash.NewMaglev(hosts, size)
		if err != nil {
			return VIP{}, fmt.Errorf("service %s: %w", s.Name, err)
		}
		for i, h := range m.Table() {
			table[i] = hostSlots[h]
		}
	}
	v := VIP{ID: id, Addr: vip, Proto: proto, Table: table}
	switch s.Affinity.Mode {
	case pools.ModeSourceIP:
		v.Flags = FlagSourceIP
	case pools.ModeQUICCID:
		v.Flags, v.CIDLength = FlagQUIC, uint32(s.Affinity.QUICCID.CIDLength)
	}
	return v, nil
}

// unhealthyLocked: the checker's verdict, or until it has one, the last verdict known.
func (l *Loader) unhealthyLocked(s *pools.Service, key string, b *pools.Backend) bool {
	if s.HealthCheck == nil {
		delete(l.lastDown, key)
		return false
	}
	st := l.health.View(s.Name, b.Identity()) // Unknown before the first Apply has started the checker
	if st == health.Unknown {
		return l.lastDown[key]
	}
	l.lastDown[key] = st == health.Unhealthy
	return l.lastDown[key]
}

// PinnedStats reads the counters of the forwarder pinned for cfg.Iface, whether or not a
// loader runs.
func PinnedStats(cfg Config) (Stats, error) {
	var m [5]*ebpf.Map
	for i, name := range []string{"path_stats", "vip_stats", "backend_stats", "vip_names", "backend_names"} {
		pm, err := ebpf.LoadPinnedMap(filepath.Join(cfg.pinDir(), name), nil)
		if err != nil {
			return Stats{}, fmt.Errorf("no stickylb forwarder pinned for %s: %w", cfg.Iface, err)
		}
		defer pm.Close()
		m[i] = pm
	}
	return readStats(statsMaps{m[0], m[1], m[2], m[3], m[4]})
}

// onTransition rebuilds the tables after a health transition (flows to surviving backends
// are untouched).
func (l *Loader) onTransition(service string, tr health.Transition) {
	l.log.Info("backend health changed", zap.String("service", service), zap.String("backend", tr.ID), zap.Bool("healthy", tr.Healthy))
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.applyLocked(l.file); err != nil {
		l.log.Error("rebuilding tables", zap.Error(err))
	}
}
