package l4xdp

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds"
)

// A backend the control plane found down and then cannot probe (a prober fault: EPERM,
// EMFILE, ...) is UNKNOWN, never down: Envoy and gRPC route to it from the same view, so
// a fed XDP node must too. Before this rule the node kept its last verdict (down) while
// every other tier sent the backend new sessions.
func TestFedUnknownAfterDownIsRoutable(t *testing.T) {
	// The same service served to Envoy (listen) and to XDP nodes (vip); no slow start,
	// so the table is the plain Maglev table over the routable backends.
	src := strings.Replace(fedFile(2), "    slow_start: {window: 2000s, aggression: 1, min_weight_percent: 10}\n", "    listen: 0.0.0.0:8080\n", 1)
	const b2 = "web/10.0.5.2:80"
	t0 := time.Now().Add(-time.Minute)
	down := map[string]fleetview.Verdict{b2: {State: health.Unhealthy, Since: t0, From: health.Healthy}}
	unknown := map[string]fleetview.Verdict{b2: {State: health.Unknown, Since: t0.Add(30 * time.Second), From: health.Unhealthy}}

	l := newFedLoader(t, "")
	feed(t, l, src, down)
	if slices.Contains(tableNames(t, l, "web"), b2) {
		t.Fatal("a backend found down is in the table")
	}
	feed(t, l, src, unknown)

	// What Envoy is told for the same verdict: UNKNOWN, which it routes to.
	f, err := pools.Parse("pools.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	r, err := xds.Translate(f, xds.Node{}, func(svc string, b *pools.Backend) health.State {
		return unknown[fleetview.Key(svc, b.Identity())].State
	})
	if err != nil {
		t.Fatal(err)
	}
	envoy := corev3.HealthStatus_UNHEALTHY
	for _, m := range r.Endpoints {
		for _, le := range m.(*endpointv3.ClusterLoadAssignment).GetEndpoints() {
			for _, e := range le.GetLbEndpoints() {
				if e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress() == "10.0.5.2" {
					envoy = e.GetHealthStatus()
				}
			}
		}
	}
	if envoy != corev3.HealthStatus_UNKNOWN {
		t.Fatalf("Envoy is told %v for the backend, want UNKNOWN (routable)", envoy)
	}

	names := tableNames(t, l, "web")
	n := 0
	for _, name := range names {
		if name == b2 {
			n++
		}
	}
	// Two equal backends: Maglev gives each half the slots, up to its rounding.
	if lo := len(names) * 4 / 10; n < lo {
		t.Fatalf("the UNKNOWN backend holds %d of %d slots, want at least %d (Envoy routes to it)", n, len(names), lo)
	}
	l.mu.Lock()
	slot := l.slots[b2]
	l.mu.Unlock()
	if _, flags := backendAt(t, l.Tables(), slot); flags&backendDown != 0 {
		t.Fatalf("the UNKNOWN backend is flagged down: %d", flags)
	}
	got := map[int]int{}
	for _, b := range flowBackends(t, l, 400) {
		got[b]++
	}
	if got[2] == 0 {
		t.Fatalf("no new flow went to the UNKNOWN backend: %v", got)
	}
}

