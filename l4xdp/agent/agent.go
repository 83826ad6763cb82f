// Package agent is the backend agent of tunnel forwarding (`stickylb backend`): a TC ingress
// program (../bpf/backend.c) on a backend's interface that decapsulates the GUE packets the
// XDP forwarder sends (so no fou or ipip module is needed), passes a packet of a connection
// this backend does not hold to the secondary the packet names (second chance), refuses
// tunnel packets from sources that are not LB nodes, and counts each path; and the loader
// that attaches it, keeps its table of the host's addresses up to date, and reads its
// counters.
//
// The link and the counters are pinned, so a restarted agent swaps its program in without a
// moment of undecapsulated traffic, and the counters go on; Detach removes them.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
)

// DefaultPinRoot is where the agent pins its link and counters (one directory per interface).
const DefaultPinRoot = "/sys/fs/bpf/stickylb-backend"

// DefaultTunnelPort is the tunnel's UDP port when none is given (the pools file's default
// tunnel_port).
const DefaultTunnelPort = 6080

// Limits of the program's maps (backend.c).
const (
	maxTunnelPorts = 16
	maxLBSources   = 256
	maxLocalAddrs  = 4096
)

// Paths names the program's paths (enum agent_path in ../bpf/backend.c), by index.
var Paths = [...]string{"decap", "second_chance", "no_socket", "refused", "malformed", "not_local"}

// Config configures an Agent.
type Config struct {
	// Iface is the interface tunnel packets arrive on (and second-chance packets leave by).
	Iface string
	// TunnelPorts are the UDP ports decapsulated (none: DefaultTunnelPort).
	TunnelPorts []uint16
	// LBSources are the LB nodes' tunnel sources: a tunnel-port packet from elsewhere is
	// dropped. At least one.
	LBSources []netip.Prefix
	// PinRoot is the bpffs directory of the pinned state (default DefaultPinRoot).
	PinRoot string
}

func (c Config) ports() []uint16 {
	if len(c.TunnelPorts) == 0 {
		return []uint16{DefaultTunnelPort}
	}
	return c.TunnelPorts
}

func (c Config) pinDir() string {
	root := c.PinRoot
	if root == "" {
		root = DefaultPinRoot
	}
	return filepath.Join(root, c.Iface)
}

// Validate checks the configuration: an interface, ports 1..65535 (at most 16), at least one
// LB source prefix (at most 256).
func (c Config) Validate() error {
	if c.Iface == "" {
		return errors.New("no interface")
	}
	if len(c.ports()) > maxTunnelPorts {
		return fmt.Errorf("%d tunnel ports: at most %d", len(c.ports()), maxTunnelPorts)
	}
	if slices.Contains(c.ports(), 0) {
		return errors.New("tunnel port 0: want 1..65535")
	}
	if len(c.LBSources) == 0 {
		return errors.New("no LB source: tunnel packets from every source would be refused (give the LB nodes' tunnel sources)")
	}
	if len(c.LBSources) > maxLBSources {
		return fmt.Errorf("%d LB sources: at most %d", len(c.LBSources), maxLBSources)
	}
	for _, p := range c.LBSources {
		if !p.IsValid() {
			return fmt.Errorf("LB source %v: want an address or prefix", p)
		}
	}
	return nil
}

// Agent is the attached program and its maps.
type Agent struct {
	cfg  Config
	log  *zap.Logger
	objs backendObjects
	lnk  link.Link
	dir  string

	mu    sync.Mutex
	local int // addresses in local_addrs after the last sync
}

// pinnedMaps are the maps a restarted agent adopts: the counters. The others are written
// from the agent's flags and the host's addresses at each start.
var pinnedMaps = []string{"agent_stats"}

// Open loads the program, writes its ports, sources and the host's addresses, and attaches
// it to the interface's TC ingress (TCX), or swaps it into the link a previous agent pinned.
func Open(cfg Config, log *zap.Logger) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ifc, err := net.InterfaceByName(cfg.Iface)
	if err != nil {
		return nil, fmt.Errorf("interface %q: %w", cfg.Iface, err)
	}
	a := &Agent{cfg: cfg, log: log, dir: cfg.pinDir()}
	if err := os.MkdirAll(a.dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s (is bpffs mounted at %s?): %w", a.dir, filepath.Dir(a.dir), err)
	}
	if err := a.load(); err != nil {
		return nil, err
	}
	if err := a.configure(); err != nil {
		a.objs.Close()
		return nil, err
	}
	if err := a.attach(ifc); err != nil {
		a.objs.Close()
		return nil, err
	}
	return a, nil
}

