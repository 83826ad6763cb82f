// The forwarder's counters: by path, VIP and backend, from a loader's maps or the pinned ones.

package l4xdp

import (
	"fmt"
	"path/filepath"
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
