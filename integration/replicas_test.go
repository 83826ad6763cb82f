package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	xdsgrpc "google.golang.org/grpc/xds"

	"github.com/stickylb/stickylb/internal/testkit/etcdtest"
	"github.com/stickylb/stickylb/internal/testkit/grpctest"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/xds/store"
)

// The control plane as a replicated service, end to end: a three-member etcd on the
// host's side of the test bridge, three `stickylb xds --etcd` replicas (r1..r3, each in a
// namespace of its own, so one can be cut off from etcd with firewall rules in it alone),
// two XDP nodes (lb on r1 first, lb2 on r2 first), a Caddy node (on r3 first) and a
// grpc-go xDS client (on r3) over one stored pools file of two services: "spread", a TCP
// VIP over b1..b3, and "rpc", gRPC over g1..g3 on host addresses of the bridge.
//
// Phases: a backend killed; the leader SIGKILLed while a backend goes down; a replica cut
// off from etcd; every etcd member stopped, then back; the change API (a drain reaches
// every tier, two PUTs with one If-Match, a bad weight, no credentials).

var rpHosts = map[string]string{
	"host": "10.79.0.1", "cl": "10.79.0.10", "cl2": "10.79.0.20", "lb": "10.79.0.2", "lb2": "10.79.0.4",
	"b1": "10.79.0.11", "b2": "10.79.0.12", "b3": "10.79.0.13",
	"g1": "10.79.0.31", "g2": "10.79.0.32", "g3": "10.79.0.33",
	"r1": "10.79.0.51", "r2": "10.79.0.52", "r3": "10.79.0.53",
}

const (
	// The replicas' timing: a leader that stops answering is replaced within rpTTL; a
	// replica without etcd for rpStoreTimeout stops serving.
	rpTTL          = 2 * time.Second
	rpStoreTimeout = 3 * time.Second
	// Health checks: every faInterval, a backend down after rpUnhealthy failed probes
	// (two, so the leader can be killed while one is going down).
	rpInterval  = faInterval
	rpTimeout   = faTimeout
	rpUnhealthy = 2
	rpXDSPort   = 18000
	rpAdminPort = 18001
	rpAPI       = "127.0.0.1:18002" // in each replica's namespace: plaintext on loopback
	rpToken     = "e2e-token-of-the-operator"
)

// rpPools is the stored pools file over the given backends of each service.
func rpPools(vip, rpc []string) string {
	return "# the fleet's pools file, stored in etcd\n" + twoServicePools(rpHosts, rpUnhealthy, vip, rpc)
}

// newReplicaTopo: the fleet's bridge with the replicas' namespaces, and the host on it
// (etcd, Caddy, the gRPC client and the gRPC backends live on the host).
func newReplicaTopo(t *testing.T) *topo {
	tp := newLAN(t, lan{
		prefix: "slr",
		hosts:  []string{"cl", "cl2", "lb", "lb2", "b1", "b2", "b3", "r1", "r2", "r3"},
		v4:     func(h string) string { return rpHosts[h] },
		via:    map[string]string{"cl": "lb", "cl2": "lb2"},
	})
	hostOnBridge(tp, "slrh0", rpHosts["host"], rpHosts["g1"], rpHosts["g2"], rpHosts["g3"])
	return tp
}

// rpRig is TestReplicatedControlPlane's rig: the network, etcd, the replicas, the nodes of
// every tier and the backends, and what a phase leaves for the next.
type rpRig struct {
	*topo
	bin, dir string
	etcd     *etcdtest.Cluster
	cli      *clientv3.Client
	replicas map[string]*loaderProc // nil once killed
	backends map[string]*faBackend
	nodes    map[string]*loaderProc // the XDP nodes
	// Caddy's address and metrics address; cc: the grpc-go xDS client's connection,
	// caddyCC: the gRPC connection to Caddy.
	caddyAddr, caddyMetrics string
	cc, caddyCC             *grpc.ClientConn
}

// rpReplicas are the replicas, in the order they start (and, an election being first come
// first served, lead).
var rpReplicas = []string{"r1", "r2", "r3"}

func newRPRig(t *testing.T) *rpRig {
	tp, bin, _ := startXDPTest(t, newReplicaTopo)
	builtCaddy(t)
	r := &rpRig{topo: tp, bin: bin, dir: t.TempDir(), replicas: map[string]*loaderProc{}, backends: map[string]*faBackend{},
		nodes: map[string]*loaderProc{}, caddyAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t)), caddyMetrics: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	tp.writeFile(filepath.Join(r.dir, "tokens"), "operator "+rpToken+"\n")
	tp.writeFile(filepath.Join(r.dir, "token"), rpToken+"\n")
	tp.writeFile(filepath.Join(r.dir, "badtoken"), "not-the-token-of-anyone\n")
	for _, f := range []string{"tokens", "token", "badtoken"} {
		if err := os.Chmod(filepath.Join(r.dir, f), 0o600); err != nil { // files of secrets: refused if others may read them
			t.Fatal(err)
		}
	}
	tp.root.Cleanup(func() {
		for _, c := range []*grpc.ClientConn{r.cc, r.caddyCC} {
			if c != nil {
				c.Close()
			}
		}
	})
	return r
}

