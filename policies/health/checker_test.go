package health

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// schedSlack is the allowance added to bounds computed from the config: timer
// and scheduling latency on a shared 2-core machine under -race.
const schedSlack = 250 * time.Millisecond

// firstProbeBound is D + Timeout from the package documentation.
func firstProbeBound(cfg Config) time.Duration {
	return min(cfg.Interval/firstProbeSpread, maxFirstProbeDelay) + cfg.Timeout
}

// TestDetectionWithinBound closes real listeners and measures, per target,
// the time from the close to the Unhealthy transition, then reopens them and
// measures recovery. Each must lie between the least time the thresholds
// allow ((N-1) gaps of at least 0.9 × Interval, so a single failure cannot
// trip it) and the documented bound N × Interval + Timeout plus slack.
func TestDetectionWithinBound(t *testing.T) {
	cfg := Config{Protocol: TCP, Interval: 200 * time.Millisecond, Timeout: 100 * time.Millisecond, HealthyThreshold: 2, UnhealthyThreshold: 3}
	c, err := NewChecker(cfg, AllowShortIntervals())
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	var backends []*tcpBackend
	var targets []Target
	for i := range n {
		b := newTCPBackend(t)
		backends = append(backends, b)
		targets = append(targets, Target{ID: fmt.Sprintf("b%d", i), Address: b.addr})
	}
	if err := c.SetTargets(targets); err != nil {
		t.Fatal(err)
	}
	ch, cancel := c.Subscribe(64)
	defer cancel()
	col := collect(ch)
	start := time.Now()
	runChecker(t, c)
	for _, tg := range targets {
		tr, _ := col.waitTransition(t, firstProbeBound(cfg)+schedSlack, 0, tg.ID+" healthy", func(tr Transition) bool { return tr.ID == tg.ID })
		if !tr.Healthy || tr.From != Unknown || tr.Reason != "tcp: connected" {
			t.Fatalf("first transition of %s: %+v, want healthy from unknown, tcp: connected", tg.ID, tr)
		}
		if d := tr.At.Sub(start); d > firstProbeBound(cfg)+schedSlack {
			t.Errorf("%s first known after %v, bound %v + slack", tg.ID, d, firstProbeBound(cfg))
		}
	}

	check := func(phase string, threshold int, healthy bool, reason string, since time.Time, mark int) {
		t.Helper()
		upper := time.Duration(threshold)*cfg.Interval + cfg.Timeout
		lower := time.Duration(threshold-1)*(cfg.Interval-cfg.Interval/intervalJitter) - 20*time.Millisecond
		for _, tg := range targets {
			tr, _ := col.waitTransition(t, upper+schedSlack, mark, tg.ID+" "+phase, func(tr Transition) bool { return tr.ID == tg.ID })
			d := tr.At.Sub(since)
			t.Logf("%s %s after %v (allowed %v..%v+%v): %s", tg.ID, phase, d, lower, upper, schedSlack, tr.Reason)
			if tr.Healthy != healthy || tr.Reason != reason {
				t.Errorf("%s %s: %+v, want healthy=%v reason %q", tg.ID, phase, tr, healthy, reason)
			}
			if d > upper+schedSlack {
				t.Errorf("%s %s took %v, over the bound %v + slack %v", tg.ID, phase, d, upper, schedSlack)
			}
			if d < lower {
				t.Errorf("%s %s took only %v: fewer than %d probes can have run", tg.ID, phase, d, threshold)
			}
		}
	}

	mark := len(col.all())
	for _, b := range backends {
		b.down()
	}
	check("detection", cfg.UnhealthyThreshold, false, "tcp: connection refused", time.Now(), mark)

	mark = len(col.all())
	for _, b := range backends {
		b.up()
	}
	check("recovery", cfg.HealthyThreshold, true, "tcp: connected", time.Now(), mark)

	for _, tg := range targets {
		healthy, since, known := c.Status(tg.ID)
		st, _ := c.Lookup(tg.ID)
		if !healthy || !known || !since.Equal(st.Since) || st.State != Healthy {
			t.Errorf("Status(%s) = %v %v %v, Lookup %+v", tg.ID, healthy, since, known, st)
		}
	}
}

