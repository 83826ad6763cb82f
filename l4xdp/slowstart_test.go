package l4xdp

import (
	"testing"
	"time"
)

// A backend that joins ramps its weight in rampSteps steps over the window, with the other
// tiers' formula, from the time its ramp began; the schedule follows the weights.
func TestSlowStartSteps(t *testing.T) {
	l := newTestLoader(t, "")
	two := "services:\n  - name: web\n    protocol: tcp\n    vip: 10.0.0.100:80\n    balance: weighted_round_robin\n" +
		"    slow_start: {window: 10s, aggression: 1, min_weight_percent: 10}\n    backends:\n" +
		"      - {address: 10.0.5.1:80, mac: \"02:00:00:00:05:01\"}\n"
	l.applyFile(t, two)
	key := "web/10.0.5.2:80"
	l.applyFile(t, two+"      - {address: 10.0.5.2:80, mac: \"02:00:00:00:05:02\"}\n")
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.rampFrom[key]; !ok {
		t.Fatal("a backend added by an edit does not ramp")
	}
	weight := func() uint32 {
		t.Helper()
		var w uint32
		if err := l.maps.objs.Weights.Lookup(l.slots[key], &w); err != nil {
			t.Fatal(err)
		}
		return w
	}
	if w := weight(); w != 10 { // min_weight_percent of 100
		t.Fatalf("weight at the start of the ramp %d, want 10", w)
	}
	for _, tc := range []struct {
		elapsed time.Duration
		want    uint32
	}{
		// Each case sits 250 ms into its step (steps of 500 ms), so the time applyWaitLocked
		// takes to read the clock again cannot carry it into the next step.
		{2*time.Second + 250*time.Millisecond, 20}, // step 4 of 20: 2 s
		{5*time.Second + 250*time.Millisecond, 50},
		{9*time.Second + 750*time.Millisecond, 95}, // the last step
		{10 * time.Second, 100},                    // done
	} {
		l.rampFrom[key] = time.Now().Add(-tc.elapsed)
		if !l.rampDueLocked(time.Now()) {
			t.Fatalf("%s into the ramp: no step due", tc.elapsed)
		}
		if err := l.applyWaitLocked(l.file, resolveWait); err != nil {
			t.Fatal(err)
		}
		if w := weight(); w != tc.want {
			t.Errorf("%s into the ramp: weight %d, want %d", tc.elapsed, w, tc.want)
		}
	}
	if _, ok := l.rampFrom[key]; ok {
		t.Error("a finished ramp is still tracked")
	}
}
