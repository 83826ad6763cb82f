package fleetview

import (
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/stickylb/stickylb/policies/pools"
)

// TestHostileStrings: a view's strings are held to the pools file's own limits (names,
// zones, hash keys: pools.ValidName, ValidZone, ValidHashKey) and no metadata string is
// longer than the longest the file allows, so a view the file could not hold is NACKed
// whole, for XDP and Caddy nodes alike, and the NACK's text stays short whatever the
// control plane sent (it is logged, and sent back in the request).
func TestHostileStrings(t *testing.T) {
	huge := strings.Repeat("z", 1<<20)
	setEP := func(key, v string) func(*clusterv3.Cluster, *endpointv3.ClusterLoadAssignment) {
		return func(_ *clusterv3.Cluster, l *endpointv3.ClusterLoadAssignment) {
			l.Endpoints[0].LbEndpoints[0].Metadata.FilterMetadata[MetadataKey].Fields[key] = structpb.NewStringValue(v)
		}
	}
	setCluster := func(key string, v *structpb.Value) func(*clusterv3.Cluster, *endpointv3.ClusterLoadAssignment) {
		return func(c *clusterv3.Cluster, _ *endpointv3.ClusterLoadAssignment) {
			c.Metadata.FilterMetadata[MetadataKey].Fields[key] = v
		}
	}
	rename := func(name string) func(*clusterv3.Cluster, *endpointv3.ClusterLoadAssignment) {
		return func(c *clusterv3.Cluster, l *endpointv3.ClusterLoadAssignment) { c.Name, l.ClusterName = name, name }
	}
	zones := func(zs ...string) *structpb.Value {
		l := &structpb.ListValue{}
		for _, z := range zs {
			l.Values = append(l.Values, structpb.NewStringValue(z))
		}
		return structpb.NewListValue(l)
	}
	cases := []struct {
		name, want string
		edit       func(*clusterv3.Cluster, *endpointv3.ClusterLoadAssignment)
	}{
		{"a 1 MiB zone", "zone", setEP("zone", huge)},
		{"a zone one byte over", "zone", setEP("zone", strings.Repeat("z", pools.MaxZoneLength+1))},
		{"a zone with a newline", "zone", setEP("zone", "z1\nlevel=error")},
		{"a hash key one byte over", "hash_key", setEP("hash_key", strings.Repeat("k", pools.MaxHashKeyLength+1))},
		{"a hash key with a space", "hash_key", setEP("hash_key", "a b")},
		{"a 1 MiB address", "address", setEP("address", huge)},
		{"a 1 MiB health time", "health_since", setEP("health_since", huge)},
		{"a 1 MiB drained zone", "drained_zones", setCluster("drained_zones", zones("z3", huge))},
		{"a drained zone with a quote", "drained_zones", setCluster("drained_zones", zones(`z"3`))},
		{"a 1 MiB protocol", "protocol", setCluster("protocol", structpb.NewStringValue(huge))},
		{"a service name one byte over", "name", rename(strings.Repeat("s", pools.MaxNameLength+1))},
		{"a service name in capitals", "name", rename("API")},
		{"a 1 MiB service name", "name", rename(huge)},
	}
	for _, kind := range []struct {
		name   string
		file   string
		encode func(*pools.File, func(string, *pools.Backend) Verdict) ([]*clusterv3.Cluster, []*endpointv3.ClusterLoadAssignment)
		decode func(clusters, assignments map[string]proto.Message) (*View, error)
	}{{"xdp", file, Encode, Decode}, {"caddy", caddyFile, EncodeCaddy, DecodeCaddy}} {
		f, err := pools.Parse("pools.yaml", []byte(kind.file))
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range cases {
			t.Run(kind.name+"/"+tc.name, func(t *testing.T) {
				cs, ls := kind.encode(f, nil)
				tc.edit(cs[0], ls[0])
				c, l := byName(cs, ls)
				v, err := kind.decode(c, l)
				if err == nil {
					t.Fatalf("decoded: %d services", len(v.File.Services))
				}
				if !strings.Contains(err.Error(), tc.want) || len(err.Error()) > 1024 {
					t.Fatalf("error of %d bytes (want <= 1024, naming %s): %.300s", len(err.Error()), tc.want, err)
				}
			})
		}
	}
}
