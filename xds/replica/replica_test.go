package replica

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/xds/store"
)

// pushSlack covers a stored write's way to a node: the watch event, one build, one push
// (milliseconds idle; stated for a loaded 2-core machine).
const pushSlack = 2 * time.Second

// live is a loopback listener that accepts and closes: a backend whose tcp check passes.
// Closing it kills the backend.
func live(t *testing.T) net.Listener {
	ln := loopback.Listen(t)
	loopback.AcceptAndClose(t, ln)
	return ln
}

// Two replicas, one leader: nodes on either replica hold the same verdicts under the same
// version, which is the store's revision; only the leader wrote verdicts; a backend killed
// reaches both nodes under one new version.
func TestReplicasServeOneVersion(t *testing.T) {
	rg := newRig(t, 3)
	up, down := live(t), loopback.Refused(t)
	rg.apply(vipPools(up.Addr().String(), down))
	log := testLogger(t)
	r1, r2 := rg.replica("r1", log), rg.replica("r2", log)
	rg.waitFor(testTTL+pushSlack, "one leader", func() (bool, string) { l := leaders(r1, r2); return len(l) == 1, fmt.Sprint(l) })
	n1, n2 := rg.node("n1", r1.addr), rg.node("n2", r2.addr)
	agree := func(want map[string]health.State) func() (bool, string) {
		return func() (bool, string) {
			rev := fmt.Sprint(rg.state().Revision)
			for _, n := range []*node{n1, n2} {
				for id, st := range want {
					if got := n.verdict("spread", id); got != st {
						return false, fmt.Sprintf("%s: %v", id, got)
					}
				}
				if n.version() != rev {
					return false, fmt.Sprintf("version %s, store at %s", n.version(), rev)
				}
			}
			return true, ""
		}
	}
	// The first verdicts: a tcp probe within interval/10 plus its timeout.
	rg.waitFor(time.Second+pushSlack, "both nodes hold the first verdicts at the store's revision",
		agree(map[string]health.State{up.Addr().String(): health.Healthy, down: health.Unhealthy}))
	leader := leaders(r1, r2)[0]
	for k, v := range rg.state().Verdicts {
		if v.By != leader {
			t.Fatalf("verdict of %v written by %s, the leader is %s", k, v.By, leader)
		}
	}
	// Both status pages say when each backend was last checked: the leader from its own
	// checker, the other replica from the stored verdict.
	for _, r := range []*running{r1, r2} {
		for _, b := range r.r.Server().Status().Services[0].Backends {
			if b.Health.LastCheck == nil {
				t.Errorf("%s's status page: no last check of %s", r.r.cfg.ID, b.ID)
			}
		}
	}
	up.Close()
	killed := time.Now()
	rg.waitFor(time.Second+500*time.Millisecond+pushSlack, "both nodes see the killed backend down under one version",
		agree(map[string]health.State{up.Addr().String(): health.Unhealthy, down: health.Unhealthy}))
	t.Logf("a killed backend reached both nodes %s after the kill", time.Since(killed).Round(time.Millisecond))
}

