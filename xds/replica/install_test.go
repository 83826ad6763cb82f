package replica

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds/store"
)

const plainFile = "services:\n  - name: web\n    protocol: http\n    listen: 0.0.0.0:80\n    backends:\n      - {address: 10.0.0.1:80}\n"

// offline is a replica that installs states handed to it: no store, no loops.
func offline(t *testing.T, log *zap.Logger) *Replica {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return New(ctx, Config{ID: "r", Keys: store.KeysOf("/u")}, nil, log)
}

func stateAt(rev, docRev int64, yaml string) *store.State {
	return &store.State{Revision: rev, Doc: &store.Document{YAML: []byte(yaml), Revision: docRev}, Verdicts: map[store.VerdictKey]store.Verdict{}}
}

// A state older than the newest one read is never served after it (the hold timer read
// the newest state, let go of the lock, and installed it after a newer one had come by
// watch: the version served went back); a whole read of the store is served whatever
// came before.
func TestInstallNeverGoesBack(t *testing.T) {
	r := offline(t, zap.NewNop())
	r.install(stateAt(7, 3, plainFile))
	r.install(stateAt(5, 3, plainFile))
	if got := r.served.Load().Revision; got != 7 {
		t.Fatalf("served revision %d after installing 7 then 5, want 7", got)
	}
	r.mu.Lock()
	r.installLocked(stateAt(6, 3, plainFile), true)
	r.mu.Unlock()
	if got := r.served.Load().Revision; got != 6 {
		t.Fatalf("a whole read at 6 after 7: served %d, want 6", got)
	}
}

// A stored document that does not parse here is logged once for its revision, not at
// every store event, and the status page says so and what is served.
func TestBadDocumentLoggedOnce(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	r := offline(t, zap.New(core))
	r.install(stateAt(3, 3, plainFile))
	bad := "services:\n  - name: web\n    protocol: http\n    balance: magelv\n"
	for rev := int64(10); rev < 30; rev++ { // the bad file stored at 10, then 19 unrelated writes
		r.install(stateAt(rev, 10, bad))
	}
	if n := logs.FilterMessageSnippet("does not parse").Len(); n != 1 {
		t.Fatalf("%d log lines for one bad document over 20 store events, want 1", n)
	}
	s := r.Status()
	if !strings.Contains(s.Problem, "revision 10") || !strings.Contains(s.Problem, "serving the file of revision 3") {
		t.Fatalf("status problem %q", s.Problem)
	}
	if got := r.served.Load().Revision; got != 29 {
		t.Fatalf("served revision %d, want 29 (the good file, at the store's revision)", got)
	}
	r.install(stateAt(31, 31, plainFile))
	if s := r.Status(); s.Problem != "" {
		t.Fatalf("a good file stored: problem %q remains", s.Problem)
	}
}

// A stored verdict stands for its probe target only: a backend keyed by hash_key whose
// address changed neither starts its new leader's checker from the old address's verdict
// nor is served it.
func TestVerdictNeedsTheSameTarget(t *testing.T) {
	file := func(addr string) *pools.File {
		f, err := pools.Parse("p", []byte(fmt.Sprintf("services:\n  - name: web\n    protocol: tcp\n    vip: 10.9.9.9:80\n"+
			"    health_check: {protocol: tcp, interval: 1s, timeout: 500ms}\n    backends:\n      - {address: %q, hash_key: k1}\n", addr)))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	old, moved := file("10.0.0.1:80"), file("10.0.0.2:80")
	cfg := pools.HealthServices(old.Services)[0].Config
	k := store.VerdictKey{Service: "web", ID: "k1"}
	known := map[store.VerdictKey]store.Verdict{k: {State: health.Healthy, Since: time.Unix(100, 0), Target: store.ProbeTarget(cfg, "10.0.0.1:80")}}
	if s := seeded(old, known)[0].Targets[0]; s.Seed != health.Healthy {
		t.Fatalf("same target: seed %v, want healthy", s.Seed)
	}
	if s := seeded(moved, known)[0].Targets[0]; s.Seed != health.Unknown {
		t.Fatalf("address changed: seed %v, want unknown (probed anew)", s.Seed)
	}
	legacy := map[store.VerdictKey]store.Verdict{k: {State: health.Healthy}} // stored before targets were
	if s := seeded(moved, legacy)[0].Targets[0]; s.Seed != health.Healthy {
		t.Fatalf("a verdict without a target: seed %v, want healthy", s.Seed)
	}

	r := offline(t, zap.NewNop())
	st := stateAt(5, 5, "services:\n  - name: web\n    protocol: tcp\n    vip: 10.9.9.9:80\n    health_check: {protocol: tcp, interval: 1s, timeout: 500ms}\n    backends:\n      - {address: \"10.0.0.2:80\", hash_key: k1}\n")
	st.Verdicts = known
	r.mu.Lock()
	r.released = true
	r.installLocked(st, true)
	r.mu.Unlock()
	if got := r.view("web", moved.Services[0].Backends[0]); got != health.Unknown {
		t.Fatalf("served %v for a backend whose stored verdict is of its old address, want unknown", got)
	}
}

// The first-verdicts hold of a cold start installs nothing once Run has returned: its
// timer is stopped (it fired later and served the state of a replica that had stopped).
func TestHoldTimerStopsWithRun(t *testing.T) {
	// A client of an address nothing listens on: the loops Run starts end at once on a
	// cancelled context, before any exchange.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{loopback.Refused(t)}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	r := New(t.Context(), Config{ID: "r", Keys: store.KeysOf("/u")}, cli, zap.NewNop())
	file := vipPools(loopback.Refused(t)) // one checked backend, no stored verdict: a hold
	r.install(stateAt(5, 5, file))
	r.mu.Lock()
	armed := r.holdTimer != nil
	r.mu.Unlock()
	if !armed || r.served.Load().Revision != 0 {
		t.Fatalf("no hold: timer %v, serving %d", armed, r.served.Load().Revision)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	r.Run(ctx)
	// Stop reports whether it stopped a pending timer: false when Run had stopped it. The
	// hold lasts the check's first-verdict bound (over a second here); Run takes
	// milliseconds.
	r.mu.Lock()
	pending := r.holdTimer.Stop()
	r.mu.Unlock()
	if pending {
		t.Fatalf("the hold timer was still pending %s after Run was called, and Run had returned", time.Since(start))
	}
	if got := r.served.Load().Revision; got != 0 {
		t.Fatalf("served revision %d after Run returned", got)
	}
}
