package healthtest

import (
	"testing"

	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

func TestSwitch(t *testing.T) {
	var s Switch
	a, b := &pools.Backend{Address: "10.0.0.1:80"}, &pools.Backend{Address: "10.0.0.2:80"}
	if s.View("svc", a) != health.Healthy {
		t.Fatal("a backend is unhealthy before anything was turned down")
	}
	s.Down(a.Address)
	if s.View("svc", a) != health.Unhealthy || s.View("svc", b) != health.Healthy {
		t.Fatalf("after Down(a): a %v, b %v; want unhealthy, healthy", s.View("svc", a), s.View("svc", b))
	}
}
