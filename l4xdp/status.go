// The forwarder's status for the status page: per VIP, its backends with their active flows
// (from the program's counters, never by walking the connection table), weights, verdicts
// and the VIP's table generation and counters.

package l4xdp

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/policies/status"
)

// panicNoteXDP says what the forwarder does when a VIP is in panic.
const panicNoteXDP = "every non-draining backend is down: new flows go to all of them (fail open)"

// Status is the forwarder's state now. The counters are read after the loader's lock is
// released: a flow count and a verdict may be a few microseconds apart, never inconsistent
// within one.
func (l *Loader) Status() (*status.Snapshot, error) {
	host, _ := os.Hostname()
	snap := &status.Snapshot{Tier: status.TierXDP, Node: host, Time: time.Now(),
		Actions: status.Actions{DrainHint: "read-only: to drain a backend, set `drain: true` on it in the pools file (or, fed by a control plane, in the control plane's)"}}
	l.mu.Lock()
	f := l.file
	var svcs []status.Service
	if f != nil {
		for _, s := range vipServices(f) {
			svcs = append(svcs, l.serviceStatusLocked(s, snap.Time))
		}
	}
	fed := l.external != nil
	l.mu.Unlock()
	// The snapshot is of the moment its reading ended: a probe that finished while the
	// services were read is then not later than the snapshot that shows it.
	snap.Time = time.Now()

	st, err := l.maps.Stats()
	if err != nil {
		return nil, fmt.Errorf("reading the forwarder's counters: %w", err)
	}
	for i := range svcs {
		svc := &svcs[i]
		for j := range svc.Backends {
			b := &svc.Backends[j]
			b.Flows = status.Ptr(st.ActiveBackends[svc.Name+"/"+b.ID])
		}
		c := st.VIPs[svc.Name]
		svc.Counters = map[string]uint64{"packets": c.Packets, "bytes": c.Bytes}
		panicking := svc.Panic
		svc.Finish(panicNoteXDP)
		svc.Panic = panicking // the tables' own rule (see candidates), not Finish's
		// Flows per zone: the program's own per-zone counts (those of the zone metric),
		// which also hold the flows of a backend removed while they finish.
		zones := map[string]int64{}
		for k, n := range st.ActiveZones {
			if z, ok := strings.CutPrefix(k, svc.Name+"/"); ok {
				zones[z] = n
			}
		}
		svc.SetZoneFlows(zones)
		svc.Load.SessionsNote = "flows are active connections counted by the program (first packet to FIN, RST or idle timeout)"
	}
	snap.Services = svcs
	snap.Counters = map[string]uint64{}
	for p, c := range st.Paths {
		snap.Counters[p] = c.Packets
	}
	if fed {
		snap.Notes = append(snap.Notes, "fed by a control plane: health verdicts and their times are the control plane's; "+
			"this node sends no probes, so its last check is n/a here (the control plane's page shows it)")
	}
	return snap, nil
}

// serviceStatusLocked is one VIP service as the loader's tables hold it now.
func (l *Loader) serviceStatusLocked(s *pools.Service, now time.Time) status.Service {
	out := status.Service{Name: s.Name, VIP: s.VIP, Policy: s.Balance,
		Affinity:   status.Affinity{Mode: s.Affinity.Mode},
		Generation: status.Ptr(l.gens[s.Name])}
	if s.Affinity.TTL > 0 && s.Affinity.Mode != pools.ModeNone {
		out.Affinity.TTL = s.Affinity.TTL.String()
	}
	if s.IdleTimeout > 0 {
		out.Notes = append(out.Notes, "idle flows leave the connection table after "+s.IdleTimeout.String())
	}
	if hc := s.HealthCheck; hc != nil {
		out.HealthCheck = status.HealthCheck{Active: true, Target: hc.Protocol, Interval: hc.Interval.String(),
			Timeout: hc.Timeout.String(), Fails: hc.UnhealthyThreshold, Passes: hc.HealthyThreshold,
			Bound: (hc.Interval*time.Duration(hc.UnhealthyThreshold) + hc.Timeout).String()}
		if l.external != nil {
			out.HealthCheck.Active, out.HealthCheck.Bound = false, ""
			out.Notes = append(out.Notes, "health is checked by the control plane")
		}
	} else {
		out.Notes = append(out.Notes, "no health_check: every backend takes new flows")
	}
	ss := slowStartOf(s)
	usable, undrained := false, false
	for _, b := range s.Backends {
		key := s.Name + "/" + b.Identity()
		bs := status.Backend{ID: b.Identity(), Address: b.Address, Zone: b.Zone,
			Draining: b.Drain || s.ZoneDrained(b.Zone), Health: l.healthLocked(s, key, b)}
		w := float64(max(b.Weight, 1))
		bs.Weight, bs.EffectiveWeight = status.Ptr(w), status.Ptr(w)
		if since, ok := l.rampFrom[key]; ok {
			if step := rampStep(ss, since, now); step < rampSteps {
				// The tables hold the weight of the step's start (see effectiveWeightLocked).
				f := ss.Factor(since, since.Add(time.Duration(int64(ss.Window)*int64(step)/rampSteps)))
				bs.SlowStart = &status.SlowStart{Since: since, Window: ss.Window.String(), Factor: f}
				bs.EffectiveWeight = status.Ptr(w * f)
			}
		}
		down := bs.Health.State == status.Unhealthy
		if down || bs.Draining {
			bs.EffectiveWeight = status.Ptr(0.0)
		}
		if !b.Drain {
			undrained = true
			usable = usable || !down
		}
		out.Backends = append(out.Backends, bs)
	}
	out.Panic.Active = undrained && !usable
	if out.Panic.Active {
		out.Panic.Note = panicNoteXDP
	}
	return out
}

// healthLocked is a backend's verdict as the loader builds its tables from it: the control
// plane's, or its own checker's, or, until one has a verdict, the last verdict it had.
func (l *Loader) healthLocked(s *pools.Service, key string, b *pools.Backend) status.Health {
	if s.HealthCheck == nil {
		return status.Health{State: status.Unknown}
	}
	var h status.Health
	var st health.State
	var probe *health.TargetStatus // the loader's own checker's, nil when fed
	if l.external != nil {
		v := l.external(s.Name, b.Identity())
		st = v.State
		if !v.Since.IsZero() {
			h.Since = status.Ptr(v.Since)
		}
	} else if l.health != nil {
		ts, _ := l.health.Lookup(s.Name, b.Identity()) // Unknown before the checker has it
		st = ts.State
		if tr, ok := l.seen[key]; ok && tr.To == st {
			h.Since = status.Ptr(tr.At)
			if st == health.Unhealthy {
				h.Reason = tr.Reason
			}
		}
		probe = &ts
	}
	switch {
	case st == health.Healthy:
		h.State = status.Healthy
	case st == health.Unhealthy:
		h.State = status.Unhealthy
	case l.lastDown[key]:
		h.State, h.Reason = status.Unhealthy, "the last verdict this forwarder had (no new one yet)"
	default:
		h.State = status.Unknown
	}
	if probe != nil {
		h.AddProbe(*probe, s.HealthCheck.UnhealthyThreshold)
	}
	return h
}
