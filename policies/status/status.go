// Package status holds the live status model every stickylb tier reports (Caddy, the xDS
// control plane, the XDP forwarder) and the one self-contained HTML page that shows it.
//
// A tier fills a Snapshot per request and serves it two ways: as JSON for tools (Snapshot
// marshals as is) and as the page (Page), which fetches the JSON beside it ("status.json",
// relative to the page's own URL) every RefreshInterval, renders every service's backends,
// sorts and filters them and marks the rows whose state changed since the last refresh.
//
// A field a tier cannot know is left nil and shows as n/a: the model never carries a
// made-up value. Caddy, for example, has no time of the last active check and no reason of
// the last failure; its health events give the time of the last change only.
package status

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stickylb/stickylb/policies/health"
)

// RefreshInterval is how often the page fetches the JSON again.
const RefreshInterval = 2 * time.Second

// Tier names, the values of Snapshot.Tier.
const (
	TierCaddy = "caddy"
	TierXDS   = "xds"
	TierXDP   = "xdp"
)

// Health states of a backend.
const (
	Healthy   = "healthy"
	Unhealthy = "unhealthy"
	// Unknown: not probed yet, or the probe failed for the prober's own reasons.
	Unknown = "unknown"
)

// Snapshot is everything one tier's status endpoint reports at one instant.
type Snapshot struct {
	// Tier is caddy, xds or xdp.
	Tier string `json:"tier"`
	// Node names the process that answers (its host name), so pages of several nodes can be
	// told apart.
	Node string `json:"node,omitempty"`
	// Time is when the snapshot was taken.
	Time time.Time `json:"time"`
	// Actions says what the page may change from here.
	Actions Actions `json:"actions"`
	// Services in a stable order (the tier's config order or by name).
	Services []Service `json:"services"`
	// Nodes are the data-plane nodes connected to a control plane (xds tier only).
	Nodes []Node `json:"nodes,omitempty"`
	// Feeds are the control planes a node takes its view from (XDP and Caddy nodes fed by
	// `stickylb xds`): what waits for endpoints, what was left out.
	Feeds []Feed `json:"feeds,omitempty"`
	// Config is the file the tier serves and how its last edit went (xds, and xdp with
	// --pools); nil where the tier has none.
	Config *ConfigFile `json:"config,omitempty"`
	// Notes are tier-wide remarks for the operator (what cannot be known, and why).
	Notes []string `json:"notes,omitempty"`
	// Counters are tier-wide path counters (XDP: packets by path through the program).
	Counters map[string]uint64 `json:"counters,omitempty"`
	// Replica is set on a replica of the replicated control plane (xds tier with a store).
	Replica *Replica `json:"replica,omitempty"`
	// Routing is what the node announces to its routers (XDP nodes with BGP), nil when it
	// announces nothing itself.
	Routing *Routing `json:"routing,omitempty"`
}

// Replica is the replicated control plane as one of its replicas sees it.
type Replica struct {
	// ID is this replica's id (--replica-id).
	ID string `json:"id"`
	// Leader: this replica probes the backends and writes the verdicts.
	Leader bool `json:"leader"`
	// LeaderID is the leading replica's id, as the election shows it ("" when none).
	LeaderID string `json:"leader_id,omitempty"`
	// Store is connected, lost (no answer within the store timeout: streams refused) or
	// empty (no pools file stored yet).
	Store string `json:"store"`
	// Revision is the store revision this replica serves (the version nodes are sent).
	Revision int64 `json:"revision"`
	// Replicas are the replicas in the election, the leader first.
	Replicas []string `json:"replicas,omitempty"`
	// Problem is what the replica serves around, when anything: a stored pools file that
	// does not parse here, and which one it serves instead.
	Problem string `json:"problem,omitempty"`
	// Note says why the replica refuses streams, when it does.
	Note string `json:"note,omitempty"`
}

