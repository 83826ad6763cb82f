package adsclient

import "time"

// backoff yields the waits between connection attempts (see Backoff).
type backoff struct {
	cfg Backoff
	// rand returns a uniform integer in [0, n); injected so tests can pin the draws.
	rand    func(n int64) int64
	attempt int
}

// ceiling is the upper bound of the next wait: Initial doubled once per failure, capped.
func (b *backoff) ceiling() time.Duration {
	c := b.cfg.Initial
	for i := 0; i < b.attempt && c < b.cfg.Max; i++ {
		c *= 2
	}
	return min(c, b.cfg.Max)
}

// next returns the wait before the next attempt, uniform in [0, ceiling] (full jitter).
func (b *backoff) next() time.Duration {
	c := b.ceiling()
	b.attempt++
	return time.Duration(b.rand(int64(c) + 1))
}

// reset starts over from Initial (after a healthy stream).
func (b *backoff) reset() { b.attempt = 0 }
