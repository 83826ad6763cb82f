package adsclient

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// ApplyLogEvery is how often a node logs the updates it applies, at most: a control plane
// that sends a new version every few milliseconds costs one line per interval.
const ApplyLogEvery = 10 * time.Second

// Sampled writes info lines of one kind at most once per Every: the first at once; those
// that follow within Every are held, the latest of them written when Every has passed with
// how many lines it stands for ("skipped": the ones not written), so a flood of updates
// costs one line per interval and the last state is always in the log. Safe for concurrent
// use; Stop it when its logger's owner goes.
type Sampled struct {
	Log   *zap.Logger
	Every time.Duration

	mu      sync.Mutex
	last    time.Time // when a line was last written
	held    *heldLine // the latest line not written yet
	skipped int       // lines not written since the last one was
	timer   *time.Timer
	stopped bool
}

type heldLine struct {
	msg    string
	fields []zap.Field
}

// Info writes msg with fields now, or holds it until Every has passed since the last line.
func (s *Sampled) Info(msg string, fields ...zap.Field) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	now := time.Now()
	if s.held == nil && now.Sub(s.last) >= s.Every {
		s.last = now
		s.Log.Info(msg, fields...)
		return
	}
	if s.held != nil {
		s.skipped++
	}
	s.held = &heldLine{msg: msg, fields: fields}
	if s.timer == nil {
		s.timer = time.AfterFunc(s.Every-now.Sub(s.last), s.flush)
	}
}

// flush writes the held line, if any.
func (s *Sampled) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timer = nil
	s.writeHeldLocked()
}

func (s *Sampled) writeHeldLocked() {
	if s.held == nil {
		return
	}
	fields := s.held.fields
	if s.skipped > 0 {
		fields = append(fields[:len(fields):len(fields)], zap.Int("skipped", s.skipped))
	}
	s.Log.Info(s.held.msg, fields...)
	s.last, s.held, s.skipped = time.Now(), nil, 0
}

// Stop writes the held line and ends the sampler: later lines are dropped.
func (s *Sampled) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if !s.stopped {
		s.writeHeldLocked()
	}
	s.stopped = true
}