// TestFirstProbeIsPrompt uses a user-valid config (5 s interval): a new
// target must be known long before one interval has passed.
func TestFirstProbeIsPrompt(t *testing.T) {
	cfg := Config{Protocol: TCP, Interval: 5 * time.Second, Timeout: time.Second}
	c, err := NewChecker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	up := newTCPBackend(t)
	refused := loopback.Refused(t)
	if err := c.SetTargets([]Target{{ID: "up", Address: up.addr}, {ID: "refused", Address: refused}}); err != nil {
		t.Fatal(err)
	}
	if _, _, known := c.Status("up"); known {
		t.Fatalf("target known before any probe")
	}
	if st, _ := c.Lookup("up"); st.State != Unknown || !st.State.Routable() {
		t.Fatalf("new target state %v, want unknown (routable)", st.State)
	}
	ch, cancel := c.Subscribe(4)
	defer cancel()
	col := collect(ch)
	start := time.Now()
	runChecker(t, c)
	bound := firstProbeBound(c.Config()) + schedSlack
	tr, _ := col.waitTransition(t, bound, 0, "up healthy", func(tr Transition) bool { return tr.ID == "up" })
	if !tr.Healthy || tr.From != Unknown {
		t.Errorf("up: %+v", tr)
	}
	tr, _ = col.waitTransition(t, bound, 0, "refused unhealthy", func(tr Transition) bool { return tr.ID == "refused" })
	if tr.Healthy || tr.From != Unknown || tr.Reason != "tcp: connection refused" || tr.Address != refused {
		t.Errorf("refused: %+v, want unhealthy from unknown with tcp: connection refused", tr)
	}
	if d := time.Since(start); d > bound {
		t.Errorf("first results took %v, bound %v", d, bound)
	}
	if healthy, _, known := c.Status("refused"); healthy || !known {
		t.Errorf("Status(refused) healthy=%v known=%v", healthy, known)
	}
}