// The leader crashes: the other replica leads within the lease TTL (plus slack), writes
// nothing (every verdict stored stands), and a node of the crashed replica moves to the
// other one and applies nothing: the same version, identical, although writes outside the
// state (the election's, another application's) moved etcd's revision meanwhile.
func TestLeaderCrashFailsOverWithoutRewrite(t *testing.T) {
	rg := newRig(t, 3)
	up, down := live(t), loopback.Refused(t)
	rg.apply(vipPools(up.Addr().String(), down))
	log := testLogger(t)
	rs := map[string]*running{"r1": rg.replica("r1", log)}
	rg.waitFor(testTTL+pushSlack, "r1 leads", func() (bool, string) { return rs["r1"].r.leading.Load(), "" })
	rs["r2"] = rg.replica("r2", log)
	rg.serving(rs["r1"])
	n := rg.node("n", rs["r1"].addr, rs["r2"].addr)
	rg.waitFor(time.Second+pushSlack, "the node holds both verdicts", func() (bool, string) {
		return n.verdict("spread", down) == health.Unhealthy && n.verdict("spread", up.Addr().String()) == health.Healthy, ""
	})
	rg.waitFor(pushSlack, "r2 serves the same revision", func() (bool, string) {
		return rs["r2"].r.served.Load().Revision == rs["r1"].r.served.Load().Revision, ""
	})
	if addr, _ := n.server(); addr != rs["r1"].addr {
		t.Fatalf("the node is on %s, not r1 (%s)", addr, rs["r1"].addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rg.cli.Put(ctx, "/another-application/key", "v"); err != nil {
		t.Fatal(err)
	}
	before, applied := rg.state(), n.applied.Load()
	_, unchanged := n.server()
	crashed := time.Now()
	rs["r1"].crash()
	rg.waitFor(testTTL+pushSlack, "the node moved to r2 and took its version as unchanged", func() (bool, string) {
		addr, u := n.server()
		return n.c.Connected() && addr == rs["r2"].addr && u > unchanged, fmt.Sprintf("on %s, %d unchanged (%d before)", addr, u, unchanged)
	})
	t.Logf("the node reconnected to r2 %s after r1 crashed", time.Since(crashed).Round(time.Millisecond))
	if v := n.version(); v != fmt.Sprint(before.Revision) {
		t.Fatalf("the node holds version %s after the move, want %d (what it had)", v, before.Revision)
	}
	rg.waitFor(testTTL+pushSlack-time.Since(crashed), "r2 leads", func() (bool, string) { return rs["r2"].r.leading.Load(), "" })
	leadAt := time.Now()
	t.Logf("r2 leads %s after r1 crashed (lease %s)", time.Since(crashed).Round(time.Millisecond), testTTL)
	// The new leader has probed every backend since it took over, and compared its
	// checkers with the store after those probes: anything it would write, it has.
	rg.waitFor(2*time.Second+pushSlack, "r2 probed every backend and reconciled", func() (bool, string) {
		mon := rs["r2"].r.mon.Load()
		if mon == nil {
			return false, "not leading"
		}
		var last time.Time
		for _, id := range []string{up.Addr().String(), down} {
			ts, ok := mon.Lookup("spread", id)
			if !ok || !ts.LastProbe.After(leadAt) {
				return false, id + " not probed since r2 leads"
			}
			last = maxTime(last, ts.LastProbe)
		}
		return time.Unix(0, rs["r2"].r.reconciled.Load()).After(last), "no reconcile after the probes"
	})
	if after := rg.state(); after.Revision != before.Revision {
		t.Fatalf("the failover wrote to the store: revision %d -> %d", before.Revision, after.Revision)
	}
	if got := n.applied.Load(); got != applied {
		t.Fatalf("the node applied %d views moving between replicas, want none", got-applied)
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// A replica on an empty store refuses streams with UNAVAILABLE and says how to load a
// file; once one is stored it serves.
func TestEmptyStoreRefusesStreams(t *testing.T) {
	rg := newRig(t, 1)
	r := rg.replica("r1", testLogger(t))
	cc, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	refused := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
		if err != nil {
			return err
		}
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "x"}, TypeUrl: resource.ClusterType}); err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	rg.waitFor(pushSlack, "refused for an empty store", func() (bool, string) {
		err := refused()
		return status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "stickylb pools apply"), fmt.Sprint(err)
	})
	if s := r.r.Status(); s.Store != "empty" || !strings.Contains(s.Note, "stickylb pools apply") {
		t.Fatalf("status: %+v", s)
	}
	rg.apply(vipPools(loopback.Refused(t)))
	n := rg.node("n", r.addr)
	rg.waitFor(time.Second+pushSlack, "served once a file is stored", func() (bool, string) { return n.version() != "", "" })
}