// TestReplicatedControlPlane: see the file's comment. Needs root. One phase after another
// on one rig (each a subtest; a failed phase stops the rest; run alone, a phase runs the
// phases it needs first). CI: about 2 minutes (the stickylb and etcd builds, thirteen
// processes, eleven namespaces).
func TestReplicatedControlPlane(t *testing.T) {
	r := newRPRig(t)
	r.phases([]rigPhase{
		{"start", nil, r.start},
		{"a backend killed", []string{"start"}, r.backendKilled},
		{"the leader killed while a backend goes down", []string{"a backend killed"}, r.leaderKilled},
		{"a replica cut off from etcd", []string{"the leader killed while a backend goes down"}, r.replicaCut},
		{"every etcd member stopped, then back", []string{"a replica cut off from etcd"}, r.etcdStopped},
		{"the change API", []string{"start"}, r.changeAPI},
	})
}

func (r *rpRig) xdsAddr(rep string) string { return fmt.Sprintf("%s:%d", rpHosts[rep], rpXDSPort) }

// startReplica runs replica rep in its namespace.
func (r *rpRig) startReplica(rep string) {
	r.replicas[rep] = r.startProc(rep, "serving xDS as a replica", r.bin, "xds", "--etcd", strings.Join(r.etcd.Endpoints(), ","),
		"--listen", r.xdsAddr(rep), "--admin", fmt.Sprintf("%s:%d", rpHosts[rep], rpAdminPort), "--replica-id", rep,
		"--lease-ttl", strconv.Itoa(int(rpTTL/time.Second)), "--store-timeout", rpStoreTimeout.String(),
		"--api", rpAPI, "--api-tokens", filepath.Join(r.dir, "tokens"))
}

// alive are the replicas not killed, in their order.
func (r *rpRig) alive() []string {
	var out []string
	for _, rep := range rpReplicas {
		if r.replicas[rep] != nil {
			out = append(out, rep)
		}
	}
	return out
}

// metric is a series of replica rep's /metrics ("absent" when it has none or rep is down).
func (r *rpRig) metric(rep, series string) string {
	return seriesValue(httpBody(fmt.Sprintf("http://%s:%d/metrics", rpHosts[rep], rpAdminPort)), series)
}

// leader is the replica whose stickylb_xds_leader is 1 ("" when none).
func (r *rpRig) leader(among ...string) string {
	for _, rep := range among {
		if r.metric(rep, "stickylb_xds_leader") == "1" {
			return rep
		}
	}
	return ""
}

// ctl runs `stickylb ctl` in replica rep's namespace against its API.
func (r *rpRig) ctl(rep string, args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", r.kit.Name(rep), r.bin, "ctl", "--api", "http://" + rpAPI,
		"--token-file", filepath.Join(r.dir, "token")}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// verdicts are the stored verdicts now.
func (r *rpRig) verdicts() map[store.VerdictKey]store.Verdict {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	st, _, err := store.Load(ctx, r.cli, store.KeysOf(store.DefaultPrefix))
	if err != nil {
		return nil
	}
	return st.Verdicts
}

// cut drops every packet between replica rep and etcd, both ways (nft in rep's namespace).
func (r *rpRig) cut(rep string) {
	var ports []string
	for _, p := range r.etcd.ClientPorts() {
		ports = append(ports, strconv.Itoa(p))
	}
	set := "{ " + strings.Join(ports, ", ") + " }"
	rule := fmt.Sprintf(`table inet cut {
	chain out { type filter hook output priority 0; ip daddr %[1]s tcp dport %[2]s drop; }
	chain in { type filter hook input priority 0; ip saddr %[1]s tcp sport %[2]s drop; }
}`, rpHosts["host"], set)
	cmd := exec.Command("ip", "netns", "exec", r.kit.Name(rep), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rule)
	if out, err := cmd.CombinedOutput(); err != nil {
		r.t.Fatalf("nft: %v\n%s", err, out)
	}
}

func (r *rpRig) uncut(rep string) { r.in(rep, "nft", "delete", "table", "inet", "cut") }

// adsMetrics is the /metrics of an ADS node: an XDP node (lb, lb2) or Caddy.
func (r *rpRig) adsMetrics(node string) string {
	if node == "caddy" {
		return httpBody("http://" + r.caddyMetrics + "/metrics")
	}
	return r.get(node, faNodeMetrics, "/metrics")
}

