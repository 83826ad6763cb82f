// Attaching the forwarder to an interface and pinning its link and maps, so a restarted
// loader adopts them; detaching.

package l4xdp

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/stickylb/stickylb/policies/health"
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
	// Tables sizes the connection table and its flood guard.
	Tables Options
	// Zone is the node's zone (`--zone`): with cross_zone off, new flows go to this zone's
	// backends while it has any. Empty: every zone.
	Zone string
	// NAT is where NAT flows leave from (`--nat-source`, `--nat-ports`).
	NAT NAT
	// Tunnel is where tunnel packets leave from (`--tunnel-source`).
	Tunnel Tunnel
	// Served, when set, hears the VIP addresses served after each apply (see ServedFunc).
	Served ServedFunc
	// RetryApplied, when set, is called (under the loader's lock) when the loader's retry
	// installs a config whose Apply or ApplyView had failed for what may pass: a pools-file
	// edit refused for now is applied after all.
	RetryApplied func()
}

// NAT configures the translation of flows to backends reached by NAT: each such flow
// leaves the LB from one of Sources and a port of [PortLow, PortHigh], allocated per
// (source address, backend, protocol).
type NAT struct {
	// Sources are the LB's addresses NAT flows leave from, IPv4 and/or IPv6 (a NAT backend
	// needs one of its family). None: no backend may be reached by NAT.
	Sources []netip.Addr
	// PortLow and PortHigh bound the source ports, inclusive (both 0: DefaultNATPortLow to
	// DefaultNATPortHigh, above Linux's default ephemeral range).
	PortLow, PortHigh uint16
}

// Default NAT source ports: above Linux's default ip_local_port_range (32768-60999).
const (
	DefaultNATPortLow  = 61000
	DefaultNATPortHigh = 65535
)

// transientMaps are the program's maps a loader makes for itself, unpinned: its config and
// NAT sources (written from its flags), the per-CPU insert budgets, clock readings, schedule
// positions and NAT and tunnel scratch space.
var transientMaps = []string{"config", "insert_budget", "cpu_clock", "sched_pos", "nat_sources", "nat_scratch", "tunnel_scratch"}

// pinnedMaps are the program's other maps, the state a restarted loader adopts: every map of
// the generated bindings but the transient ones, so a map added to the program is pinned
// with no edit here.
var pinnedMaps = slices.DeleteFunc(slices.Sorted(maps.Keys(mapsByName(&lbMaps{}))),
	func(name string) bool { return slices.Contains(transientMaps, name) })

// mapsByName lists m's maps by their names in the object (bpf2go's ebpf struct tags).
func mapsByName(m *lbMaps) map[string]*ebpf.Map {
	v := reflect.ValueOf(m).Elem()
	out := make(map[string]*ebpf.Map, v.NumField())
	for i := range v.NumField() {
		out[v.Type().Field(i).Tag.Get("ebpf")] = v.Field(i).Interface().(*ebpf.Map)
	}
	return out
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
	if err := cfg.NAT.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.Tunnel.Validate(); err != nil {
		return nil, err
	}
	tun4, tun6, err := cfg.Tunnel.sources(ifc)
	if err != nil {
		return nil, err
	}
	// Bound to the network namespace the loader opens in, from whichever goroutine it is
	// used (the maintenance loop's retries among them).
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening a netlink socket: %w", err)
	}
	opened := false
	defer func() {
		if !opened {
			nl.Close()
		}
	}()
	l := &Loader{cfg: cfg, log: log, iface: ifc, nl: nl, dir: cfg.pinDir(), slots: map[string]uint32{}, vipIDs: map[string]uint32{},
		lastDown: map[string]bool{}, rampFrom: map[string]time.Time{}, rampBuilt: map[string]int{}}
	l.health = health.NewMonitor(l.onTransition, cfg.HealthOptions...)
	if err := os.MkdirAll(l.dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s (is bpffs mounted at %s?): %w", l.dir, filepath.Dir(l.dir), err)
	}
	adopted, err := l.loadTables(tun4, tun6)
	if err != nil {
		return nil, err
	}
	if err := l.attach(adopted); err != nil {
		l.maps.Close()
		return nil, err
	}
	opened = true
	return l, nil
}

// loadTables loads the program with the maps a previous loader pinned that still fit, makes
// and pins the others, and configures them (NAT, tunnel sources, the state restored). It
// reports whether any pinned map was adopted; on an error nothing stays open.
func (l *Loader) loadTables(tun4, tun6 netip.Addr) (adopted bool, err error) {
	spec, err := l.cfg.Tables.spec()
	if err != nil {
		return false, err
	}
	repl, fresh := l.adoptable(spec)
	tables := &Tables{}
	if err := spec.LoadAndAssign(&tables.objs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		for _, m := range repl {
			m.Close()
		}
		if errors.Is(err, os.ErrPermission) {
			return false, fmt.Errorf("loading the XDP program: no BPF permission (run as root, or with CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON): %w", err)
		}
		return false, fmt.Errorf("loading the XDP program: %w", err)
	}
	for _, m := range repl { // LoadAndAssign holds its own references
		m.Close()
	}
	l.maps = tables
	if err := l.configureTables(tun4, tun6, fresh); err != nil {
		tables.Close()
		return false, err
	}
	return len(fresh) < len(pinnedMaps), nil
}

