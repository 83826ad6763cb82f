package health

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Target is one backend to probe.
type Target struct {
	// ID is the backend's identity (its hash_key, else its address as
	// written); transitions and Status use it.
	ID string
	// Address is host:port, or a bare host for icmp checks and for checks
	// that set Config.Port.
	Address string
	// Seed, when not Unknown, is the state a new target starts in: a verdict another
	// prober decided, which this one takes over (a replicated control plane's new leader).
	// The thresholds then count from it, so a backend stays as it was until they are met
	// again, and no transition is made to the state it already has. SeedSince is when
	// that state began (default: when the target is added).
	Seed      State
	SeedSince time.Time
}

// Scheduling constants; see the package documentation for the bound they
// give.
const (
	// firstProbeSpread: a new target's first probe comes after a random
	// delay below min(Interval/firstProbeSpread, maxFirstProbeDelay), so a
	// cold start or a large SetTargets does not probe every backend at the
	// same instant, yet no target waits a whole interval to be known.
	firstProbeSpread   = 10
	maxFirstProbeDelay = time.Second
	// intervalJitter: every gap between two probes of a target is drawn
	// from (Interval - Interval/intervalJitter, Interval]. Drawing below
	// the interval, never above, desynchronises targets that started
	// together while keeping every gap <= Interval, which the detection
	// bound needs.
	intervalJitter = 10
)

// Checker probes a set of targets and keeps one health view of them.
// All methods are safe for concurrent use.
type Checker struct {
	cfg    Config
	prober prober

	mu      sync.Mutex
	targets map[string]*target
	subs    map[*subscriber]struct{}
	runCtx  context.Context // set while Run runs
	started bool
	stopped bool
	stop    chan struct{} // closed when Run begins to shut down
	wg      sync.WaitGroup
}

type target struct {
	Target
	addr   string // what the prober dials, from probeAddress
	m      machine
	cancel context.CancelFunc
	done   chan struct{} // closed when the target's goroutine has exited
}

// NewChecker returns a Checker for cfg (with defaults applied). It probes
// nothing until Run.
func NewChecker(cfg Config, opts ...Option) (*Checker, error) {
	o := options{minInterval: MinInterval}
	for _, opt := range opts {
		opt(&o)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(o.minInterval); err != nil {
		return nil, err
	}
	// The Checker keeps its own copies so later edits of the caller's
	// slices cannot change a running check.
	cfg.ExpectStatus = slices.Clone(cfg.ExpectStatus)
	cfg.ExpectRanges = slices.Clone(cfg.ExpectRanges)
	c := &Checker{
		cfg:     cfg,
		targets: make(map[string]*target),
		subs:    make(map[*subscriber]struct{}),
		stop:    make(chan struct{}),
	}
	switch cfg.Protocol {
	case TCP:
		c.prober = tcpProber{}
	case HTTP:
		p, err := newHTTPProber(cfg)
		if err != nil {
			return nil, fmt.Errorf("building http health check: %w", err)
		}
		c.prober = p
	case ICMP:
		c.prober = &icmpProber{forced: o.icmpMode}
	}
	return c, nil
}

// SetTargets replaces the set of probed targets. Targets whose ID and
// Address are unchanged keep their state and counters; new ones (and ones
// whose Address changed) start Unknown and, while Run runs, get their first
// probe within min(Interval/10, 1s); removed ones stop being probed (their
// goroutines end without waiting for SetTargets) and pending undelivered
// transitions of them are dropped.
//
// An invalid list (empty or duplicate ID, unusable address) is rejected as a
// whole with an error naming every bad entry, and the current set is kept.
func (c *Checker) SetTargets(ts []Target) error {
	next := make(map[string]string, len(ts))
	addrs := make(map[string]string, len(ts))
	var errs []error
	for i, t := range ts {
		if t.ID == "" {
			errs = append(errs, fmt.Errorf("target %d (%q): empty id", i, t.Address))
			continue
		}
		if _, dup := next[t.ID]; dup {
			errs = append(errs, fmt.Errorf("target %d: duplicate id %q", i, t.ID))
			continue
		}
		addr, err := probeAddress(c.cfg, t.Address)
		if err != nil {
			errs = append(errs, fmt.Errorf("target %d (%q): %w", i, t.ID, err))
			continue
		}
		next[t.ID] = t.Address
		addrs[t.ID] = addr
	}
	if len(errs) > 0 {
		return fmt.Errorf("setting health check targets: %w", errors.Join(errs...))
	}

	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var removed []string
	for id, tg := range c.targets {
		if a, ok := next[id]; ok && a == tg.Address {
			continue
		}
		if tg.cancel != nil {
			tg.cancel()
		}
		delete(c.targets, id)
		removed = append(removed, id)
	}
	if len(removed) > 0 {
		for s := range c.subs {
			s.purge(removed)
		}
	}
	for _, t := range ts {
		if _, ok := c.targets[t.ID]; ok {
			continue
		}
		tg := &target{Target: t, addr: addrs[t.ID], m: machine{state: t.Seed, since: now}}
		if t.Seed != Unknown && !t.SeedSince.IsZero() {
			tg.m.since = t.SeedSince
		}
		c.targets[t.ID] = tg
		if c.runCtx != nil && !c.stopped {
			c.startLocked(tg)
		}
	}
	return nil
}

// Run probes the targets until ctx is done, then stops every probe (an
// in-flight probe is aborted), waits for all of the Checker's goroutines to
// exit, closes the subscribers' channels and returns nil. A Checker runs
// once: a second call returns an error at once.
func (c *Checker) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.started {
		c.mu.Unlock()
		return errors.New("health checker: Run called more than once")
	}
	c.started = true
	c.runCtx = ctx
	for _, tg := range c.targets {
		c.startLocked(tg)
	}
	c.mu.Unlock()

	<-ctx.Done()

	c.mu.Lock()
	c.stopped = true
	close(c.stop)
	for _, tg := range c.targets {
		tg.cancel()
	}
	c.mu.Unlock()
	c.wg.Wait()

	c.mu.Lock()
	subs := c.subs
	c.subs = make(map[*subscriber]struct{})
	c.mu.Unlock()
	for s := range subs {
		s.close()
	}
	return nil
}