// server is the replica an ADS node's client is (or was last) connected to.
func (r *rpRig) server(node string) string {
	for _, l := range strings.Split(r.adsMetrics(node), "\n") {
		if strings.HasPrefix(l, "stickylb_xds_current_server{") && strings.HasSuffix(l, " 1") {
			for _, rep := range rpReplicas {
				if strings.Contains(l, `address="`+r.xdsAddr(rep)+`"`) {
					return rep
				}
			}
		}
	}
	return ""
}

func (r *rpRig) connected(node string) bool {
	return seriesValue(r.adsMetrics(node), "stickylb_xds_connected") == "1"
}

// updates are an ADS node's stickylb_xds_updates_total: type URL -> result (applied,
// unchanged, rejected) -> count. An applied update is one that rebuilt the node's tables; an
// unchanged one (the resources it holds, under any version) was ACKed and built nothing.
func (r *rpRig) updates(node string) map[string]map[string]int {
	out := map[string]map[string]int{}
	label := func(l, name string) string {
		_, v, ok := strings.Cut(l, name+`="`)
		v, _, _ = strings.Cut(v, `"`)
		if !ok {
			return ""
		}
		return v
	}
	for _, l := range strings.Split(r.adsMetrics(node), "\n") {
		if !strings.HasPrefix(l, "stickylb_xds_updates_total{") {
			continue
		}
		n, err := strconv.Atoi(l[strings.LastIndex(l, " ")+1:])
		if err != nil {
			continue
		}
		typ := label(l, "type")
		if out[typ] == nil {
			out[typ] = map[string]int{}
		}
		out[typ][label(l, "result")] += n
	}
	return out
}

// stateWrites records the times of the writes under the store's state/ (the verdicts and
// the revision mark: what changes a version) from now until stop is called.
func (r *rpRig) stateWrites(t *testing.T) (since func(time.Time) int, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var at []time.Time
	state := store.KeysOf(store.DefaultPrefix).State()
	now, err := r.cli.Get(ctx, state, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		cancel()
		t.Fatalf("reading the store's revision: %v", err)
	}
	wc := r.cli.Watch(clientv3.WithRequireLeader(ctx), state, clientv3.WithPrefix(), clientv3.WithRev(now.Header.Revision+1))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for resp := range wc {
			if err := resp.Err(); err != nil {
				t.Errorf("watching the state: %v", err)
				return
			}
			mu.Lock()
			for range resp.Events {
				at = append(at, time.Now())
			}
			mu.Unlock()
		}
	}()
	since = func(from time.Time) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, a := range at {
			if !a.Before(from) {
				n++
			}
		}
		return n
	}
	return since, func() { cancel(); <-done }
}

// startNode runs XDP node lb subscribed to the replicas, in the order given.
func (r *rpRig) startNode(lb string, servers ...string) {
	var addrs []string
	for _, rep := range servers {
		addrs = append(addrs, r.xdsAddr(rep))
	}
	r.nodes[lb] = r.startProc(lb, "", r.bin, "xdp", "--xds", strings.Join(addrs, ","), "--iface", "eth0", "--mode", "native",
		"--pin-root", r.pinRoot(lb), "--node-id", lb+"/xdp/eth0", "--metrics", faNodeMetrics)
}

// keys calls faK keys through a gRPC connection: backend -> keys.
func keys(cc *grpc.ClientConn) (map[string]int, error) {
	got := map[string]int{}
	for i := range faK {
		b, err := grpcCallKey(cc, fmt.Sprintf("key-%02d", i))
		if err != nil {
			return got, err
		}
		got[b]++
	}
	return got, nil
}

// reach is where tier's new sessions go: backend -> count.
func (r *rpRig) reach(tier string) (map[string]int, error) {
	switch tier {
	case "lb":
		return r.reaches("cl", faK)
	case "lb2":
		return r.reaches("cl2", faK)
	case "caddy":
		return keys(r.caddyCC)
	}
	return keys(r.cc)
}

// servesOnly: every tier's new sessions go to vip's backends (the XDP nodes) or rpc's (Caddy
// and the grpc-go client) only.
func (r *rpRig) servesOnly(vip, rpc []string) func() (bool, string) {
	return tiersServeOnly(r.reach, vip, rpc)
}

// sameRevision: every live replica serves one store revision.
func (r *rpRig) sameRevision() (bool, string) {
	var revs []string
	for _, rep := range r.alive() {
		revs = append(revs, rep+"="+r.metric(rep, "stickylb_xds_store_revision"))
	}
	for _, rv := range revs[1:] {
		if rv[3:] != revs[0][3:] {
			return false, strings.Join(revs, " ")
		}
	}
	return true, strings.Join(revs, " ")
}

