// Snapshots of the XDP nodes: every service with a vip and the control plane's verdicts,
// as fleetview encodes them, in a snapshot group of their own.

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

// shareKey says which nodes may share one snapshot: Envoy nodes of one zone (the zone
// shapes their endpoints); every XDP node, and every Caddy node (their views do not depend
// on the zone: a Caddy node applies its zone itself).
func (n Node) shareKey() string {
	switch n.Group {
	case GroupXDP, GroupCaddy:
		return n.Group
	}
	return "envoy/" + n.Zone
}

// verdictTimes remembers when each backend last changed state, for the XDP view's
// health_since (the checker's transitions carry it).
type verdictTimes struct {
	mu    sync.Mutex
	since map[string]time.Time // fleetview.Key(service, identity)
}

// RecordTransition notes a health transition's time, published with the verdict to XDP
// nodes; call it before Refresh.
func (s *Server) RecordTransition(service string, tr health.Transition) {
	s.verdicts.mu.Lock()
	defer s.verdicts.mu.Unlock()
	if s.verdicts.since == nil {
		s.verdicts.since = map[string]time.Time{}
	}
	s.verdicts.since[fleetview.Key(service, tr.ID)] = tr.At
}

func (s *Server) verdictOf(service string, b *pools.Backend) fleetview.Verdict {
	var v fleetview.Verdict
	if s.view != nil {
		v.State = s.view(service, b)
	}
	s.verdicts.mu.Lock()
	defer s.verdicts.mu.Unlock()
	if v.State != health.Unknown {
		v.Since = s.verdicts.since[fleetview.Key(service, b.Identity())]
	}
	return v
}

// buildFleet is build for the node groups of stickylb's own nodes (XDP and Caddy): their
// fleetview, checked by Envoy's validation rules like every other snapshot, and empty
// listener and route lists so that every type has the version.
func (s *Server) buildFleet(f *pools.File, group, version string) (*cachev3.Snapshot, error) {
	s.Stats.Builds.Add(1)
	encode := fleetview.Encode
	if group == GroupCaddy {
		encode = fleetview.EncodeCaddy
	}
	cs, ls := encode(f, s.verdictOf)
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
	if s.mutateXDP != nil {
		s.mutateXDP(clusters, endpoints)
	}
	return cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{
		resource.ListenerType: {},
		resource.RouteType:    {},
		resource.ClusterType:  clusters,
		resource.EndpointType: endpoints,
	})
}

// noteSubscribed records that a node asked for typeURL: a snapshot counts as acknowledged
// once every type the node subscribed to is (an XDP node asks for clusters and endpoints
// only, and would otherwise never have one to roll back to).
func (s *Server) noteSubscribed(id, typeURL string) {
	if typeURL == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ns := s.nodes[id]; ns != nil {
		if ns.subscribed == nil {
			ns.subscribed = map[string]bool{}
		}
		ns.subscribed[typeURL] = true
	}
}

// ackTypes are the types whose ACKs make ns's snapshot acknowledged.
func (ns *nodeState) ackTypes() []string {
	var out []string
	for _, t := range typeURLs {
		if ns.subscribed[t] {
			out = append(out, t)
		}
	}
	if len(out) == 0 {
		return typeURLs
	}
	return out
}
