package fleetview

import (
	"fmt"
	"sort"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

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
		f := map[string]*structpb.Value{
			"protocol":       structpb.NewStringValue(s.Protocol),
			"cross_zone":     structpb.NewBoolValue(s.CrossZone),
			"health_checked": structpb.NewBoolValue(s.HealthCheck != nil),
		}
		// Listed, as for XDP nodes, so a Caddy node keeps a drained zone as the last resort
		// (each endpoint's drain folds the zone in; backend_drain is the backend's own).
		if len(s.DrainedZones) > 0 {
			zs := make([]*structpb.Value, len(s.DrainedZones))
			for i, z := range s.DrainedZones {
				zs[i] = structpb.NewStringValue(z)
			}
			f["drained_zones"] = structpb.NewListValue(&structpb.ListValue{Values: zs})
		}
		cs = append(cs, &clusterv3.Cluster{
			Name:                 s.Name,
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{EdsConfig: &corev3.ConfigSource{
				ResourceApiVersion:    corev3.ApiVersion_V3,
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			}},
			ConnectTimeout: durationpb.New(5 * time.Second),
			Metadata:       meta(f),
		})
		ls = append(ls, encodeEndpoints(s, verdict))
	}
	return cs, ls
}

// DecodeCaddy reads the Caddy nodes' view (see EncodeCaddy) as Decode reads the XDP one:
// the services with their protocol, cross_zone and backends, and the verdicts. A cluster
// without endpoints gives ErrIncomplete.
func DecodeCaddy(clusters, assignments map[string]proto.Message) (*View, error) {
	v := &View{File: &pools.File{Filename: "xds"}, Verdicts: map[string]Verdict{}}
	names := make([]string, 0, len(clusters))
	for n := range clusters {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		c, ok := clusters[name].(*clusterv3.Cluster)
		if !ok {
			return nil, fmt.Errorf("cluster %s: a %T, not a Cluster", name, clusters[name])
		}
		f, err := fieldsOf(c.GetMetadata())
		if err != nil {
			return nil, fmt.Errorf("cluster %s: %w", name, err)
		}
		s := &pools.Service{Name: name, Protocol: f.str("protocol", true), CrossZone: f.boolean("cross_zone"),
			DrainedZones: f.strings("drained_zones")}
		if f.boolean("health_checked") {
			s.HealthCheck = &pools.HealthCheck{}
		}
		if f.err != nil {
			return nil, fmt.Errorf("cluster %s: %w", name, f.err)
		}
		if s.Protocol != caddyProtocols[0] && s.Protocol != caddyProtocols[1] {
			return nil, fmt.Errorf("cluster %s: protocol %q: want one of %v", name, s.Protocol, caddyProtocols)
		}
		v.File.Services = append(v.File.Services, s)
	}
	if err := v.attachEndpoints(assignments); err != nil {
		return nil, err
	}
	return v, nil
}
