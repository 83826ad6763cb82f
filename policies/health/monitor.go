package health

import (
	"context"
	"fmt"
	"reflect"
	"sync"
)

// Service is one service's health checking as a Monitor runs it.
type Service struct {
	// Name identifies the service in View and in onTransition.
	Name string
	// Config is how its backends are probed.
	Config Config
	// Targets are its backends (identity and address to probe).
	Targets []Target
}

// Monitor runs one Checker per service, for the tiers that probe their backends themselves
// (the xDS server for the whole fleet, the XDP loader). Applying a new set of services keeps
// the checker, and so the verdicts, of every service whose Config is unchanged; only its
// targets follow.
type Monitor struct {
	opts         []Option
	onTransition func(service string, tr Transition)

	mu       sync.Mutex
	checkers map[string]*runningChecker // by service name
	wg       sync.WaitGroup             // the checkers' Run and Watch loops
}

type runningChecker struct {
	c      *Checker
	cfg    Config
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned
}

// NewMonitor returns a monitor that calls onTransition, on a goroutine of its own per
// service, after every transition. onTransition may call View.
func NewMonitor(onTransition func(service string, tr Transition), opts ...Option) *Monitor {
	return &Monitor{opts: opts, onTransition: onTransition, checkers: map[string]*runningChecker{}}
}

// View is the state the service's checker sees for the backend with identity id: Unknown
// for a service without a checker or a backend not probed yet.
func (m *Monitor) View(service, id string) State {
	m.mu.Lock()
	rc := m.checkers[service]
	m.mu.Unlock()
	if rc == nil {
		return Unknown
	}
	st, ok := rc.c.Lookup(id)
	if !ok {
		return Unknown
	}
	return st.State
}

// Lookup is the full status of the backend with identity id as the service's checker holds
// it (its last probe's time and result included); false for a service without a checker or
// a backend it does not probe.
func (m *Monitor) Lookup(service, id string) (TargetStatus, bool) {
	m.mu.Lock()
	rc := m.checkers[service]
	m.mu.Unlock()
	if rc == nil {
		return TargetStatus{}, false
	}
	return rc.c.Lookup(id)
}

// Apply starts, retargets or stops checkers so that exactly services are checked; they run
// until ctx is done or Stop.
func (m *Monitor) Apply(ctx context.Context, services []Service) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[string]bool{}
	for _, s := range services {
		seen[s.Name] = true
		rc := m.checkers[s.Name]
		if rc != nil && !reflect.DeepEqual(rc.cfg, s.Config) {
			m.stopLocked(s.Name)
			rc = nil
		}
		if rc == nil {
			var err error
			if rc, err = m.startLocked(ctx, s); err != nil {
				return err
			}
		}
		if err := rc.c.SetTargets(s.Targets); err != nil {
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

func (m *Monitor) startLocked(ctx context.Context, s Service) (*runningChecker, error) {
	c, err := NewChecker(s.Config, m.opts...)
	if err != nil {
		return nil, fmt.Errorf("service %s: health checker: %w", s.Name, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	rc := &runningChecker{c: c, cfg: s.Config, cancel: cancel, done: make(chan struct{})}
	m.checkers[s.Name] = rc
	name := s.Name
	watch := c.Watch(cctx, 64, func(tr Transition) { m.onTransition(name, tr) })
	m.wg.Add(2)
	go func() { defer m.wg.Done(); watch() }()
	go func() { defer m.wg.Done(); defer close(rc.done); _ = c.Run(cctx) }()
	return rc, nil
}

// stopLocked waits for the checker's Run only: its Watch loop may be inside onTransition,
// waiting for a lock the caller of Apply holds.
func (m *Monitor) stopLocked(name string) {
	if rc := m.checkers[name]; rc != nil {
		rc.cancel()
		<-rc.done
		delete(m.checkers, name)
	}
}

// Stop ends every checker and waits for their loops, onTransition calls included; call it
// without holding a lock onTransition takes.
func (m *Monitor) Stop() {
	m.mu.Lock()
	for name := range m.checkers {
		m.stopLocked(name)
	}
	m.mu.Unlock()
	m.wg.Wait()
}
