package pools

import (
	"context"
	"fmt"
	"sync"

	"github.com/stickylb/stickylb/policies/health"
)

// CheckerConfig is the health checker configuration of hc, for the tiers that probe
// (the xDS server and the XDP loader).
func (hc *HealthCheck) CheckerConfig() health.Config {
	return health.Config{
		Protocol:           health.Protocol(hc.Protocol),
		Path:               hc.Path,
		ExpectStatus:       hc.ExpectStatus,
		Port:               hc.Port,
		Interval:           hc.Interval,
		Timeout:            hc.Timeout,
		HealthyThreshold:   hc.HealthyThreshold,
		UnhealthyThreshold: hc.UnhealthyThreshold,
	}
}

// HealthTargets are the service's backends as health targets: identity and the address to
// probe (the bare IP for icmp checks).
func (s *Service) HealthTargets() []health.Target {
	ts := make([]health.Target, 0, len(s.Backends))
	for _, b := range s.Backends {
		addr := b.Address
		if s.HealthCheck != nil && s.HealthCheck.Protocol == HealthICMP {
			addr = b.AddrPort().Addr().String()
		}
		ts = append(ts, health.Target{ID: b.Identity(), Address: addr})
	}
	return ts
}

// HealthMonitor runs one health checker per service of a pools file that has a
// health_check, for the tiers that probe their backends themselves (the xDS server for the
// whole fleet, the XDP loader). A pools-file edit keeps the checker, and so the view, of
// every service whose health_check is unchanged; only its targets follow the file.
type HealthMonitor struct {
	opts         []health.Option
	onTransition func(service string, tr health.Transition)

	mu       sync.Mutex
	checkers map[string]*runningChecker // by service name
	wg       sync.WaitGroup             // the checkers' Run and Watch loops
}

type runningChecker struct {
	c      *health.Checker
	cfg    HealthCheck
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned
}

// NewHealthMonitor returns a monitor that calls onTransition, on a goroutine of its own per
// service, after every transition. onTransition may call View.
func NewHealthMonitor(onTransition func(service string, tr health.Transition), opts ...health.Option) *HealthMonitor {
	return &HealthMonitor{opts: opts, onTransition: onTransition, checkers: map[string]*runningChecker{}}
}

// View is the state the service's checker sees for b: Unknown for a service without a
// health_check or a backend not probed yet.
func (m *HealthMonitor) View(service string, b *Backend) health.State {
	m.mu.Lock()
	rc := m.checkers[service]
	m.mu.Unlock()
	if rc == nil {
		return health.Unknown
	}
	st, ok := rc.c.Lookup(b.Identity())
	if !ok {
		return health.Unknown
	}
	return st.State
}

// Apply starts, retargets or stops checkers for services (a file's, or the part of them a
// tier serves); they run until ctx is done or Stop.
func (m *HealthMonitor) Apply(ctx context.Context, services []*Service) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	for _, s := range services {
		if s.HealthCheck == nil {
			continue
		}
		seen[s.Name] = true
		rc := m.checkers[s.Name]
		if rc != nil && fmt.Sprint(rc.cfg) != fmt.Sprint(*s.HealthCheck) {
			m.stopLocked(s.Name)
			rc = nil
		}
		if rc == nil {
			c, err := health.NewChecker(s.HealthCheck.CheckerConfig(), m.opts...)
			if err != nil {
				return fmt.Errorf("service %s: health checker: %w", s.Name, err)
			}
			cctx, cancel := context.WithCancel(ctx)
			rc = &runningChecker{c: c, cfg: *s.HealthCheck, cancel: cancel, done: make(chan struct{})}
			m.checkers[s.Name] = rc
			name := s.Name
			watch := c.Watch(cctx, 64, func(tr health.Transition) { m.onTransition(name, tr) })
			m.wg.Add(2)
			go func() { defer m.wg.Done(); watch() }()
			go func() { defer m.wg.Done(); defer close(rc.done); _ = c.Run(cctx) }()
		}
		if err := rc.c.SetTargets(s.HealthTargets()); err != nil {
			return fmt.Errorf("service %s: health targets: %w", s.Name, err)
		}
	}
	for name := range m.checkers {
		if !seen[name] {
			m.stopLocked(name)
		}
	}
	return nil
}

// stopLocked waits for the checker's Run only: its Watch loop may be inside onTransition,
// waiting for a lock the caller of Apply holds.
func (m *HealthMonitor) stopLocked(name string) {
	if rc := m.checkers[name]; rc != nil {
		rc.cancel()
		<-rc.done
		delete(m.checkers, name)
	}
}

// Stop ends every checker and waits for their loops, onTransition calls included; call it
// without holding a lock onTransition takes.
func (m *HealthMonitor) Stop() {
	m.mu.Lock()
	for name := range m.checkers {
		m.stopLocked(name)
	}
	m.mu.Unlock()
	m.wg.Wait()
}