// serveBackend starts backend h: a VIP backend's data and health ports, or a gRPC backend
// and its health port.
func (r *rpRig) serveBackend(h string) {
	if strings.HasPrefix(h, "b") {
		data, hc := r.serve(h, faVIPPort), r.serve(h, faVIPHealthPort)
		r.backends[h] = &faBackend{data: data.Close, health: hc}
		return
	}
	gs := faGRPC(r.root, h, rpHosts[h])
	r.backends[h] = &faBackend{data: gs.Stop, health: faListener(r.root, fmt.Sprintf("%s:%d", rpHosts[h], faGRPCHealth))}
}

// start: the backends, etcd, the stored file, r1 leading before r2 and r3 start (so the
// election's queue is r1, r2, r3), the XDP nodes on r1 and r2 first, Caddy on r3 first, and
// the grpc-go client on r3, the replica no phase kills or cuts.
func (r *rpRig) start(t *testing.T) {
	r.readyNodes(r.bin, "lb", "lb2")
	for _, h := range []string{"b1", "b2", "b3", "g1", "g2", "g3"} {
		r.serveBackend(h)
	}
	r.etcd = etcdtest.Start(r.root, 3, rpHosts["host"])
	r.cli = r.etcd.Client(r.root)
	pools := filepath.Join(r.dir, "pools.yaml")
	r.writeFile(pools, rpPools([]string{"b1", "b2", "b3"}, []string{"g1", "g2", "g3"}))
	if out, err := exec.Command(r.bin, "pools", "apply", pools, "--etcd", strings.Join(r.etcd.Endpoints(), ",")).CombinedOutput(); err != nil {
		t.Fatalf("pools apply: %v\n%s", err, out)
	}
	r.startReplica("r1")
	testwait.For(t, rpTTL+faPushSlack, "r1 leads", func() (bool, string) { return r.leader("r1") == "r1", "" })
	for _, rep := range []string{"r2", "r3"} {
		r.startReplica(rep)
		testwait.For(t, rpTTL+faPushSlack, rep+" in the election", func() (bool, string) {
			body := httpBody(fmt.Sprintf("http://%s:%d/status.json", rpHosts["r1"], rpAdminPort))
			return strings.Contains(body, `"`+rep+`"`), "not listed on r1's status page"
		})
	}
	r.startNode("lb", "r1", "r2", "r3")
	r.startNode("lb2", "r2", "r3", "r1")
	caddyfile := filepath.Join(r.dir, "Caddyfile")
	r.writeFile(caddyfile, fmt.Sprintf(`{
	admin off
	persist_config off
	auto_https off
	servers {
		protocols h1 h2c
	}
}
http://%s {
	reverse_proxy {
		dynamic stickylb_xds {
			server  %s %s %s
			service rpc
			node_id fleet/caddy
		}
		lb_policy sticky_header x-session {
			no_table
		}
		transport http {
			versions h2c
		}
	}
}
http://%s {
	metrics
}
`, r.caddyAddr, r.xdsAddr("r3"), r.xdsAddr("r1"), r.xdsAddr("r2"), r.caddyMetrics))
	runCaddy(r.root, caddyfile, "XDG_DATA_HOME="+filepath.Join(r.dir, "data"))
	waitPort(t, r.caddyAddr, 30*time.Second)
	waitPort(t, r.caddyMetrics, 30*time.Second)
	var err error
	if r.caddyCC, err = grpc.NewClient("passthrough:///"+r.caddyAddr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	// grpc-go takes the bootstrap's servers as a fallback list for resources it has not
	// cached yet (gRFC A71); the client stays on r3.
	var servers []string
	for _, rep := range []string{"r3", "r1", "r2"} {
		servers = append(servers, fmt.Sprintf(`{"server_uri":%q,"channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}`, r.xdsAddr(rep)))
	}
	bootstrap := fmt.Sprintf(`{"xds_servers":[%s],"node":{"id":"fleet/grpc","locality":{"zone":"zone-a"}}}`, strings.Join(servers, ","))
	rb, err := xdsgrpc.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	if r.cc, err = grpc.NewClient("xds:///rpc", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(rb)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 20*time.Second, "every tier serves its three backends", r.servesOnly([]string{"b1", "b2", "b3"}, []string{"g1", "g2", "g3"}))
	for node, want := range map[string]string{"lb": "r1", "lb2": "r2", "caddy": "r3"} {
		if got := r.server(node); got != want {
			t.Fatalf("%s is on %q, want %s", node, got, want)
		}
	}
}

// b1 and g1 die (g1 to the health checks only: grpc-go skips a backend it cannot connect
// to on its own): out of every tier's new sessions within interval x unhealthy_threshold +
// timeout + push slack; every replica then serves one revision.
func (r *rpRig) backendKilled(t *testing.T) {
	killed := time.Now()
	r.backends["b1"].kill()
	r.backends["g1"].health.Close()
	bound := rpInterval*rpUnhealthy + rpTimeout + faPushSlack
	testwait.For(t, bound, "no tier sends new sessions to b1 or g1", r.servesOnly([]string{"b2", "b3"}, []string{"g2", "g3"}))
	t.Logf("b1, g1 out of every tier %s after the kill (bound %s)", time.Since(killed).Round(time.Millisecond), bound)
	testwait.For(t, faPushSlack, "every replica serves one revision", r.sameRevision)
}

// rpMoveBound is the correctness bound of a node's move to another replica once its own is
// killed: it tries the next address at once, so this is generous (the goal, 2 s, is
// reported).
const rpMoveBound = rpTTL + faPushSlack

// The leader is SIGKILLed once the leader's status page shows b2's first failed probe of
// the two that take it down: a new leader takes over within the lease TTL plus one
// interval (plus slack), b2 is out of every tier within the TTL, two intervals, a timeout
// and the push slack, no stored verdict reverts meanwhile (b3, g3 stay healthy; b2, g2 once
// down stay down), and no node rebuilds for the move: the node of the killed replica moves
// to another, which answers it with the version it holds (ACKed unchanged; an apply only
// for a write of the state meanwhile), and no XDP node applies more updates of a type than
// there were writes of the state in the phase. The counts are the nodes' own
// stickylb_xds_updates_total{result="applied"} (their log of applies is sampled).
func (r *rpRig) leaderKilled(t *testing.T) {
	leader := r.leader(r.alive()...)
	if leader == "" {
		t.Fatal("no leader")
	}
	on := map[string]string{}
	for _, n := range faADSNodes {
		on[n] = r.server(n)
	}
	writes, stopWatch := r.stateWrites(t)
	defer stopWatch()
	phaseStart := time.Now()
	before := map[string]map[string]map[string]int{}
	for lb := range r.nodes {
		before[lb] = r.updates(lb)
	}
	var mu sync.Mutex
	var reverts []string
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		down := map[store.VerdictKey]bool{}
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			for k, v := range r.verdicts() {
				id := k.Service + "/" + k.ID
				switch {
				case (strings.Contains(id, rpHosts["b3"]) || strings.Contains(id, rpHosts["g3"])) && v.State != health.Healthy:
					mu.Lock()
					reverts = append(reverts, id+" "+v.State.String())
					mu.Unlock()
				case v.State == health.Unhealthy:
					down[k] = true
				case down[k]:
					mu.Lock()
					reverts = append(reverts, id+" back to "+v.State.String())
					mu.Unlock()
				}
			}
		}
	}()
	r.backends["b2"].kill()
	r.backends["g2"].health.Close()
	// The signal: the leader's page gives b2's failures in a row (its own checker's).
	b2 := fmt.Sprintf("%s:%d", rpHosts["b2"], faVIPPort)
	var seen string
	testwait.For(t, rpInterval+rpTimeout+faPushSlack, "the leader saw b2's first failed probe", func() (bool, string) {
		seen = r.backendHealth(leader, "spread", b2)
		return strings.Contains(seen, "failures in a row") || strings.HasPrefix(seen, "unhealthy"), seen
	})
	killed := time.Now()
	r.replicas[leader].kill()
	r.replicas[leader] = nil
	if strings.HasPrefix(seen, "unhealthy") {
		t.Logf("the leader was killed after b2's second failure (%s): its verdict was stored; the new leader decides g2 only", seen)
	} else {
		t.Logf("the leader was killed between b2's first and second failure (%s)", seen)
	}
	for _, n := range faADSNodes {
		if on[n] != leader {
			continue
		}
		atKill := r.updates(n)
		moved := testwait.For(t, rpMoveBound, n+" on another replica", func() (bool, string) {
			return r.connected(n) && r.server(n) != leader, r.server(n)
		})
		t.Logf("%s moved from %s to %s %s after the kill (goal 2 s)", n, leader, r.server(n), moved.Round(time.Millisecond))
		r.movedRebuildsNothing(t, n, atKill, killed.Add(-faPushSlack), writes)
	}
	lead := testwait.For(t, rpTTL+rpInterval+faPushSlack, "a new leader", func() (bool, string) {
		return r.leader(r.alive()...) != "", "none"
	})
	t.Logf("%s killed; %s leads %s later (bound %s)", leader, r.leader(r.alive()...), lead.Round(time.Millisecond), rpTTL+rpInterval)
	bound := rpTTL + rpInterval*rpUnhealthy + rpTimeout + faPushSlack
	testwait.For(t, bound-time.Since(killed), "b2 and g2 out of every tier", r.servesOnly([]string{"b3"}, []string{"g3"}))
	t.Logf("b2, g2 out of every tier %s after the leader's kill (bound %s)", time.Since(killed).Round(time.Millisecond), bound)
	close(stop)
	<-sampled
	if len(reverts) > 0 {
		t.Fatalf("stored verdicts reverted: %v", reverts)
	}
	testwait.For(t, faPushSlack, "every live replica serves one revision", r.sameRevision)
	// Each write under the state changes a node's resources once at most: a node that
	// applied more updates of a type than there were writes rebuilt for something else (a
	// move to a replica that sent it an older state, then the newer one again).
	n := writes(phaseStart)
	for lb := range r.nodes {
		after := r.updates(lb)
		for typ, res := range after {
			applied := res["applied"] - before[lb][typ]["applied"]
			t.Logf("%s (on %s, now on %s): %d updates of %s applied over %d writes of the state", lb, on[lb], r.server(lb), applied, typeName(typ), n)
			if applied > n {
				t.Errorf("%s applied %d updates of %s over %d writes of the state: moving replicas must rebuild nothing", lb, applied, typ, n)
			}
		}
	}
}

