package health

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// Protocol names how a target is probed.
type Protocol string

// The probe protocols. The pools file writes them in lower case.
const (
	// HTTP sends GET Path and compares the status with the expected ones.
	HTTP Protocol = "http"
	// TCP succeeds when a connection is established within the timeout.
	TCP Protocol = "tcp"
	// ICMP sends an echo request and waits for the matching echo reply.
	ICMP Protocol = "icmp"
)

// Limits and defaults, for every tier that probes (the pools file's health_check fills its
// omitted fields from these through WithDefaults). MinInterval and MaxInterval are the
// range AWS's ELB documents (1 s - 300 s); the defaults are its usual settings, with
// DefaultTimeout halved for intervals under 4 s (see WithDefaults).
const (
	MinInterval               = time.Second
	MaxInterval               = 300 * time.Second
	DefaultInterval           = 5 * time.Second
	DefaultTimeout            = 2 * time.Second
	DefaultHealthyThreshold   = 2
	DefaultUnhealthyThreshold = 3
	DefaultPath               = "/"
)

// shortestInterval is the floor AllowShortIntervals keeps, so that a mistyped
// test config cannot turn a checker into a busy loop.
const shortestInterval = time.Millisecond

// StatusRange is an inclusive range of HTTP status codes, such as 200-299.
type StatusRange struct {
	Min, Max int
}

// defaultExpect is what HAProxy and Caddy accept by default: any 2xx or 3xx.
// Redirects are not followed, so a 3xx is the backend's own answer.
var defaultExpect = StatusRange{Min: 200, Max: 399}

// Config says how every target of one Checker is probed.
//
// Zero fields take defaults (see WithDefaults), so Config{} is a valid TCP
// check every 5 s with a 2 s timeout.
type Config struct {
	// Protocol is http, tcp or icmp; empty means tcp, HAProxy's default check.
	Protocol Protocol
	// Path is the HTTP request target, "/" when empty; it may carry a query.
	Path string
	// Host is the HTTP Host header; empty sends the probed address, as a
	// client dialling it would.
	Host string
	// ExpectStatus lists accepted HTTP status codes. With ExpectRanges it
	// forms the accepted set; when both are empty it is 200-399.
	ExpectStatus []int
	// ExpectRanges lists accepted inclusive HTTP status ranges.
	ExpectRanges []StatusRange
	// Port, when not 0, is probed instead of the target's own port, for
	// backends that serve their health endpoint apart from their traffic.
	// It has no meaning for icmp.
	Port int
	// Interval is the time between the starts of two probes of one target.
	Interval time.Duration
	// Timeout bounds one probe (connect, request and response headers, or
	// echo round trip). It must be shorter than Interval, so the probes of
	// one target never overlap and every probe ends before the next starts.
	Timeout time.Duration
	// HealthyThreshold is the number of consecutive successes that make an
	// unhealthy target healthy.
	HealthyThreshold int
	// UnhealthyThreshold is the number of consecutive failures that make a
	// healthy target unhealthy.
	UnhealthyThreshold int
}