// Routing is a node's announcements to its routers and the sessions that carry them.
type Routing struct {
	// Protocol is "bgp"; ASN and RouterID the node's own.
	Protocol string `json:"protocol"`
	ASN      uint32 `json:"asn"`
	RouterID string `json:"router_id"`
	// Drained says why the node is drained (every VIP withdrawn on purpose), empty if not.
	Drained string `json:"drained,omitempty"`
	// Forwarding says why the node cannot forward (every VIP withdrawn), empty if it can.
	Forwarding string `json:"forwarding,omitempty"`
	// GracefulRestart: the node leaves without withdrawing on SIGTERM (RFC 4724).
	GracefulRestart bool `json:"graceful_restart"`
	// Communities tag every route, as ASN:VALUE.
	Communities []string       `json:"communities,omitempty"`
	Peers       []RoutePeer    `json:"peers"`
	Announced   []Announcement `json:"announced"`
}

// RoutePeer is one router the node announces to.
type RoutePeer struct {
	Address string `json:"address"`
	ASN     uint32 `json:"asn"`
	// State is the session's (established when up); Since the last change of up or down.
	State string     `json:"state"`
	Up    bool       `json:"up"`
	Since *time.Time `json:"since"`
	// Reason says why it is not up (the last connect error, or why the session ended).
	Reason string `json:"reason,omitempty"`
	// Downs counts the sessions that ended.
	Downs uint64 `json:"downs"`
}

// Announcement is one VIP address and whether the node announces it now.
type Announcement struct {
	VIP       string    `json:"vip"`
	Announced bool      `json:"announced"`
	Since     time.Time `json:"since"`
	// Reason and Why say why it is not announced (withdrawn for a drain, a shutdown, ...).
	Reason string `json:"reason,omitempty"`
	Why    string `json:"why,omitempty"`
}

// Actions lists what the page may do. Every state-changing request needs the same origin
// and the CSRFHeader.
type Actions struct {
	// Drain: the page may POST DrainPath and UndrainPath.
	Drain bool `json:"drain"`
	// DrainHint tells how to drain where the page cannot (e.g. "set drain: true in the
	// pools file").
	DrainHint string `json:"drain_hint,omitempty"`
}

// Paths of the drain actions, relative to the page, and the header that must accompany them.
const (
	DrainPath   = "drain"
	UndrainPath = "undrain"
	JSONPath    = "status.json"
	CSRFHeader  = "X-Stickylb-Csrf"
)

// DrainRequest is the JSON body of a drain or undrain POST.
type DrainRequest struct {
	// Upstream is the backend's identity as the snapshot names it (Backend.ID).
	Upstream string `json:"upstream"`
}

// Service is one load-balanced service: a reverse_proxy in Caddy, a pools-file service in
// xds and xdp.
type Service struct {
	// Name identifies the service within the snapshot.
	Name string `json:"name"`
	// Listen lists where the service is served (Caddy's server addresses, an Envoy
	// listener); VIP is the XDP virtual IP.
	Listen []string `json:"listen,omitempty"`
	VIP    string   `json:"vip,omitempty"`
	// Policy is the selection policy (sticky_cookie, sticky_url, weighted_least_conn, ...);
	// Balance picks new sessions (the fallback or the pools file's balance).
	Policy  string `json:"policy"`
	Balance string `json:"balance,omitempty"`
	// Affinity describes how sessions are kept.
	Affinity Affinity `json:"affinity"`
	// HealthCheck describes how health is decided.
	HealthCheck HealthCheck `json:"health_check"`
	// Load is the service-wide load.
	Load ServiceLoad `json:"load"`
	// Repins counts sessions moved to another backend, by reason (expired, unavailable,
	// unknown, retry, invalid); nil when the tier does not count them.
	Repins map[string]uint64 `json:"repins"`
	// Panic reports whether no backend can take traffic, and what the tier does then.
	Panic Panic `json:"panic"`
	// Generation of the lookup tables (XDP), nil elsewhere.
	Generation *uint64 `json:"generation,omitempty"`
	// Counters are tier-specific path counters (XDP: passed, fragments, ...).
	Counters map[string]uint64 `json:"counters,omitempty"`
	// Backends in the tier's order.
	Backends []Backend `json:"backends"`
	// Zones sums the backends by zone, in zone order; nil when no backend has a zone
	// (Caddy's upstreams have none).
	Zones []Zone `json:"zones,omitempty"`
	// Notes are remarks about this service.
	Notes []string `json:"notes,omitempty"`
}

