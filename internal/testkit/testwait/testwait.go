// Package testwait is how tests wait: on a condition or a channel, with a deadline the
// caller states, never with a bare sleep. A wait that runs out fails the test with what it
// was waiting for and what it last saw.
package testwait

import (
	"testing"
	"time"
)

// Interval is how often For polls: short, so a test waits little past the moment its
// condition holds, and long enough that polling costs the machine nothing.
const Interval = 10 * time.Millisecond

// For is Until at Interval: the wait every test uses unless it needs its own pace.
func For(tb testing.TB, within time.Duration, what string, cond func() (bool, string)) time.Duration {
	tb.Helper()
	return Until(tb, within, Interval, what, cond)
}

// Until calls cond every interval until it holds, and returns how long that took. When
// within has passed first, it fails tb with what and what cond last reported.
func Until(tb testing.TB, within, interval time.Duration, what string, cond func() (bool, string)) time.Duration {
	tb.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for {
		ok, seen := cond()
		if ok {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not within %s; last saw %s", what, within, seen)
		}
		time.Sleep(interval) // the polling interval of a condition with a deadline
	}
}

// Recv returns the next value from ch, or fails tb with what when within passes first.
func Recv[T any](tb testing.TB, ch <-chan T, within time.Duration, what string) T {
	tb.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		tb.Fatalf("%s: not within %s", what, within)
		var zero T
		return zero
	}
}
