package pools

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stickylb/stickylb/policies/health"
)

// HealthMonitor: an edit keeps the checker (and its verdicts) of a service whose
// health_check did not change, and starts afresh one whose health_check did.
func TestHealthMonitorKeepsCheckersAcrossEdits(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // refused from now on
	file := func(interval string, backends ...string) []*Service {
		src := "services:\n  - name: a\n    protocol: tcp\n    listen: 127.0.0.1:1\n    affinity: {mode: none}\n    balance: maglev\n" +
			"    health_check: {protocol: tcp, interval: " + interval + ", timeout: 500ms, unhealthy_threshold: 1}\n    backends:\n"
		for _, b := range backends {
			src += fmt.Sprintf("      - {address: %q}\n", b)
		}
		f, err := Parse("pools.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		return f.Services
	}
	var transitions atomic.Int64
	m := NewHealthMonitor(func(string, health.Transition) { transitions.Add(1) })
	defer m.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := file("1s", dead)
	if err := m.Apply(ctx, first); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for m.View("a", first[0].Backends[0]) != health.Unhealthy {
		if time.Now().After(deadline) {
			t.Fatalf("the dead backend not unhealthy within 5s: %v", m.View("a", first[0].Backends[0]))
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Same health_check, one more backend: the verdict stands at once.
	grown := file("1s", dead, "127.0.0.1:9")
	if err := m.Apply(ctx, grown); err != nil {
		t.Fatal(err)
	}
	if st := m.View("a", grown[0].Backends[0]); st != health.Unhealthy {
		t.Fatalf("after an edit that kept the health_check: %v, want unhealthy", st)
	}
	// Another interval: a new checker, which knows nothing yet.
	changed := file("2s", dead)
	if err := m.Apply(ctx, changed); err != nil {
		t.Fatal(err)
	}
	if st := m.View("a", changed[0].Backends[0]); st != health.Unknown {
		t.Fatalf("after the health_check changed: %v, want unknown", st)
	}
	if transitions.Load() == 0 {
		t.Fatal("onTransition never called")
	}
	// Gone from the file: no checker, no view.
	if err := m.Apply(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if st := m.View("a", changed[0].Backends[0]); st != health.Unknown {
		t.Fatalf("after the service left: %v", st)
	}
}