func TestSetTargetsAddRemoveKeep(t *testing.T) {
	cfg := Config{Protocol: TCP, Interval: 2 * time.Second, Timeout: 200 * time.Millisecond}
	c, err := NewChecker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a, b := newTCPBackend(t), newTCPBackend(t)
	if err := c.SetTargets([]Target{{ID: "a", Address: a.addr}}); err != nil {
		t.Fatal(err)
	}
	ch, cancel := c.Subscribe(16)
	defer cancel()
	col := collect(ch)
	runChecker(t, c)
	bound := firstProbeBound(cfg) + schedSlack
	col.waitTransition(t, bound, 0, "a healthy", func(tr Transition) bool { return tr.ID == "a" && tr.Healthy })
	_, sinceA, _ := c.Status("a")

	// Add b: probed within D + Timeout, far less than the 2 s interval.
	added := time.Now()
	if err := c.SetTargets([]Target{{ID: "a", Address: a.addr}, {ID: "b", Address: b.addr}}); err != nil {
		t.Fatal(err)
	}
	tr, _ := col.waitTransition(t, bound, 0, "b healthy", func(tr Transition) bool { return tr.ID == "b" })
	if d := tr.At.Sub(added); !tr.Healthy || d > bound {
		t.Errorf("added target: %+v after %v, want healthy within %v", tr, d, bound)
	}
	// a kept its state: same since, no new transition.
	if healthy, since, known := c.Status("a"); !healthy || !known || !since.Equal(sinceA) {
		t.Errorf("unchanged target a: healthy=%v known=%v since %v (was %v)", healthy, known, since, sinceA)
	}
	for _, tr := range col.all() {
		if tr.ID == "a" && tr.At.After(sinceA) {
			t.Errorf("unchanged target a transitioned: %+v", tr)
		}
	}

	// Remove a: its goroutine ends, it disappears from the view.
	c.mu.Lock()
	doneA := c.targets["a"].done
	c.mu.Unlock()
	if err := c.SetTargets([]Target{{ID: "b", Address: b.addr}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-doneA:
	case <-time.After(time.Second):
		t.Fatalf("removed target's goroutine still running after 1s")
	}
	if _, _, known := c.Status("a"); known {
		t.Errorf("removed target still known")
	}
	if _, ok := c.Lookup("a"); ok {
		t.Errorf("removed target still in Lookup")
	}
	if snap := c.Snapshot(); len(snap) != 1 || snap[0].ID != "b" {
		t.Errorf("Snapshot after removal: %+v", snap)
	}

	// Same ID, new address: a new target, starting from unknown.
	mark := len(col.all())
	refused := loopback.Refused(t)
	if err := c.SetTargets([]Target{{ID: "b", Address: refused}}); err != nil {
		t.Fatal(err)
	}
	tr, _ = col.waitTransition(t, bound, mark, "b at its new address", func(tr Transition) bool { return tr.ID == "b" })
	if tr.Healthy || tr.From != Unknown || tr.Address != refused {
		t.Errorf("re-addressed target: %+v, want unhealthy from unknown at %s", tr, refused)
	}
}

func TestSetTargetsRejectsBadInput(t *testing.T) {
	c, err := NewChecker(Config{Protocol: TCP})
	if err != nil {
		t.Fatal(err)
	}
	good := []Target{{ID: "a", Address: "127.0.0.1:1"}}
	if err := c.SetTargets(good); err != nil {
		t.Fatal(err)
	}
	err = c.SetTargets([]Target{
		{ID: "x", Address: "127.0.0.1:2"},
		{ID: "", Address: "127.0.0.1:3"},
		{ID: "x", Address: "127.0.0.1:4"},
		{ID: "y", Address: "127.0.0.1"},
	})
	if err == nil {
		t.Fatalf("bad target list accepted")
	}
	for _, w := range []string{"target 1", "empty id", `duplicate id "x"`, `target 3 ("y")`, "has no port"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	if snap := c.Snapshot(); len(snap) != 1 || snap[0].ID != "a" {
		t.Errorf("a rejected list changed the targets: %+v", snap)
	}
}

// TestSlowSubscriberDoesNotStall flips real HTTP backends while one
// subscriber never reads: a second subscriber must see every flip (so
// probing went on), and the slow one must, when it reads, get the latest
// state of every target with the lost transitions counted, holding no more
// than buf + 1 + targets transitions.
func TestSlowSubscriberDoesNotStall(t *testing.T) {
	const n, rounds, slowBuf = 4, 6, 1
	// A threshold of 1 turns one slow probe into a transition: the timeout leaves a
	// loopback HTTP probe room even under -race on a loaded machine.
	cfg := Config{Protocol: HTTP, Path: "/", Interval: 250 * time.Millisecond, Timeout: 200 * time.Millisecond, HealthyThreshold: 1, UnhealthyThreshold: 1}
	c, err := NewChecker(cfg, AllowShortIntervals())
	if err != nil {
		t.Fatal(err)
	}
	var backends []*httpBackend
	var targets []Target
	for i := range n {
		b := newHTTPBackend(t)
		backends = append(backends, b)
		targets = append(targets, Target{ID: fmt.Sprintf("h%d", i), Address: b.addr})
	}
	if err := c.SetTargets(targets); err != nil {
		t.Fatal(err)
	}
	// No deferred unsubscribes: Run closes both channels when it returns,
	// and a checker stalled by a subscriber then fails the test through
	// runChecker's deadline instead of hanging it.
	slow, _ := c.Subscribe(slowBuf)
	fastCh, _ := c.Subscribe(256)
	fast := collect(fastCh)
	runChecker(t, c)

	lastState := func(all []Transition) map[string]Transition {
		m := map[string]Transition{}
		for _, tr := range all {
			m[tr.ID] = tr
		}
		return m
	}
	reach := func(healthy bool) {
		t.Helper()
		testwait.For(t, 2*time.Second, fmt.Sprintf("every target healthy=%v on the fast subscriber", healthy), func() (bool, string) {
			last := lastState(fast.all())
			for _, tg := range targets {
				if tr, ok := last[tg.ID]; !ok || tr.Healthy != healthy {
					return false, fmt.Sprintf("%+v", last)
				}
			}
			return true, ""
		})
	}
	reach(true)
	for r := 1; r <= rounds; r++ {
		healthy := r%2 == 0
		for _, b := range backends {
			if healthy {
				b.status.Store(200)
			} else {
				b.status.Store(503)
			}
		}
		reach(healthy)
	}

	for _, tr := range fast.all() {
		if tr.Coalesced != 0 {
			t.Errorf("fast subscriber lost transitions: %+v", tr)
		}
	}
	// Now read the slow subscriber until every transition the fast one has seen is
	// accounted for (the probes go on meanwhile: both see any later one).
	var got []Transition
	delivered := map[string]int{}
	perTarget := map[string]int{}
	accounted := func() bool {
		clear(perTarget)
		for _, tr := range fast.all() {
			perTarget[tr.ID]++
		}
		for _, tg := range targets {
			if delivered[tg.ID] != perTarget[tg.ID] {
				return false
			}
		}
		return true
	}
	deadline := time.After(2 * time.Second)
	for !accounted() {
		select {
		case tr := <-slow:
			got = append(got, tr)
			delivered[tr.ID] += 1 + tr.Coalesced
		case <-time.After(10 * time.Millisecond): // the fast collector may be behind: count again
		case <-deadline:
			t.Fatalf("slow subscriber: accounted %v of %v; got %+v", delivered, perTarget, got)
		}
	}
	t.Logf("fast subscriber: %d transitions; slow subscriber: %d delivered, covering %v", len(fast.all()), len(got), delivered)
	if len(got) > slowBuf+1+n {
		t.Errorf("slow subscriber held %d transitions, bound buf+1+targets = %d", len(got), slowBuf+1+n)
	}
	last := lastState(got)
	fastLast := lastState(fast.all())
	for _, tg := range targets {
		healthy, _, _ := c.Status(tg.ID)
		if last[tg.ID].Healthy != healthy || !last[tg.ID].At.Equal(fastLast[tg.ID].At) {
			t.Errorf("%s: slow subscriber's latest %+v, fast %+v, Status healthy=%v", tg.ID, last[tg.ID], fastLast[tg.ID], healthy)
		}
	}
}

// TestRunStopsEverything: Run returns promptly on cancel even while probes
// hang (they are aborted, not waited out), every goroutine the checker
// started has exited by then, and subscriber channels are closed.
func TestRunStopsEverything(t *testing.T) {
	hang := newHTTPBackend(t)
	hang.hang.Store(true)
	before := runtime.NumGoroutine()

	cfg := Config{Protocol: HTTP, Interval: 10 * time.Second, Timeout: 5 * time.Second}
	c, err := NewChecker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var targets []Target
	for i := range 5 {
		targets = append(targets, Target{ID: fmt.Sprintf("hang%d", i), Address: hang.addr})
	}
	targets = append(targets, Target{ID: "refused", Address: loopback.Refused(t)})
	if err := c.SetTargets(targets); err != nil {
		t.Fatal(err)
	}
	slow, _ := c.Subscribe(1) // never read, never cancelled: Run must end it
	fastCh, cancel := c.Subscribe(8)
	defer cancel()
	fast := collect(fastCh)

	ctx, stop := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	// Wait until the hanging probes are in flight.
	testwait.For(t, 3*time.Second, "5 hanging requests", func() (bool, string) {
		n := hang.inFlight.Load()
		return n == 5, fmt.Sprintf("%d in flight", n)
	})
	fast.waitTransition(t, 3*time.Second, 0, "refused unhealthy", func(tr Transition) bool { return tr.ID == "refused" })
	// A second refused target would fill the slow channel; add one so the
	// pump goroutine exists when Run stops.
	if err := c.SetTargets(append(targets, Target{ID: "refused2", Address: loopback.Refused(t)})); err != nil {
		t.Fatal(err)
	}
	fast.waitTransition(t, 3*time.Second, 0, "refused2 unhealthy", func(tr Transition) bool { return tr.ID == "refused2" })

	c.mu.Lock()
	var dones []chan struct{}
	for _, tg := range c.targets {
		dones = append(dones, tg.done)
	}
	c.mu.Unlock()

	stopped := time.Now()
	stop()
	if err := testwait.Recv(t, errc, 2*time.Second, "Run returning after cancel, with probes of 5s timeout in flight"); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if d := time.Since(stopped); d > time.Second {
		t.Errorf("Run took %v to return after cancel", d)
	}
	for _, d := range dones {
		select {
		case <-d:
		default:
			t.Fatalf("Run returned while a probe goroutine was still running")
		}
	}
	// The slow subscriber's channel is closed after at most its buffer.
	for range 2 {
		if _, ok := <-slow; !ok {
			break
		}
	}
	if _, ok := <-slow; ok {
		t.Errorf("slow subscriber's channel not closed after Run returned")
	}
	select {
	case <-fast.done:
	case <-time.After(time.Second):
		t.Errorf("fast subscriber's channel not closed after Run returned")
	}
	if err := c.Run(context.Background()); err == nil {
		t.Errorf("second Run returned nil")
	}
	if ch, _ := c.Subscribe(1); ch != nil {
		if _, ok := <-ch; ok {
			t.Errorf("Subscribe after Run returned an open channel with data")
		}
	}
	testwait.For(t, 5*time.Second, "goroutines back to the count before the checker", func() (bool, string) {
		n := runtime.NumGoroutine()
		if n <= before {
			return true, ""
		}
		buf := make([]byte, 1<<16)
		return false, fmt.Sprintf("%d goroutines, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	})
}

func TestUnsubscribeClosesChannel(t *testing.T) {
	c, err := NewChecker(Config{})
	if err != nil {
		t.Fatal(err)
	}
	ch, cancel := c.Subscribe(0)
	if cap(ch) != 1 {
		t.Errorf("Subscribe(0) capacity %d, want 1", cap(ch))
	}
	cancel()
	cancel() // idempotent
	if _, ok := <-ch; ok {
		t.Errorf("channel open after cancel")
	}
}

// TestWatch: the loop gets the transitions, and returns when its context is done or when
// the checker stops (its subscription closes), whichever comes first.
func TestWatch(t *testing.T) {
	cfg := Config{Protocol: TCP, Interval: 5 * time.Second, Timeout: time.Second}
	newChecker := func() *Checker {
		c, err := NewChecker(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.SetTargets([]Target{{ID: "up", Address: newTCPBackend(t).addr}}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	ended := func(done chan struct{}, why string) {
		t.Helper()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("the watch loop did not return within 5s of %s", why)
		}
	}
	for _, endBy := range []string{"its context", "the checker stopping"} {
		c := newChecker()
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan Transition, 4)
		loop := c.Watch(ctx, 4, func(tr Transition) { got <- tr })
		done := make(chan struct{})
		go func() { defer close(done); loop() }()
		stop := runChecker(t, c)
		select {
		case tr := <-got:
			if tr.ID != "up" || !tr.Healthy {
				t.Fatalf("%s: transition %+v, want up healthy", endBy, tr)
			}
		case <-time.After(firstProbeBound(c.Config()) + schedSlack):
			t.Fatalf("%s: no transition within the first probe's bound", endBy)
		}
		if endBy == "its context" {
			cancel()
		} else {
			stop()
		}
		ended(done, endBy)
		cancel()
		stop()
	}
}
