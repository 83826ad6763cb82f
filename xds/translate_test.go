package xds

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	maglevv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/maglev/v3"
	ringhashv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/ring_hash/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func example(t *testing.T) *pools.File {
	t.Helper()
	f, err := pools.Load(filepath.Join("..", "pools.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func resourceName(m proto.Message) string {
	switch x := m.(type) {
	case interface{ GetName() string }:
		return x.GetName()
	case *endpointv3.ClusterLoadAssignment:
		return x.GetClusterName()
	}
	return ""
}

// TestGolden translates pools.example.yaml for a zone-a node, validates every resource (the
// Any contents too) and compares each service's resources with testdata/golden/SERVICE.json.
// Run with -update to rewrite them after a deliberate change, and read the diff.
func TestGolden(t *testing.T) {
	f := example(t)
	view := func(_ string, b *pools.Backend) health.State { return health.Healthy }
	r, err := Translate(f, Node{ID: "envoy-a", Zone: "zone-a"}, view)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.ValidateAll(); err != nil {
		t.Fatalf("generated resources fail validation: %v", err)
	}
	opts := protojson.MarshalOptions{Multiline: true, Indent: "  "}
	per := map[string]map[string]json.RawMessage{}
	for kind, group := range map[string][]proto.Message{"listener": r.Listeners, "route": r.Routes, "cluster": r.Clusters, "endpoints": r.Endpoints} {
		for _, m := range group {
			b, err := opts.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			name := resourceName(m)
			if per[name] == nil {
				per[name] = map[string]json.RawMessage{}
			}
			per[name][kind] = b
		}
	}
	for _, s := range f.Services {
		got := per[s.Name]
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", "  ")
		if err := enc.Encode(got); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", "golden", s.Name+".json")
		if *update {
			os.MkdirAll(filepath.Dir(path), 0o755)
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test ./xds -run TestGolden -update)", err)
		}
		if !bytes.Equal(normalize(t, want), normalize(t, buf.Bytes())) {
			t.Errorf("%s differs from %s:\n%s", s.Name, path, buf.String())
		}
		// The pinned defaults are in the golden text itself.
		text := strings.Join(strings.Fields(buf.String()), "")
		for _, pinned := range []string{`"healthyPanicThreshold":{"value":1}`, `"overprovisioningFactor":1000000`, `"loadBalancingPolicy"`} {
			if !strings.Contains(strings.ReplaceAll(text, "\\\"", "\""), pinned) && !strings.Contains(text, pinned) {
				t.Errorf("%s: pinned default %s not visible", s.Name, pinned)
			}
		}
	}
}

// normalize re-encodes JSON so formatting differences do not count.
func normalize(t *testing.T, b []byte) []byte {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(v)
	return out
}

func TestCrossZoneLocalities(t *testing.T) {
	f := example(t)
	r, err := Translate(f, Node{Zone: "zone-a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range r.Endpoints {
		cla := m.(*endpointv3.ClusterLoadAssignment)
		switch cla.GetClusterName() {
		case "api": // cross_zone off: own zone P0, zone-b P1
			if len(cla.Endpoints) != 2 || cla.Endpoints[0].Locality.Zone != "zone-a" || cla.Endpoints[0].Priority != 0 || cla.Endpoints[1].Priority != 1 {
				t.Fatalf("api localities: %v", cla.Endpoints)
			}
			if w := cla.Endpoints[0].LoadBalancingWeight.GetValue(); w != 4 {
				t.Fatalf("locality weight %d, want 4 (3+1)", w)
			}
		case "web": // cross_zone on: both P0; drained backend DRAINING
			for _, l := range cla.Endpoints {
				if l.Priority != 0 {
					t.Fatalf("web: %v", cla.Endpoints)
				}
				for _, e := range l.LbEndpoints {
					if e.GetEndpoint().GetHostname() == "web-3" && e.HealthStatus != corev3.HealthStatus_DRAINING {
						t.Fatalf("drained backend: %v", e.HealthStatus)
					}
				}
			}
		case "media": // drained zone-b at the lowest priority, DRAINING
			last := cla.Endpoints[len(cla.Endpoints)-1]
			if last.Locality.Zone != "zone-b" || last.LbEndpoints[0].HealthStatus != corev3.HealthStatus_DRAINING {
				t.Fatalf("media: %v", cla.Endpoints)
			}
		}
	}
	rb, _ := Translate(f, Node{Zone: "zone-b"}, nil)
	for _, m := range rb.Endpoints {
		if cla := m.(*endpointv3.ClusterLoadAssignment); cla.ClusterName == "api" && cla.Endpoints[0].Locality.Zone != "zone-b" {
			t.Fatalf("zone-b node: %v", cla.Endpoints)
		}
	}
}

func TestValidateRejects(t *testing.T) {
	router := &hcmv3.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})}}
	stat := &hcmv3.HttpFilter{Name: "envoy.filters.http.stateful_session", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})}}
	badHCM := &hcmv3.HttpConnectionManager{StatPrefix: "x", HttpFilters: []*hcmv3.HttpFilter{router, stat},
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: "x", ConfigSource: &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}}}}
	cluster := func(p proto.Message, name string) *clusterv3.Cluster {
		return &clusterv3.Cluster{Name: "c", LoadBalancingPolicy: &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{TypedExtensionConfig: typed(name, p)}}}}
	}
	cases := map[string]struct {
		m    proto.Message
		want string
	}{
		"router not last":  {&listenerv3.Listener{Name: "l", ApiListener: &listenerv3.ApiListener{ApiListener: mustAny(badHCM)}}, "router filter must be last"},
		"non-prime maglev": {cluster(&maglevv3.Maglev{TableSize: wrapperspb.UInt64(65536)}, "envoy.load_balancing_policies.maglev"), "not prime"},
		// PGV's rule on RingHash, reachable only by opening the Any.
		"ring too large inside Any": {cluster(&ringhashv3.RingHash{MaximumRingSize: wrapperspb.UInt64(1 << 30)}, "envoy.load_balancing_policies.ring_hash"), "MaximumRingSize"},
		"no policy":                 {&clusterv3.Cluster{Name: "c"}, "no load_balancing_policy"},
		// PGV's rule deep in a tree with no Any on the way: the root's ValidateAll reaches it.
		"port out of range deep in an endpoint": {&endpointv3.ClusterLoadAssignment{ClusterName: "c", Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address: "10.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 70000}}}}}}}}}}}, "PortValue"},
	}
	for name, tc := range cases {
		err := Validate(tc.m)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
		t.Logf("%s: %v", name, err)
	}
}
