package replica

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/stickylb/stickylb/adsclient"
	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/internal/testkit/etcdtest"
	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/xds/store"
)

// Timing of the replicas in these tests: a lease of 1 s, the store lost after 2 s.
const (
	testTTL          = time.Second
	testStoreTimeout = 2 * time.Second
)

// rig is a real etcd cluster and the replicas and nodes of one test.
type rig struct {
	t    testing.TB
	etcd *etcdtest.Cluster
	keys store.Keys
	cli  *clientv3.Client
}

func newRig(t testing.TB, members int) *rig {
	t.Helper()
	// Not skipped under -short: the race detector's pass (-race -short) must run the
	// replica's loops against a real store.
	c := etcdtest.Start(t, members, "127.0.0.1")
	return &rig{t: t, etcd: c, keys: store.KeysOf("/rig"), cli: c.Client(t)}
}

// apply stores yaml over whatever is stored.
func (rg *rig) apply(yaml string) int64 {
	rg.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, rev, err := store.ReplaceDocument(ctx, rg.cli, rg.keys, []byte(yaml), -1, store.Change{By: "test", Op: "apply"}, nil)
	if err != nil {
		rg.t.Fatal(err)
	}
	return rev
}

// state is the store's state now.
func (rg *rig) state() *store.State {
	rg.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, _, err := store.Load(ctx, rg.cli, rg.keys)
	if err != nil {
		rg.t.Fatal(err)
	}
	return st
}

// running is one replica of the test, in process, with its own etcd client.
type running struct {
	r      *Replica
	addr   string
	cli    *clientv3.Client
	lag    *lagWatcher // the client's watches, which the test can hold back
	cancel context.CancelFunc
	g      *grpc.Server
	done   chan struct{}
}

// lagWatcher passes a client's watch responses on, or holds them back (in order) while
// the test says: a watch that stalls, or lags, while the client's reads work.
type lagWatcher struct {
	clientv3.Watcher
	mu   sync.Mutex
	held chan struct{} // non-nil while held; closed on release
}

func (w *lagWatcher) hold() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.held == nil {
		w.held = make(chan struct{})
	}
}

func (w *lagWatcher) release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.held != nil {
		close(w.held)
		w.held = nil
	}
}

