package xds

import (
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/policies/status"
)

// drainHint is what the fleet page says instead of drain buttons: the pools file is the
// fleet's truth, so the control plane's page only reads.
const drainHint = "read-only: to drain a backend, set `drain: true` on it (or list its zone under `drained_zones`) in the pools file; the control plane reloads it and pushes the change to every node"

// drainHintReplica replaces drainHint on a replica of the replicated control plane.
const drainHintReplica = "read-only: drain a backend through the change API (`stickylb ctl drain SERVICE BACKEND`, or POST /v1/services/SERVICE/backends/BACKEND/drain), or edit the stored pools file (`stickylb pools get`, then `stickylb pools apply`)"

// panicNoteXDS says what the control plane does when a service is in panic.
const panicNoteXDS = "every non-draining backend is down: the control plane fails open, publishing them all as UNKNOWN"

// ProbeLookup gives the fleet checker's status of a backend, its last probe included
// (health.Monitor.Lookup); false when it does not probe the backend.
type ProbeLookup func(service, id string) (health.TargetStatus, bool)

// WithProbes lets the status page show when the checker last probed each backend and, for
// a healthy backend whose last probes failed, why it may soon be down. Without it the page
// shows n/a there.
func WithProbes(p ProbeLookup) Option { return func(s *Server) { s.verdicts.probes = p } }

// ReplicaStatus reports the replicated control plane as this replica sees it, for the
// status page (nil outside the replicated mode).
type ReplicaStatus func() *status.Replica

// WithReplicaStatus puts the replica's status on the status page.
func WithReplicaStatus(f ReplicaStatus) Option { return func(s *Server) { s.replica = f } }

// editLog holds the record of the pools file's edits that Watch keeps (nil without Watch).
type editLog = atomic.Pointer[status.ConfigLog]

// nodeStatus is what Status copies from a stream under the lock.
type nodeStatus struct {
	node      Node
	userAgent string
	opened    time.Time
	acked     map[string]string
}

