package caddymodule

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/internal/testkit/zonecases"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/policies/zones"
)

// TestXDSSourceDrainedZoneLastResort: a drained zone is the last resort on Caddy nodes as on
// the other tiers. Its backends get no new session while another zone has a usable backend;
// when none has, they take new sessions (not the dead ones of the live zones); a backend
// that drains itself stays drained either way.
func TestXDSSourceDrainedZoneLastResort(t *testing.T) {
	f := poolstest.Parse(t, `services:
  - name: api
    protocol: http
    listen: 127.0.0.1:8080
    drained_zones: [z2]
    backends:
      - {address: 10.0.9.1:80, zone: z1}
      - {address: 10.0.9.2:80, zone: z2}
      - {address: 10.0.9.3:80, zone: z2, drain: true}
`)
	view := func(z1 health.State) *xdsView {
		t.Helper()
		cs, ls := fleetview.EncodeCaddy(f, func(_ string, b *pools.Backend) fleetview.Verdict {
			if b.Zone == "z1" {
				return fleetview.Verdict{State: z1}
			}
			return fleetview.Verdict{State: health.Healthy}
		})
		c, l := map[string]proto.Message{}, map[string]proto.Message{}
		for i := range cs {
			c[cs[i].Name], l[ls[i].ClusterName] = cs[i], ls[i]
		}
		dv, err := fleetview.DecodeCaddy(c, l)
		if err != nil {
			t.Fatal(err)
		}
		v, err := routableView(dv)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	drainedOf := func(v *xdsView) string {
		var out []string
		for _, b := range v.Services["api"].Backends {
			if b.Drain {
				out = append(out, b.Dial)
			}
		}
		return strings.Join(out, " ")
	}
	up := view(health.Healthy)
	if got, want := drainedOf(up), "10.0.9.2:80 10.0.9.3:80"; got != want {
		t.Fatalf("z1 healthy: drained %q, want %q", got, want)
	}
	if got, want := strings.Join(dials(t, sourceWith(up, "")), " "), "10.0.9.1:80 10.0.9.2:80 10.0.9.3:80"; got != want {
		t.Fatalf("z1 healthy: upstreams %q, want %q (drained ones keep their sessions)", got, want)
	}
	down := view(health.Unhealthy)
	if got, want := drainedOf(down), "10.0.9.3:80"; got != want {
		t.Fatalf("z1 down: drained %q, want %q (the drained zone is the last resort)", got, want)
	}
	if got, want := strings.Join(dials(t, sourceWith(down, "")), " "), "10.0.9.2:80 10.0.9.3:80"; got != want {
		t.Fatalf("z1 down: upstreams %q, want %q", got, want)
	}
}

// TestXDSSourceFollowsTheZoneRule: for every case of the zone rule, a Caddy node of the
// case's zone, on the view the control plane encodes, returns as upstreams that take new
// sessions (those not in the drain set) exactly where zones.Eligible sends them (its
// Local); the draining ones it returns beside them are usable.
func TestXDSSourceFollowsTheZoneRule(t *testing.T) {
	for _, c := range zonecases.Cases {
		f := poolstest.Parse(t, c.PoolsFile(pools.BalanceRoundRobin))
		cs, ls := fleetview.EncodeCaddy(f, func(_ string, b *pools.Backend) fleetview.Verdict {
			return fleetview.Verdict{State: c.State(b.Address)}
		})
		dv, err := fleetview.DecodeCaddy(map[string]proto.Message{cs[0].Name: cs[0]}, map[string]proto.Message{ls[0].ClusterName: ls[0]})
		if err != nil {
			t.Fatal(err)
		}
		v, err := routableView(dv)
		if err != nil {
			t.Fatal(err)
		}
		byDial := map[string]xdsBackend{}
		for _, b := range v.Services["api"].Backends {
			byDial[b.Dial] = b
		}
		var got []string
		for _, d := range v.Services["api"].pick(c.NodeZone) {
			switch b := byDial[d]; {
			case !b.Drain:
				got = append(got, c.ID(d))
			case !b.usable():
				t.Errorf("%s: a draining upstream returned though down: %s", c.Name, c.ID(d))
			}
		}
		var want []string
		e := zones.Eligible(c.NodeZone, c.Backends, c.Policy)
		for _, i := range e.Local {
			want = append(want, c.Backends[i].ID)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: new sessions to %v, the rule's %v", c.Name, got, want)
		}
	}
}