// movedRebuildsNothing: ADS node n, which held the updates atKill when its replica was
// killed, has been sent every type it subscribes to by the replica it moved to, and applied
// none of them but for writes of the state since from (each may change its resources once):
// the new replica sent the version the node holds, identical, which it ACKs unchanged.
func (r *rpRig) movedRebuildsNothing(t *testing.T, n string, atKill map[string]map[string]int, from time.Time, writes func(time.Time) int) {
	total := func(res map[string]int) int { return res["applied"] + res["unchanged"] + res["rejected"] }
	var now map[string]map[string]int
	// The new replica answers each type's first request once it serves the node's version
	// (it holds it at most the store timeout).
	testwait.For(t, rpStoreTimeout+faPushSlack, n+" answered for every type by its new replica", func() (bool, string) {
		now = r.updates(n)
		var waiting []string
		for typ, res := range atKill {
			if total(now[typ]) <= total(res) {
				waiting = append(waiting, typeName(typ))
			}
		}
		return len(waiting) == 0, "no answer yet for " + strings.Join(waiting, ", ")
	})
	w := writes(from)
	for typ, res := range atKill {
		applied, unchanged := now[typ]["applied"]-res["applied"], now[typ]["unchanged"]-res["unchanged"]
		t.Logf("%s's move: %s applied %d, unchanged %d (%d writes of the state meanwhile)", n, typeName(typ), applied, unchanged, w)
		if applied > w || now[typ]["rejected"] != res["rejected"] {
			t.Errorf("%s's move rebuilt its tables: %s applied %d, rejected %d, over %d writes of the state", n, typ, applied, now[typ]["rejected"]-res["rejected"], w)
		}
	}
}

