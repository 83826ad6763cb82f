package fleetview

import (
	"errors"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// caddyFile: the fleet of the Caddy-group tests of xds too.
var caddyFile = poolstest.CaddyFleet

// TestCaddyRoundTrip: the Caddy view holds the http and grpc services with what a Caddy
// node routes by (identity, address, weight, zone, drain, cross_zone, verdict and time),
// passes Envoy's validation, and the Assembler applies it with DecodeCaddy.
func TestCaddyRoundTrip(t *testing.T) {
	f, err := pools.Parse("pools.yaml", []byte(caddyFile))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	cs, ls := EncodeCaddy(f, func(_ string, b *pools.Backend) Verdict {
		if b.Identity() == "api-1" {
			return Verdict{State: health.Unhealthy, Since: at}
		}
		return Verdict{}
	})
	for _, c := range cs {
		if err := c.ValidateAll(); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range ls {
		if err := l.ValidateAll(); err != nil {
			t.Fatal(err)
		}
	}
	c, l := byName(cs, ls)
	if _, err := Decode(c, l); err == nil {
		t.Fatal("the XDP decoder took the Caddy view")
	}
	var got *View
	a := &Assembler{Decode: DecodeCaddy, Apply: func(v *View) error { got = v; return nil }}
	if err := a.Clusters("1", c); err != nil || got != nil {
		t.Fatalf("clusters alone: err %v, applied %v", err, got)
	}
	if err := a.Endpoints("1", l); err != nil {
		t.Fatal(err)
	}
	if got == nil || len(got.File.Services) != 2 || got.File.Services[0].Name != "api" || got.File.Services[1].Name != "rpc" {
		t.Fatalf("services %+v, want api and rpc", got)
	}
	api := got.File.Services[0]
	if api.Protocol != pools.ProtocolHTTP || api.CrossZone || api.HealthCheck == nil {
		t.Fatalf("api: %+v", api)
	}
	b1, b2 := api.Backends[0], api.Backends[1]
	if b1.Identity() != "api-1" || b1.Address != "10.0.7.1:80" || b1.Weight != 3 || b1.Zone != "z1" || b1.Drain {
		t.Fatalf("first backend %+v", b1)
	}
	if b2.Identity() != "10.0.7.2:80" || !b2.Drain || b2.Weight != pools.DefaultWeight {
		t.Fatalf("second backend %+v", b2)
	}
	if vd := got.Verdicts[Key("api", "api-1")]; vd.State != health.Unhealthy || !vd.Since.Equal(at) {
		t.Fatalf("verdict %+v", vd)
	}
	if rpc := got.File.Services[1]; rpc.Protocol != pools.ProtocolGRPC || !rpc.CrossZone {
		t.Fatalf("rpc: %+v", rpc)
	}

	// A cluster of a protocol Caddy does not proxy, or without its metadata, is an error
	// naming it; a cluster whose endpoints have not come is incomplete.
	bad := proto.Clone(c["api"]).(*clusterv3.Cluster)
	bad.Metadata.FilterMetadata[MetadataKey].Fields["protocol"] = structpb.NewStringValue("udp")
	if _, err := DecodeCaddy(map[string]proto.Message{"api": bad}, l); err == nil || !strings.Contains(err.Error(), "cluster api") {
		t.Fatalf("udp cluster: %v", err)
	}
	bare := proto.Clone(c["api"]).(*clusterv3.Cluster)
	bare.Metadata = nil
	if _, err := DecodeCaddy(map[string]proto.Message{"api": bare}, l); err == nil {
		t.Fatal("a cluster without metadata decoded")
	}
	if _, err := DecodeCaddy(c, map[string]proto.Message{"api": l["api"]}); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("rpc without endpoints: %v, want ErrIncomplete", err)
	}
}
