package xds

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/stickylb/stickylb/adsclient"
	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
)

const unknownZonePools = `services:
  - name: api
    protocol: grpc
    cross_zone: false
    backends:
      - {address: 10.0.7.1:80, zone: z1}
      - {address: 10.0.7.2:80, zone: z2}
  - name: l4
    protocol: tcp
    vip: 10.0.0.100:80
    cross_zone: false
    backends:
      - {address: 10.0.8.1:80, zone: z1, mac: "02:00:00:00:08:01"}
      - {address: 10.0.8.2:80, zone: z2, mac: "02:00:00:00:08:02"}
`

// A node of a zone the pools file does not name gets the cross-zone view and is counted
// (stickylb_xds_unknown_zone_streams_total), whatever its tier: an Envoy or gRPC node is
// served the cross-zone view; an XDP or Caddy node, served the one view of its group,
// finds no backend in its zone and spreads over every zone, which is the same thing, and
// a typo in its --zone or zone is as worth counting. Named zones and no zone are not counted.
func TestUnknownZoneCounted(t *testing.T) {
	s, addr := startXDSWithView(t, poolstest.Parse(t, unknownZonePools), nil)
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// priorities is the zone -> priority map of api's EDS as a gRPC node of zone gets it.
	priorities := func(id, zone string) map[string]uint32 {
		t.Helper()
		stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		node := &corev3.Node{Id: id, UserAgentName: "grpc-go", Locality: &corev3.Locality{Zone: zone}}
		if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: []string{"api"}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var cla endpointv3.ClusterLoadAssignment
		if err := resp.GetResources()[0].UnmarshalTo(&cla); err != nil {
			t.Fatal(err)
		}
		out := map[string]uint32{}
		for _, le := range cla.GetEndpoints() {
			out[le.GetLocality().GetZone()] = le.GetPriority()
		}
		return out
	}
	count := func() uint64 { return s.Stats.UnknownZone.Load() }

	if p := priorities("g1", "z1"); p["z1"] != 0 || p["z2"] != 1 {
		t.Fatalf("a z1 node: priorities %v, want z1 0 and z2 1", p)
	}
	if p := priorities("g2", ""); p["z1"] != 0 || p["z2"] != 0 {
		t.Fatalf("a node without a zone: priorities %v, want the cross-zone view", p)
	}
	if n := count(); n != 0 {
		t.Fatalf("named zones and no zone counted %d", n)
	}
	if p := priorities("g3", "zq"); p["z1"] != 0 || p["z2"] != 0 {
		t.Fatalf("a node of an unknown zone: priorities %v, want the cross-zone view", p)
	}
	if n := count(); n != 1 {
		t.Fatalf("an Envoy-group node of an unknown zone counted %d, want 1", n)
	}

	for i, c := range []adsclient.Config{
		{NodeID: "h1/xdp/eth0", Zone: "zq", UserAgentName: fleetview.UserAgentXDP},
		{NodeID: "h1/caddy", Zone: "zq", UserAgentName: fleetview.UserAgentCaddy},
	} {
		c.Server = addr
		decode := fleetview.DecodeCaddy
		if c.UserAgentName == fleetview.UserAgentXDP {
			decode = nil
		}
		startFleetNode(t, c, decode)
		want := uint64(2 + i)
		testwait.For(t, 5*time.Second, c.UserAgentName+" node of an unknown zone counted", func() (bool, string) {
			return count() == want, fmt.Sprint(count())
		})
	}
	// A Caddy node of a named zone is not counted.
	startCaddyNode(t, addr, "h2/caddy", "z1")
	testwait.For(t, 5*time.Second, "the named-zone Caddy node admitted", func() (bool, string) {
		return len(s.Nodes()) == 6, fmt.Sprint(s.Nodes())
	})
	if n := count(); n != 3 {
		t.Fatalf("after a Caddy node of a named zone: %d counted, want 3", n)
	}
}
