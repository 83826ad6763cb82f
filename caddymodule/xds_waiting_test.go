package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/internal/testkit/adstest"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"github.com/stickylb/stickylb/policies/status"
)

// A Caddy node whose control plane stops sending one service's endpoints applies the
// other services' updates (ACKed), serves the waiting service's last good view, and its
// status.json lists that service as waiting, and since when.
func TestXDSSourceWaitsForEndpoints(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	cp := adstest.Start(t)
	cs, ls := fleetview.EncodeCaddy(poolstest.Parse(t, poolstest.CaddyFleet), nil)
	v1 := cp.Set(t, cs, ls) // api, rpc
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	api := &XDSUpstreams{Server: cp.Addr, Service: "api", NodeID: "waiting/caddy"}
	rpc := &XDSUpstreams{Server: cp.Addr, Service: "rpc", NodeID: "waiting/caddy"}
	for _, x := range []*XDSUpstreams{api, rpc} {
		if err := x.Provision(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { api.Cleanup(); rpc.Cleanup(); cancel() })
	acked := func(v string) {
		t.Helper()
		testwait.For(t, 10*time.Second, "the node's ACK of version "+v, func() (bool, string) {
			return cp.Acked(resource.ClusterType) == v && cp.Acked(resource.EndpointType) == v,
				fmt.Sprintf("acked %q %q, NACKs %q", cp.Acked(resource.ClusterType), cp.Acked(resource.EndpointType), cp.NACKs())
		})
	}
	acked(v1)

	// Version 2: api's weight changes; rpc's endpoints are missing.
	api2 := proto.Clone(ls[0]).(*endpointv3.ClusterLoadAssignment) // the control plane may still marshal version 1
	api2.Endpoints[0].LbEndpoints[0].LoadBalancingWeight = wrapperspb.UInt32(7)
	before := time.Now()
	acked(cp.Set(t, cs, []*endpointv3.ClusterLoadAssignment{api2}))
	if w, _ := xdsTable.weight("10.0.7.1:80"); w != 7 {
		t.Fatalf("api's weight %v after version 2, want 7: one cluster without endpoints held the view back", w)
	}
	if ups, err := rpc.GetUpstreams(nil); err != nil || len(ups) != 1 || ups[0].Dial != "10.0.8.1:50051" {
		t.Fatalf("rpc, waiting for its endpoints, serves %v (%v), want its last good backend", ups, err)
	}
	b, err := json.Marshal(collectStatus(ctx, nil, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	var snap status.Snapshot
	if err := json.Unmarshal(b, &snap); err != nil {
		t.Fatal(err)
	}
	if len(snap.Feeds) != 1 || len(snap.Feeds[0].Waiting) != 1 {
		t.Fatalf("status.json feeds: %s", b)
	}
	w := snap.Feeds[0].Waiting[0]
	if w.Service != "rpc" || !w.Kept || w.Since.Before(before.Add(-time.Second)) || !strings.Contains(string(b), "waiting since") {
		t.Fatalf("status.json: waiting %+v (since the version sent at %s), notes %q", w, before, snap.Notes)
	}
}
