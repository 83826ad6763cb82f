package xds

import (
	"context"
	"fmt"
	"sync"

	"go.uber.org/zap"

	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// Monitor probes every service's backends with the policies health checker, so that the
// whole fleet sees one health view (no in-proxy checks), and rebuilds the snapshots on each
// transition.
type Monitor struct {
	log  *zap.Logger
	opts []health.Option

	mu       sync.Mutex
	checkers map[string]*runningChecker // by service name
	onChange func()
}

type runningChecker struct {
	c      *health.Checker
	cfg    pools.HealthCheck
	cancel context.CancelFunc
	done   chan struct{}
}

// NewMonitor returns a monitor; onChange runs after every transition (the server's Refresh).
func NewMonitor(log *zap.Logger, onChange func(), opts ...health.Option) *Monitor {
	return &Monitor{log: log, opts: opts, checkers: map[string]*runningChecker{}, onChange: onChange}
}

// View is the health view for Translate: Unknown for services without checks.
func (m *Monitor) View(service string, b *pools.Backend) health.State {
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

// Apply starts, retargets or stops checkers for f. A service whose check config is
// unchanged keeps its checker (and its view) with the new targets.
func (m *Monitor) Apply(ctx context.Context, f *pools.File) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	for _, s := range f.Services {
		if s.HealthCheck == nil {
			continue
		}
		seen[s.Name] = true
		targets := s.HealthTargets()
		rc := m.checkers[s.Name]
		if rc != nil && !sameCheck(rc.cfg, *s.HealthCheck) {
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
			go c.Watch(cctx, 64, func(tr health.Transition) {
				m.log.Info("backend health changed", zap.String("service", name), zap.String("backend", tr.ID),
					zap.Bool("healthy", tr.Healthy), zap.String("reason", tr.Reason))
				m.onChange()
			})()
			go func() { defer close(rc.done); _ = c.Run(cctx) }()
		}
		if err := rc.c.SetTargets(targets); err != nil {
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

func sameCheck(a, b pools.HealthCheck) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

func (m *Monitor) stopLocked(name string) {
	if rc := m.checkers[name]; rc != nil {
		rc.cancel()
		<-rc.done
		delete(m.checkers, name)
	}
}

// Stop ends every checker.
func (m *Monitor) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name := range m.checkers {
		m.stopLocked(name)
	}
}
