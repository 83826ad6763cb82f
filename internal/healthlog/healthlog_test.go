package healthlog

import (
	"fmt"
	"sync"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/stickylb/stickylb/policies/health"
)

// A prober fault striking every backend of two services, many times over and from
// several goroutines, logs one line per cause; every real verdict change is logged.
func TestProberFaultLoggedOncePerCause(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	l := New(zap.New(core))
	causes := []string{"tcp: prober fault: EMFILE (too many open files)", "icmp: prober fault: no ICMP socket"}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				for _, c := range causes {
					l.Transition(fmt.Sprintf("svc%d", i%2), health.Transition{ID: fmt.Sprintf("10.0.0.%d:80", g*50+i),
						To: health.Unknown, ProberFault: true, From: health.Healthy, Reason: c})
				}
			}
		}()
	}
	wg.Wait()
	faults := logs.FilterMessageSnippet("prober's own reasons").All()
	if len(faults) != len(causes) {
		t.Fatalf("%d prober-fault lines for %d causes: %v", len(faults), len(causes), faults)
	}
	seen := map[string]bool{}
	for _, e := range faults {
		if e.Level != zapcore.WarnLevel {
			t.Errorf("a prober fault logged at %v, want warn", e.Level)
		}
		seen[e.ContextMap()["cause"].(string)] = true
	}
	for _, c := range causes {
		if !seen[c] {
			t.Errorf("cause %q never logged", c)
		}
	}

	// Real verdicts: one line each, the same backend twice included.
	for _, to := range []health.State{health.Unhealthy, health.Healthy, health.Unhealthy} {
		l.Transition("svc0", health.Transition{ID: "10.0.0.1:80", To: to, Healthy: to == health.Healthy, Reason: "tcp: connection refused"})
	}
	changes := logs.FilterMessage("backend health changed").All()
	if len(changes) != 3 || changes[2].ContextMap()["state"] != "unhealthy" {
		t.Fatalf("verdict changes logged: %v", changes)
	}
	if n := logs.Len(); n != len(causes)+3 {
		t.Fatalf("%d lines in all, want %d", n, len(causes)+3)
	}
}
