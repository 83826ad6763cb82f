package adsclient

import (
	"fmt"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// resourceWrapperType is the type URL of discovery.v3.Resource, in which a server may wrap
// each resource of a state-of-the-world response (with its name and TTL).
const resourceWrapperType = "type.googleapis.com/envoy.service.discovery.v3.Resource"

// decode unpacks a response's resources by name, keeping only names (nil: every resource).
// Any error rejects the whole response, as Envoy rejects a response it cannot parse.
func decode(resp *discoveryv3.DiscoveryResponse, names map[string]bool) (map[string]proto.Message, error) {
	out := make(map[string]proto.Message, len(resp.GetResources()))
	for i, a := range resp.GetResources() {
		name := ""
		if a.GetTypeUrl() == resourceWrapperType {
			var r discoveryv3.Resource
			if err := a.UnmarshalTo(&r); err != nil {
				return nil, fmt.Errorf("resource %d: unwrapping: %w", i, err)
			}
			if r.GetResource() == nil {
				return nil, fmt.Errorf("resource %d (%q): wrapper without a resource", i, r.GetName())
			}
			name, a = r.GetName(), r.GetResource()
		}
		if a.GetTypeUrl() != resp.GetTypeUrl() {
			return nil, fmt.Errorf("resource %d: type %s in a %s response", i, a.GetTypeUrl(), resp.GetTypeUrl())
		}
		m, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{})
		if err != nil {
			return nil, fmt.Errorf("resource %d: decoding %s: %w", i, a.GetTypeUrl(), err)
		}
		if name == "" {
			name = nameOf(m)
		}
		if name == "" {
			return nil, fmt.Errorf("resource %d: a %s without a name", i, a.GetTypeUrl())
		}
		if names != nil && !names[name] {
			continue // not subscribed (a server may send more for full-state types)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("resource %q sent twice", name)
		}
		out[name] = m
	}
	return out, nil
}

// nameOf is the name xDS keys a resource by: name for Envoy's resource types, cluster_name
// for a ClusterLoadAssignment (which has no name field).
func nameOf(m proto.Message) string {
	switch r := m.(type) {
	case interface{ GetName() string }:
		return r.GetName()
	case interface{ GetClusterName() string }:
		return r.GetClusterName()
	}
	return ""
}

// sameResources reports whether two decoded sets hold equal resources under equal names.
func sameResources(a, b map[string]proto.Message) bool {
	if len(a) != len(b) {
		return false
	}
	for name, m := range a {
		o, ok := b[name]
		if !ok || !proto.Equal(m, o) {
			return false
		}
	}
	return true
}
