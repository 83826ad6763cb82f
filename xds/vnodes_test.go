package xds

import (
	"fmt"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	ringhashv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/ring_hash/v3"

	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// ringSizes returns the min and max ring sizes of a translated cluster's ring_hash policy.
func ringSizes(t *testing.T, r *Resources) (uint64, uint64) {
	t.Helper()
	c := r.Clusters[0].(*clusterv3.Cluster)
	var rh ringhashv3.RingHash
	if err := c.GetLoadBalancingPolicy().GetPolicies()[0].GetTypedExtensionConfig().GetTypedConfig().UnmarshalTo(&rh); err != nil {
		t.Fatal(err)
	}
	return rh.GetMinimumRingSize().GetValue(), rh.GetMaximumRingSize().GetValue()
}

// TestVirtualNodesRingSizes: the ring sizes follow the hosts each node's ring is built over
// (healthy and unknown, not draining, in the priority that takes the traffic), so every
// host keeps V x weight / the file's smallest weight points.
func TestVirtualNodesRingSizes(t *testing.T) {
	file := func(crossZone bool, bs ...string) *pools.File {
		var b strings.Builder
		fmt.Fprintf(&b, "services:\n  - name: api\n    protocol: grpc\n    affinity: {mode: header, header: {name: x}}\n    balance: ring_hash\n    hash: {virtual_nodes: 160}\n    cross_zone: %v\n    backends:\n", crossZone)
		for _, s := range bs {
			b.WriteString("      - " + s + "\n")
		}
		f := poolstest.Parse(t, b.String())
		return f
	}
	down := func(addrs ...string) HealthView {
		return func(_ string, b *pools.Backend) health.State {
			for _, a := range addrs {
				if b.Address == a {
					return health.Unhealthy
				}
			}
			return health.Healthy
		}
	}
	equal := file(true, "{address: 10.0.0.1:80}", "{address: 10.0.0.2:80}", "{address: 10.0.0.3:80}")
	weighted := file(true, "{address: 10.0.0.1:80, weight: 3}", "{address: 10.0.0.2:80, weight: 1}", "{address: 10.0.0.3:80, weight: 2}",
		"{address: 10.0.0.4:80, weight: 2, drain: true}")
	zoned := file(false, "{address: 10.0.0.1:80, weight: 2, zone: a}", "{address: 10.0.0.2:80, weight: 2, zone: a}", "{address: 10.0.0.3:80, weight: 1, zone: b}")
	for _, c := range []struct {
		name string
		f    *pools.File
		node Node
		view HealthView
		want uint64
	}{
		{"3 equal", equal, Node{ID: "n"}, nil, 480},
		{"3 equal, one down", equal, Node{ID: "n"}, down("10.0.0.2:80"), 320},
		{"3 equal, all down", equal, Node{ID: "n"}, down("10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"), 480},
		{"3:1:2, one draining", weighted, Node{ID: "n"}, nil, 960},
		// The lightest backend is down: the others keep 480 and 320 points.
		{"3:1:2, weight 1 down", weighted, Node{ID: "n"}, down("10.0.0.2:80"), 800},
		{"cross_zone off, zone a", zoned, Node{ID: "n", Zone: "a"}, nil, 640},
		{"cross_zone off, zone b", zoned, Node{ID: "n", Zone: "b"}, nil, 160},
		{"cross_zone off, zone a down", zoned, Node{ID: "n", Zone: "a"}, down("10.0.0.1:80", "10.0.0.2:80"), 160},
	} {
		r, err := Translate(c.f, c.node, c.view)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if err := r.ValidateAll(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if lo, hi := ringSizes(t, r); lo != c.want || hi != c.want {
			t.Errorf("%s: ring sizes %d..%d, want %d", c.name, lo, hi, c.want)
		}
	}
	// Without virtual_nodes the file's sizes are served as written.
	f := poolstest.Parse(t, "services:\n  - {name: api, protocol: grpc, affinity: {mode: header, header: {name: x}}, balance: ring_hash, hash: {min_ring_size: 2048}, backends: [{address: 10.0.0.1:80}]}\n")
	r, err := Translate(f, Node{ID: "n"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if lo, hi := ringSizes(t, r); lo != 2048 || hi != pools.DefaultMaxRingSize {
		t.Errorf("min/max ring sizes %d..%d, want 2048..%d", lo, hi, pools.DefaultMaxRingSize)
	}
}
