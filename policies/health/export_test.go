package health

// What only tests use of the checker: kept out of the package's API (a test hook in the
// shipped code would be a door no configuration should find).

import (
	"slices"
	"strings"
	"time"
)

// Config returns the configuration the Checker runs with, defaults applied.
func (c *Checker) Config() Config {
	cfg := c.cfg
	cfg.ExpectStatus = slices.Clone(cfg.ExpectStatus)
	cfg.ExpectRanges = slices.Clone(cfg.ExpectRanges)
	return cfg
}

// Status reports whether target id is healthy and since when. known is
// false when id is not a target or has not been probed yet (State Unknown,
// which is routable: see State.Routable); since is then when it was added.
func (c *Checker) Status(id string) (healthy bool, since time.Time, known bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	tg, ok := c.targets[id]
	if !ok {
		return false, time.Time{}, false
	}
	return tg.m.state == Healthy, tg.m.since, tg.m.state != Unknown
}

// Snapshot returns the status of every target, sorted by ID.
func (c *Checker) Snapshot() []TargetStatus {
	c.mu.Lock()
	out := make([]TargetStatus, 0, len(c.targets))
	for _, tg := range c.targets {
		out = append(out, tg.status())
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b TargetStatus) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// AllowShortIntervals lets a Checker run with intervals (and so timeouts)
// below MinInterval, down to 1 ms. It exists for tests and benchmarks, here
// and in other packages, that must see several probes in well under a
// second; Config.Validate, which user configuration goes through, keeps the
// 1 s floor. It is an option of the constructor rather than a Config field so
// that no configuration file can reach it.
func AllowShortIntervals() Option {
	return func(o *options) { o.minInterval = shortestInterval }
}

// withICMPMode pins the ICMP socket kind, so tests can exercise each path.
func withICMPMode(m icmpMode) Option {
	return func(o *options) { o.icmpMode = m }
}
