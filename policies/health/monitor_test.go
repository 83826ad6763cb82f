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
