package replica

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/policies/health"
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
	up.Close()
	killed := time.Now()
	rg.waitFor(time.Second+500*time.Millisecond+pushSlack, "both nodes see the killed backend down under one version",
		agree(map[string]health.State{up.Addr().String(): health.Unhealthy, down: health.Unhealthy}))
	t.Logf("a killed backend reached both nodes %s after the kill", time.Since(killed).Round(time.Millisecond))
}

// The leader crashes: the other replica leads within the lease TTL (plus slack), writes
// nothing (every verdict stored stands), and a node of the crashed replica moves to the
// other one and applies nothing (the same version, identical).
func TestLeaderCrashFailsOverWithoutRewrite(t *testing.T) {
	rg := newRig(t, 3)
	up, down := live(t), loopback.Refused(t)
	rg.apply(vipPools(up.Addr().String(), down))
	log := testLogger(t)
	rs := map[string]*running{"r1": rg.replica("r1", log)}
	rg.waitFor(testTTL+pushSlack, "r1 leads", func() (bool, string) { return rs["r1"].r.leading.Load(), "" })
	rs["r2"] = rg.replica("r2", log)
	n := rg.node("n", rs["r1"].addr, rs["r2"].addr)
	rg.waitFor(time.Second+pushSlack, "the node holds both verdicts", func() (bool, string) {
		return n.verdict("spread", down) == health.Unhealthy && n.verdict("spread", up.Addr().String()) == health.Healthy, ""
	})
	rg.waitFor(pushSlack, "r2 serves the same revision", func() (bool, string) {
		return rs["r2"].r.served.Load().Revision == rs["r1"].r.served.Load().Revision, ""
	})
	before, applied := rg.state(), n.applied.Load()
	crashed := time.Now()
	rs["r1"].crash()
	rg.waitFor(testTTL+pushSlack, "the node moved to r2", func() (bool, string) {
		return n.c.Connected() && n.version() == fmt.Sprint(before.Revision), n.version()
	})
	t.Logf("the node reconnected to r2 %s after r1 crashed", time.Since(crashed).Round(time.Millisecond))
	rg.waitFor(testTTL+pushSlack-time.Since(crashed), "r2 leads", func() (bool, string) { return rs["r2"].r.leading.Load(), "" })
	t.Logf("r2 leads %s after r1 crashed (lease %s)", time.Since(crashed).Round(time.Millisecond), testTTL)
	// Bounded observation: two reconcile rounds and a probe interval of the new leader.
	time.Sleep(2*reconcileEvery + time.Second)
	if after := rg.state(); after.Revision != before.Revision {
		t.Fatalf("the failover wrote to the store: revision %d -> %d", before.Revision, after.Revision)
	}
	if got := n.applied.Load(); got != applied {
		t.Fatalf("the node applied %d views moving between replicas, want none", got-applied)
	}
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

// Every etcd member stopped: the replica ends its streams within the store timeout (plus
// a heartbeat) and the node keeps its view; etcd back: the replica serves again within the
// lease TTL plus 5 s, the node gets the same version (applying nothing), then the next
// change.
func TestStoreLostAndBack(t *testing.T) {
	rg := newRig(t, 3)
	dead := loopback.Refused(t)
	rg.apply(vipPools(dead))
	r := rg.replica("r1", testLogger(t))
	n := rg.node("n", r.addr)
	rg.waitFor(time.Second+pushSlack, "the node holds the verdict", func() (bool, string) {
		return n.verdict("spread", dead) == health.Unhealthy, ""
	})
	version, applied := n.version(), n.applied.Load()
	for _, m := range rg.etcd.Members() {
		m.Kill()
	}
	// The replica's last exchange was at most a heartbeat before the kill: the stream ends
	// within the store timeout of it, plus a heartbeat to notice.
	took := rg.waitFor(testStoreTimeout+time.Second, "the replica ends the node's stream", func() (bool, string) {
		return !n.c.Connected(), "connected"
	})
	t.Logf("stream ended %s after etcd stopped (--store-timeout %s)", took.Round(time.Millisecond), testStoreTimeout)
	if took < testStoreTimeout-testStoreTimeout/5 {
		t.Fatalf("the stream ended %s after etcd stopped, before the store timeout %s", took, testStoreTimeout)
	}
	if s := r.r.Status(); s.Store != "lost" || s.Note == "" {
		t.Fatalf("status while lost: %+v", s)
	}
	rg.etcd.RestartAll(t)
	back := time.Now()
	rg.waitFor(testTTL+5*time.Second, "the node is served again", func() (bool, string) {
		return n.c.Connected() && n.version() == version, n.version()
	})
	t.Logf("served again %s after etcd answered", time.Since(back).Round(time.Millisecond))
	if got := n.applied.Load(); got != applied {
		t.Fatalf("the node applied %d views after the outage with nothing changed", got-applied)
	}
	other := loopback.Refused(t)
	rg.apply(vipPools(dead, other))
	rg.waitFor(time.Second+pushSlack, "the next change reaches the node", func() (bool, string) {
		return n.verdict("spread", other) == health.Unhealthy, fmt.Sprint(n.verdict("spread", other))
	})
}