// startLocked starts tg's probe goroutine; c.mu is held and the Checker is
// running, so the WaitGroup cannot be waited on yet.
func (c *Checker) startLocked(tg *target) {
	ctx, cancel := context.WithCancel(c.runCtx)
	tg.cancel = cancel
	tg.done = make(chan struct{})
	c.wg.Add(1)
	go c.loop(ctx, tg)
}

// loop probes one target until its context ends. Probe starts follow a
// schedule (first delay, then gaps of at most Interval) rather than "sleep
// Interval after each probe", so probe duration and timer lateness do not
// accumulate.
func (c *Checker) loop(ctx context.Context, tg *target) {
	defer c.wg.Done()
	defer close(tg.done)
	delay := firstDelay(c.cfg.Interval)
	next := time.Now().Add(delay)
	timer := time.NewTimer(delay)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		pctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		out, result := c.prober.probe(pctx, tg.addr)
		cancel()
		if ctx.Err() != nil {
			// Aborted by removal or shutdown: the result says nothing
			// about the backend.
			return
		}
		now := time.Now()
		c.record(tg, out, result, now)
		next = next.Add(nextGap(c.cfg.Interval))
		if next.Before(now) {
			// Behind schedule (the machine stalled): probe now and drop
			// the backlog instead of bursting.
			next = now
		}
		timer.Reset(next.Sub(now))
	}
}

func firstDelay(interval time.Duration) time.Duration {
	spread := min(interval/firstProbeSpread, maxFirstProbeDelay)
	if spread <= 0 {
		return 0
	}
	return rand.N(spread)
}

func nextGap(interval time.Duration) time.Duration {
	j := interval / intervalJitter
	if j <= 0 {
		return interval
	}
	return interval - rand.N(j)
}

// record applies one probe result and tells the subscribers of a change.
// Holding c.mu across the offers keeps each target's transitions in order.
func (c *Checker) record(tg *target, out outcome, result string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped || c.targets[tg.ID] != tg {
		return
	}
	var changed bool
	var from State
	if out == inconclusive {
		changed, from = tg.m.unknown(at, result)
	} else {
		changed, from = tg.m.observe(out == passed, at, result, c.cfg.HealthyThreshold, c.cfg.UnhealthyThreshold)
	}
	if !changed {
		return
	}
	tr := Transition{
		ID: tg.ID, Address: tg.Address,
		To: tg.m.state, Healthy: tg.m.state == Healthy, ProberFault: out == inconclusive, From: from,
		At: at, Reason: result,
	}
	for s := range c.subs {
		s.offer(tr, c.spawnLocked)
	}
}

// spawnLocked runs f on a goroutine that Run waits for; c.mu is held and
// the Checker is not stopped.
func (c *Checker) spawnLocked(f func(stop <-chan struct{})) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f(c.stop)
	}()
}

// Subscribe returns a channel of transitions and a function that ends the
// subscription and closes the channel. The channel holds buf transitions
// (at least 1); it is also closed when Run returns.
//
// Probing never waits for a subscriber. When the channel is full, further
// transitions queue with at most one per target: a newer transition of a
// target replaces its undelivered one and counts it in Coalesced. So a
// subscriber that falls behind loses intermediate flaps, never a target's
// latest state, and memory stays bounded by buf plus the number of targets.
// Status, Lookup and Snapshot give the current state at any time.
func (c *Checker) Subscribe(buf int) (<-chan Transition, func()) {
	s := newSubscriber(max(buf, 1))
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		s.close()
		return s.ch, func() {}
	}
	c.subs[s] = struct{}{}
	c.mu.Unlock()
	return s.ch, func() {
		c.mu.Lock()
		delete(c.subs, s)
		c.mu.Unlock()
		s.close()
	}
}

// Watch subscribes at once (with a buffer of buf, as Subscribe) and returns the loop that
// hands each transition to fn until ctx is done or the checker stops, then unsubscribes.
// Run the loop on a goroutine of the caller's; subscribing before it starts means no
// transition after Watch returns is missed.
func (c *Checker) Watch(ctx context.Context, buf int, fn func(Transition)) (loop func()) {
	ch, unsub := c.Subscribe(buf)
	return func() {
		defer unsub()
		for {
			select {
			case <-ctx.Done():
				return
			case tr, ok := <-ch:
				if !ok { // Run returned and closed the subscriptions
					return
				}
				fn(tr)
			}
		}
	}
}

// Lookup returns the full status of target id, false when it is not a
// target.
func (c *Checker) Lookup(id string) (TargetStatus, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	tg, ok := c.targets[id]
	if !ok {
		return TargetStatus{}, false
	}
	return tg.status(), true
}

func (tg *target) status() TargetStatus {
	return TargetStatus{
		ID: tg.ID, Address: tg.Address,
		State: tg.m.state, Since: tg.m.since, Reason: tg.m.reason,
		LastProbe: tg.m.lastProbe, LastResult: tg.m.lastResult,
		ConsecutiveSuccesses: tg.m.okRun, ConsecutiveFailures: tg.m.failRun,
	}
}