// typeName is the last part of a type URL (ClusterLoadAssignment for EDS's).
func typeName(url string) string { return url[strings.LastIndex(url, ".")+1:] }

// backendHealth is a backend's health on replica rep's status page: its state, and the
// reason the page gives ("" when rep or the backend is not there).
func (r *rpRig) backendHealth(rep, service, id string) string {
	var snap struct {
		Services []struct {
			Name     string `json:"name"`
			Backends []struct {
				ID     string                         `json:"id"`
				Health struct{ State, Reason string } `json:"health"`
			} `json:"backends"`
		} `json:"services"`
	}
	if json.Unmarshal([]byte(httpBody(fmt.Sprintf("http://%s:%d/status.json", rpHosts[rep], rpAdminPort))), &snap) != nil {
		return ""
	}
	for _, s := range snap.Services {
		for _, b := range s.Backends {
			if s.Name == service && b.ID == id {
				return b.Health.State + ": " + b.Health.Reason
			}
		}
	}
	return ""
}

// The leader now (with an XDP node or both) is cut off from etcd, both ways, as b1 and g1
// return: another replica takes the lead within the lease TTL and finds them up within an
// interval and a timeout; the cut one stops serving within the store timeout (plus a
// heartbeat) and its nodes move. No node holds the change later than another by more than
// the store timeout (plus the push slack).
func (r *rpRig) replicaCut(t *testing.T) {
	cut := r.leader(r.alive()...)
	if cut == "" || cut == "r3" {
		t.Fatalf("the leader is %q: the phase cuts a leader other than r3, the grpc-go client's", cut)
	}
	r.cut(cut)
	cutAt := time.Now()
	r.serveBackend("b1")
	// g1 still serves (only its health port was closed): its health port opens again.
	r.backends["g1"].health = faListener(r.root, fmt.Sprintf("%s:%d", rpHosts["g1"], faGRPCHealth))
	stopped := testwait.For(t, rpStoreTimeout+time.Second+faPushSlack, cut+" stops serving", func() (bool, string) {
		v := r.metric(cut, "stickylb_xds_serving")
		return v == "0", v
	})
	t.Logf("%s stopped serving %s after the cut (--store-timeout %s)", cut, stopped.Round(time.Millisecond), rpStoreTimeout)
	// Its readiness probe says so (a Kubernetes Service would leave it out), its liveness
	// probe does not.
	healthz := fmt.Sprintf("http://%s:%d/healthz", rpHosts[cut], rpAdminPort)
	if b := httpBody(healthz); !strings.HasPrefix(b, "not ready: lost the store") {
		t.Errorf("%s's /healthz while cut off: %q", cut, b)
	}
	if b := httpBody(fmt.Sprintf("http://%s:%d/livez", rpHosts[cut], rpAdminPort)); b != "ok\n" {
		t.Errorf("%s's /livez while cut off: %q", cut, b)
	}
	first := map[string]time.Duration{}
	bound := max(rpTTL+rpInterval+rpTimeout, rpStoreTimeout+time.Second) + faPushSlack
	testwait.For(t, bound-time.Since(cutAt), "every tier sends new sessions to b1 or g1 again", func() (bool, string) {
		var saw []string
		for _, tier := range faTierOrder {
			if _, ok := first[tier]; ok {
				continue
			}
			got, err := r.reach(tier)
			if err == nil && (got["b1"] > 0 || got["g1"] > 0) {
				first[tier] = time.Since(cutAt)
				continue
			}
			saw = append(saw, fmt.Sprintf("%s: %v %v", tier, got, err))
		}
		return len(saw) == 0, strings.Join(saw, "; ")
	})
	lo, hi := bound, time.Duration(0)
	for tier, d := range first {
		on := "r3"
		if tier != "grpc" {
			on = r.server(tier)
		}
		t.Logf("%s took b1/g1 back %s after the cut (on %s)", tier, d.Round(time.Millisecond), on)
		lo, hi = min(lo, d), max(hi, d)
	}
	if spread := hi - lo; spread > rpStoreTimeout+faPushSlack {
		t.Errorf("the nodes took the change %s apart, over the store timeout %s plus the push slack", spread, rpStoreTimeout)
	}
	for lb := range r.nodes {
		if s := r.server(lb); s == cut {
			t.Errorf("%s still on the cut replica", lb)
		}
	}
	if v := r.metric(cut, "stickylb_xds_serving"); v != "0" {
		t.Errorf("%s serves while cut off from etcd: stickylb_xds_serving %s", cut, v)
	}
	r.uncut(cut)
	uncut := time.Now()
	testwait.For(t, rpTTL+5*time.Second, cut+" serves again", func() (bool, string) {
		v := r.metric(cut, "stickylb_xds_serving")
		return v == "1", v
	})
	t.Logf("%s serves again %s after the cut ended", cut, time.Since(uncut).Round(time.Millisecond))
	if b := httpBody(healthz); b != "ok\n" {
		t.Errorf("%s's /healthz once it serves again: %q", cut, b)
	}
	testwait.For(t, faPushSlack, "every live replica serves one revision", r.sameRevision)
}

