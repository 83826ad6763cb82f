package poolstest

import (
	"strings"
	"testing"

	"github.com/stickylb/stickylb/policies/pools"
)

// TestAPI: the fixture is a valid pools file whose health check is the one the constants
// state, over the entries given, in order.
func TestAPI(t *testing.T) {
	f, err := pools.Parse("pools.yaml", []byte(API(append(Addresses("127.0.0.1:8001"), "address: 127.0.0.1:8002, drain: true")...)))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Services) != 1 || f.Services[0].Name != "api" {
		t.Fatalf("services %+v, want api alone", f.Services)
	}
	s := f.Services[0]
	hc := s.HealthCheck
	if hc == nil || hc.Interval != Interval || hc.Timeout != Timeout || hc.UnhealthyThreshold != Unhealthy || hc.HealthyThreshold != 1 {
		t.Fatalf("health check %+v, want interval %s, timeout %s, unhealthy %d, healthy 1", hc, Interval, Timeout, Unhealthy)
	}
	if len(s.Backends) != 2 || s.Backends[0].Address != "127.0.0.1:8001" || s.Backends[0].Drain ||
		s.Backends[1].Address != "127.0.0.1:8002" || !s.Backends[1].Drain {
		t.Fatalf("backends %+v, want 127.0.0.1:8001 and 127.0.0.1:8002 draining", s.Backends)
	}
}

// TestCaddyFleet: the fixture parses to what its comment promises, which the tests using it
// rely on.
func TestCaddyFleet(t *testing.T) {
	f, err := pools.Parse("pools.yaml", []byte(CaddyFleet))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range f.Services {
		names = append(names, s.Name+"/"+s.Protocol)
	}
	if got := strings.Join(names, " "); got != "api/http rpc/grpc web/tcp" {
		t.Fatalf("services %s, want api/http rpc/grpc web/tcp", got)
	}
	api := f.Services[0]
	if api.CrossZone || api.HealthCheck == nil || len(api.Backends) != 2 {
		t.Fatalf("api: cross_zone %v, health check %+v, %d backends", api.CrossZone, api.HealthCheck, len(api.Backends))
	}
	b1, b2 := api.Backends[0], api.Backends[1]
	if b1.Identity() != "api-1" || b1.Weight != 3 || b1.Zone != "z1" || b1.Drain || !b2.Drain || b2.Zone != "z2" {
		t.Fatalf("api's backends: %+v, %+v", b1, b2)
	}
}

// TestFleet: the fixture parses to what its comment promises, and an entry appended lands
// in web.
func TestFleet(t *testing.T) {
	f, err := pools.Parse("pools.yaml", []byte(Fleet+"      - {address: 10.0.6.3:443}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Services) != 2 || f.Services[0].Name != "api" || f.Services[1].Name != "web" {
		t.Fatalf("services %+v, want api and web", f.Services)
	}
	api, web := f.Services[0], f.Services[1]
	if len(api.Backends) != 2 || api.Backends[0].Zone != "zone-a" || !api.Backends[1].Drain || api.Backends[1].Zone != "zone-b" {
		t.Fatalf("api's backends: %+v", api.Backends)
	}
	if web.Protocol != pools.ProtocolTCP || len(web.Backends) != 3 || web.Backends[0].MAC == "" || web.Backends[1].Weight != 2 ||
		web.Backends[2].Address != "10.0.6.3:443" {
		t.Fatalf("web: %s, backends %+v", web.Protocol, web.Backends)
	}
}