// load loads the program, adopting the pinned counters that fit and pinning fresh ones.
func (a *Agent) load() error {
	spec, err := loadBackend()
	if err != nil {
		return fmt.Errorf("reading the agent's object: %w", err)
	}
	repl := map[string]*ebpf.Map{}
	var fresh []string
	for _, name := range pinnedMaps {
		m, err := ebpf.LoadPinnedMap(filepath.Join(a.dir, name), nil)
		if err == nil && spec.Maps[name].Compatible(m) == nil {
			repl[name] = m
			continue
		}
		if m != nil {
			m.Close()
		}
		fresh = append(fresh, name)
	}
	err = spec.LoadAndAssign(&a.objs, &ebpf.CollectionOptions{MapReplacements: repl})
	for _, m := range repl {
		m.Close()
	}
	if err != nil {
		if errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("loading the TC program: no BPF permission (run as root, or with CAP_BPF and CAP_NET_ADMIN): %w", err)
		}
		return fmt.Errorf("loading the TC program: %w", err)
	}
	for _, name := range fresh {
		path := filepath.Join(a.dir, name)
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			a.objs.Close()
			return fmt.Errorf("removing the old pinned map %s: %w", name, err)
		}
		if err := a.objs.AgentStats.Pin(path); err != nil {
			a.objs.Close()
			return fmt.Errorf("pinning map %s: %w", name, err)
		}
	}
	return nil
}

// configure writes the tunnel ports, the LB sources and the host's addresses.
func (a *Agent) configure() error {
	for _, p := range a.cfg.ports() {
		if err := a.objs.TunnelPorts.Put(netOrder(p), uint8(1)); err != nil {
			return fmt.Errorf("writing tunnel port %d: %w", p, err)
		}
	}
	for _, p := range a.cfg.LBSources {
		if err := a.objs.LbSources.Put(prefixKey(p), uint8(1)); err != nil {
			return fmt.Errorf("writing LB source %v: %w", p, err)
		}
	}
	return a.SyncLocal()
}