// Affinity is how a service keeps sessions.
type Affinity struct {
	// Mode: cookie, app_cookie, url, header, source_ip, quic_cid, none.
	Mode string `json:"mode"`
	// Stateless: sessions live in clients (sealed cookies), so the tier cannot count them.
	Stateless bool `json:"stateless"`
	// Scope names the cookie or session table (as the metrics label them).
	Scope string `json:"scope,omitempty"`
	// TTL of a session without requests; empty when the tier has none.
	TTL string `json:"ttl,omitempty"`
}

// HealthCheck is a service's health checking as configured.
type HealthCheck struct {
	// Active: a prober sends checks; its interval, timeout and thresholds follow.
	Active   bool   `json:"active"`
	Target   string `json:"target,omitempty"` // URI or port probed
	Interval string `json:"interval,omitempty"`
	Timeout  string `json:"timeout,omitempty"`
	Fails    int    `json:"fails,omitempty"`
	Passes   int    `json:"passes,omitempty"`
	// Passive: failed requests count against a backend.
	Passive bool `json:"passive"`
	// Bound is the longest a dead backend can stay marked healthy: interval × fails +
	// timeout for active checks; empty when nothing bounds it.
	Bound string `json:"bound,omitempty"`
}

// ServiceLoad is a service's load as a whole.
type ServiceLoad struct {
	// Sessions held in the service's session tables; nil when they cannot be counted (see
	// SessionsNote).
	Sessions *int64 `json:"sessions"`
	// SessionsCapacity is the tables' bound (max_sessions), nil without tables.
	SessionsCapacity *int64 `json:"sessions_capacity,omitempty"`
	// SessionsNote says why sessions are not counted, or what the count covers.
	SessionsNote string `json:"sessions_note,omitempty"`
	// NewSessionsTotal counts sessions started (first picks and re-pins) since the counters
	// began; NewSessionsPerSec is its recent rate. nil when not known.
	NewSessionsTotal  *uint64  `json:"new_sessions_total"`
	NewSessionsPerSec *float64 `json:"new_sessions_per_sec"`
	// InFlight is the sum of the backends' requests in flight (nil if any is unknown).
	InFlight *int64 `json:"in_flight"`
	// Flows is the sum of the backends' active flows (XDP).
	Flows *int64 `json:"flows,omitempty"`
}

// Panic is the fail-open state of a service.
type Panic struct {
	// Active: no backend is healthy and not draining.
	Active bool `json:"active"`
	// Note says what the tier does then (fail open to every non-draining backend, or fail).
	Note string `json:"note,omitempty"`
}

// Backend is one backend of a service.
type Backend struct {
	// ID is the backend's identity: its hash_key, else its address as written.
	ID string `json:"id"`
	// Address is where it is reached.
	Address string `json:"address"`
	// Zone is its zone; empty when none is configured (shown as n/a).
	Zone string `json:"zone,omitempty"`
	// Weight is the configured weight; EffectiveWeight the weight new sessions see now
	// (slow start ramping); nil when the policy has no weights.
	Weight          *float64 `json:"weight"`
	EffectiveWeight *float64 `json:"effective_weight"`
	// SlowStart is the ramp in progress, nil when none.
	SlowStart *SlowStart `json:"slow_start"`
	// Health is its health.
	Health Health `json:"health"`
	// Draining: it takes no new sessions; its pinned ones stay. DrainedSince is when.
	Draining     bool       `json:"draining"`
	DrainedSince *time.Time `json:"drained_since"`
	// InFlight is requests in flight to it, nil when unknown.
	InFlight *int64 `json:"in_flight"`
	// Sessions pinned to it in the service's tables, nil when unknown.
	Sessions *int64 `json:"sessions"`
	// Flows: active flows on it (XDP, from counters).
	Flows *int64 `json:"flows,omitempty"`
}

