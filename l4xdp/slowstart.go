// Slow start: a backend that joins, or turns healthy again, ramps its weight over the
// service's window, in steps every node takes at the same times.

package l4xdp

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/stickylb/stickylb/policies/balance"
	"github.com/stickylb/stickylb/policies/pools"
)

// rampSteps is how many times the tables step over a slow-start window (the floor
// is ten). The factor is computed at the start of each step, so nodes that share the ramp's
// start (the health transition's time, as the verdict's source gives it) build the same
// table in the same step.
const rampSteps = 20

// maintainTick is how often the loader looks for a ramp step due: windows of a second or
// more take every one of their rampSteps steps.
const maintainTick = 50 * time.Millisecond

// DefaultRecount is how often the loader recounts active connections from the connection
// table (LRU evictions have no callback; see Options.Recount).
const DefaultRecount = 5 * time.Second

func (l *Loader) now() time.Time { return time.Now() }

func slowStartOf(s *pools.Service) balance.SlowStart {
	if s.SlowStart == nil {
		return balance.SlowStart{}
	}
	return balance.SlowStart{Window: s.SlowStart.Window, Aggression: s.SlowStart.Aggression, MinWeightPercent: s.SlowStart.MinWeightPercent}
}

// joinedLocked starts key's ramp: a backend added by an edit.
func (l *Loader) joinedLocked(key string, at time.Time) { l.rampFrom[key] = at }

// recoveredLocked starts key's ramp at at, the time its verdict turned healthy.
func (l *Loader) recoveredLocked(key string, at time.Time) { l.rampFrom[key] = at }

// rampStep is the step of a ramp that started at since, at now: 0..rampSteps (done).
func rampStep(ss balance.SlowStart, since, now time.Time) int {
	if ss.Window <= 0 || since.IsZero() {
		return rampSteps
	}
	el := now.Sub(since)
	if el <= 0 {
		return 0
	}
	return int(min(int64(rampSteps), int64(el)*rampSteps/int64(ss.Window)))
}

// effectiveWeightLocked is backend key's weight in weightScale units, ramped at the start
// of its current slow-start step, and whether a ramp holds it down.
func (l *Loader) effectiveWeightLocked(s *pools.Service, key string, weight uint32, now time.Time) (uint32, bool) {
	full := max(weight, 1) * weightScale
	ss := slowStartOf(s)
	since, ok := l.rampFrom[key]
	if !ok {
		return full, false
	}
	step := rampStep(ss, since, now)
	l.rampBuilt[key] = step
	if step >= rampSteps {
		delete(l.rampFrom, key)
		delete(l.rampBuilt, key)
		return full, false
	}
	at := since.Add(time.Duration(int64(ss.Window) * int64(step) / rampSteps))
	f := ss.Factor(since, at)
	return max(1, uint32(float64(full)*f+0.5)), true
}

// rampDueLocked says whether some ramp has entered a step its tables were not built for.
func (l *Loader) rampDueLocked(now time.Time) bool {
	if l.file == nil || len(l.rampFrom) == 0 {
		return false
	}
	windows := map[string]balance.SlowStart{}
	for _, s := range vipServices(l.file) {
		for _, b := range s.Backends {
			windows[s.Name+"/"+b.Identity()] = slowStartOf(s)
		}
	}
	for key, since := range l.rampFrom {
		ss, ok := windows[key]
		if !ok {
			delete(l.rampFrom, key)
			delete(l.rampBuilt, key)
			continue
		}
		if built, ok := l.rampBuilt[key]; !ok || built != rampStep(ss, since, now) {
			return true
		}
	}
	return false
}

// startMaintenanceLocked starts, once, the loop that steps slow-start ramps, retries a
// failed apply, recounts active connections and sweeps ended NAT flows; it ends with ctx
// or Close.
func (l *Loader) startMaintenanceLocked(ctx context.Context) {
	if l.maintStop != nil {
		return
	}
	stop := make(chan struct{})
	l.maintStop, l.maintDone = stop, make(chan struct{})
	go func() {
		defer close(l.maintDone)
		tick := time.NewTicker(maintainTick)
		defer tick.Stop()
		lastCount := time.Now()
		every := l.cfg.Tables.recount()
		for {
			select {
			case <-ctx.Done():
				return
			case <-stop:
				return
			case <-tick.C:
			}
			l.mu.Lock()
			now := l.now()
			if !l.stoppingLocked() && (l.rampDueLocked(now) || l.holdEndedLocked(now)) {
				l.rebuildLocked("a slow-start step or the first verdicts")
			}
			retry := l.retryDueLocked(now)
			l.mu.Unlock()
			if retry {
				l.retry()
			}
			if time.Since(lastCount) >= every {
				lastCount = time.Now()
				if err := l.maps.Recount(); err != nil {
					l.log.Warn("recounting active connections", zap.Error(err))
				}
				if _, err := l.maps.SweepNAT(); err != nil {
					l.log.Warn("sweeping ended NAT flows", zap.Error(err))
				}
				l.mu.Lock()
				routed := l.routed
				l.mu.Unlock()
				l.resolveNextHops(routed, 0)
			}
		}
	}()
}

// stopMaintenance ends the loop started by startMaintenanceLocked and waits for it.
func (l *Loader) stopMaintenance() {
	l.mu.Lock()
	stop, done := l.maintStop, l.maintDone
	l.mu.Unlock()
	if stop == nil {
		return
	}
	select {
	case <-stop:
	default:
		close(stop)
	}
	<-done
}
