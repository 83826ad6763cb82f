package integration

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
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

// rpRig is the test's fleet.
type rpRig struct {
	tp       *topo
	bin, dir string
	etcd     *etcdtest.Cluster
	cli      *clientv3.Client
	replicas map[string]*loaderProc
	backends map[string]*faBackend
}

func (rg *rpRig) xdsAddr(r string) string { return fmt.Sprintf("%s:%d", rpHosts[r], rpXDSPort) }

// startReplica runs replica r in its namespace.
func (rg *rpRig) startReplica(r string) {
	rg.replicas[r] = rg.tp.startProc(r, "serving xDS as a replica", rg.bin, "xds", "--etcd", strings.Join(rg.etcd.Endpoints(), ","),
		"--listen", rg.xdsAddr(r), "--admin", fmt.Sprintf("%s:%d", rpHosts[r], rpAdminPort), "--replica-id", r,
		"--lease-ttl", strconv.Itoa(int(rpTTL/time.Second)), "--store-timeout", rpStoreTimeout.String(),
		"--api", rpAPI, "--api-tokens", filepath.Join(rg.dir, "tokens"))
}

// metric is a series of replica r's /metrics ("absent" when it has none or r is down).
func (rg *rpRig) metric(r, series string) string {
	return seriesValue(httpBody(fmt.Sprintf("http://%s:%d/metrics", rpHosts[r], rpAdminPort)), series)
}

// leader is the replica whose stickylb_xds_leader is 1 ("" when none).
func (rg *rpRig) leader(among ...string) string {
	for _, r := range among {
		if rg.metric(r, "stickylb_xds_leader") == "1" {
			return r
		}
	}
	return ""
}

// ctl runs `stickylb ctl` in replica r's namespace against its API.
func (rg *rpRig) ctl(r string, args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", rg.tp.kit.Name(r), rg.bin, "ctl", "--api", "http://" + rpAPI,
		"--token-file", filepath.Join(rg.dir, "token")}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// verdicts are the stored verdicts now.
func (rg *rpRig) verdicts() map[store.VerdictKey]store.Verdict {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	st, _, err := store.Load(ctx, rg.cli, store.KeysOf(store.DefaultPrefix))
	if err != nil {
		return nil
	}
	return st.Verdicts
}

// cut drops every packet between replica r and etcd, both ways (nft in r's namespace).
func (rg *rpRig) cut(r string) {
	var ports []string
	for _, p := range rg.etcd.ClientPorts() {
		ports = append(ports, strconv.Itoa(p))
	}
	set := "{ " + strings.Join(ports, ", ") + " }"
	rule := fmt.Sprintf(`table inet cut {
	chain out { type filter hook output priority 0; ip daddr %[1]s tcp dport %[2]s drop; }
	chain in { type filter hook input priority 0; ip saddr %[1]s tcp sport %[2]s drop; }
}`, rpHosts["host"], set)
	cmd := exec.Command("ip", "netns", "exec", rg.tp.kit.Name(r), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rule)
	if out, err := cmd.CombinedOutput(); err != nil {
		rg.tp.t.Fatalf("nft: %v\n%s", err, out)
	}
}

func (rg *rpRig) uncut(r string) { rg.tp.in(r, "nft", "delete", "table", "inet", "cut") }