// A --pools loader (its own checker): a backend it had down (pinned maps, after a
// restart) stays down while its (re)started checker has not probed it, for the checker's
// first-verdict bound, as the control plane publishes nothing until its first probes
// decide; a prober fault (the checker probed and could not) makes it routable at once,
// logged once per cause; and once the bound has passed, Unknown is routable even without
// a transition (a first probe that hits a prober fault makes none).
func TestOwnCheckerUnknownAfterDown(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	l := newFedLoader(t, "")
	l.log = zap.New(core)
	// No checker runs for the service: its View is Unknown, as a checker that has not
	// probed yet or whose probes cannot run.
	l.health = health.NewMonitor(l.onTransition)
	t.Cleanup(l.health.Stop)
	const b2 = "web/10.0.5.2:80"
	src := strings.Replace(fedFile(2), "    slow_start: {window: 2000s, aggression: 1, min_weight_percent: 10}\n", "", 1)
	f, err := pools.Parse("pools.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	hold := firstVerdictHold(f)
	if want := 500*time.Millisecond + 2*time.Second + 250*time.Millisecond; hold != want { // interval 5s, timeout 2s by default
		t.Fatalf("hold %s, want %s", hold, want)
	}
	apply := func(holdFor time.Duration) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lastDown[b2] = true // as a restarted loader reads it from the pinned flags
		l.holdUntil = l.now().Add(holdFor)
		if err := l.applyWaitLocked(f, resolveWait); err != nil {
			t.Fatal(err)
		}
		l.file = f
		l.startMaintenanceLocked(context.Background())
	}
	apply(time.Hour)
	if slices.Contains(tableNames(t, l, "web"), b2) {
		t.Fatal("a backend the loader had down is in the table before its checker probed it")
	}
	fault := health.Transition{ID: "10.0.5.2:80", To: health.Unknown, ProberFault: true, From: health.Unknown,
		At: time.Now(), Reason: "tcp: prober fault: EMFILE"}
	l.onTransition("web", fault)
	if !slices.Contains(tableNames(t, l, "web"), b2) {
		t.Fatal("a prober fault left the backend out of the table: UNKNOWN is routable")
	}
	l.onTransition("web", fault) // the same cause again: not logged again
	if n := logs.FilterMessageSnippet("prober's own reasons").Len(); n != 1 {
		t.Fatalf("the prober fault logged %d times, want once", n)
	}

	// No transition at all: routable once the hold has passed (the maintenance loop
	// rebuilds the tables then), within its tick plus a second of slack.
	l.mu.Lock()
	delete(l.seen, b2)
	l.mu.Unlock()
	// Long enough that the check below reads the table within the hold even on a loaded
	// machine under -race (it looks up every slot of the table).
	const short = time.Second
	apply(short)
	if slices.Contains(tableNames(t, l, "web"), b2) {
		t.Fatal("the backend is in the table during the hold")
	}
	deadline := time.Now().Add(short + maintainTick + time.Second)
	for !slices.Contains(tableNames(t, l, "web"), b2) {
		if time.Now().After(deadline) {
			t.Fatal("the hold passed and the UNKNOWN backend is still out of the table")
		}
		time.Sleep(maintainTick / 5) // polling the map, not waiting for an outcome
	}
}

// TestStoppingKeepsLastVerdicts: once the context of the last Apply is done, the checkers
// stop and a stopped one reads Unknown. A rebuild still under way (a transition in flight,
// the end of the first-verdict hold) must keep the last verdicts: a dead backend written
// back as up would reach the next loader, which adopts the pinned flags as its last
// verdicts and sends new flows to it. TestXDPEndToEnd's restart caught it one run in three.
func TestStoppingKeepsLastVerdicts(t *testing.T) {
	l := newFedLoader(t, "")
	l.health = health.NewMonitor(l.onTransition) // no checker: every View is Unknown
	t.Cleanup(l.health.Stop)
	const b2 = "web/10.0.5.2:80"
	f, err := pools.Parse("pools.yaml", []byte(fedFile(2)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.mu.Lock()
	l.lastDown[b2] = true
	l.holdUntil = l.now().Add(time.Hour)
	l.runCtx = ctx
	if err := l.applyWaitLocked(f, resolveWait); err != nil {
		t.Fatal(err)
	}
	l.file = f
	l.mu.Unlock()
	if slices.Contains(tableNames(t, l, "web"), b2) {
		t.Fatal("a backend the loader had down is in the table during the hold")
	}

	cancel() // SIGTERM: the checkers stop
	l.mu.Lock()
	l.holdUntil = time.Time{} // the hold over: Unknown would be routable
	l.mu.Unlock()
	l.onTransition("web", health.Transition{ID: "10.0.5.1:80", To: health.Healthy, From: health.Unknown, Healthy: true, At: time.Now()})
	l.mu.Lock()
	err = l.applyWaitLocked(f, resolveWait) // a rebuild already under way when the context ended
	down := l.lastDown[b2]
	l.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if !down || slices.Contains(tableNames(t, l, "web"), b2) {
		t.Fatalf("after the context ended, the down backend was written back as up (last verdict down: %v)", down)
	}
}
