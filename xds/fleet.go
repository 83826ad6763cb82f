// Snapshots of stickylb's own nodes, as fleetview encodes them: XDP nodes get every service
// with a vip, Caddy nodes every http and grpc service, each with the control plane's
// verdicts, in a snapshot group of their own.

package xds

import (
	"fmt"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// Snapshot groups: which view a node gets, by its node.user_agent_name.
const (
	// GroupEnvoy is the default: Envoy and proxyless gRPC nodes get the Envoy resources.
	GroupEnvoy = ""
	// GroupXDP nodes (`stickylb xdp --xds`, user agent fleetview.UserAgentXDP) get the
	// fleetview of the vip services and nothing else.
	GroupXDP = "xdp"
	// GroupCaddy nodes (the stickylb_xds upstream source, user agent
	// fleetview.UserAgentCaddy) get the fleetview of the http and grpc services.
	GroupCaddy = "caddy"
)

// groupOf is the snapshot group of a node. Any other user agent (Envoy, gRPC) is an Envoy
// node, so their snapshots are as before.
func groupOf(n *corev3.Node) string {
	switch n.GetUserAgentName() {
	case fleetview.UserAgentXDP:
		return GroupXDP
	case fleetview.UserAgentCaddy:
		return GroupCaddy
	}
	return GroupEnvoy
}

// Fleet view keys: every XDP node shares one view, every Caddy node another (their views do
// not depend on the zone: a Caddy node applies its zone itself). Zones are letters, digits,
// '.', '_' and '-', so no zone is one of these keys.
const (
	xdpView   = "\x00xdp"
	caddyView = "\x00caddy"
)

// viewKey is the view a node is served: XDP nodes share one, Caddy nodes another; Envoy and
// gRPC nodes get their zone's when the file names it, else the cross-zone view "" (the
// localities a zone no backend is in gets: every zone at priority 0).
func viewKey(named map[string]bool, n Node) string {
	switch n.Group {
	case GroupXDP:
		return xdpView
	case GroupCaddy:
		return caddyView
	}
	if named[n.Zone] {
		return n.Zone
	}
	return ""
}

// viewNode is the node a view is built for.
func viewNode(key string) Node {
	switch key {
	case xdpView:
		return Node{Group: GroupXDP}
	case caddyView:
		return Node{Group: GroupCaddy}
	}
	return Node{Zone: key}
}

// verdictTimes remembers when each backend last changed state, and from what, for the XDP
// view's health_since and health_from (the checker's transitions carry both).
type verdictTimes struct {
	mu    sync.Mutex
	since map[string]time.Time    // fleetview.Key(service, identity)
	from  map[string]health.State // the state left at since
	// reason of the last transition to unhealthy (the status page's last failure).
	reason map[string]string
	// probes, set once by WithProbes, gives the checker's last probe of a backend.
	probes ProbeLookup
}

// RecordTransition notes a health transition's time, published with the verdict to XDP
// nodes; call it before Refresh.
func (s *Server) RecordTransition(service string, tr health.Transition) {
	s.verdicts.mu.Lock()
	defer s.verdicts.mu.Unlock()
	if s.verdicts.since == nil {
		s.verdicts.since, s.verdicts.from = map[string]time.Time{}, map[string]health.State{}
	}
	s.verdicts.since[fleetview.Key(service, tr.ID)] = tr.At
	s.verdicts.from[fleetview.Key(service, tr.ID)] = tr.From
	if tr.To == health.Unhealthy {
		if s.verdicts.reason == nil {
			s.verdicts.reason = map[string]string{}
		}
		s.verdicts.reason[fleetview.Key(service, tr.ID)] = tr.Reason
	}
}

// verdictOf is a backend's verdict in view (the version's frozen health view), with the
// time it last changed.
func (s *Server) verdictOf(view HealthView, service string, b *pools.Backend) fleetview.Verdict {
	var v fleetview.Verdict
	if view != nil {
		v.State = view(service, b)
	}
	s.verdicts.mu.Lock()
	defer s.verdicts.mu.Unlock()
	if v.State != health.Unknown {
		v.Since = s.verdicts.since[fleetview.Key(service, b.Identity())]
		v.From = s.verdicts.from[fleetview.Key(service, b.Identity())]
	}
	return v
}

// buildFleet is build for the node groups of stickylb's own nodes (XDP and Caddy): their
// fleetview, checked by Envoy's validation rules like every other snapshot, and empty
// listener and route lists so that every type has the version. view is the version's
// frozen health view.
func (s *Server) buildFleet(f *pools.File, group, version string, view HealthView) (*cachev3.Snapshot, error) {
	s.Stats.Builds.Add(1)
	encode := fleetview.Encode
	if group == GroupCaddy {
		encode = fleetview.EncodeCaddy
	}
	cs, ls := encode(f, func(service string, b *pools.Backend) fleetview.Verdict { return s.verdictOf(view, service, b) })
	clusters := make([]types.Resource, 0, len(cs))
	for _, c := range cs {
		if err := c.ValidateAll(); err != nil {
			return nil, fmt.Errorf("validating the XDP view of %s: %w", c.GetName(), err)
		}
		clusters = append(clusters, c)
	}
	endpoints := make([]types.Resource, 0, len(ls))
	for _, l := range ls {
		if err := l.ValidateAll(); err != nil {
			return nil, fmt.Errorf("validating the XDP endpoints of %s: %w", l.GetClusterName(), err)
		}
		endpoints = append(endpoints, l)
	}
	if s.hooks.mutateXDP != nil {
		s.hooks.mutateXDP(clusters, endpoints)
	}
	return cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{
		resource.ListenerType: {},
		resource.RouteType:    {},
		resource.ClusterType:  clusters,
		resource.EndpointType: endpoints,
	})
}
