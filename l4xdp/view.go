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

// Verdicts says what the control plane decided about a backend (identity id) of a service,
// and since when (the control plane's clock; zero when it does not say). Unknown means no
// verdict yet: the backend keeps the last verdict this forwarder had (from the pinned maps
// after a restart), so a control plane that restarts does not put a dead backend back for
// its first probe; a backend never judged takes new flows. A service whose HealthCheck is
// nil is not checked: its backends all take new flows.
//
// The time starts slow start: a backend whose verdict turns from unhealthy to healthy
// ramps from the time the control plane gives, not from when this node heard of it, so
// every node fed the same view builds the same table at the same step.
type Verdicts func(service, id string) (health.State, time.Time)

// ApplyView installs f's vip services with the control plane's verdicts instead of the
// loader's own probes (its health checkers are stopped, and stay stopped). A view the
// forwarder cannot hold (a table size its maps cannot take, an affinity it does not
// implement, a backend without a MAC) is an error, and the maps keep the last view applied.
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
	if err := l.applyLocked(f); err != nil {
		l.external = prev
		return err
	}
	l.file = f
	// Ramps step and active counts are reconciled as with --pools; Close ends the loop.
	l.startMaintenanceLocked(context.Background())
	return nil
}

// externalDownLocked is unhealthyLocked for a loader fed by a control plane: the verdict
// decides, Unknown keeps the last one, and a verdict that turns healthy from unhealthy
// (as this node last knew it, pinned maps included) starts key's ramp at the control
// plane's transition time.
func (l *Loader) externalDownLocked(s *pools.Service, key string, b *pools.Backend) bool {
	st, since := l.external(s.Name, b.Identity())
	if st == health.Unknown {
		return l.lastDown[key]
	}
	if was, ok := l.lastDown[key]; ok && was && st == health.Healthy {
		if since.IsZero() {
			since = l.now() // a control plane that gives no time: this node's best guess
		}
		l.recoveredLocked(key, since)
	}
	l.lastDown[key] = st == health.Unhealthy
	return l.lastDown[key]
}

// joinTimeLocked is when a backend that joins (first seen in a view, or added to the pools
// file) starts its ramp: with a control plane's healthy verdict, the verdict's time, which
// every node fed the view shares; else now.
func (l *Loader) joinTimeLocked(s *pools.Service, b *pools.Backend, now time.Time) time.Time {
	if l.external == nil || s.HealthCheck == nil {
		return now
	}
	if st, since := l.external(s.Name, b.Identity()); st == health.Healthy && !since.IsZero() {
		return since
	}
	return now
}

// checkView finds what the write phase of applyLocked would only find half-way (after
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
	}
	return errors.Join(errs...)
}
