package chash

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
)

// pointsPer counts each caller index's points on r.
func pointsPer(r *Ring) map[int]int {
	m := map[int]int{}
	for _, o := range r.owner {
		m[int(o)]++
	}
	return m
}

func weighted(ws ...uint32) []Host {
	hs := make([]Host, len(ws))
	for i, w := range ws {
		hs[i] = Host{ID: fmt.Sprintf("10.0.0.%d:80", i+1), Weight: w}
	}
	return hs
}

// TestVirtualNodesPointsPerHost: every host gets V x w / w_min points, and keeps them when
// other hosts come and go. The fixed-total ring this replaces gives 1024/3 -> 1024/4 points.
func TestVirtualNodesPointsPerHost(t *testing.T) {
	cases := []struct {
		name    string
		weights []uint32
		v       uint64
		minW    uint32
	}{
		{"equal-3", []uint32{1, 1, 1}, 160, 0},
		{"equal-4", []uint32{1, 1, 1, 1}, 160, 0},
		{"equal-7", []uint32{5, 5, 5, 5, 5, 5, 5}, 150, 0},
		{"3:1:2", []uint32{3, 1, 2}, 160, 0},
		{"3:1:2:2", []uint32{3, 1, 2, 2}, 160, 0},
		// The lightest backend is down: the file's smallest weight still sets the unit.
		{"3:2:2 of a file with weight 1", []uint32{3, 2, 2}, 160, 1},
		{"2:3 of a file with weight 2", []uint32{3, 3, 2}, 200, 2},
		{"many", []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 100, 0},
	}
	for _, c := range cases {
		r, err := NewVirtualNodesRing(weighted(c.weights...), c.v, c.minW)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		minW := c.minW
		if minW == 0 {
			minW = c.weights[0]
			for _, w := range c.weights {
				minW = min(minW, w)
			}
		}
		got := pointsPer(r)
		for i, w := range c.weights {
			if want := int(c.v * uint64(w) / uint64(minW)); got[i] != want {
				t.Errorf("%s: host %d (weight %d) has %d points, want %d", c.name, i, w, got[i], want)
			}
		}
	}
	// The fixed-size ring, for contrast: each old host loses points when a fourth comes.
	r3, _ := NewRing(weighted(1, 1, 1), DefaultMinRingSize, GRPCRingSizeCap)
	r4, _ := NewRing(weighted(1, 1, 1, 1), DefaultMinRingSize, GRPCRingSizeCap)
	if pointsPer(r3)[0] == pointsPer(r4)[0] {
		t.Fatalf("fixed-size ring kept host 0's %d points; the contrast this test relies on is gone", pointsPer(r3)[0])
	}
}

// TestPlanVirtualNodesMoveIdeal: 3 -> 4 equal hosts with 160 points each moves about the ideal
// 1/4 of 200,000 fixed keys (the fourth host's arcs), the fixed 1024-point ring about 1/3.
func TestPlanVirtualNodesMoveIdeal(t *testing.T) {
	const keys = 200_000
	moved := func(a, b Picker, ha, hb []Host) float64 {
		n := 0
		for i := range keys {
			h := KeyHash("key-" + strconv.Itoa(i))
			if ha[a.Pick(h)].ID != hb[b.Pick(h)].ID {
				n++
			}
		}
		return float64(n) / keys
	}
	h3, h4 := weighted(1, 1, 1), weighted(1, 1, 1, 1)
	v3, _ := NewVirtualNodesRing(h3, 160, 0)
	v4, _ := NewVirtualNodesRing(h4, 160, 0)
	f3, _ := NewRing(h3, DefaultMinRingSize, GRPCRingSizeCap)
	f4, _ := NewRing(h4, DefaultMinRingSize, GRPCRingSizeCap)
	mv, mf := moved(v3, v4, h3, h4), moved(f3, f4, h3, h4)
	t.Logf("3 -> 4 hosts: virtual_nodes 160 moves %.4f, min_ring_size 1024 moves %.4f (ideal 0.25)", mv, mf)
	if mv > 0.25*1.15 {
		t.Errorf("virtual nodes moved %.4f, more than 1.15 x the ideal", mv)
	}
	if mf < mv {
		t.Errorf("the fixed ring (%.4f) moved less than virtual nodes (%.4f)", mf, mv)
	}
	// Nothing moves between old hosts: every moved key went to the new one.
	for i := range keys {
		h := KeyHash("key-" + strconv.Itoa(i))
		if a, b := h3[v3.Pick(h)].ID, h4[v4.Pick(h)].ID; a != b && b != h4[3].ID {
			t.Fatalf("key %d moved from %s to %s, an old host", i, a, b)
		}
	}
}