// configureTables writes the loaded tables' configuration, restores the pinned state and
// pins the maps made afresh (fresh), then reserves NAT's ports and turns on forwarding.
func (l *Loader) configureTables(tun4, tun6 netip.Addr, fresh []string) error {
	tables := l.maps
	if err := tables.configure(l.cfg.Tables, l.cfg.NAT); err != nil {
		return err
	}
	if err := tables.configureTunnel(tun4, tun6); err != nil {
		return err
	}
	l.tunnel4, l.tunnel6 = tun4, tun6
	if err := l.restore(); err != nil {
		return err
	}
	for _, name := range fresh {
		path := filepath.Join(l.dir, name)
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("removing the old pinned map %s: %w", name, err)
		}
		if err := mapsByName(&tables.objs.lbMaps)[name].Pin(path); err != nil {
			return fmt.Errorf("pinning map %s: %w", name, err)
		}
	}
	// After the pinning: what is reserved is recorded in the pinned state, for Detach.
	if err := l.reservePorts(); err != nil {
		return fmt.Errorf("reserving the NAT ports from the host's own: %w", err)
	}
	return l.enableForwarding(l.cfg.NAT.has(true), l.cfg.NAT.has(false), "the FIB lookups of NAT need it")
}

// attach puts the loaded program on the interface: into a previous loader's pinned link,
// atomically under the same maps, or by a new link it pins.
func (l *Loader) attach(adopted bool) error {
	linkPath := filepath.Join(l.dir, "link")
	if old, err := link.LoadPinnedLink(linkPath, nil); err == nil {
		if err := old.Update(l.maps.Program()); err != nil {
			old.Close()
			return fmt.Errorf("updating the pinned XDP link on %s: %w", l.cfg.Iface, err)
		}
		l.lnk = old
		l.log.Info("adopted the running forwarder", zap.String("iface", l.cfg.Iface), zap.Bool("maps", adopted))
		return nil
	}
	flags := link.XDPDriverMode
	if l.cfg.Mode == ModeGeneric {
		flags = link.XDPGenericMode
	}
	lnk, err := link.AttachXDP(link.XDPOptions{Program: l.maps.Program(), Interface: l.iface.Index, Flags: flags})
	if err != nil {
		return fmt.Errorf("attaching XDP (%s mode) to %s: %w", l.cfg.Mode, l.cfg.Iface, err)
	}
	if err := lnk.Pin(linkPath); err != nil {
		lnk.Close()
		return fmt.Errorf("pinning the XDP link: %w", err)
	}
	l.lnk = lnk
	return nil
}

// adoptable opens the maps a previous loader pinned that fit spec (same type, key, value
// and size), to be reused; it returns them and the names of the maps to make and pin afresh.
// A pinned map of another layout (an upgrade that changed it) or size (--conn-table-size
// changed) is replaced: for the connection table, established flows then re-hash once
// (with Maglev, most land where they were).
func (l *Loader) adoptable(spec *ebpf.CollectionSpec) (map[string]*ebpf.Map, []string) {
	repl := map[string]*ebpf.Map{}
	var fresh []string
	for _, name := range pinnedMaps {
		m, err := ebpf.LoadPinnedMap(filepath.Join(l.dir, name), nil)
		if err != nil {
			fresh = append(fresh, name)
			continue
		}
		if err := spec.Maps[name].Compatible(m); err != nil {
			l.log.Warn("a pinned map does not fit this loader (its layout or size changed): starting it afresh",
				zap.String("map", name), zap.Error(err))
			m.Close()
			fresh = append(fresh, name)
			continue
		}
		repl[name] = m
	}
	return repl, fresh
}

// Close stops the health checkers and releases this process's handles. The link and maps
// stay pinned, so the program keeps forwarding until Detach.
func (l *Loader) Close() error {
	l.health.Stop() // not under l.mu: a transition being handled takes it
	l.stopMaintenance()
	err := l.lnk.Close()
	l.nl.Close()
	return errors.Join(err, l.maps.Close())
}

// Detach removes the program and the pinned state of iface.
func Detach(cfg Config) error {
	dir := cfg.pinDir()
	lnk, err := link.LoadPinnedLink(filepath.Join(dir, "link"), nil)
	if err != nil {
		return fmt.Errorf("no stickylb forwarder pinned for %s: %w", cfg.Iface, err)
	}
	errs := []error{lnk.Unpin(), lnk.Close(), releasePorts(dir)}
	for _, name := range pinnedMaps {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, os.Remove(dir))
	return errors.Join(errs...)
}
