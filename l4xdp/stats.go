// The forwarder's counters: by path, VIP and backend, from a loader's maps or the pinned ones.

package l4xdp

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
)

// Counter is a packet and byte count.
type Counter struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// Stats are the forwarder's counters: by path (forward, conn_hit, conn_miss, fragment, ...),
// by VIP (its service) and by backend ("service/backend").
type Stats struct {
	Paths    map[string]Counter `json:"paths"`
	VIPs     map[string]Counter `json:"vips"`
	Backends map[string]Counter `json:"backends"`
	// ActiveBackends is each backend's active connections ("service/backend"), as the
	// program counts them (a flow from its first packet to the client's FIN or RST, or its
	// idle timeout); ActiveZones sums them by zone ("service/zone"), so an operator sees a
	// drained zone empty.
	ActiveBackends map[string]int64 `json:"active_backends"`
	ActiveZones    map[string]int64 `json:"active_zones"`
}

type statsMaps struct{ path, vip, backend, vipNames, backendNames, active, zones *ebpf.Map }

// Stats sums the per-CPU counters.
func (f *Tables) Stats() (Stats, error) {
	o := &f.objs
	return readStats(statsMaps{o.PathStats, o.VipStats, o.BackendStats, o.VipNames, o.BackendNames, o.Active, o.BackendZones})
}

func sumCounter(m *ebpf.Map, idx uint32) (Counter, error) {
	var per []lbCounter
	if err := m.Lookup(idx, &per); err != nil {
		return Counter{}, err
	}
	var c Counter
	for _, x := range per {
		c.Packets += x.Packets
		c.Bytes += x.Bytes
	}
	return c, nil
}

func readStats(m statsMaps) (Stats, error) {
	st := Stats{Paths: map[string]Counter{}, VIPs: map[string]Counter{}, Backends: map[string]Counter{},
		ActiveBackends: map[string]int64{}, ActiveZones: map[string]int64{}}
	for i := uint32(0); i < numPaths; i++ {
		c, err := sumCounter(m.path, i)
		if err != nil {
			return st, fmt.Errorf("reading path counters: %w", err)
		}
		st.Paths[pathNames[i]] = c
	}
	for _, t := range []struct {
		names, counters *ebpf.Map
		into            map[string]Counter
	}{{m.vipNames, m.vip, st.VIPs}, {m.backendNames, m.backend, st.Backends}} {
		ns, err := names(t.names)
		if err != nil {
			return st, fmt.Errorf("reading names: %w", err)
		}
		for idx, name := range ns {
			c, err := sumCounter(t.counters, idx)
			if err != nil {
				return st, fmt.Errorf("reading counters of %s: %w", name, err)
			}
			t.into[name] = c
		}
	}
	return st, readActive(m, st)
}

// readActive fills st's active connections (a forwarder pinned before they were counted
// has no such maps: nothing to add).
func readActive(m statsMaps, st Stats) error {
	if m.active == nil || m.zones == nil {
		return nil
	}
	backends, err := names(m.backendNames)
	if err != nil {
		return fmt.Errorf("reading names: %w", err)
	}
	zones, err := names(m.zones)
	if err != nil {
		return fmt.Errorf("reading zones: %w", err)
	}
	for slot, name := range backends {
		var n int64
		if err := m.active.Lookup(slot, &n); err != nil {
			return fmt.Errorf("reading active connections of %s: %w", name, err)
		}
		n = max(n, 0) // a recount corrects a count a race took below zero
		st.ActiveBackends[name] = n
		if z, ok := zones[slot]; ok {
			service, _, _ := strings.Cut(name, "/")
			st.ActiveZones[service+"/"+z] += n
		}
	}
	return nil
}

// PinnedStats reads the counters of the forwarder pinned for cfg.Iface, whether or not a
// loader runs.
func PinnedStats(cfg Config) (Stats, error) {
	var m [7]*ebpf.Map
	for i, name := range []string{"path_stats", "vip_stats", "backend_stats", "vip_names", "backend_names", "active", "backend_zones"} {
		pm, err := ebpf.LoadPinnedMap(filepath.Join(cfg.pinDir(), name), nil)
		if err != nil {
			if i >= 5 { // pinned by a loader that counted no connections
				continue
			}
			return Stats{}, fmt.Errorf("no stickylb forwarder pinned for %s: %w", cfg.Iface, err)
		}
		defer pm.Close()
		m[i] = pm
	}
	return readStats(statsMaps{m[0], m[1], m[2], m[3], m[4], m[5], m[6]})
}

// VIPTable is one VIP's Maglev table as backend names ("service/identity"; "" for an empty
// slot) and the backends flagged down, as the pinned maps hold them. Two forwarders fed the
// same view hold equal VIPTables whatever slot numbers each gave its backends.
type VIPTable struct {
	Table []string `json:"table"`
	Down  []string `json:"down,omitempty"`
	Panic bool     `json:"panic,omitempty"`
}

// PinnedTables reads the tables of the forwarder pinned for cfg.Iface, by service.
func PinnedTables(cfg Config) (map[string]VIPTable, error) {
	open := func(name string) (*ebpf.Map, error) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(cfg.pinDir(), name), nil)
		if err != nil {
			return nil, fmt.Errorf("no stickylb forwarder pinned for %s: %w", cfg.Iface, err)
		}
		return m, nil
	}
	var ms [5]*ebpf.Map
	for i, name := range []string{"vips", "maglev", "vip_names", "backend_names", "backends"} {
		m, err := open(name)
		if err != nil {
			return nil, err
		}
		defer m.Close()
		ms[i] = m
	}
	vips, maglev, vipNames, backendNames, backends := ms[0], ms[1], ms[2], ms[3], ms[4]
	vn, err := names(vipNames)
	if err != nil {
		return nil, err
	}
	bn, err := names(backendNames)
	if err != nil {
		return nil, err
	}
	out := map[string]VIPTable{}
	var k lbVipKey
	var meta lbVipMeta
	it := vips.Iterate()
	for it.Next(&k, &meta) {
		svc := vn[meta.Id]
		var innerID ebpf.MapID
		if err := maglev.Lookup(meta.Id, &innerID); err != nil {
			return nil, fmt.Errorf("the table of VIP %s: %w", svc, err)
		}
		inner, err := ebpf.NewMapFromID(innerID)
		if err != nil {
			return nil, fmt.Errorf("the table of VIP %s: %w", svc, err)
		}
		vt := VIPTable{Table: make([]string, meta.TableSize), Panic: meta.Flags&FlagPanic != 0}
		for i := uint32(0); i < meta.TableSize; i++ {
			var slot uint32
			if err := inner.Lookup(i, &slot); err != nil {
				inner.Close()
				return nil, fmt.Errorf("the table of VIP %s: %w", svc, err)
			}
			if slot != emptySlot {
				vt.Table[i] = bn[slot]
			}
		}
		inner.Close()
		for slot, name := range bn {
			var b lbBackend
			if strings.HasPrefix(name, svc+"/") && backends.Lookup(slot, &b) == nil && b.Flags&backendDown != 0 {
				vt.Down = append(vt.Down, name)
			}
		}
		sort.Strings(vt.Down)
		out[svc] = vt
	}
	return out, it.Err()
}