// Every etcd member stopped: the replica ends its streams within the store timeout of its
// last exchange with etcd (plus stopSlack), not earlier, and the node keeps its view; etcd
// back: the replica serves again within the lease TTL plus 5 s, the node gets the same
// version (applying nothing), then the next change.
func TestStoreLostAndBack(t *testing.T) {
	rg := newRig(t, 3)
	dead := loopback.Refused(t)
	rg.apply(vipPools(dead))
	r := rg.replica("r1", testLogger(t))
	n := rg.node("n", r.addr)
	rg.waitFor(time.Second+pushSlack, "the node holds the verdict", func() (bool, string) {
		return n.verdict("spread", dead) == health.Unhealthy, ""
	})
	closed := make(chan [2]time.Time, 1) // when the gate closed, and the last exchange then
	r.r.Gate().OnChange(func(open bool) {
		if !open {
			select {
			case closed <- [2]time.Time{time.Now(), time.Unix(0, r.r.lastOK.Load())}:
			default:
			}
		}
	})
	admin := r.r.Server().AdminHandler()
	healthz := func(path string) (int, string) {
		w := httptest.NewRecorder()
		admin.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		return w.Code, w.Body.String()
	}
	if code, body := healthz("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz while serving: %d %s", code, body)
	}
	version, applied := n.version(), n.applied.Load()
	for _, m := range rg.etcd.Members() {
		m.Kill()
	}
	c := testwait.Recv(t, closed, testStoreTimeout+2*time.Second, "the replica stops serving")
	took := c[0].Sub(c[1])
	t.Logf("stopped serving %s after the last exchange with etcd (--store-timeout %s)", took.Round(time.Millisecond), testStoreTimeout)
	if took < testStoreTimeout || took > testStoreTimeout+stopSlack {
		t.Fatalf("stopped serving %s after the last exchange with etcd, want %s..%s", took, testStoreTimeout, testStoreTimeout+stopSlack)
	}
	rg.waitFor(pushSlack, "the node's stream ended", func() (bool, string) { return !n.c.Connected(), "connected" })
	if s := r.r.Status(); s.Store != "lost" || s.Note == "" {
		t.Fatalf("status while lost: %+v", s)
	}
	// A readiness probe takes the replica out of its Service; a liveness probe leaves it.
	if code, body := healthz("/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "lost the store") {
		t.Fatalf("/healthz while the store is lost: %d %s", code, body)
	}
	if code, body := healthz("/livez"); code != http.StatusOK {
		t.Fatalf("/livez while the store is lost: %d %s", code, body)
	}
	rg.etcd.RestartAll(t)
	back := time.Now()
	// The replica's gate open, not only the node's stream: a stream opens (the node counts
	// as connected) before the gate refuses it.
	rg.waitFor(testTTL+5*time.Second, "the node is served again", func() (bool, string) {
		open, why := r.r.Gate().State()
		return open && n.c.Connected() && n.version() == version, fmt.Sprintf("gate open %v (%s), node version %s", open, why, n.version())
	})
	t.Logf("served again %s after etcd answered", time.Since(back).Round(time.Millisecond))
	if code, body := healthz("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz once served again: %d %s", code, body)
	}
	if got := n.applied.Load(); got != applied {
		t.Fatalf("the node applied %d views after the outage with nothing changed", got-applied)
	}
	other := loopback.Refused(t)
	rg.apply(vipPools(dead, other))
	rg.waitFor(time.Second+pushSlack, "the next change reaches the node", func() (bool, string) {
		return n.verdict("spread", other) == health.Unhealthy, fmt.Sprint(n.verdict("spread", other))
	})
}

// stopSlack is what a replica may take past the store timeout to stop serving: the
// heartbeat wakes at the timeout, its read is bounded by it, and closing the gate is a few
// channel operations (scheduling on a loaded 2-core machine).
const stopSlack = 300 * time.Millisecond