func (w *lagWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	in := w.Watcher.Watch(ctx, key, opts...)
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		for resp := range in {
			w.mu.Lock()
			held := w.held
			w.mu.Unlock()
			if held != nil {
				select {
				case <-held:
				case <-ctx.Done():
					return
				}
			}
			select {
			case out <- resp:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// replica starts a replica on a free port.
func (rg *rig) replica(id string, log *zap.Logger) *running {
	rg.t.Helper()
	cli, err := store.Config{Endpoints: rg.etcd.Endpoints(), DialTimeout: time.Second}.Client(log)
	if err != nil {
		rg.t.Fatal(err)
	}
	lag := &lagWatcher{Watcher: cli.Watcher}
	cli.Watcher = lag
	ctx, cancel := context.WithCancel(context.Background())
	r := New(ctx, Config{ID: id, Keys: rg.keys, LeaseTTL: testTTL, StoreTimeout: testStoreTimeout}, cli, log)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		rg.t.Fatal(err)
	}
	g := grpc.NewServer(grpc.ChainStreamInterceptor(r.Gate().StreamInterceptor()))
	r.Server().Register(g)
	go g.Serve(ln)
	rn := &running{r: r, addr: ln.Addr().String(), cli: cli, lag: lag, cancel: cancel, g: g, done: make(chan struct{})}
	go func() { r.Run(ctx); close(rn.done) }()
	rg.t.Cleanup(rn.stop)
	return rn
}

// serving waits until each replica admits streams (it has read the store and, starting
// cold, its first verdicts): a node started then goes to the first of its list.
func (rg *rig) serving(rs ...*running) {
	rg.t.Helper()
	for _, r := range rs {
		rg.waitFor(testTTL+time.Second+pushSlack, r.r.cfg.ID+" serving", func() (bool, string) {
			open, why := r.r.Gate().State()
			return open, why
		})
	}
}

// stop ends the replica as SIGTERM does (it resigns).
func (rn *running) stop() {
	rn.lag.release()
	rn.cancel()
	<-rn.done
	rn.g.Stop()
	rn.cli.Close()
}

// crash ends the replica as SIGKILL does: its connections drop and nothing is said to
// etcd (its lease runs out). Its loops end in the background.
func (rn *running) crash() {
	rn.lag.release()
	rn.cli.Close()
	rn.g.Stop()
	rn.cancel()
}

// node is an XDP-group ADS client that records what it applies.
type node struct {
	c       *adsclient.Client
	applied atomic.Int64 // views applied (a table rebuild on a real node)
	mu      sync.Mutex
	view    *fleetview.View
	views   []appliedView // every view applied, in order
}

// appliedView is a view a node applied and the endpoints' version it came under.
type appliedView struct {
	version string
	view    *fleetview.View
}

func (rg *rig) node(id string, servers ...string) *node {
	rg.t.Helper()
	c, err := adsclient.New(adsclient.Config{Servers: servers, NodeID: id, UserAgentName: fleetview.UserAgentXDP,
		Backoff: adsclient.Backoff{Initial: 50 * time.Millisecond, Max: 500 * time.Millisecond}}, zap.NewNop())
	if err != nil {
		rg.t.Fatal(err)
	}
	n := &node{c: c}
	a := &fleetview.Assembler{Apply: func(v *fleetview.View) error {
		n.mu.Lock()
		n.view = v
		n.mu.Unlock()
		n.applied.Add(1)
		return nil
	}}
	// The version a view came under: the endpoints' response that completed it.
	endpoints := a.Endpoints
	onEndpoints := func(version string, res map[string]proto.Message) error {
		before := n.applied.Load()
		err := endpoints(version, res)
		if n.applied.Load() != before {
			n.mu.Lock()
			n.views = append(n.views, appliedView{version: version, view: n.view})
			n.mu.Unlock()
		}
		return err
	}
	if err := c.Subscribe(resource.ClusterType, a.Clusters); err != nil {
		rg.t.Fatal(err)
	}
	if err := c.Subscribe(resource.EndpointType, onEndpoints); err != nil {
		rg.t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		rg.t.Fatal(err)
	}
	rg.t.Cleanup(func() { c.Close() })
	return n
}

// server is the control-plane address the node's current (or last) stream went to, and
// how many responses it took as unchanged (equal to what it had: ACKed, nothing applied).
func (n *node) server() (addr string, unchanged int) {
	ch := make(chan prometheus.Metric, 64)
	n.c.Collector().Collect(ch)
	close(ch)
	for m := range ch {
		var pb dto.Metric
		if m.Write(&pb) != nil {
			continue
		}
		labels := map[string]string{}
		for _, l := range pb.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		switch {
		case strings.Contains(m.Desc().String(), "stickylb_xds_current_server"):
			addr = labels["address"]
		case strings.Contains(m.Desc().String(), "stickylb_xds_updates_total") && labels["result"] == "unchanged":
			unchanged += int(pb.GetCounter().GetValue())
		}
	}
	return addr, unchanged
}

// appliedViews are the views the node applied, with their versions.
func (n *node) appliedViews() []appliedView {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.views)
}

// version is the endpoints' version the node last ACKed.
func (n *node) version() string { return n.c.Version(resource.EndpointType) }

// verdict is the node's view of a backend.
func (n *node) verdict(service, id string) health.State {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.view == nil {
		return 255
	}
	return n.view.Verdict(service, id).State
}

// vipPools is a pools file with one health-checked VIP service over backends (loopback
// addresses the test listens on, or refuses).
func vipPools(backends ...string) string {
	var b strings.Builder
	b.WriteString("services:\n  - name: spread\n    protocol: tcp\n    vip: \"10.9.9.9:80\"\n    affinity: {mode: none}\n    balance: maglev\n")
	b.WriteString("    health_check: {protocol: tcp, interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}\n    backends:\n")
	for _, a := range backends {
		fmt.Fprintf(&b, "      - {address: %q}\n", a)
	}
	return b.String()
}

// twoReplicas: a one-member store holding vipPools of one dead backend, and replicas r1
// and r2 on it (r1 started first).
func twoReplicas(t *testing.T) (rg *rig, dead string, r1, r2 *running) {
	rg = newRig(t, 1)
	dead = loopback.Refused(t)
	rg.apply(vipPools(dead))
	log := testLogger(t)
	return rg, dead, rg.replica("r1", log), rg.replica("r2", log)
}

// leaders are the replicas that lead now.
func leaders(rs ...*running) []string {
	var out []string
	for _, r := range rs {
		if r.r.leading.Load() {
			out = append(out, r.r.cfg.ID)
		}
	}
	return out
}

func testLogger(t testing.TB) *zap.Logger { return zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)) }

// waitFor is testwait.For on the rig's test.
func (rg *rig) waitFor(within time.Duration, what string, cond func() (bool, string)) time.Duration {
	rg.t.Helper()
	return testwait.For(rg.t, within, what, cond)
}
