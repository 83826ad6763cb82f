package adsclient

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// ApplyLogEvery is how often a node logs the updates it applies, at most: a control plane
// that sends a new version every few milliseconds costs one line per interval.
const ApplyLogEvery = 10 * time.Second

// Paced hands values to Fn at most once per Every: the first at once; of those that come
// within Every after it only the latest is kept, and handed over when Every has passed with
// how many it replaced (skipped). A flood costs one call per interval and the last value
// is always handed over. Fn runs with the Paced locked (calls are ordered and never
// overlap), so it must not call back into it. Safe for concurrent use; Stop it when Fn's
// resources go.
type Paced[T any] struct {
	Every time.Duration
	Fn    func(v T, skipped int)

	mu      sync.Mutex
	last    time.Time // when Fn was last called
	held    *T        // the latest value not handed over yet
	skipped int       // values replaced since Fn was last called
	timer   *time.Timer
	stopped bool
}

// Put hands v to Fn now, or keeps it until Every has passed since Fn was last called.
func (p *Paced[T]) Put(v T) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	now := time.Now()
	if p.held == nil && now.Sub(p.last) >= p.Every {
		p.last = now
		p.Fn(v, 0)
		return
	}
	if p.held != nil {
		p.skipped++
	}
	p.held = &v
	if p.timer == nil {
		p.timer = time.AfterFunc(p.Every-now.Sub(p.last), p.flush)
	}
}

func (p *Paced[T]) flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.timer = nil
	if !p.stopped {
		p.handHeldLocked()
	}
}

func (p *Paced[T]) handHeldLocked() {
	if p.held == nil {
		return
	}
	p.Fn(*p.held, p.skipped)
	p.last, p.held, p.skipped = time.Now(), nil, 0
}

// Stop hands over the value held, if any, and ends the Paced: later values are dropped.
func (p *Paced[T]) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	if !p.stopped {
		p.handHeldLocked()
	}
	p.stopped = true
}

// Sampled writes info lines of one kind at most once per Every, through a Paced: a line
// written after others were held says how many it stands for ("skipped": those not
// written). Safe for concurrent use; Stop it when its logger's owner goes.
type Sampled struct {
	Log   *zap.Logger
	Every time.Duration

	once sync.Once
	p    Paced[heldLine]
}

type heldLine struct {
	msg    string
	fields []zap.Field
}

func (s *Sampled) init() {
	s.once.Do(func() {
		s.p.Every = s.Every
		s.p.Fn = func(l heldLine, skipped int) {
			if skipped > 0 {
				l.fields = append(l.fields[:len(l.fields):len(l.fields)], zap.Int("skipped", skipped))
			}
			s.Log.Info(l.msg, l.fields...)
		}
	})
}

// Info writes msg with fields now, or holds it until Every has passed since the last line.
func (s *Sampled) Info(msg string, fields ...zap.Field) {
	s.init()
	s.p.Put(heldLine{msg: msg, fields: fields})
}

// Stop writes the line held and ends the sampler: later lines are dropped.
func (s *Sampled) Stop() {
	s.init()
	s.p.Stop()
}
