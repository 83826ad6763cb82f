package health

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
)

// Monitor: an edit keeps the checker (and its verdicts) of a service whose
// health_check did not change, and starts afresh one whose health_check did.
func TestMonitorKeepsCheckersAcrossEdits(t *testing.T) {
	dead := loopback.Refused(t)
	// A pools file's service "a": tcp checks, unhealthy after one failure.
	file := func(interval time.Duration, backends ...string) []Service {
		s := Service{Name: "a", Config: Config{Protocol: TCP, Interval: interval, Timeout: 500 * time.Millisecond, UnhealthyThreshold: 1}}
		for _, b := range backends {
			s.Targets = append(s.Targets, Target{ID: b, Address: b})
		}
		return []Service{s}
	}
	var transitions atomic.Int64
	m := NewMonitor(func(string, Transition) { transitions.Add(1) })
	defer m.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := file(time.Second, dead)
	if err := m.Apply(ctx, first); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for m.View("a", first[0].Targets[0].ID) != Unhealthy {
		if time.Now().After(deadline) {
			t.Fatalf("the dead backend not unhealthy within 5s: %v", m.View("a", first[0].Targets[0].ID))
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Same health_check, one more backend: the verdict stands at once.
	grown := file(time.Second, dead, "127.0.0.1:9")
	if err := m.Apply(ctx, grown); err != nil {
		t.Fatal(err)
	}
	if st := m.View("a", grown[0].Targets[0].ID); st != Unhealthy {
		t.Fatalf("after an edit that kept the health_check: %v, want unhealthy", st)
	}
	// Another interval: a new checker, which knows nothing yet.
	changed := file(2*time.Second, dead)
	if err := m.Apply(ctx, changed); err != nil {
		t.Fatal(err)
	}
	if st := m.View("a", changed[0].Targets[0].ID); st != Unknown {
		t.Fatalf("after the health_check changed: %v, want unknown", st)
	}
	if transitions.Load() == 0 {
		t.Fatal("onTransition never called")
	}
	// Gone from the file: no checker, no view.
	if err := m.Apply(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if st := m.View("a", changed[0].Targets[0].ID); st != Unknown {
		t.Fatalf("after the service left: %v", st)
	}
}

// A target seeded with a verdict another prober decided keeps it until the thresholds are
// met again from it: a seeded healthy backend that now fails stays healthy for
// unhealthy_threshold - 1 failures and makes one transition, from healthy; a seeded
// unhealthy one that fails makes none; the seed's time is the state's since.
func TestSeededTargetsKeepTheirVerdict(t *testing.T) {
	dead := loopback.Refused(t)
	since := time.Unix(1_000_000, 0)
	trs := make(chan Transition, 16)
	m := NewMonitor(func(_ string, tr Transition) { trs <- tr }, AllowShortIntervals())
	defer m.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	svc := Service{Name: "a", Config: Config{Protocol: TCP, Interval: 100 * time.Millisecond, Timeout: 50 * time.Millisecond, UnhealthyThreshold: 3},
		Targets: []Target{{ID: "up", Address: dead, Seed: Healthy, SeedSince: since}, {ID: "down", Address: dead, Seed: Unhealthy, SeedSince: since}}}
	if err := m.Apply(ctx, []Service{svc}); err != nil {
		t.Fatal(err)
	}
	if st, _ := m.Lookup("a", "up"); st.State != Healthy || !st.Since.Equal(since) {
		t.Fatalf("seeded: %+v", st)
	}
	select {
	case tr := <-trs:
		if tr.ID != "up" || tr.From != Healthy || tr.To != Unhealthy {
			t.Fatalf("transition %+v", tr)
		}
		if st, _ := m.Lookup("a", "up"); st.ConsecutiveFailures != 3 {
			t.Fatalf("turned unhealthy after %d failures, want 3", st.ConsecutiveFailures)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the seeded healthy target never turned unhealthy")
	}
	// Bounded observation: the seeded unhealthy target's failures change nothing.
	select {
	case tr := <-trs:
		t.Fatalf("unexpected transition %+v", tr)
	case <-time.After(500 * time.Millisecond):
	}
}