// WithDefaults returns c with its zero fields replaced by the defaults; this
// is the configuration a Checker runs with.
func (c Config) WithDefaults() Config {
	if c.Protocol == "" {
		c.Protocol = TCP
	}
	if c.Protocol == HTTP && c.Path == "" {
		c.Path = DefaultPath
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Timeout == 0 {
		// Half the interval when the interval is short, so the default stays
		// valid for every valid interval.
		c.Timeout = min(DefaultTimeout, c.Interval/2)
	}
	if c.HealthyThreshold == 0 {
		c.HealthyThreshold = DefaultHealthyThreshold
	}
	if c.UnhealthyThreshold == 0 {
		c.UnhealthyThreshold = DefaultUnhealthyThreshold
	}
	return c
}

// FirstVerdictWithin bounds how long a new target stays Unknown before its first
// probe has completed: the first probe's delay, below min(Interval/10, 1s), plus the
// probe's Timeout (see the package documentation), with c's defaults applied. A tier
// that holds its last verdicts until its checker's first ones holds them this long.
func (c Config) FirstVerdictWithin() time.Duration {
	c = c.WithDefaults()
	return min(c.Interval/firstProbeSpread, maxFirstProbeDelay) + c.Timeout
}

// Validate reports every problem of c (after defaults), joined into one
// error. Intervals must lie in [MinInterval, MaxInterval]; tests that need
// shorter ones pass AllowShortIntervals to NewChecker instead.
func (c Config) Validate() error {
	return c.validate(MinInterval)
}

func (c Config) validate(minInterval time.Duration) error {
	c = c.WithDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format, args...))
	}
	switch c.Protocol {
	case HTTP, TCP, ICMP:
	default:
		bad("protocol %q is not one of http, tcp, icmp", c.Protocol)
	}
	if c.Interval < minInterval || c.Interval > MaxInterval {
		bad("interval %v is outside %v..%v", c.Interval, minInterval, MaxInterval)
	}
	if c.Timeout <= 0 {
		bad("timeout %v must be positive", c.Timeout)
	} else if c.Timeout >= c.Interval {
		bad("timeout %v must be shorter than the interval %v", c.Timeout, c.Interval)
	}
	if c.HealthyThreshold < 1 {
		bad("healthy threshold %d must be at least 1", c.HealthyThreshold)
	}
	if c.UnhealthyThreshold < 1 {
		bad("unhealthy threshold %d must be at least 1", c.UnhealthyThreshold)
	}
	if c.Port < 0 || c.Port > 65535 {
		bad("port %d is outside 0..65535", c.Port)
	}
	if c.Protocol == ICMP && c.Port != 0 {
		bad("port %d has no meaning for icmp checks", c.Port)
	}
	if c.Protocol == HTTP {
		if err := checkPath(c.Path); err != nil {
			errs = append(errs, err)
		}
		if strings.ContainsAny(c.Host, " \t\r\n/") {
			bad("host %q is not a valid Host header", c.Host)
		}
		for _, s := range c.ExpectStatus {
			if s < 100 || s > 599 {
				bad("expected status %d is outside 100..599", s)
			}
		}
		for _, r := range c.ExpectRanges {
			if r.Min < 100 || r.Max > 599 || r.Min > r.Max {
				bad("expected status range %d-%d is not within 100..599 with min <= max", r.Min, r.Max)
			}
		}
	} else if c.Protocol != "" {
		// Fields that would silently do nothing are errors, so a pools file
		// that says path: /healthz on a tcp check is told so.
		if c.Path != "" {
			bad("path is only used by http checks, not %s", c.Protocol)
		}
		if c.Host != "" {
			bad("host is only used by http checks, not %s", c.Protocol)
		}
		if len(c.ExpectStatus) > 0 || len(c.ExpectRanges) > 0 {
			bad("expected statuses are only used by http checks, not %s", c.Protocol)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("invalid health check: %w", errors.Join(errs...))
}

func checkPath(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("path %q must start with /", p)
	}
	if _, err := url.ParseRequestURI(p); err != nil {
		return fmt.Errorf("path %q is not a request target: %w", p, err)
	}
	return nil
}

// expects reports whether an HTTP status counts as a success under c.
func (c Config) expects(status int) bool {
	if len(c.ExpectStatus) == 0 && len(c.ExpectRanges) == 0 {
		return status >= defaultExpect.Min && status <= defaultExpect.Max
	}
	for _, s := range c.ExpectStatus {
		if s == status {
			return true
		}
	}
	for _, r := range c.ExpectRanges {
		if status >= r.Min && status <= r.Max {
			return true
		}
	}
	return false
}

// Option changes how NewChecker builds a Checker.
type Option func(*options)

type options struct {
	minInterval time.Duration
	icmpMode    icmpMode
}
