package balance

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestSmoothWRRSequence(t *testing.T) {
	var s SmoothWRR
	var got strings.Builder
	for i := 0; i < 7; i++ {
		got.WriteByte("abc"[s.Next([]int{5, 1, 1})])
	}
	if got.String() != "aabacaa" { // nginx's documented sequence for weights 5, 1, 1
		t.Fatalf("sequence %q, want aabacaa", got.String())
	}
	if s.Next([]int{0, 0}) != -1 {
		t.Fatal("no positive weight must give -1")
	}
	counts := make([]int, 3)
	var s2 SmoothWRR
	for i := 0; i < 600; i++ {
		counts[s2.Next([]int{3, 0, 1})]++
	}
	if counts[0] != 450 || counts[1] != 0 || counts[2] != 150 {
		t.Fatalf("counts %v, want exactly [450 0 150]", counts)
	}
}

type sim struct {
	active  []int64
	weights []float64
	ok      []bool
}

func (s *sim) get(i int) Candidate {
	return Candidate{Active: s.active[i], Weight: s.weights[i], Eligible: s.ok[i]}
}

func TestLeastConnArgmin(t *testing.T) {
	var l LeastConn
	s := &sim{active: []int64{5, 1, 3}, weights: []float64{1, 1, 1}, ok: []bool{true, true, true}}
	if got := l.Pick(3, s.get); got != 1 {
		t.Fatalf("picked %d, want 1 (least active)", got)
	}
	// Weights: 5/10 = 0.5 beats 1/1.
	s.weights = []float64{10, 1, 1}
	if got := l.Pick(3, s.get); got != 0 {
		t.Fatalf("picked %d, want 0 (least active per weight)", got)
	}
	s.ok[0] = false
	if got := l.Pick(3, s.get); got != 1 {
		t.Fatalf("picked %d, want 1 (0 not eligible)", got)
	}
	s.weights[1], s.weights[2] = 0, 0 // weight 0: no new picks
	if got := l.Pick(3, s.get); got != -1 {
		t.Fatalf("picked %d with nothing eligible", got)
	}
}

// TestLeastConnSteadyState holds requests open (nothing completes) and checks that the
// in-flight counts follow the weights exactly.
func TestLeastConnSteadyState(t *testing.T) {
	var l LeastConn
	s := &sim{active: make([]int64, 3), weights: []float64{3, 2, 1}, ok: []bool{true, true, true}}
	for i := 0; i < 600; i++ {
		s.active[l.Pick(3, s.get)]++
	}
	if s.active[0] != 300 || s.active[1] != 200 || s.active[2] != 100 {
		t.Fatalf("in flight %v, want [300 200 100]", s.active)
	}
}

// TestLeastConnTiesFollowWeights: requests that finish before the next arrives leave every
// backend at 0 in flight, so every pick ties on active; the weights still decide, in the
// smooth WRR order.
func TestLeastConnTiesFollowWeights(t *testing.T) {
	var l LeastConn
	s := &sim{active: make([]int64, 3), weights: []float64{1, 1, 1}, ok: []bool{true, true, true}}
	s.weights = []float64{3, 2, 1}
	counts := make([]int, 3)
	for i := 0; i < 600; i++ {
		counts[l.Pick(3, s.get)]++
	}
	if counts[0] != 300 || counts[1] != 200 || counts[2] != 100 {
		t.Fatalf("weights 3:2:1, sequential requests: %v, want [300 200 100]", counts)
	}
}

func TestSlowStartFactor(t *testing.T) {
	now := time.Unix(1000, 0)
	ss := SlowStart{Window: 10 * time.Second, Aggression: 1, MinWeightPercent: 10}
	cases := []struct {
		elapsed time.Duration
		want    float64
	}{
		{0, 0.1}, // floored at min_weight_percent
		{500 * time.Millisecond, 0.1},
		{2 * time.Second, 0.2},
		{5 * time.Second, 0.5},
		{9 * time.Second, 0.9},
		{10 * time.Second, 1},
		{time.Hour, 1},
	}
	for _, tc := range cases {
		if got := ss.Factor(now.Add(-tc.elapsed), now); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("linear, %s: %v, want %v", tc.elapsed, got, tc.want)
		}
	}
	// Aggression 2: sqrt of the time fraction (Envoy's pow(t, 1/aggression)).
	ss.Aggression = 2
	if got := ss.Factor(now.Add(-2500*time.Millisecond), now); math.Abs(got-0.5) > 1e-12 {
		t.Errorf("aggression 2 at 25%%: %v, want 0.5", got)
	}
	ss.Aggression, ss.MinWeightPercent = 0.5, 0
	if got := ss.Factor(now.Add(-5*time.Second), now); math.Abs(got-0.25) > 1e-12 {
		t.Errorf("aggression 0.5 at 50%%: %v, want 0.25", got)
	}
	if got := ss.Factor(now, now); got <= 0 {
		t.Errorf("factor at 0 with no floor must stay positive (1 ms), got %v", got)
	}
	if got := ss.Factor(time.Time{}, now); got != 1 {
		t.Errorf("healthy since forever: %v", got)
	}
	if got := (SlowStart{}).Weight(7, now, now); got != 7 {
		t.Errorf("disabled: %v", got)
	}
	if got := (SlowStart{Window: time.Second, Aggression: 1}).Weight(4, now.Add(-250*time.Millisecond), now); got != 1 {
		t.Errorf("Weight 4 at 25%%: %v, want 1", got)
	}
}

func TestSlowStartValidate(t *testing.T) {
	for _, bad := range []SlowStart{
		{Window: -1},
		{Window: time.Second, Aggression: -1},
		{Window: time.Second, Aggression: math.NaN()},
		{Window: time.Second, MinWeightPercent: 101},
		{Window: time.Second, MinWeightPercent: -1},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if err := (SlowStart{Window: 30 * time.Second, Aggression: 1, MinWeightPercent: 10}).Validate(); err != nil {
		t.Error(err)
	}
}

// TestSlowStartShares: a new backend beside two warm ones, equal weights, sequential
// requests: its share of picks rises with the factor.
func TestSlowStartShares(t *testing.T) {
	ss := SlowStart{Window: 10 * time.Second, Aggression: 1, MinWeightPercent: 10}
	t0 := time.Unix(0, 0)
	var l LeastConn
	prev := 0.0
	for _, at := range []time.Duration{time.Second, 4 * time.Second, 7 * time.Second, 11 * time.Second} {
		now := t0.Add(at)
		n := 0
		for i := 0; i < 1000; i++ {
			c := []Candidate{
				{Weight: 1, Eligible: true},
				{Weight: 1, Eligible: true},
				{Weight: ss.Weight(1, t0, now), Eligible: true},
			}
			if l.Pick(3, func(i int) Candidate { return c[i] }) == 2 {
				n++
			}
		}
		f := ss.Factor(t0, now)
		want := f / (2 + f)
		share := float64(n) / 1000
		if math.Abs(share-want) > 0.01 || share < prev {
			t.Fatalf("at %s the new backend took %.3f, want %.3f (rising)", at, share, want)
		}
		prev = share
	}
}

func BenchmarkLeastConnPick(b *testing.B) {
	for _, n := range []int{3, 10, 100} {
		c := make([]Candidate, n)
		for i := range c {
			c[i] = Candidate{Active: int64(i % 7), Weight: float64(1 + i%3), Eligible: true}
		}
		b.Run("upstreams="+strconv.Itoa(n), func(b *testing.B) {
			var l LeastConn
			for b.Loop() {
				l.Pick(n, func(i int) Candidate { return c[i] })
			}
		})
	}
}