// Status is the fleet view for the status page: every service of the current file with its
// backends as the version's frozen health view sees them, and every admitted stream's node
// by zone with the versions it has ACKed.
func (s *Server) Status() *status.Snapshot {
	s.mu.Lock()
	f, view := s.file, s.health
	panicking := make(map[string]bool, len(s.panicking))
	for k, v := range s.panicking {
		panicking[k] = v
	}
	var nodes []nodeStatus
	for _, st := range s.streams {
		if !st.admitted {
			continue
		}
		n := nodeStatus{node: st.node, userAgent: st.keyNode.GetUserAgentName(), opened: st.opened, acked: make(map[string]string, len(st.acks.ackedBy))}
		for t, v := range st.acks.ackedBy {
			n.acked[t] = v
		}
		nodes = append(nodes, n)
	}
	s.mu.Unlock()

	host, _ := os.Hostname()
	snap := &status.Snapshot{Tier: status.TierXDS, Node: host, Actions: status.Actions{DrainHint: drainHint}}
	for _, svc := range f.Services {
		snap.Services = append(snap.Services, s.serviceStatus(svc, view, panicking[svc.Name]))
	}
	// Taken after the health reads, so no probe the snapshot shows is later than its time.
	snap.Time = time.Now()
	for _, n := range nodes {
		snap.Nodes = append(snap.Nodes, nodeOf(n))
	}
	slices.SortFunc(snap.Nodes, func(a, b status.Node) int {
		if c := strings.Compare(a.Zone, b.Zone); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	if view == nil {
		snap.Notes = append(snap.Notes, "no health checking: every backend is published as UNKNOWN")
	}
	if s.replica != nil {
		snap.Replica = s.replica()
		snap.Actions.DrainHint = drainHintReplica
	}

	snap.Config = s.edits.Load().File()
	return snap
}

// nodeOf names a node's kind from its group and user agent, and its ACKed versions by short
// type name (cluster, endpoint, listener, route).
func nodeOf(n nodeStatus) status.Node {
	out := status.Node{ID: n.node.ID, Zone: n.node.Zone, Group: n.node.Group,
		Connected: status.Ptr(n.opened), Versions: map[string]string{}}
	switch n.node.Group {
	case GroupXDP:
		out.Kind, out.Group = "xdp", "xdp"
	case GroupCaddy:
		out.Kind, out.Group = "caddy", "caddy"
	default:
		out.Group = "envoy"
		if ua := strings.ToLower(n.userAgent); strings.Contains(ua, "grpc") {
			out.Kind = "grpc"
		} else if strings.Contains(ua, "envoy") {
			out.Kind = "envoy"
		}
	}
	for t, v := range n.acked {
		out.Versions[shortType(t)] = v
	}
	return out
}

// shortType is a type URL's last word, lowercased: "cluster" for ...config.cluster.v3.Cluster.
func shortType(t string) string {
	switch t {
	case resource.ClusterType:
		return "cluster"
	case resource.EndpointType:
		return "endpoint"
	case resource.ListenerType:
		return "listener"
	case resource.RouteType:
		return "route"
	}
	return strings.ToLower(t[strings.LastIndexAny(t, "./")+1:])
}

// serviceStatus is one service of the file as the fleet sees it now.
func (s *Server) serviceStatus(svc *pools.Service, view HealthView, panicking bool) status.Service {
	out := status.Service{Name: svc.Name, VIP: svc.VIP, Policy: svc.Balance,
		Affinity: status.Affinity{Mode: svc.Affinity.Mode}}
	if svc.Listen != "" {
		out.Listen = []string{svc.Listen}
	}
	if svc.Affinity.TTL > 0 && svc.Affinity.Mode != pools.ModeNone {
		out.Affinity.TTL = svc.Affinity.TTL.String()
	}
	if hc := svc.HealthCheck; hc != nil {
		out.HealthCheck = status.HealthCheck{Active: true, Target: hc.Protocol + " " + hc.Path, Interval: hc.Interval.String(),
			Timeout: hc.Timeout.String(), Fails: hc.UnhealthyThreshold, Passes: hc.HealthyThreshold,
			Bound: (hc.Interval*time.Duration(hc.UnhealthyThreshold) + hc.Timeout).String()}
		out.HealthCheck.Target = strings.TrimSpace(out.HealthCheck.Target)
	}
	out.Load.SessionsNote = "sessions live in the data-plane nodes: see each node's own page"
	for _, b := range svc.Backends {
		v := s.verdictOf(view, svc.Name, b)
		bs := status.Backend{ID: b.Identity(), Address: b.Address, Zone: b.Zone,
			Weight:   status.Ptr(float64(b.Weight)),
			Draining: b.Drain || slices.Contains(svc.DrainedZones, b.Zone),
			Health:   status.Health{State: stateName(v.State), Reason: s.reasonOf(svc.Name, b, v)}}
		if !v.Since.IsZero() {
			bs.Health.Since = status.Ptr(v.Since)
		}
		if probes := s.verdicts.probes; probes != nil && svc.HealthCheck != nil {
			if ts, ok := probes(svc.Name, b.Identity()); ok {
				bs.Health.AddProbe(ts, svc.HealthCheck.UnhealthyThreshold)
			}
		}
		out.Backends = append(out.Backends, bs)
	}
	out.Finish(panicNoteXDS)
	// The server's own panic state is the truth (it reads Unknown as routable).
	out.Panic = status.Panic{Active: panicking}
	if panicking {
		out.Panic.Note = panicNoteXDS
	}
	return out
}

// reasonOf is the reason of the backend's last failure while it is unhealthy.
func (s *Server) reasonOf(service string, b *pools.Backend, v fleetview.Verdict) string {
	if v.State != health.Unhealthy {
		return ""
	}
	s.verdicts.mu.Lock()
	defer s.verdicts.mu.Unlock()
	return s.verdicts.reason[fleetview.Key(service, b.Identity())]
}

// stateName maps the checker's state to the model's.
func stateName(st health.State) string {
	switch st {
	case health.Healthy:
		return status.Healthy
	case health.Unhealthy:
		return status.Unhealthy
	}
	return status.Unknown
}
