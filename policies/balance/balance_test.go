package balance

import (
	"math"
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

// TestSlowStartShares: a new backend beside two warm ones, equal weights, picks in the
// ratio of the weights (smooth WRR, weights in thousandths): its share rises with the factor.
func TestSlowStartShares(t *testing.T) {
	ss := SlowStart{Window: 10 * time.Second, Aggression: 1, MinWeightPercent: 10}
	t0 := time.Unix(0, 0)
	prev := 0.0
	for _, at := range []time.Duration{time.Second, 4 * time.Second, 7 * time.Second, 11 * time.Second} {
		now := t0.Add(at)
		var wrr SmoothWRR
		weights := []int{1000, 1000, int(math.Round(1000 * ss.Weight(1, t0, now)))}
		n := 0
		for i := 0; i < 1000; i++ {
			if wrr.Next(weights) == 2 {
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
