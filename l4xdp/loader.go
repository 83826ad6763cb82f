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
var pinnedMaps = []string{"vips", "vip_addrs", "maglev", "backends", "conns", "server_ids", "path_stats", "vip_stats", "backend_stats"}

// Loader attaches the forwarder to an interface and keeps its maps in step with a pools
// file and the health of its backends.
type Loader struct {
	cfg   Config
	log   *zap.Logger
	iface *net.Interface
	fw    *Forwarder
	lnk   link.Link
	dir   string

	mu       sync.Mutex
	file     *pools.File
	slots    map[string]uint32 // "service/identity" -> backend slot
	checkers map[string]*health.Checker
	cancel   context.CancelFunc
	wg       sync.WaitGroup
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
	l := &Loader{cfg: cfg, log: log, iface: ifc, dir: cfg.pinDir(), slots: map[string]uint32{}, checkers: map[string]*health.Checker{}}
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
	if !adopted {
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
		"conns": m.Conns, "server_ids": m.ServerIds, "path_stats": m.PathStats, "vip_stats": m.VipStats, "backend_stats": m.BackendStats}[name]
}

// Forwarder returns the loaded forwarder (its counters).
func (l *Loader) Forwarder() *Forwarder { return l.fw }

// Close stops the health checkers and releases this process's handles. The link and maps
// stay pinned, so the program keeps forwarding until Detach.
func (l *Loader) Close() error {
	l.mu.Lock()
	if l.cancel != nil {
		l.cancel()
	}
	l.mu.Unlock()
	l.wg.Wait()
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

// resolveMAC returns the backend's MAC: from the pools file, else the neighbour table of
// the interface (asking the kernel to resolve it first).
func (l *Loader) resolveMAC(b *pools.Backend) (net.HardwareAddr, error) {
	if hw := b.HardwareAddr(); hw != nil {
		return hw, nil
	}
	ip := b.AddrPort().Addr()
	lk, err := netlink.LinkByIndex(l.iface.Index)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		neighs, err := netlink.NeighList(lk.Attrs().Index, family(ip))
		if err != nil {
			return nil, fmt.Errorf("reading the neighbour table: %w", err)
		}
		for _, n := range neighs {
			if n.IP.Equal(ip.AsSlice()) && len(n.HardwareAddr) == 6 && n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_PERMANENT|netlink.NUD_DELAY|netlink.NUD_PROBE) != 0 {
				return n.HardwareAddr, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("backend %s: no MAC in the neighbour table of %s; set mac: in the pools file or make it reachable", b.Address, l.cfg.Iface)
		}
		// A datagram makes the kernel resolve the neighbour.
		if c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, 9))); err == nil {
			c.Write([]byte{0})
			c.Close()
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
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
	l.restartCheckersLocked(ctx, f)
	return nil
}

func (l *Loader) applyLocked(f *pools.File) error {
	var vipServices []*pools.Service
	for _, s := range f.Services {
		if s.VIP != "" {
			vipServices = append(vipServices, s)
		}
	}
	sort.Slice(vipServices, func(i, j int) bool { return vipServices[i].Name < vipServices[j].Name })
	used := map[uint32]bool{}
	next := uint32(0)
	slot := func(key string) uint32 {
		if s, ok := l.slots[key]; ok {
			used[s] = true
			return s
		}
		for used[next] || slotTaken(l.slots, next) {
			next++
		}
		l.slots[key] = next
		used[next] = true
		return next
	}
	for id, s := range vipServices {
		vip, _ := s.VIPAddrPort()
		proto := uint8(6)
		if s.Protocol == pools.ProtocolUDP {
			proto = 17
		}
		var hosts []chash.Host
		var hostSlots []uint32
		for _, b := range s.Backends {
			idx := slot(s.Name + "/" + b.Identity())
			mac, err := l.resolveMAC(b)
			if err != nil {
				return err
			}
			if err := l.fw.SetBackend(idx, Backend{MAC: mac, Alive: true}); err != nil {
				return err
			}
			if b.ServerID != 0 {
				if err := l.fw.SetServerID(uint32(id+1), b.ServerID, idx); err != nil {
					return err
				}
			}
			if b.Drain || s.ZoneDrained(b.Zone) || l.unhealthyLocked(s.Name, b) {
				continue
			}
			hosts = append(hosts, chash.Host{ID: b.Identity(), Weight: b.Weight})
			hostSlots = append(hostSlots, idx)
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
				return fmt.Errorf("service %s: %w", s.Name, err)
			}
			for i, h := range m.Table() {
				table[i] = hostSlots[h]
			}
		}
		var flags uint32
		cid := uint32(0)
		switch s.Affinity.Mode {
		case pools.ModeSourceIP:
			flags = FlagSourceIP
		case pools.ModeQUICCID:
			flags, cid = FlagQUIC, uint32(s.Affinity.QUICCID.CIDLength)
		}
		if err := l.fw.SetVIP(VIP{ID: uint32(id + 1), Addr: vip, Proto: proto, Flags: flags, CIDLength: cid, Table: table}); err != nil {
			return err
		}
	}
	// Backends no longer in the file leave the pool: their flows re-pick.
	for key, s := range l.slots {
		if !used[s] {
			_ = l.fw.SetBackend(s, Backend{MAC: make(net.HardwareAddr, 6), Alive: false})
			delete(l.slots, key)
		}
	}
	return nil
}

func slotTaken(m map[string]uint32, s uint32) bool {
	for _, v := range m {
		if v == s {
			return true
		}
	}
	return false
}

func (l *Loader) unhealthyLocked(service string, b *pools.Backend) bool {
	c := l.checkers[service]
	if c == nil {
		return false
	}
	st, ok := c.Lookup(b.Identity())
	return ok && st.State == health.Unhealthy
}

// restartCheckersLocked runs a health checker per VIP service with health_check; each
// transition rebuilds the tables (flows to surviving backends are untouched).
func (l *Loader) restartCheckersLocked(ctx context.Context, f *pools.File) {
	if l.cancel != nil {
		l.cancel()
		l.mu.Unlock()
		l.wg.Wait()
		l.mu.Lock()
	}
	cctx, cancel := context.WithCancel(ctx)
	l.cancel = cancel
	l.checkers = map[string]*health.Checker{}
	for _, s := range f.Services {
		if s.VIP == "" || s.HealthCheck == nil {
			continue
		}
		c, err := health.NewChecker(s.HealthCheck.CheckerConfig(), l.cfg.HealthOptions...)
		if err != nil {
			l.log.Error("health checker", zap.String("service", s.Name), zap.Error(err))
			continue
		}
		ts := s.HealthTargets()
		if err := c.SetTargets(ts); err != nil {
			l.log.Error("health targets", zap.String("service", s.Name), zap.Error(err))
			continue
		}
		l.checkers[s.Name] = c
		events, unsub := c.Subscribe(64)
		l.wg.Add(2)
		go func() { defer l.wg.Done(); _ = c.Run(cctx) }()
		go func(name string) {
			defer l.wg.Done()
			defer unsub()
			for {
				select {
				case <-cctx.Done():
					return
				case tr := <-events:
					l.log.Info("backend health changed", zap.String("service", name), zap.String("backend", tr.ID), zap.Bool("healthy", tr.Healthy))
					l.mu.Lock()
					if err := l.applyLocked(l.file); err != nil {
						l.log.Error("rebuilding tables", zap.Error(err))
					}
					l.mu.Unlock()
				}
			}
		}(s.Name)
	}
}
