// Package balance holds what the tiers share for choosing the backend of a new session or
// flow: slow start for backends that just joined or recovered, and smooth weighted round
// robin. (Weighted least connections is a scan each tier does over its own counts: Caddy's
// in caddymodule, the XDP forwarder's in its BPF program.)
package balance

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

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