// TestReplicatedControlPlane: see the file's comment. Needs root. CI: about 2 minutes
// (the stickylb and etcd builds, thirteen processes, eleven namespaces).
func TestReplicatedControlPlane(t *testing.T) {
	tp, bin, _ := startXDPTest(t, newReplicaTopo)
	builtCaddy(t)
	rg := &rpRig{tp: tp, bin: bin, dir: t.TempDir(), replicas: map[string]*loaderProc{}, backends: map[string]*faBackend{}}
	tp.writeFile(filepath.Join(rg.dir, "tokens"), "operator "+rpToken+"\n")
	tp.writeFile(filepath.Join(rg.dir, "token"), rpToken+"\n")
	tp.writeFile(filepath.Join(rg.dir, "badtoken"), "not-the-token-of-anyone\n")
	replicas := []string{"r1", "r2", "r3"}
	nodes := map[string]*loaderProc{}
	startNode := func(lb string, servers ...string) {
		var addrs []string
		for _, r := range servers {
			addrs = append(addrs, rg.xdsAddr(r))
		}
		nodes[lb] = tp.startProc(lb, "", bin, "xdp", "--xds", strings.Join(addrs, ","), "--iface", "eth0", "--mode", "native",
			"--pin-root", tp.pinRoot(lb), "--node-id", lb+"/xdp/eth0", "--metrics", faNodeMetrics)
	}
	caddyAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	caddyMetrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	adsMetrics := func(node string) string {
		if node == "caddy" {
			return httpBody("http://" + caddyMetrics + "/metrics")
		}
		return tp.get(node, faNodeMetrics, "/metrics")
	}
	adsNodes := []string{"lb", "lb2", "caddy"}
	// applied sums a node's stickylb_xds_updates_total{result="applied"}: the views it
	// applied (an XDP node rebuilds its tables for each, Caddy its upstreams).
	applied := func(node string) int {
		n := 0
		for _, l := range strings.Split(adsMetrics(node), "\n") {
			if strings.HasPrefix(l, "stickylb_xds_updates_total{") && strings.Contains(l, `result="applied"`) {
				v, _ := strconv.Atoi(l[strings.LastIndex(l, " ")+1:])
				n += v
			}
		}
		return n
	}
	// server is the replica a node's ADS client is (or was last) connected to.
	server := func(node string) string {
		for _, l := range strings.Split(adsMetrics(node), "\n") {
			if strings.HasPrefix(l, "stickylb_xds_current_server{") && strings.HasSuffix(l, " 1") {
				for _, r := range replicas {
					if strings.Contains(l, `address="`+rg.xdsAddr(r)+`"`) {
						return r
					}
				}
			}
		}
		return ""
	}
	connected := func(node string) bool { return seriesValue(adsMetrics(node), "stickylb_xds_connected") == "1" }

	var cc, caddyCC *grpc.ClientConn
	keys := func(cc *grpc.ClientConn) (map[string]int, error) {
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
	tiers := map[string]func() (map[string]int, error){
		"lb":    func() (map[string]int, error) { return tp.reaches("cl", faK) },
		"lb2":   func() (map[string]int, error) { return tp.reaches("cl2", faK) },
		"caddy": func() (map[string]int, error) { return keys(caddyCC) },
		"grpc":  func() (map[string]int, error) { return keys(cc) },
	}
	tierOrder := []string{"lb", "lb2", "caddy", "grpc"}
	servesOnly := func(vip, rpc []string) func() (bool, string) {
		want := map[string][]string{"lb": vip, "lb2": vip, "caddy": rpc, "grpc": rpc}
		return func() (bool, string) {
			for _, tier := range tierOrder {
				got, err := tiers[tier]()
				if err != nil {
					return false, fmt.Sprintf("%s: %v after %v", tier, err, got)
				}
				for b := range got {
					if !slices.Contains(want[tier], b) {
						return false, fmt.Sprintf("%s: %v, want only %v", tier, got, want[tier])
					}
				}
			}
			return true, ""
		}
	}
	sameRevision := func() (bool, string) {
		var revs []string
		for _, r := range replicas {
			if rg.replicas[r] == nil {
				continue
			}
			revs = append(revs, r+"="+rg.metric(r, "stickylb_xds_store_revision"))
		}
		for _, r := range revs[1:] {
			if r[3:] != revs[0][3:] {
				return false, strings.Join(revs, " ")
			}
		}
		return true, strings.Join(revs, " ")
	}
	serveBackend := func(h string) {
		if strings.HasPrefix(h, "b") {
			data, hc := tp.serve(h, faVIPPort), tp.serve(h, faVIPHealthPort)
			rg.backends[h] = &faBackend{data: data.Close, health: hc}
			return
		}
		gs := faGRPC(tp.root, h, rpHosts[h])
		rg.backends[h] = &faBackend{data: gs.Stop, health: faListener(tp.root, fmt.Sprintf("%s:%d", rpHosts[h], faGRPCHealth))}
	}

	tp.phase("start", func(t *testing.T) {
		tp.readyNodes(bin, "lb", "lb2")
		for _, h := range []string{"b1", "b2", "b3", "g1", "g2", "g3"} {
			serveBackend(h)
		}
		rg.etcd = etcdtest.Start(tp.root, 3, rpHosts["host"])
		rg.cli = rg.etcd.Client(tp.root)
		pools := filepath.Join(rg.dir, "pools.yaml")
		tp.writeFile(pools, rpPools([]string{"b1", "b2", "b3"}, []string{"g1", "g2", "g3"}))
		if out, err := exec.Command(bin, "pools", "apply", pools, "--etcd", strings.Join(rg.etcd.Endpoints(), ",")).CombinedOutput(); err != nil {
			t.Fatalf("pools apply: %v\n%s", err, out)
		}
		for _, r := range replicas {
			rg.startReplica(r)
		}
		startNode("lb", "r1", "r2", "r3")
		startNode("lb2", "r2", "r3", "r1")
		caddyfile := filepath.Join(rg.dir, "Caddyfile")
		tp.writeFile(caddyfile, fmt.Sprintf(`{
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
`, caddyAddr, rg.xdsAddr("r3"), rg.xdsAddr("r1"), rg.xdsAddr("r2"), caddyMetrics))
		runCaddy(tp.root, caddyfile, "XDG_DATA_HOME="+filepath.Join(rg.dir, "data"))
		waitPort(t, caddyAddr, 30*time.Second)
		waitPort(t, caddyMetrics, 30*time.Second)
		var err error
		if caddyCC, err = grpc.NewClient("passthrough:///"+caddyAddr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			t.Fatal(err)
		}
		tp.root.Cleanup(func() { caddyCC.Close() })
		// grpc-go takes the bootstrap's servers as a fallback list for resources it has not
		// cached yet (gRFC A71); the client stays on r3, the replica no phase kills.
		var servers []string
		for _, r := range []string{"r3", "r1", "r2"} {
			servers = append(servers, fmt.Sprintf(`{"server_uri":%q,"channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}`, rg.xdsAddr(r)))
		}
		bootstrap := fmt.Sprintf(`{"xds_servers":[%s],"node":{"id":"fleet/grpc","locality":{"zone":"zone-a"}}}`, strings.Join(servers, ","))
		rb, err := xdsgrpc.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
		if err != nil {
			t.Fatal(err)
		}
		if cc, err = grpc.NewClient("xds:///rpc", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(rb)); err != nil {
			t.Fatal(err)
		}
		tp.root.Cleanup(func() { cc.Close() })
		testwait.For(t, 20*time.Second, "every tier serves its three backends", servesOnly([]string{"b1", "b2", "b3"}, []string{"g1", "g2", "g3"}))
		testwait.For(t, 5*time.Second, "one leader", func() (bool, string) { l := rg.leader(replicas...); return l != "", l })
		for node, want := range map[string]string{"lb": "r1", "lb2": "r2", "caddy": "r3"} {
			if got := server(node); got != want {
				t.Fatalf("%s is on %q, want %s", node, got, want)
			}
		}
	})

	// b1 and g1 die (g1 to the health checks only: grpc-go skips a backend it cannot
	// connect to on its own): out of every tier's new sessions within interval x
	// unhealthy_threshold + timeout + push slack; every replica then serves one revision.
	tp.phase("a backend killed", func(t *testing.T) {
		killed := time.Now()
		rg.backends["b1"].kill()
		rg.backends["g1"].health.Close()
		bound := rpInterval*rpUnhealthy + rpTimeout + faPushSlack
		testwait.For(t, bound, "no tier sends new sessions to b1 or g1", servesOnly([]string{"b2", "b3"}, []string{"g2", "g3"}))
		t.Logf("b1, g1 out of every tier %s after the kill (bound %s)", time.Since(killed).Round(time.Millisecond), bound)
		testwait.For(t, faPushSlack, "every replica serves one revision", sameRevision)
	})

	// The leader is SIGKILLed between b2's first and second failed probe: a new leader
	// takes over within the lease TTL plus one interval (plus slack), b2 is out of every
	// tier within the TTL, two intervals, a timeout and the push slack, no stored verdict
	// reverts meanwhile (b3, g3 stay healthy; b2, g2 once down stay down), and the nodes of
	// the killed replica move to another and apply no more views than the nodes that
	// stayed.
	tp.phase("the leader killed while a backend goes down", func(t *testing.T) {
		leader := rg.leader(replicas...)
		before := map[string]int{}
		on := map[string]string{}
		for _, n := range adsNodes {
			before[n], on[n] = applied(n), server(n)
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
				for k, v := range rg.verdicts() {
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
		rg.backends["b2"].kill()
		rg.backends["g2"].health.Close()
		// Between the first failed probe (within an interval) and the second.
		time.Sleep(rpInterval)
		killed := time.Now()
		rg.replicas[leader].kill()
		rg.replicas[leader] = nil
		// A node of the killed replica is on another within 2 s (the goal), having applied
		// nothing for the move (checked below).
		for _, n := range adsNodes {
			if on[n] != leader {
				continue
			}
			moved := testwait.For(t, 2*time.Second, n+" on another replica", func() (bool, string) {
				return connected(n) && server(n) != leader, server(n)
			})
			t.Logf("%s moved from %s to %s %s after the kill", n, leader, server(n), moved.Round(time.Millisecond))
		}
		var alive []string
		for _, r := range replicas {
			if r != leader {
				alive = append(alive, r)
			}
		}
		lead := testwait.For(t, rpTTL+rpInterval+faPushSlack, "a new leader", func() (bool, string) {
			l := rg.leader(alive...)
			return l != "", "none"
		})
		t.Logf("%s killed; %s leads %s later (bound %s)", leader, rg.leader(alive...), lead.Round(time.Millisecond), rpTTL+rpInterval)
		bound := rpTTL + rpInterval*rpUnhealthy + rpTimeout + faPushSlack
		testwait.For(t, bound-time.Since(killed), "b2 and g2 out of every tier", servesOnly([]string{"b3"}, []string{"g3"}))
		t.Logf("b2, g2 out of every tier %s after the leader's kill (bound %s)", time.Since(killed).Round(time.Millisecond), bound)
		close(stop)
		<-sampled
		if len(reverts) > 0 {
			t.Fatalf("stored verdicts reverted: %v", reverts)
		}
		testwait.For(t, faPushSlack, "every live replica serves one revision", sameRevision)
		// The node's new replica sends it the version it had, identical: applied as
		// nothing; b2's verdict is the one view every node applies.
		for _, n := range adsNodes {
			moved := on[n] == leader
			d := applied(n) - before[n]
			t.Logf("%s: on %s, now on %s; %d views applied (b2's verdict)", n, on[n], server(n), d)
			if d != 1 {
				t.Errorf("%s (moved: %v) applied %d views, want 1 (b2's verdict): moving replicas must rebuild nothing", n, moved, d)
			}
		}
	})

	// r2 (the leader now, with both XDP nodes) cut off from etcd, both ways, as b1 and g1
	// return: r3 takes the lead within the lease TTL, finds them up within an interval
	// and a timeout; r2 stops serving within the store timeout (plus a heartbeat) and its
	// nodes move to r3. No node holds the change later than another by more than the
	// store timeout (plus the push slack).
	tp.phase("a replica cut off from etcd", func(t *testing.T) {
		cut := "r2"
		rg.cut(cut)
		cutAt := time.Now()
		serveBackend("b1")
		// g1 still serves (only its health port was closed): its health port opens again.
		rg.backends["g1"].health = faListener(tp.root, fmt.Sprintf("%s:%d", rpHosts["g1"], faGRPCHealth))
		stopped := testwait.For(t, rpStoreTimeout+time.Second+faPushSlack, cut+" stops serving", func() (bool, string) {
			v := rg.metric(cut, "stickylb_xds_serving")
			return v == "0", v
		})
		t.Logf("%s stopped serving %s after the cut (--store-timeout %s)", cut, stopped.Round(time.Millisecond), rpStoreTimeout)
		first := map[string]time.Duration{}
		bound := max(rpTTL+rpInterval+rpTimeout, rpStoreTimeout+time.Second) + faPushSlack
		testwait.For(t, bound-time.Since(cutAt), "every tier sends new sessions to b1 or g1 again", func() (bool, string) {
			var saw []string
			for _, tier := range tierOrder {
				if _, ok := first[tier]; ok {
					continue
				}
				got, err := tiers[tier]()
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
				on = server(tier)
			}
			t.Logf("%s took b1/g1 back %s after the cut (on %s)", tier, d.Round(time.Millisecond), on)
			lo, hi = min(lo, d), max(hi, d)
		}
		if spread := hi - lo; spread > rpStoreTimeout+faPushSlack {
			t.Errorf("the nodes took the change %s apart, over the store timeout %s plus the push slack", spread, rpStoreTimeout)
		}
		for _, n := range []string{"lb", "lb2"} {
			if s := server(n); s == cut {
				t.Errorf("%s still on the cut replica", n)
			}
		}
		rg.uncut(cut)
		uncut := time.Now()
		testwait.For(t, rpTTL+5*time.Second, cut+" serves again", func() (bool, string) {
			v := rg.metric(cut, "stickylb_xds_serving")
			return v == "1", v
		})
		t.Logf("%s serves again %s after the cut ended", cut, time.Since(uncut).Round(time.Millisecond))
		testwait.For(t, faPushSlack, "every live replica serves one revision", sameRevision)
	})

	// Every etcd member killed: every tier keeps forwarding on its last view (the replicas
	// end their streams within the store timeout); etcd back: the replicas serve again
	// within the lease TTL plus 5 s, and one change through the API (a drain of b3 and g3)
	// reaches every tier: the ADS nodes within their backoff's ceiling (read from their
	// stream ends) plus the push slack, grpc-go within its reconnect bound.
	tp.phase("every etcd member stopped, then back", func(t *testing.T) {
		ends := map[string]int{}
		for _, n := range adsNodes {
			ends[n], _ = strconv.Atoi(seriesValue(adsMetrics(n), "stickylb_xds_stream_ends_total"))
		}
		for _, m := range rg.etcd.Members() {
			m.Kill()
		}
		down := time.Now()
		testwait.For(t, rpStoreTimeout+time.Second+faPushSlack, "every ADS node's stream ended", func() (bool, string) {
			for _, n := range adsNodes {
				if connected(n) {
					return false, n + " connected"
				}
			}
			return true, ""
		})
		t.Logf("every ADS node's stream ended %s after etcd stopped", time.Since(down).Round(time.Millisecond))
		if ok, saw := servesOnly([]string{"b1", "b3"}, []string{"g1", "g3"})(); !ok {
			t.Fatalf("with etcd down: %s", saw)
		}
		rg.etcd.RestartAll(t)
		back := time.Now()
		outage := back.Sub(down)
		live := []string{"r2", "r3"}
		testwait.For(t, rpTTL+5*time.Second, "the replicas serve again", func() (bool, string) {
			for _, r := range live {
				if v := rg.metric(r, "stickylb_xds_serving"); v != "1" {
					return false, r + "=" + v
				}
			}
			return true, ""
		})
		t.Logf("the replicas serve again %s after etcd answered (outage %s; no leader for up to the lease TTL)", time.Since(back).Round(time.Millisecond), outage.Round(time.Millisecond))
		if ok, saw := servesOnly([]string{"b1", "b3"}, []string{"g1", "g3"})(); !ok {
			t.Fatalf("once etcd is back: %s", saw)
		}
		drained := time.Now()
		for _, c := range [][]string{{"drain", "spread", rpHosts["b3"] + ":80"}, {"drain", "rpc", fmt.Sprintf("%s:%d", rpHosts["g3"], faGRPCPort)}} {
			if out, err := rg.ctl("r3", c...); err != nil {
				t.Fatalf("ctl %v: %v\n%s", c, err, out)
			}
		}
		by := back
		for _, n := range adsNodes {
			e, _ := strconv.Atoi(seriesValue(adsMetrics(n), "stickylb_xds_stream_ends_total"))
			by = maxTime(by, back.Add(adsReconnectBound((e-ends[n])/3+2)+faPushSlack))
		}
		by = maxTime(by, back.Add(grpcReconnectBound(outage)+faPushSlack))
		by = maxTime(by, drained.Add(faPushSlack))
		testwait.For(t, time.Until(by), "every tier drains b3 and g3", servesOnly([]string{"b1"}, []string{"g1"}))
		t.Logf("the drain reached every tier %s after the API call (bound %s)", time.Since(drained).Round(time.Millisecond), by.Sub(drained).Round(time.Millisecond))
	})

	// The API refuses what it must and changes nothing then: two PUTs of the file with one
	// If-Match give one success and one 409; a weight of 0 is a 400 naming the path; a
	// wrong token and no credentials are 401s.
	tp.phase("the change API", func(t *testing.T) {
		revision := func() string {
			out, err := rg.ctl("r3", "pools-get")
			if err != nil {
				t.Fatalf("pools-get: %v\n%s", err, out)
			}
			return out[strings.LastIndex(out, "revision "):]
		}
		before := revision()
		rev := strings.Fields(before)[1]
		pools := filepath.Join(rg.dir, "put.yaml")
		tp.writeFile(pools, rpPools([]string{"b1", "b3"}, []string{"g1", "g3"}))
		outs := make([]string, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, r := range []string{"r2", "r3"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				outs[i], errs[i] = rg.ctl(r, "pools-put", pools, "--if-match", rev)
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
		out, err := rg.ctl("r3", "weight", "spread", rpHosts["b1"]+":80", "0")
		if want := "services[spread].backends[" + rpHosts["b1"] + ":80].weight: 0"; err == nil || !strings.Contains(out, "400") || !strings.Contains(out, want) {
			t.Fatalf("weight 0: %v\n%s", err, out)
		}
		bad := exec.Command("ip", "netns", "exec", rg.tp.kit.Name("r3"), rg.bin, "ctl", "--api", "http://"+rpAPI,
			"--token-file", filepath.Join(rg.dir, "badtoken"), "drain", "spread", rpHosts["b1"]+":80")
		if out, err := bad.CombinedOutput(); err == nil || !strings.Contains(string(out), "401") {
			t.Fatalf("a wrong token: %v\n%s", err, out)
		}
		var resp string
		tp.inNS("r3", func() { resp = rawRequest(t, rpAPI, "POST /v1/services/spread/backends/"+rpHosts["b1"]+":80/drain") })
		if !strings.HasPrefix(resp, "HTTP/1.1 401") {
			t.Fatalf("no credentials: %q", resp)
		}
		if after := revision(); after != before {
			t.Fatalf("refused requests changed the file: %s -> %s", before, after)
		}
		m := httpBody(fmt.Sprintf("http://%s:%d/metrics", rpHosts["r3"], rpAdminPort))
		for _, want := range []string{`stickylb_xds_api_changes_total{op="backend_put",result="invalid"} 1`, `stickylb_xds_api_changes_total{op="backend_drain",result="unauthorized"} 2`} {
			if !strings.Contains(m, want) {
				t.Errorf("r3's metrics lack %s", want)
			}
		}
	})
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
