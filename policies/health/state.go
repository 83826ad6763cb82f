package health

import "time"

// State is what the checker knows about a target.
type State uint8

// The states of a target. Every target starts Unknown and leaves it with its
// first probe; it returns to Unknown when a probe cannot be run for the
// prober's own reasons (see Transition.ProberFault).
const (
	// Unknown: not probed yet, or the prober cannot probe it. Routable (see
	// State.Routable).
	Unknown State = iota
	// Healthy: the first probe passed, or HealthyThreshold probes in a row
	// passed since the target was last Unhealthy.
	Healthy
	// Unhealthy: the first probe failed, or UnhealthyThreshold probes in a
	// row failed since the target was last Healthy.
	Unhealthy
)

// String returns "unknown", "healthy" or "unhealthy".
func (s State) String() string {
	switch s {
	case Unknown:
		return "unknown"
	case Healthy:
		return "healthy"
	case Unhealthy:
		return "unhealthy"
	}
	return "invalid"
}

// Routable reports whether traffic may go to a target in state s: every
// state but Unhealthy. Unknown is routable so that a load balancer starting
// cold, or a backend just added, is not blackholed until its first probe
// (which comes within min(Interval/10, 1s)); Envoy's EDS health_status
// UNKNOWN means the same. The xDS server and the XDP loader both use this,
// so the fleet has one rule.
func (s State) Routable() bool { return s != Unhealthy }

// Transition tells that a target entered Healthy or Unhealthy, or returned to
// Unknown because the prober could not probe it.
type Transition struct {
	// ID and Address identify the target as given to SetTargets.
	ID, Address string
	// To is the state entered.
	To State
	// Healthy is To == Healthy.
	Healthy bool
	// ProberFault is set when To is Unknown: the probe failed for the
	// prober's own reasons (permissions, descriptors, buffers, no ICMP
	// socket), which say nothing about the backend. Reason names the cause.
	ProberFault bool
	// From is the state left. Unknown marks the target's first result; slow
	// start keys on Unhealthy -> Healthy.
	From State
	// At is when the deciding probe completed.
	At time.Time
	// Reason is the deciding probe's result, such as "tcp: connection
	// refused", "http: status 503", "icmp: timeout" or "http: status 200".
	Reason string
	// Coalesced counts earlier transitions of this target that this one
	// replaced, undelivered, because the subscriber was not reading (see
	// Checker.Subscribe). 0 when nothing was lost.
	Coalesced int
}

// TargetStatus is a target's state as Checker.Lookup and Checker.Snapshot
// report it.
type TargetStatus struct {
	ID, Address string
	State       State
	// Since is when the target entered State: the deciding probe's
	// completion, or for Unknown when the target was added.
	Since time.Time
	// Reason is the deciding probe's result; while Unknown, the prober fault that keeps the
	// target there, if any (empty before a first probe).
	Reason string
	// LastProbe and LastResult describe the latest completed probe, which
	// may not have changed the state.
	LastProbe  time.Time
	LastResult string
	// ConsecutiveSuccesses and ConsecutiveFailures are the current runs;
	// one of them is 0.
	ConsecutiveSuccesses, ConsecutiveFailures int
}

// machine is one target's threshold counter. It is kept apart from probing
// and timers so that the counting rules can be driven with chosen times.
type machine struct {
	state      State
	since      time.Time
	reason     string
	lastProbe  time.Time
	lastResult string
	okRun      int
	failRun    int
}

// outcome is what one probe says about its target.
type outcome uint8

const (
	// failed: the target did not answer as it should (refused, timed out,
	// unreachable, a wrong status). The backend's fault.
	failed outcome = iota
	// passed: the target answered as it should.
	passed
	// inconclusive: the prober could not run the probe for its own reasons;
	// nothing is known of the target.
	inconclusive
)

// unknown records a probe that could not be run: the target returns to
// Unknown (routable, never down: a prober that cannot probe must not take a
// fleet's backends out) and both runs restart, so the next real result
// decides at once, as a first probe does.
func (m *machine) unknown(at time.Time, result string) (changed bool, from State) {
	m.lastProbe, m.lastResult = at, result
	m.okRun, m.failRun = 0, 0
	from = m.state
	if from == Unknown {
		// Never decided yet: the state stays, but a new cause is said once (a transition
		// from Unknown to Unknown), so a backend the prober cannot probe from its first
		// probe on is logged with why, and counts as decided, rather than silently unknown.
		if m.reason == result {
			return false, from
		}
		m.reason = result
		return true, from
	}
	m.state, m.since, m.reason = Unknown, at, result
	return true, from
}

// observe records one probe result and reports whether the state changed,
// and from what. The first result decides Unknown either way, as HAProxy's
// default init-state "up" takes a server down on its first failed check and
// Envoy takes a new host healthy on its first passed one; after that the
// thresholds apply.
func (m *machine) observe(ok bool, at time.Time, result string, healthyThreshold, unhealthyThreshold int) (changed bool, from State) {
	m.lastProbe, m.lastResult = at, result
	from = m.state
	if ok {
		m.failRun = 0
		m.okRun++
		if m.state == Unknown || (m.state == Unhealthy && m.okRun >= healthyThreshold) {
			m.state = Healthy
		}
	} else {
		m.okRun = 0
		m.failRun++
		if m.state == Unknown || (m.state == Healthy && m.failRun >= unhealthyThreshold) {
			m.state = Unhealthy
		}
	}
	if m.state == from {
		return false, from
	}
	m.since, m.reason = at, result
	return true, from
}