// Every etcd member killed: every tier keeps forwarding on its last view (the replicas end
// their streams within the store timeout); etcd back: the replicas serve again within the
// lease TTL plus 5 s, and one change through the API (a drain of b3 and g3) reaches every
// tier: the ADS nodes within their backoff's ceiling (read from their stream ends) plus
// the push slack, grpc-go within its reconnect bound.
func (r *rpRig) etcdStopped(t *testing.T) {
	ends := map[string]int{}
	for _, n := range faADSNodes {
		ends[n], _ = strconv.Atoi(seriesValue(r.adsMetrics(n), "stickylb_xds_stream_ends_total"))
	}
	for _, m := range r.etcd.Members() {
		m.Kill()
	}
	down := time.Now()
	testwait.For(t, rpStoreTimeout+time.Second+faPushSlack, "every ADS node's stream ended", func() (bool, string) {
		for _, n := range faADSNodes {
			if r.connected(n) {
				return false, n + " connected"
			}
		}
		return true, ""
	})
	t.Logf("every ADS node's stream ended %s after etcd stopped", time.Since(down).Round(time.Millisecond))
	if ok, saw := r.servesOnly([]string{"b1", "b3"}, []string{"g1", "g3"})(); !ok {
		t.Fatalf("with etcd down: %s", saw)
	}
	r.etcd.RestartAll(t)
	back := time.Now()
	outage := back.Sub(down)
	testwait.For(t, rpTTL+5*time.Second, "the replicas serve again", func() (bool, string) {
		for _, rep := range r.alive() {
			if v := r.metric(rep, "stickylb_xds_serving"); v != "1" {
				return false, rep + "=" + v
			}
		}
		return true, ""
	})
	t.Logf("the replicas serve again %s after etcd answered (outage %s; no leader for up to the lease TTL)", time.Since(back).Round(time.Millisecond), outage.Round(time.Millisecond))
	if ok, saw := r.servesOnly([]string{"b1", "b3"}, []string{"g1", "g3"})(); !ok {
		t.Fatalf("once etcd is back: %s", saw)
	}
	drained := time.Now()
	for _, c := range [][]string{{"drain", "spread", rpHosts["b3"] + ":80"}, {"drain", "rpc", fmt.Sprintf("%s:%d", rpHosts["g3"], faGRPCPort)}} {
		if out, err := r.ctl("r3", c...); err != nil {
			t.Fatalf("ctl %v: %v\n%s", c, err, out)
		}
	}
	by := back
	for _, n := range faADSNodes {
		e, _ := strconv.Atoi(seriesValue(r.adsMetrics(n), "stickylb_xds_stream_ends_total"))
		by = maxTime(by, back.Add(adsReconnectBound((e-ends[n])/3+2)+faPushSlack))
	}
	by = maxTime(by, back.Add(grpcReconnectBound(outage)+faPushSlack))
	by = maxTime(by, drained.Add(faPushSlack))
	testwait.For(t, time.Until(by), "every tier drains b3 and g3", r.servesOnly([]string{"b1"}, []string{"g1"}))
	t.Logf("the drain reached every tier %s after the API call (bound %s)", time.Since(drained).Round(time.Millisecond), by.Sub(drained).Round(time.Millisecond))
}

