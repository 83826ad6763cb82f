package plan

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stickylb/stickylb/policies/pools"
)

// weightedFile is one header-keyed service over backends of the given weights.
func weightedFile(t testing.TB, protocol, hash string, weights ...int) *pools.File {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "services:\n  - name: api\n    protocol: %s\n    affinity: {mode: header, header: {name: x}}\n    balance: ring_hash\n    hash: %s\n    backends:\n", protocol, hash)
	for i, w := range weights {
		fmt.Fprintf(&b, "      - {address: 10.0.0.%d:80, weight: %d}\n", i+1, w)
	}
	f, err := pools.Parse("t.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestPlanVirtualNodesNearIdeal: with virtual_nodes 160, adding a backend moves within 1.15x of
// the ideal share of plan's fixed keys, equal weights or not; the fixed 1024-point ring on
// the same change does not (its points are shared out again among all backends).
func TestPlanVirtualNodesNearIdeal(t *testing.T) {
	for _, c := range []struct {
		name       string
		old, next  []int
		ideal      float64
		wantPoints [2]int
	}{
		{"3 -> 4 equal", []int{1, 1, 1}, []int{1, 1, 1, 1}, 0.25, [2]int{480, 640}},
		{"3:1:2 -> 3:1:2:2", []int{3, 1, 2}, []int{3, 1, 2, 2}, 0.25, [2]int{960, 1280}},
	} {
		rs, err := Compare(weightedFile(t, "http", "{virtual_nodes: 160}", c.old...), weightedFile(t, "http", "{virtual_nodes: 160}", c.next...), 0)
		if err != nil {
			t.Fatal(err)
		}
		r := rs[0]
		fixed, err := Compare(weightedFile(t, "http", "{min_ring_size: 1024}", c.old...), weightedFile(t, "http", "{min_ring_size: 1024}", c.next...), 0)
		if err != nil {
			t.Fatal(err)
		}
		f := fixed[0]
		t.Logf("%s: virtual_nodes 160 moves %.4f (ring points %v), min_ring_size 1024 moves %.4f, Maglev %.4f, mod-N %.4f, ideal %.4f",
			c.name, r.Moved, *r.RingPoints, f.Moved, *r.Maglev, r.ModN, r.Ideal)
		if r.Ideal != c.ideal {
			t.Errorf("%s: ideal %v, want %v", c.name, r.Ideal, c.ideal)
		}
		if r.Moved > 1.15*r.Ideal || r.Moved < r.Ideal-sigma4(r.Ideal, r.Keys) {
			t.Errorf("%s: virtual nodes moved %.4f, want within 1.15x of the ideal %.2f", c.name, r.Moved, r.Ideal)
		}
		if f.Moved <= 1.15*f.Ideal {
			t.Errorf("%s: the fixed-size ring moved only %.4f; this test no longer shows the difference", c.name, f.Moved)
		}
		if r.Ring == nil || *r.Ring != r.Moved || *r.RingPoints != c.wantPoints || r.Maglev == nil || r.GRPCRing != nil {
			t.Errorf("%s: table %+v", c.name, r)
		}
	}
}

// TestPlanGRPCRingCapped: a grpc service whose virtual-node ring passes 4096 points shows the
// ring gRPC clients build (capped at 4096 points, so it moves more), beside Envoy's and Caddy's.
func TestPlanGRPCRingCapped(t *testing.T) {
	old := weightedFile(t, "grpc", "{virtual_nodes: 160}", 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)
	next := weightedFile(t, "grpc", "{virtual_nodes: 160}", 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)
	if len(next.Warnings) != 1 || len(old.Warnings) != 0 {
		t.Fatalf("warnings: %v / %v", old.Warnings, next.Warnings)
	}
	rs, err := Compare(old, next, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	if r.GRPCRing == nil || *r.GRPCRingPoints != [2]int{4000, 4096} || *r.RingPoints != [2]int{4000, 4160} {
		t.Fatalf("gRPC ring not shown: %+v", r)
	}
	t.Logf("25 -> 26 backends: Envoy/Caddy ring moves %.4f (%v points), gRPC's %.4f (%v points), ideal %.4f",
		*r.Ring, *r.RingPoints, *r.GRPCRing, *r.GRPCRingPoints, r.Ideal)
	if *r.GRPCRing <= *r.Ring {
		t.Errorf("the capped gRPC ring moved %.4f, no more than the full ring's %.4f", *r.GRPCRing, *r.Ring)
	}
	// The same file under the cap: nothing to show.
	small := weightedFile(t, "grpc", "{virtual_nodes: 160}", 1, 1, 1)
	if rs, _ = Compare(small, small, 0); rs[0].GRPCRing != nil {
		t.Fatalf("uncapped ring shown as capped: %+v", rs[0])
	}
}