// attach swaps the program into the pinned link of a previous agent, or attaches it to the
// interface's TCX ingress and pins the link.
func (a *Agent) attach(ifc *net.Interface) error {
	path := filepath.Join(a.dir, "link")
	if old, err := link.LoadPinnedLink(path, nil); err == nil {
		if err := old.Update(a.objs.StickylbBackend); err != nil {
			old.Close()
			return fmt.Errorf("updating the pinned TC link on %s: %w", a.cfg.Iface, err)
		}
		a.lnk = old
		a.log.Info("adopted the running agent", zap.String("iface", a.cfg.Iface))
		return nil
	}
	lnk, err := link.AttachTCX(link.TCXOptions{Interface: ifc.Index, Program: a.objs.StickylbBackend, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return fmt.Errorf("attaching the TC program to %s's ingress (TCX, kernel 6.6 or later): %w", a.cfg.Iface, err)
	}
	if err := lnk.Pin(path); err != nil {
		lnk.Close()
		return fmt.Errorf("pinning the TC link: %w", err)
	}
	a.lnk = lnk
	return nil
}

// Close releases this process's handles; the link and counters stay pinned, so the program
// keeps decapsulating until Detach.
func (a *Agent) Close() error {
	return errors.Join(a.lnk.Close(), a.objs.Close())
}

// Detach removes the program and the pinned state of cfg's interface.
func Detach(cfg Config) error {
	dir := cfg.pinDir()
	lnk, err := link.LoadPinnedLink(filepath.Join(dir, "link"), nil)
	if err != nil {
		return fmt.Errorf("no stickylb backend agent pinned for %s: %w", cfg.Iface, err)
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

// Run keeps the table of the host's addresses in step (a VIP added to lo is decapsulated for
// at once) until ctx ends: on every address change the kernel reports, and every interval in
// case a report was lost.
func (a *Agent) Run(ctx context.Context, interval time.Duration) {
	updates := make(chan netlink.AddrUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.AddrSubscribeWithOptions(updates, done, netlink.AddrSubscribeOptions{ErrorCallback: func(err error) {
		if ctx.Err() == nil { // the subscription's end says nothing
			a.log.Warn("address updates", zap.Error(err))
		}
	}}); err != nil {
		a.log.Warn("subscribing to address changes: the host's addresses are read every interval only", zap.Error(err))
		updates = nil
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-updates:
			if !ok {
				updates = nil
				continue
			}
		case <-tick.C:
		}
		if err := a.SyncLocal(); err != nil {
			a.log.Warn("updating the host's addresses", zap.Error(err))
		}
	}
}

// SyncLocal writes the host's addresses (of every interface of its network namespace) into
// the program's table, and removes those it no longer has.
func (a *Agent) SyncLocal() error {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("reading the host's addresses: %w", err)
	}
	want := map[backendAgentPrefix]bool{}
	for _, ad := range addrs {
		if ip, ok := netip.AddrFromSlice(ad.IP); ok {
			want[prefixKey(netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))] = true
		}
	}
	if len(want) > maxLocalAddrs {
		return fmt.Errorf("the host has %d addresses; the agent holds %d", len(want), maxLocalAddrs)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var k backendAgentPrefix
	var v uint8
	var stale []backendAgentPrefix
	it := a.objs.LocalAddrs.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	errs := []error{it.Err()}
	for _, k := range stale {
		if err := a.objs.LocalAddrs.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	for k := range want {
		if err := a.objs.LocalAddrs.Put(k, uint8(1)); err != nil {
			errs = append(errs, err)
		}
	}
	a.local = len(want)
	return errors.Join(errs...)
}

// Counter is a path's packets and bytes.
type Counter struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// Status is what the agent's status.json says: its configuration and each path's counters.
type Status struct {
	Iface       string             `json:"iface"`
	TunnelPorts []uint16           `json:"tunnel_ports"`
	LBSources   []string           `json:"lb_sources"`
	LocalAddrs  int                `json:"local_addresses"`
	Paths       map[string]Counter `json:"paths"`
}

// Status reads the counters and describes the agent.
func (a *Agent) Status() (Status, error) {
	paths, err := stats(a.objs.AgentStats)
	st := Status{Iface: a.cfg.Iface, TunnelPorts: a.cfg.ports(), Paths: paths}
	for _, p := range a.cfg.LBSources {
		st.LBSources = append(st.LBSources, p.String())
	}
	a.mu.Lock()
	st.LocalAddrs = a.local
	a.mu.Unlock()
	return st, err
}

// PinnedStats reads the counters of the agent pinned for cfg's interface (running or not).
func PinnedStats(cfg Config) (map[string]Counter, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(cfg.pinDir(), "agent_stats"), nil)
	if err != nil {
		return nil, fmt.Errorf("no stickylb backend agent pinned for %s: %w", cfg.Iface, err)
	}
	defer m.Close()
	return stats(m)
}

// stats sums the per-CPU counters of each path.
func stats(m *ebpf.Map) (map[string]Counter, error) {
	out := make(map[string]Counter, len(Paths))
	for i, name := range Paths {
		var per []backendAgentCounter
		if err := m.Lookup(uint32(i), &per); err != nil {
			return out, fmt.Errorf("reading the %s counter: %w", name, err)
		}
		var c Counter
		for _, x := range per {
			c.Packets += x.Packets
			c.Bytes += x.Bytes
		}
		out[name] = c
	}
	return out, nil
}

// prefixKey is p as the program's LPM and address keys hold it: IPv4 mapped into IPv6.
func prefixKey(p netip.Prefix) backendAgentPrefix {
	bits := p.Bits()
	if p.Addr().Unmap().Is4() {
		bits += 96
	}
	return backendAgentPrefix{Prefixlen: uint32(bits), Addr: p.Masked().Addr().Unmap().As16()}
}

// netOrder is port p as the program holds it: network order in memory.
func netOrder(p uint16) uint16 { return p>>8 | p<<8 }
