// Package health actively checks backends: TCP connect, HTTP GET with
// expected statuses, and ICMP echo. The xDS server runs one Checker per
// service and publishes the result as EDS health_status, so every Envoy and
// gRPC node shares one view; the XDP loader rebuilds its Maglev tables on
// transitions; slow start ramps a backend from the time of its recovery.
//
// # States and the initial one
//
// A target starts Unknown, and Unknown is routable (State.Routable). Envoy
// starts hosts of an actively checked cluster as failing until their first
// check passes (and, with ignore_new_hosts_until_first_hc, leaves them out
// of load balancing meanwhile); HAProxy starts servers up (init-state "up")
// and takes one down on its first failed check. For a control plane or a
// forwarder starting cold, "down until probed" would blackhole every service
// until the first round completes, and the first probe comes soon anyway, so
// stickylb follows HAProxy: unknown targets take traffic. The first probe
// result then decides immediately, either way (HAProxy's first failure,
// Envoy's first success); after that, UnhealthyThreshold consecutive
// failures make a Healthy target Unhealthy and HealthyThreshold consecutive
// successes make an Unhealthy one Healthy.
//
// # Scheduling and the detection bound
//
// A new target (at Run, or added by SetTargets) is first probed after a
// random delay below D = min(Interval/10, 1s). After that, the gap between
// the starts of two probes of one target is drawn from
// (0.9 × Interval, Interval]: the jitter keeps targets from probing in
// lockstep, and because it only shortens gaps, no gap exceeds Interval. Each
// probe ends within Timeout, which is shorter than Interval. Hence, up to
// timer latency on a loaded machine:
//
//   - a Healthy target that fails at time f and stays failed is reported
//     Unhealthy by f + UnhealthyThreshold × Interval + Timeout (the bound in
//     docs/pools.md), and a recovered one Healthy by
//     f + HealthyThreshold × Interval + Timeout;
//   - a new target leaves Unknown by D + Timeout after it was added.
//
// # Transitions and slow subscribers
//
// Transitions carry the completion time of the deciding probe and its
// result ("tcp: connection refused", "http: status 503", "icmp: timeout").
// Probing never waits for a subscriber: beyond a subscriber's channel
// buffer, transitions are coalesced to the latest one per target (counted
// in Transition.Coalesced), so a slow reader loses flaps but never the
// current state. Status, Lookup and Snapshot read the state directly.
//
// # ICMP
//
// ICMP probes first try Linux's unprivileged ping socket ("udp4"/"udp6",
// allowed by net.ipv4.ping_group_range) and fall back to a raw socket when
// that is refused, which works as root or with CAP_NET_RAW. Replies are
// matched by sequence number, a random payload and the source address, and
// on raw sockets also by identifier.
package health
