// A loader fed by a control plane: the services and the health verdicts come from outside
// (`stickylb xdp --xds`), and the loader probes nothing itself.

package l4xdp

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// Verdict is the control plane's verdict on one backend.
type Verdict struct {
	State health.State
	// Since is when the backend entered State, on the control plane's clock (zero when it
	// does not say).
	Since time.Time
	// From is the state it left at Since (Unknown when not said).
	From health.State
}

// Verdicts says what the control plane decided about a backend (identity id) of a service.
// Unknown (not probed yet, or a prober that cannot probe it) takes new flows, as Envoy, gRPC
// and Caddy nodes route to an UNKNOWN endpoint (health.State.Routable): a node that kept
// its last verdict would hold a backend down that every other tier sends sessions to. A
// control plane that restarts does not put a dead backend back for its first probe: it
// publishes no view until its first probes have decided (see docs/fleet.md). A service
// whose HealthCheck is nil is not checked: its backends all take new flows.
//
// The time starts slow start: a backend found healthy after unhealthy (From, or this
// node's own last verdict) ramps from Since, not from when this node heard of it, so every
// node fed the same view builds the same table at the same step, one that connected after
// the backend went down too. Unknown starts no ramp: it says nothing of a recovery.
type Verdicts func(service, id string) Verdict

// ApplyView installs f's vip services with the control plane's verdicts instead of the
// loader's own probes (its health checkers are stopped, and stay stopped). A view the
// forwarder cannot hold (a table size its maps cannot take, an affinity it does not
// implement) is an error, and the maps keep the last view applied. One that fails for what
// may pass (a backend's MAC not resolved yet) is an error too, but the loader retries it
// until it is installed (see Stale): the control plane sent it to the whole fleet.
func (l *Loader) ApplyView(f *pools.File, verdicts Verdicts) error {
	if verdicts == nil {
		return errors.New("l4xdp: ApplyView needs the verdicts")
	}
	// Not under l.mu: a checker's transition being handled takes it.
	if l.health != nil {
		if err := l.health.Apply(context.Background(), nil); err != nil {
			return fmt.Errorf("stopping the loader's own health checks: %w", err)
		}
	}
	if err := checkView(f); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	prev := l.external
	l.external = verdicts
	err := l.applyWaitLocked(f, resolveWait)
	if ok, _ := isTransient(err); err != nil && !ok {
		l.external = prev
		return err
	}
	// Applied, or to be retried (see Apply): either way the view the loader holds to.
	l.file = f
	l.settleLocked(err, false)
	// Ramps step, failed applies are retried and active counts are reconciled as with
	// --pools; Close ends the loop.
	l.startMaintenanceLocked(context.Background())
	return err
}

// externalDownLocked is unhealthyLocked for a loader fed by a control plane: the verdict
// decides, Unknown is routable, and a healthy verdict that follows an unhealthy one (as
// the control plane says, or as this node last knew it, pinned maps included) ramps key
// from the control plane's transition time. Setting the ramp's start again on every view
// is harmless: it is the same time, and a ramp past its window is done.
func (l *Loader) externalDownLocked(s *pools.Service, key string, b *pools.Backend) bool {
	v := l.external(s.Name, b.Identity())
	// From counts only with a time: a start of "now" on every view would never step.
	if v.State == health.Healthy && (v.From == health.Unhealthy && !v.Since.IsZero() || l.lastDown[key]) {
		since := v.Since
		if since.IsZero() {
			since = l.now() // a control plane that gives no time: this node's best guess, once
		}
		if !l.rampDoneLocked(s, key, since) {
			l.recoveredLocked(key, since)
		}
	}
	l.lastDown[key] = !v.State.Routable()
	return l.lastDown[key]
}

// rampDoneLocked says whether a ramp of s's backend key from since is over (or another,
// later one already runs): no need to track it.
func (l *Loader) rampDoneLocked(s *pools.Service, key string, since time.Time) bool {
	if cur, ok := l.rampFrom[key]; ok && cur.After(since) {
		return true
	}
	return rampStep(slowStartOf(s), since, l.now()) >= rampSteps
}

// joinTimeLocked is when a backend that joins (first seen in a view, or added to the pools
// file) starts its ramp: with a control plane's healthy verdict, the verdict's time, which
// every node fed the view shares; else now.
func (l *Loader) joinTimeLocked(s *pools.Service, b *pools.Backend, now time.Time) time.Time {
	if l.external == nil || s.HealthCheck == nil {
		return now
	}
	if v := l.external(s.Name, b.Identity()); v.State == health.Healthy && !v.Since.IsZero() {
		return v.Since
	}
	return now
}

// checkView finds what the write phase of applyWaitLocked would only find half-way (after
// writing other VIPs), so a bad view touches no map.
func checkView(f *pools.File) error {
	var errs []error
	for _, s := range vipServices(f) {
		if _, ok := s.VIPAddrPort(); !ok {
			errs = append(errs, fmt.Errorf("service %s: vip %q is not ip:port", s.Name, s.VIP))
		}
		if s.Hash.TableSize == 0 || s.Hash.TableSize > MaxTableSize {
			errs = append(errs, fmt.Errorf("service %s: table_size %d: this forwarder's tables hold 1..%d slots", s.Name, s.Hash.TableSize, MaxTableSize))
		}
		switch s.Affinity.Mode {
		case pools.ModeNone, pools.ModeSourceIP:
		case pools.ModeQUICCID:
			if s.Affinity.QUICCID == nil || s.Affinity.QUICCID.CIDLength < pools.MinCIDLength || s.Affinity.QUICCID.CIDLength > pools.MaxCIDLength {
				errs = append(errs, fmt.Errorf("service %s: quic_cid without a connection-ID length in %d..%d", s.Name, pools.MinCIDLength, pools.MaxCIDLength))
			}
		default:
			errs = append(errs, fmt.Errorf("service %s: affinity mode %q: this forwarder implements none, source_ip and quic_cid", s.Name, s.Affinity.Mode))
		}
		if s.Protocol != pools.ProtocolTCP && s.Protocol != pools.ProtocolUDP {
			errs = append(errs, fmt.Errorf("service %s: protocol %q: want tcp or udp", s.Name, s.Protocol))
		}
		for _, b := range s.Backends {
			// The tables scale weights (weightScale): beyond the pools file's bound they wrap.
			if b.Weight > pools.MaxWeight {
				errs = append(errs, fmt.Errorf("service %s: backend %s: weight %d out of range 1..%d", s.Name, b.Address, b.Weight, pools.MaxWeight))
			}
		}
	}
	return errors.Join(errs...)
}
