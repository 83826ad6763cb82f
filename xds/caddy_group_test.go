package xds

import (
	"fmt"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/health"
)

// TestCaddyNodeView: a node with the Caddy user agent gets the http and grpc services (not
// the vip one) with identity, weight, zone, drain, cross_zone and the verdicts; a
// transition reaches it; Caddy nodes of different zones share one snapshot.
func TestCaddyNodeView(t *testing.T) {
	f := poolstest.Parse(t, poolstest.CaddyFleet)
	states := newStateView(map[string]health.State{"api-1": health.Healthy})
	s, addr := startXDSWithView(t, f, states.view)

	view := func(n *fleetNode) *fleetview.View { v, _, _ := n.last(); return v }
	n1 := startCaddyNode(t, addr, "h1/caddy", "z1")
	testwait.For(t, 5*time.Second, "the Caddy node's first view", func() (bool, string) { return view(n1) != nil, "none" })
	v := view(n1)
	if len(v.File.Services) != 2 || v.File.Services[0].Name != "api" || v.File.Services[1].Name != "rpc" {
		t.Fatalf("Caddy view services: %+v, want api and rpc", v.File.Services)
	}
	api := v.File.Services[0]
	if api.CrossZone || len(api.Backends) != 2 {
		t.Fatalf("api: cross_zone %v, %d backends", api.CrossZone, len(api.Backends))
	}
	b1, b2 := api.Backends[0], api.Backends[1]
	if b1.Identity() != "api-1" || b1.Address != "10.0.7.1:80" || b1.Weight != 3 || b1.Zone != "z1" || b1.Drain {
		t.Fatalf("api's first backend: %+v", b1)
	}
	if !b2.Drain || b2.Zone != "z2" {
		t.Fatalf("api's second backend: %+v, want draining in z2", b2)
	}
	if st := v.Verdict("api", "api-1").State; st != health.Healthy {
		t.Fatalf("api-1: %v, want healthy", st)
	}

	builds := s.Stats.Builds.Load()
	n2 := startCaddyNode(t, addr, "h2/caddy", "z2")
	testwait.For(t, 5*time.Second, "the second Caddy node registered", func() (bool, string) {
		return len(s.Nodes()) == 2, fmt.Sprint(s.Nodes())
	})
	if n := s.Stats.Builds.Load(); n != builds {
		t.Fatalf("a Caddy node of another zone built its own snapshot (%d builds, was %d)", n, builds)
	}

	at := time.Now().Add(-time.Second).UTC()
	states.set("api-1", health.Unhealthy)
	s.RecordTransition("api", health.Transition{ID: "api-1", Healthy: false, At: at})
	if err := s.Refresh(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*fleetNode{n1, n2} {
		testwait.For(t, 5*time.Second, "the verdict reaches the Caddy nodes", func() (bool, string) {
			vd := view(n).Verdicts[fleetview.Key("api", "api-1")]
			return vd.State == health.Unhealthy && vd.Since.Equal(at), fmt.Sprint(vd)
		})
	}
}

// TestCaddyNodeNACK: a Caddy view the node cannot take (a cluster of a protocol Caddy does
// not proxy) is NACKed; the server counts it once and rolls the node back to the snapshot
// it acknowledged on CDS and EDS; the node keeps its view; the next good version applies.
func TestCaddyNodeNACK(t *testing.T) {
	f := poolstest.Parse(t, poolstest.CaddyFleet)
	s, addr := startXDS(t, f)
	n := startCaddyNode(t, addr, "h1/caddy", "")
	testwait.For(t, 5*time.Second, "first view acknowledged on CDS and EDS", func() (bool, string) {
		return s.ackedVersion("h1/caddy") != "", "no ack"
	})
	before, applied, _ := n.last()
	s.mutateFleetViews(func(clusters, _ []types.Resource) {
		for _, c := range clusters {
			c.(*clusterv3.Cluster).Metadata.FilterMetadata[fleetview.MetadataKey].Fields["protocol"] = structpb.NewStringValue("udp")
		}
	})
	if err := s.Refresh(); err != nil {
		t.Fatal(err)
	}
	waitOneNACK(t, s)
	if v, a, _ := n.last(); v != before || a != applied {
		t.Fatalf("the node applied a view it should have refused (%d -> %d applied)", applied, a)
	}
	s.mutateFleetViews(nil)
	f2 := poolstest.Parse(t, strings.Replace(poolstest.CaddyFleet, "      - {address: 10.0.8.1:50051}\n",
		"      - {address: 10.0.8.1:50051}\n      - {address: 10.0.8.2:50051}\n", 1))
	if err := s.Update(f2); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "the next good version applied", func() (bool, string) {
		v, _, _ := n.last()
		return len(v.File.Services[1].Backends) == 2, fmt.Sprint(len(v.File.Services[1].Backends))
	})
	if got := s.Stats.NACKs.Load(); got != 1 {
		t.Fatalf("%d NACKs, want 1", got)
	}
}