// Zone is one zone of a service: its backends counted by state, and its load.
type Zone struct {
	// Name is the zone; empty for the backends without one.
	Name string `json:"name"`
	// Backends in the zone; Healthy and Draining count those healthy and those draining.
	Backends int `json:"backends"`
	Healthy  int `json:"healthy"`
	Draining int `json:"draining"`
	// Flows are the zone's active flows (XDP: the program's per-zone counters, which keep
	// counting flows of a backend removed while they finish), nil where the tier cannot
	// know them (the control plane: flows live in the data-plane nodes).
	Flows *int64 `json:"flows"`
}

// SlowStart is a backend's ramp after it joined or turned healthy.
type SlowStart struct {
	// Since is when the ramp started; Window how long it lasts.
	Since  time.Time `json:"since"`
	Window string    `json:"window"`
	// Factor is the share of its weight it gets now, in (0, 1].
	Factor float64 `json:"factor"`
}

// Health is a backend's health as the tier sees it.
type Health struct {
	// State is healthy, unhealthy or unknown.
	State string `json:"state"`
	// Since is the time of the last change of State, nil when the tier has not seen one.
	Since *time.Time `json:"since"`
	// LastCheck is the time of the last probe, nil when the tier cannot know it.
	LastCheck *time.Time `json:"last_check"`
	// Reason of the last failure (or of the current state), empty when unknown.
	Reason string `json:"reason,omitempty"`
}

// AddProbe fills what a tier's own checker knows of a backend (ts, from Monitor.Lookup)
// and the verdict did not: the time of the last probe, and a reason where none is set: the
// deciding probe's result while unhealthy or, while healthy, the failing probes that have
// not taken it down yet (unhealthyThreshold of them do), which tell why it may soon be.
func (h *Health) AddProbe(ts health.TargetStatus, unhealthyThreshold int) {
	if !ts.LastProbe.IsZero() {
		h.LastCheck = Ptr(ts.LastProbe)
	}
	if h.Reason != "" {
		return
	}
	switch {
	case h.State == Unhealthy && ts.State == health.Unhealthy:
		h.Reason = ts.Reason
	case h.State == Healthy && ts.ConsecutiveFailures > 0:
		h.Reason = fmt.Sprintf("last probe failed: %s (%d of the %d failures in a row that take it down)",
			ts.LastResult, ts.ConsecutiveFailures, unhealthyThreshold)
	}
}

// Node is a data-plane node connected to a control plane.
type Node struct {
	// ID is the node's id as it presents itself; Zone its zone (empty: none).
	ID   string `json:"id"`
	Zone string `json:"zone,omitempty"`
	// Kind is envoy, grpc, xdp or caddy, empty when unknown.
	Kind string `json:"kind,omitempty"`
	// Group is the snapshot group the node is served: envoy (Envoy and proxyless gRPC
	// nodes), xdp or caddy.
	Group string `json:"group,omitempty"`
	// Connected is when its current stream began, nil when unknown.
	Connected *time.Time `json:"connected"`
	// Versions ACKed, by resource type.
	Versions map[string]string `json:"versions,omitempty"`
}

// Ptr returns a pointer to v, for the optional fields.
func Ptr[T any](v T) *T { return &v }

