package health

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// stepProber answers each probe with the next outcome of a script, then repeats the last.
type stepProber struct {
	steps chan outcome
	last  outcome
}

func (p *stepProber) probe(ctx context.Context, _ string) (outcome, string) {
	select {
	case o := <-p.steps:
		p.last = o
	default:
	}
	switch p.last {
	case passed:
		return passed, "tcp: connected"
	case inconclusive:
		return inconclusive, "tcp: prober fault: EMFILE (too many open files)"
	}
	return failed, "tcp: connection refused"
}

// runScripted runs a checker of one target "b" (TCP, a 5 ms interval, both thresholds at
// threshold) whose probes answer script in turn, then its last outcome again; it returns
// the checker and its transitions, and stops it when the test ends.
func runScripted(t *testing.T, threshold int, script ...outcome) (*Checker, <-chan Transition) {
	t.Helper()
	steps := make(chan outcome, len(script))
	for _, o := range script {
		steps <- o
	}
	c, err := NewChecker(Config{Protocol: TCP, Interval: 5 * time.Millisecond, Timeout: 2 * time.Millisecond,
		HealthyThreshold: threshold, UnhealthyThreshold: threshold}, AllowShortIntervals())
	if err != nil {
		t.Fatal(err)
	}
	c.prober = &stepProber{steps: steps}
	if err := c.SetTargets([]Target{{ID: "b", Address: "127.0.0.1:1"}}); err != nil {
		t.Fatal(err)
	}
	ch, unsub := c.Subscribe(16)
	t.Cleanup(unsub)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go c.Run(ctx)
	return c, ch
}

// TestProberFaultReturnsToUnknown: a Healthy target whose probes cannot run for the
// prober's own reasons returns to Unknown (routable, never Unhealthy), and so does an
// Unhealthy one; the next real result decides at once.
func TestProberFaultReturnsToUnknown(t *testing.T) {
	_, ch := runScripted(t, 3, passed, inconclusive, failed, inconclusive, passed)
	want := []struct {
		to    State
		fault bool
	}{{Healthy, false}, {Unknown, true}, {Unhealthy, false}, {Unknown, true}, {Healthy, false}}
	for i, w := range want {
		select {
		case tr := <-ch:
			if tr.To != w.to || tr.ProberFault != w.fault || tr.Healthy != (w.to == Healthy) {
				t.Fatalf("transition %d: %+v, want to %v (prober fault %v)", i, tr, w.to, w.fault)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("transition %d (to %v) never came", i, w.to)
		}
	}
}

// TestProberFaultClassified: the prober's own errors (permissions, descriptors, buffers)
// are inconclusive; a host that does not answer is the backend's fault.
func TestProberFaultClassified(t *testing.T) {
	wrap := func(e syscall.Errno) error {
		return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", e)}
	}
	for _, c := range []struct {
		err  error
		want outcome
	}{
		{wrap(syscall.EPERM), inconclusive}, {wrap(syscall.EACCES), inconclusive},
		{wrap(syscall.EMFILE), inconclusive}, {wrap(syscall.ENFILE), inconclusive},
		{wrap(syscall.ENOBUFS), inconclusive},
		{wrap(syscall.EHOSTUNREACH), failed}, {wrap(syscall.ECONNREFUSED), failed},
		{context.DeadlineExceeded, failed}, {errors.New("anything else"), failed},
	} {
		if got, reason := failure("tcp", c.err); got != c.want {
			t.Errorf("%v: outcome %d (%s), want %d", c.err, got, reason, c.want)
		}
	}
}

// TestTCPProbeOutOfDescriptors: a real TCP probe run with the process out of file
// descriptors is inconclusive, not a failure of the backend. It runs in a child process,
// whose descriptor limit it lowers.
func TestTCPProbeOutOfDescriptors(t *testing.T) {
	if os.Getenv("HEALTH_EMFILE_CHILD") == "" {
		runChild(t, "TestTCPProbeOutOfDescriptors", "HEALTH_EMFILE_CHILD=1")
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	// Use up every descriptor under a low limit.
	low := lim
	low.Cur = 64
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	var held []*os.File
	defer func() {
		for _, f := range held {
			f.Close()
		}
	}()
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			break
		}
		held = append(held, f)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	out, result := tcpProber{}.probe(ctx, ln.Addr().String())
	if out != inconclusive {
		t.Fatalf("probe out of descriptors: outcome %d (%s), want inconclusive", out, result)
	}
	t.Logf("probe out of descriptors: %s", result)
}

// runChild re-runs test name in a child process with env added and fails if it fails.
func runChild(t *testing.T, name string, env ...string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	t.Logf("child:\n%s", out)
	if err != nil || !strings.Contains(string(out), "--- PASS: "+name) {
		t.Fatalf("child failed: %v", err)
	}
}

// TestFirstProbeFaultIsSaid: a target whose very first probe cannot run (an ICMP check
// without the permission to open a raw socket) stays Unknown, and says so once: a
// transition with the fault's reason (so it is logged, and the first-verdicts hold counts
// it decided) and the reason in its status; the same fault again says nothing more.
func TestFirstProbeFaultIsSaid(t *testing.T) {
	c, ch := runScripted(t, 1, inconclusive)
	select {
	case tr := <-ch:
		if tr.To != Unknown || tr.From != Unknown || !tr.ProberFault || !strings.Contains(tr.Reason, "prober fault") {
			t.Fatalf("first transition %+v, want Unknown to Unknown, a prober fault with its reason", tr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a first probe that could not run made no transition: nothing says why the backend is unknown")
	}
	st, ok := c.Lookup("b")
	if !ok || !strings.Contains(st.Reason, "prober fault") {
		t.Fatalf("status %+v: the reason is not the prober fault", st)
	}
	// Ten more probes, all faulting the same way, say nothing more.
	first := st.LastProbe
	testwait.For(t, 5*time.Second, "ten more probes", func() (bool, string) {
		s, _ := c.Lookup("b")
		return s.LastProbe.Sub(first) >= 10*c.cfg.Interval, s.LastProbe.String()
	})
	select {
	case tr := <-ch:
		t.Fatalf("the same fault again made another transition: %+v", tr)
	default:
	}
}
