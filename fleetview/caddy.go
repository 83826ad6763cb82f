package fleetview

import (
	"fmt"
	"slices"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"

	"github.com/stickylb/stickylb/policies/pools"
)

// UserAgentCaddy is the node.user_agent_name of Caddy nodes (the stickylb_xds upstream
// source): the control plane serves them the view of the HTTP and gRPC services.
const UserAgentCaddy = "stickylb-caddy"

// caddyProtocols are the protocols of the services a Caddy node proxies.
var caddyProtocols = []string{pools.ProtocolHTTP, pools.ProtocolGRPC}

// EncodeCaddy builds the Caddy nodes' view of f: one Cluster per http or grpc service
// (protocol and cross_zone in its metadata) and one ClusterLoadAssignment with every
// backend in file order (identity, address, weight, zone, drain, verdict and its time, as
// for XDP nodes), and the drained zones. Zones are not applied here: the view is the same for every Caddy node,
// and each node picks its own zone's backends, so one snapshot serves them all.
func EncodeCaddy(f *pools.File, verdict func(service string, b *pools.Backend) Verdict) ([]*clusterv3.Cluster, []*endpointv3.ClusterLoadAssignment) {
	var cs []*clusterv3.Cluster
	var ls []*endpointv3.ClusterLoadAssignment
	for _, s := range f.Services {
		if s.Protocol != pools.ProtocolHTTP && s.Protocol != pools.ProtocolGRPC {
			continue
		}
		// drained_zones listed, as for XDP nodes, so a Caddy node keeps a drained zone as
		// the last resort (each endpoint's drain folds the zone in; backend_drain is the
		// backend's own).
		cs = append(cs, edsCluster(s.Name, serviceFields(s)))
		ls = append(ls, encodeEndpoints(s, verdict))
	}
	return cs, ls
}

// DecodeCaddy reads the Caddy nodes' view (see EncodeCaddy) as Decode reads the XDP one:
// the services with their protocol, cross_zone and backends, and the verdicts. A cluster
// without endpoints gives ErrIncomplete.
func DecodeCaddy(clusters, assignments map[string]proto.Message) (*View, error) {
	return decodeView(clusters, assignments, decodeCaddyCluster)
}

func decodeCaddyCluster(c *clusterv3.Cluster) (*pools.Service, error) {
	f, err := fieldsOf(c.GetMetadata())
	if err != nil {
		return nil, err
	}
	s := f.service(c.GetName())
	if f.err != nil {
		return nil, f.err
	}
	if !slices.Contains(caddyProtocols, s.Protocol) {
		return nil, fmt.Errorf("protocol %q: want one of %v", s.Protocol, caddyProtocols)
	}
	return s, nil
}
