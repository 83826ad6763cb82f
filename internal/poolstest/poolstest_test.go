package poolstest

import (
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