// Finish fills what follows from the backends: the service's in-flight and flow sums, its
// zones (with the backends' flows summed where they are known) and its panic state
// (panicNote says what the tier does in panic). It sorts nothing but the zones.
func (s *Service) Finish(panicNote string) {
	var inflight, flows int64
	knownIn, knownFlows := len(s.Backends) > 0, false
	usable := 0
	s.Zones = zonesOf(s.Backends)
	for _, b := range s.Backends {
		if b.InFlight == nil {
			knownIn = false
		} else {
			inflight += *b.InFlight
		}
		if b.Flows != nil {
			knownFlows = true
			flows += *b.Flows
		}
		if b.Health.State != Unhealthy && !b.Draining {
			usable++
		}
	}
	s.Load.InFlight, s.Load.Flows = nil, nil
	if knownIn {
		s.Load.InFlight = Ptr(inflight)
	}
	if knownFlows {
		s.Load.Flows = Ptr(flows)
	}
	s.Panic = Panic{Active: len(s.Backends) > 0 && usable == 0}
	if s.Panic.Active {
		s.Panic.Note = panicNote
	}
}

// zonesOf sums backends by zone, nil when none has a zone.
func zonesOf(bs []Backend) []Zone {
	idx := map[string]int{}
	var out []Zone
	for _, b := range bs {
		i, ok := idx[b.Zone]
		if !ok {
			i = len(out)
			idx[b.Zone] = i
			out = append(out, Zone{Name: b.Zone})
		}
		z := &out[i]
		z.Backends++
		if b.Health.State == Healthy {
			z.Healthy++
		}
		if b.Draining {
			z.Draining++
		}
		if b.Flows != nil {
			z.Flows = Ptr(*b.Flows + valueOr0(z.Flows))
		}
	}
	named := false
	for _, z := range out {
		named = named || z.Name != ""
	}
	if !named {
		return nil
	}
	slices.SortFunc(out, func(a, b Zone) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func valueOr0(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// SetZoneFlows replaces the flows of the zones with those counted per zone (by zone name),
// adding a zone that has flows but no backend any more (flows of a removed backend
// finishing). Zones the counts do not name keep the sum of their backends' flows.
func (s *Service) SetZoneFlows(counts map[string]int64) {
	for i := range s.Zones {
		if n, ok := counts[s.Zones[i].Name]; ok {
			s.Zones[i].Flows = Ptr(n)
		}
	}
	for name, n := range counts {
		if n == 0 || slices.ContainsFunc(s.Zones, func(z Zone) bool { return z.Name == name }) {
			continue
		}
		s.Zones = append(s.Zones, Zone{Name: name, Flows: Ptr(n)})
	}
	slices.SortFunc(s.Zones, func(a, b Zone) int { return strings.Compare(a.Name, b.Name) })
}

// Validate checks what the page relies on: a tier, unique service names, and unique backend
// identities within a service with known health states.
func (s *Snapshot) Validate() error {
	switch s.Tier {
	case TierCaddy, TierXDS, TierXDP:
	default:
		return fmt.Errorf("status: unknown tier %q", s.Tier)
	}
	names := map[string]bool{}
	for _, svc := range s.Services {
		if names[svc.Name] {
			return fmt.Errorf("status: service %q twice", svc.Name)
		}
		names[svc.Name] = true
		ids := map[string]bool{}
		for _, b := range svc.Backends {
			if ids[b.ID] {
				return fmt.Errorf("status: service %q: backend %q twice", svc.Name, b.ID)
			}
			ids[b.ID] = true
			switch b.Health.State {
			case Healthy, Unhealthy, Unknown:
			default:
				return fmt.Errorf("status: service %q: backend %q: unknown health state %q", svc.Name, b.ID, b.Health.State)
			}
		}
	}
	return nil
}

// MarshalJSON makes nil slices and maps the page iterates over encode as empty, not null.
func (s Snapshot) MarshalJSON() ([]byte, error) {
	type plain Snapshot
	svcs := make([]Service, len(s.Services)) // a copy: marshalling must not edit the caller's
	copy(svcs, s.Services)
	for i := range svcs {
		if svcs[i].Backends == nil {
			svcs[i].Backends = []Backend{}
		}
	}
	s.Services = svcs
	return json.Marshal(plain(s))
}
