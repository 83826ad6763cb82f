// Package healthlog logs the health transitions of the tiers that probe (`stickylb xds`
// and `stickylb xdp --pools`) with one rule: every verdict change is logged, a prober
// fault once per cause.
package healthlog

import (
	"sync"

	"go.uber.org/zap"

	"github.com/stickylb/stickylb/policies/health"
)

// Logger logs health transitions. Safe for concurrent use.
type Logger struct {
	log *zap.Logger

	mu     sync.Mutex
	causes map[string]bool // prober-fault causes already logged
}

// New returns a Logger writing to log.
func New(log *zap.Logger) *Logger {
	return &Logger{log: log, causes: map[string]bool{}}
}

// Transition logs tr of service. A prober fault (the prober cannot probe: out of
// descriptors, no permission, no ICMP socket) is logged the first time its cause is seen
// only: it strikes every backend at once, and a line per backend and per probe would bury
// the log, while its cause is one fact the operator needs once.
func (l *Logger) Transition(service string, tr health.Transition) {
	if tr.ProberFault {
		if l.first(tr.Reason) {
			l.log.Warn("health probes cannot run for the prober's own reasons: the backends concerned are UNKNOWN (routable), never down",
				zap.String("service", service), zap.String("backend", tr.ID), zap.String("cause", tr.Reason))
		}
		return
	}
	l.log.Info("backend health changed", zap.String("service", service), zap.String("backend", tr.ID),
		zap.String("state", tr.To.String()), zap.String("from", tr.From.String()), zap.String("reason", tr.Reason))
}

// first reports whether cause is seen for the first time.
func (l *Logger) first(cause string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.causes[cause] {
		return false
	}
	l.causes[cause] = true
	return true
}