func TestValidateVirtualNodesRingSize(t *testing.T) {
	for _, c := range []struct {
		hosts []Host
		v     uint64
		minW  uint32
		want  uint64
		err   bool
	}{
		{weighted(1, 1, 1), 160, 0, 480, false},
		{weighted(3, 1, 2, 2), 160, 0, 1280, false},
		{weighted(3, 2, 2), 160, 1, 1120, false},
		{weighted(2, 3), 1, 0, 3, false}, // 2.5 rounds up
		{weighted(1, 1), 0, 0, 0, true},
		{weighted(1, 1), 160, 2, 0, true}, // unit above the lightest host
		{weighted(1, 10000), 1000, 0, 0, true},
		{weighted(1, 1), MaxRingSize + 1, 0, 0, true},
		{nil, 160, 0, 0, false},
	} {
		got, err := VirtualNodesRingSize(c.hosts, c.v, c.minW)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("%v x %d (min %d): %d, %v; want %d, error %v", c.hosts, c.v, c.minW, got, err, c.want, c.err)
		}
		if err != nil && !errors.Is(err, ErrVirtualNodes) {
			t.Errorf("%v: %v is not ErrVirtualNodes", c.hosts, err)
		}
	}
	if r, err := NewVirtualNodesRing(nil, 160, 0); err != nil || r.Pick(1) != -1 {
		t.Fatalf("empty: %v", err)
	}
}

// BenchmarkVirtualNodesRing compares the ring built with virtual_nodes against the existing
// ring (min_ring_size/max_ring_size) at the same number of points:
//
//	go test -run '^$' -bench BenchmarkVirtualNodesRing -benchmem ./policies/chash/
//
// 100 hosts weighted 1..4 (w_min 1), 160 virtual nodes: 40,000 points.
func BenchmarkVirtualNodesRing(b *testing.B) {
	hosts := make([]Host, 100)
	for i := range hosts {
		hosts[i] = Host{ID: fmt.Sprintf("10.1.%d.%d:8080", i/250, i%250), Weight: uint32(1 + i%4)}
	}
	const v = 160
	size, err := VirtualNodesRingSize(hosts, v, 0)
	if err != nil {
		b.Fatal(err)
	}
	build := map[string]func() (*Ring, error){
		"virtual_nodes": func() (*Ring, error) { return NewVirtualNodesRing(hosts, v, 0) },
		// The existing settings that reach the same point count: min_ring_size = points, with
		// Envoy's own maximum (stickylb's default maximum is gRPC's cap, below 40,000).
		"min_ring_size": func() (*Ring, error) { return NewRing(hosts, size, MaxRingSize) },
	}
	for _, name := range []string{"virtual_nodes", "min_ring_size"} {
		r, err := build[name]()
		if err != nil {
			b.Fatal(err)
		}
		b.Run("build/"+name, func(b *testing.B) {
			for b.Loop() {
				if _, err := build[name](); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(r.Size()), "points")
		})
		b.Run("pick/"+name, func(b *testing.B) {
			hs := make([]uint64, 4096)
			for i := range hs {
				hs[i] = KeyHash("k" + strconv.Itoa(i))
			}
			i := 0
			for b.Loop() {
				_ = r.Pick(hs[i&4095])
				i++
			}
		})
	}
}