// A watch that stalls while reads work (etcd answers, the state served grows old) is the
// store lost: the replica stops serving once the watch has not reached, for the store
// timeout, a revision a read saw, then reads the state again and serves the change.
func TestStalledWatchStopsServing(t *testing.T) {
	rg := newRig(t, 1)
	dead := loopback.Refused(t)
	rg.apply(vipPools(dead))
	core, logs := observer.New(zap.WarnLevel)
	r := rg.replica("r1", zap.New(core))
	n := rg.node("n", r.addr)
	rg.waitFor(time.Second+pushSlack, "the node holds the verdict", func() (bool, string) {
		return n.verdict("spread", dead) == health.Unhealthy, ""
	})
	r.lag.hold()
	other := loopback.Refused(t)
	rg.apply(vipPools(dead, other))
	written := time.Now()
	// The heartbeat reads the change's revision within one beat (a fifth of the timeout).
	bound := testStoreTimeout + testStoreTimeout/5 + stopSlack
	rg.waitFor(bound, "the replica with a stalled watch stops serving", func() (bool, string) {
		return logs.FilterMessageSnippet("lost the store").FilterFieldKey("why").Filter(func(e observer.LoggedEntry) bool {
			return strings.Contains(fmt.Sprint(e.ContextMap()["why"]), "stalled")
		}).Len() > 0, "not lost"
	})
	t.Logf("stopped serving %s after a change its watch did not deliver (--store-timeout %s)", time.Since(written).Round(time.Millisecond), testStoreTimeout)
	r.lag.release()
	rg.waitFor(time.Second+pushSlack, "the change reaches the node once the replica read the state again", func() (bool, string) {
		return n.verdict("spread", other) == health.Unhealthy, fmt.Sprint(n.verdict("spread", other))
	})
}

// A node that moves to a replica whose watch lags is not sent the older version that
// replica serves: its stream waits until the replica has caught up with the version the
// node holds, then gets that version, identical, and applies nothing.
func TestResumingNodeGetsNoOlderVersion(t *testing.T) {
	rg, dead, r1, r2 := twoReplicas(t)
	rg.serving(r1)
	n := rg.node("n", r1.addr, r2.addr)
	rg.waitFor(time.Second+pushSlack, "the node holds the verdict, from r1", func() (bool, string) {
		addr, _ := n.server()
		return n.verdict("spread", dead) == health.Unhealthy && addr == r1.addr, addr
	})
	rg.waitFor(pushSlack, "r2 at the node's version", func() (bool, string) {
		return fmt.Sprint(r2.r.served.Load().Revision) == n.version(), ""
	})
	// A change r2 does not see (its watch held back): a weight, which needs no probe.
	r2.lag.hold()
	rev := rg.apply(strings.Replace(vipPools(dead), fmt.Sprintf("{address: %q}", dead), fmt.Sprintf("{address: %q, weight: 2}", dead), 1))
	rg.waitFor(pushSlack, "the node holds the change from r1", func() (bool, string) {
		return n.version() == fmt.Sprint(rev), n.version()
	})
	if got := r2.r.served.Load().Revision; got >= rev {
		t.Fatalf("r2 serves %d with its watch held, the change is at %d", got, rev)
	}
	applied := n.applied.Load()
	r1.crash()
	rg.waitFor(testTTL+pushSlack, "r2 holds the node's stream", func() (bool, string) { return r2.r.holding.Load() == 1, "" })
	r2.lag.release()
	rg.waitFor(pushSlack, "the node on r2, at its version", func() (bool, string) {
		addr, _ := n.server()
		return n.c.Connected() && addr == r2.addr && n.version() == fmt.Sprint(rev), addr + " " + n.version()
	})
	if got := n.applied.Load(); got != applied {
		t.Fatalf("the node applied %d views moving to a replica that lagged, want none: %v", got-applied, versions(n.appliedViews()))
	}
}

func versions(vs []appliedView) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.version)
	}
	return out
}