// The API refuses what it must and changes nothing then: two PUTs of the file with one
// If-Match give one success and one 409; a weight of 0 is a 400 naming the path; a wrong
// token and no credentials are 401s.
func (r *rpRig) changeAPI(t *testing.T) {
	alive := r.alive()
	if len(alive) < 2 {
		t.Fatalf("replicas alive: %v", alive)
	}
	a, b := alive[len(alive)-2], alive[len(alive)-1]
	revision := func() string {
		out, err := r.ctl(b, "pools-get")
		if err != nil {
			t.Fatalf("pools-get: %v\n%s", err, out)
		}
		return out[strings.LastIndex(out, "revision "):]
	}
	before := revision()
	rev := strings.Fields(before)[1]
	pools := filepath.Join(r.dir, "put.yaml")
	r.writeFile(pools, rpPools([]string{"b1", "b3"}, []string{"g1", "g3"}))
	outs := make([]string, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, rep := range []string{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = r.ctl(rep, "pools-put", pools, "--if-match", rev)
		}()
	}
	wg.Wait()
	ok, conflict := 0, 0
	for i := range outs {
		switch {
		case errs[i] == nil:
			ok++
		case strings.Contains(outs[i], "409"):
			conflict++
		}
	}
	if ok != 1 || conflict != 1 {
		t.Fatalf("two PUTs with If-Match %s: %q %v", rev, outs, errs)
	}
	before = revision()
	out, err := r.ctl(b, "weight", "spread", rpHosts["b1"]+":80", "0")
	if want := "services[spread].backends[" + rpHosts["b1"] + ":80].weight: 0"; err == nil || !strings.Contains(out, "400") || !strings.Contains(out, want) {
		t.Fatalf("weight 0: %v\n%s", err, out)
	}
	bad := exec.Command("ip", "netns", "exec", r.kit.Name(b), r.bin, "ctl", "--api", "http://"+rpAPI,
		"--token-file", filepath.Join(r.dir, "badtoken"), "drain", "spread", rpHosts["b1"]+":80")
	if out, err := bad.CombinedOutput(); err == nil || !strings.Contains(string(out), "401") {
		t.Fatalf("a wrong token: %v\n%s", err, out)
	}
	var resp string
	r.inNS(b, func() { resp = rawRequest(t, rpAPI, "POST /v1/services/spread/backends/"+rpHosts["b1"]+":80/drain") })
	if !strings.HasPrefix(resp, "HTTP/1.1 401") {
		t.Fatalf("no credentials: %q", resp)
	}
	if after := revision(); after != before {
		t.Fatalf("refused requests changed the file: %s -> %s", before, after)
	}
	m := httpBody(fmt.Sprintf("http://%s:%d/metrics", rpHosts[b], rpAdminPort))
	for _, want := range []string{`stickylb_xds_api_changes_total{op="backend_put",result="invalid"} 1`, `stickylb_xds_api_changes_total{op="backend_drain",result="unauthorized"} 2`} {
		if !strings.Contains(m, want) {
			t.Errorf("%s's metrics lack %s", b, want)
		}
	}
}

// grpcCallKey sends one Check with key as x-session through cc and returns the backend
// that answered (faGRPC's backends name themselves as grpctest's do).
func grpcCallKey(cc *grpc.ClientConn, key string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return grpctest.Call(ctx, cc, key)
}

// rawRequest sends "METHOD PATH" without credentials to addr (from the calling thread's
// namespace) and returns the answer's status line.
func rawRequest(t *testing.T, addr, request string) string {
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "%s HTTP/1.1\r\nHost: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", request, addr)
	line, _ := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line)
}
