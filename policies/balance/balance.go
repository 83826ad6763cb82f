// Package balance chooses the backend of a new session or of an unkeyed request: weighted
// least connections over a health view, slow start for backends that just joined or
// recovered, and smooth weighted round robin.
package balance

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Candidate is one backend as a picker sees it.
type Candidate struct {
	Active   int64   // requests or connections in flight
	Weight   float64 // effective weight (slow start applied); <= 0 takes no new picks
	Eligible bool    // healthy, not draining, not excluded for this request
}

func (c Candidate) ok() bool { return c.Eligible && c.Weight > 0 && !math.IsNaN(c.Weight) }

// LeastConn picks the eligible candidate with the least load per weight, Active/Weight.
// Ties, which are the rule when requests finish before the next arrives (everything at 0 in
// flight), go to a smooth weighted round robin among the tied candidates, so that idle
// backends still share requests in the ratio of their weights, in a fixed order rather
// than by chance. (Scoring (Active+1)/Weight instead, as some balancers do, starves a
// low-weight backend entirely while requests are sequential: 1/3 always beats 1/1.) The
// zero value is ready; it is safe for concurrent use.
type LeastConn struct {
	mu      sync.Mutex
	current []float64 // smooth WRR state for tie-breaking, by candidate index
	tied    []int
}

// Pick returns the index in [0, n) of the chosen candidate, or -1 when none is eligible.
// get is called once per index, under LeastConn's lock.
func (l *LeastConn) Pick(n int, get func(i int) Candidate) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.current) != n {
		l.current = make([]float64, n) // the pool changed shape: restart the tie order
	}
	l.tied = l.tied[:0]
	var bestLoad float64
	var weights [64]float64
	ws := weights[:0]
	for i := 0; i < n; i++ {
		c := get(i)
		if !c.ok() {
			continue
		}
		load := float64(c.Active) / c.Weight
		switch {
		case len(l.tied) == 0 || load < bestLoad:
			bestLoad = load
			l.tied = append(l.tied[:0], i)
			ws = append(ws[:0], c.Weight)
		case load == bestLoad:
			l.tied = append(l.tied, i)
			ws = append(ws, c.Weight)
		}
	}
	switch len(l.tied) {
	case 0:
		return -1
	case 1:
		return l.tied[0]
	}
	best, total := -1, 0.0
	for j, i := range l.tied {
		l.current[i] += ws[j]
		total += ws[j]
		if best < 0 || l.current[i] > l.current[best] {
			best = i
		}
	}
	l.current[best] -= total
	return best
}

// SmoothWRR is nginx's smooth weighted round robin: each pick adds every weight to its
// backend's credit, takes the backend with the most credit and charges it the total. With
// weights {5, 1, 1} it yields a a b a c a a. The zero value is ready; it is safe for
// concurrent use.
type SmoothWRR struct {
	mu      sync.Mutex
	current []int64
}

// Next returns the index of the next backend for weights (<= 0 is never picked), or -1
// when no weight is positive. A change in len(weights) restarts the sequence.
func (s *SmoothWRR) Next(weights []int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.current) != len(weights) {
		s.current = make([]int64, len(weights))
	}
	best, total := -1, int64(0)
	for i, w := range weights {
		if w <= 0 {
			continue
		}
		s.current[i] += int64(w)
		total += int64(w)
		if best < 0 || s.current[i] > s.current[best] {
			best = i
		}
	}
	if best >= 0 {
		s.current[best] -= total
	}
	return best
}

// SlowStart ramps a backend's weight up after it joins or turns healthy, with Envoy's
// formula: weight × max(MinWeightPercent/100, (elapsed/Window)^(1/Aggression)) while
// elapsed < Window.
type SlowStart struct {
	Window           time.Duration // 0 disables slow start
	Aggression       float64       // > 0; 1 is linear, larger ramps faster early (0 means 1)
	MinWeightPercent float64       // floor of the factor, in percent (0..100)
}

// Default values, as Envoy's slow_start_config.
const (
	DefaultAggression       = 1.0
	DefaultMinWeightPercent = 10.0
)

// ErrSlowStart reports an invalid slow-start configuration.
var ErrSlowStart = errors.New("invalid slow start")

// Validate checks the configuration.
func (s SlowStart) Validate() error {
	switch {
	case s.Window < 0:
		return fmt.Errorf("%w: negative window %s", ErrSlowStart, s.Window)
	case s.Aggression < 0 || math.IsNaN(s.Aggression) || math.IsInf(s.Aggression, 0):
		return fmt.Errorf("%w: aggression %v must be > 0", ErrSlowStart, s.Aggression)
	case s.MinWeightPercent < 0 || s.MinWeightPercent > 100 || math.IsNaN(s.MinWeightPercent):
		return fmt.Errorf("%w: min_weight_percent %v outside 0..100", ErrSlowStart, s.MinWeightPercent)
	}
	return nil
}

// Factor returns the weight factor in (0, 1] for a backend healthy since since (zero: since
// forever).
func (s SlowStart) Factor(since, now time.Time) float64 {
	if s.Window <= 0 || since.IsZero() {
		return 1
	}
	elapsed := now.Sub(since)
	if elapsed >= s.Window {
		return 1
	}
	if elapsed < time.Millisecond { // Envoy starts the clock at 1 ms, so the factor is never 0
		elapsed = time.Millisecond
	}
	f := float64(elapsed) / float64(s.Window)
	if a := s.Aggression; a > 0 && a != 1 {
		f = math.Pow(f, 1/a)
	}
	if m := s.MinWeightPercent / 100; f < m {
		f = m
	}
	return f
}

// Weight returns weight w ramped by Factor.
func (s SlowStart) Weight(w float64, since, now time.Time) float64 {
	return w * s.Factor(since, now)
}