// A key under the state written and deleted by another client (etcdctl) leaves every
// replica on one version: the one following by watch, the one that reads the state whole
// later, and the store's (the leader marks the revision after the delete).
func TestForeignWritesLeaveOneVersion(t *testing.T) {
	rg, dead, r1, r2 := twoReplicas(t)
	rg.waitFor(testTTL+pushSlack, "one leader", func() (bool, string) { l := leaders(r1, r2); return len(l) == 1, fmt.Sprint(l) })
	rg.waitFor(time.Second+pushSlack, "the verdict stored and served by both", func() (bool, string) {
		st := rg.state()
		_, ok := st.Verdict("spread", dead)
		return ok && r1.r.served.Load().Revision == st.Revision && r2.r.served.Load().Revision == st.Revision, ""
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k := rg.keys.Verdict(store.VerdictKey{Service: "spread", ID: "10.9.9.9:9"})
	if _, err := rg.cli.Put(ctx, k, `{"state":"healthy","since":"2026-01-01T00:00:00Z"}`); err != nil {
		t.Fatal(err)
	}
	del, err := rg.cli.Delete(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	same := func(rs ...*running) func() (bool, string) {
		return func() (bool, string) {
			want := rg.state().Revision
			saw := fmt.Sprintf("store %d", want)
			ok := want > del.Header.Revision
			for _, r := range rs {
				got := r.r.served.Load().Revision
				saw += fmt.Sprintf(", %s %d", r.r.cfg.ID, got)
				ok = ok && got == want
			}
			return ok, saw + fmt.Sprintf(" (the delete at %d)", del.Header.Revision)
		}
	}
	rg.waitFor(pushSlack, "both replicas and a whole read agree, past the delete", same(r1, r2))
	r3 := rg.replica("r3", testLogger(t))
	rg.waitFor(pushSlack, "a replica reading the state whole agrees too", same(r1, r2, r3))
}

// A leader whose election key is gone (as when its lease expired while it was cut off)
// tries to write a verdict: the store refuses it, the replica says so and steps down, the
// other replica leads and writes it, and the old leader never served a verdict it did not
// read from the store.
func TestStaleLeaderStepsDown(t *testing.T) {
	rg := newRig(t, 1)
	up1, up2, down := live(t), live(t), loopback.Refused(t)
	rg.apply(vipPools(up1.Addr().String(), up2.Addr().String(), down))
	core, logs := observer.New(zap.InfoLevel)
	r1 := rg.replica("r1", zap.New(core))
	rg.waitFor(testTTL+pushSlack, "r1 leads", func() (bool, string) { return r1.r.leading.Load(), "" })
	r2 := rg.replica("r2", testLogger(t))
	n := rg.node("n", r1.addr)
	rg.waitFor(time.Second+pushSlack, "the node holds the first verdicts", func() (bool, string) {
		return n.verdict("spread", up1.Addr().String()) == health.Healthy && n.verdict("spread", down) == health.Unhealthy, ""
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ms, _, err := store.Members(ctx, rg.cli, rg.keys)
	if err != nil || len(ms) != 2 || ms[0].ID != "r1" {
		t.Fatalf("members %+v %v", ms, err)
	}
	// r1's key goes while its session lives on: r1 still thinks it leads; r2 leads now.
	if _, err := rg.cli.Delete(ctx, ms[0].Key); err != nil {
		t.Fatal(err)
	}
	rg.waitFor(testTTL+pushSlack, "r2 leads", func() (bool, string) { return r2.r.leading.Load(), "" })
	up1.Close()
	rg.waitFor(2*time.Second+pushSlack, "r1's write refused, r1 steps down", func() (bool, string) {
		return logs.FilterMessageSnippet("a verdict write was refused").Len() == 1 && !r1.r.leading.Load(), ""
	})
	rg.waitFor(2*time.Second+pushSlack, "the node holds up1 down", func() (bool, string) {
		return n.verdict("spread", up1.Addr().String()) == health.Unhealthy, ""
	})
	if v, _ := rg.state().Verdict("spread", up1.Addr().String()); v.State != health.Unhealthy || v.By != "r2" {
		t.Fatalf("the stored verdict of up1: %+v, want unhealthy by r2", v)
	}
	// Every view r1 served its node is the store's state at that view's version.
	for _, av := range n.appliedViews() {
		rev, _ := strconv.ParseInt(av.version, 10, 64)
		r, err := rg.cli.Get(ctx, rg.keys.Verdicts(), clientv3.WithPrefix(), clientv3.WithRev(rev))
		if err != nil {
			t.Fatal(err)
		}
		stored := map[string]string{}
		for _, kv := range r.Kvs {
			stored[strings.TrimPrefix(string(kv.Key), rg.keys.Verdicts()+"spread/")] = string(kv.Value)
		}
		for _, id := range []string{up1.Addr().String(), up2.Addr().String(), down} {
			got := av.view.Verdict("spread", id).State
			if want := health.Unknown; stored[id] != "" {
				want = health.Unhealthy
				if strings.Contains(stored[id], `"state":"healthy"`) {
					want = health.Healthy
				}
				if got != want {
					t.Errorf("version %s: the node was served %s %v, the store held %v", av.version, id, got, want)
				}
			}
		}
	}
}
