package xds

import (
	"net"
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/internal/testkit/zonecases"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/policies/zones"
)

// newTraffic is where a client of cla sends new sessions, as Envoy and gRPC do with the
// control plane's overprovisioning factor: to the endpoints published HEALTHY or UNKNOWN
// of the lowest priority that has any. It returns their addresses.
func newTraffic(cla *endpointv3.ClusterLoadAssignment) []string {
	var out []string
	prio := uint32(0)
	for _, l := range cla.GetEndpoints() { // by priority
		if out != nil && l.GetPriority() != prio {
			break
		}
		prio = l.GetPriority()
		for _, e := range l.GetLbEndpoints() {
			if s := e.GetHealthStatus(); s == corev3.HealthStatus_HEALTHY || s == corev3.HealthStatus_UNKNOWN {
				out = append(out, e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
			}
		}
	}
	return out
}

// TestXDSFollowsTheZoneRule: for every case of the zone rule, a node of the case's zone that
// follows the published priorities and health statuses sends new sessions exactly where
// zones.Eligible says (its Local), including in fail open, and the panic gauge is its
// FailOpen; hash services (one locality per priority) alike.
func TestXDSFollowsTheZoneRule(t *testing.T) {
	for _, c := range zonecases.Cases {
		for _, bal := range []string{pools.BalanceRoundRobin, pools.BalanceRingHash} {
			f := poolstest.Parse(t, c.PoolsFile(bal))
			view := func(_ string, b *pools.Backend) health.State { return c.State(b.Address) }
			r, err := Translate(f, Node{Zone: c.NodeZone}, view)
			if err != nil {
				t.Fatalf("%s: %v", c.Name, err)
			}
			var got []string
			for _, addr := range newTraffic(r.Endpoints[0].(*endpointv3.ClusterLoadAssignment)) {
				got = append(got, c.ID(net.JoinHostPort(addr, "80")))
			}
			slices.Sort(got)
			e := zones.Eligible(c.NodeZone, c.Backends, c.Policy)
			var want []string
			for _, i := range e.Local {
				want = append(want, c.Backends[i].ID)
			}
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("%s (%s): the xDS tier's new sessions go to %v, the rule's to %v", c.Name, bal, got, want)
			}
			if p := InPanic(f.Services[0], view); p != e.FailOpen {
				t.Errorf("%s: in panic %v, the rule fails open %v", c.Name, p, e.FailOpen)
			}
		}
	}
}
