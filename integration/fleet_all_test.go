package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	xdsgrpc "google.golang.org/grpc/xds"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"github.com/stickylb/stickylb/l4xdp"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds"
)

// Every tier on one control plane, with real processes: `stickylb xds` on the host serves
// one pools file with two services — "spread", a TCP VIP forwarded by two
// `stickylb xdp --xds` nodes (lb, lb2, each in its own namespace, in front of backends
// b1..b3 in theirs); "rpc", gRPC, called by a grpc-go xDS client in this process and
// proxied (h2c) by a Caddy built from ./cmd/caddy with `dynamic stickylb_xds`. The
// namespaces share a bridge that a veth joins to the host, so the control plane probes
// every backend and every node reaches it. The gRPC backends listen on the host's
// loopback, each on its own 127.0.0.x address, so one can die alone.
//
// Caddy proxies the gRPC service the grpc-go client calls, so that one set of keys checks
// that the two L7 tiers agree on every backend (a second service in the file no longer stops
// a grpc-go client: TestGRPCClientBesideOtherServices in xds). Caddy hashes the same
// session header (lb_policy header), so each tier maps a key to one backend and the
// outage phases can check that a key keeps its backend.
//
// Every service is health checked on a port of its own (faVIPHealthPort, faGRPCHealth):
// killing a backend closes both its ports; the fail-open phase closes only the health
// ports, so the backends still answer and a tier that fails open is seen to forward.

var faHosts = map[string]string{
	"host": "10.78.0.1", "cl": "10.78.0.10", "cl2": "10.78.0.20", "lb": "10.78.0.2", "lb2": "10.78.0.4",
	"b1": "10.78.0.11", "b2": "10.78.0.12", "b3": "10.78.0.13",
	"g1": "127.0.0.31", "g2": "127.0.0.32", "g3": "127.0.0.33",
}

const (
	// One health check for every service: a dead backend is out of the control plane's
	// view interval x unhealthy_threshold + timeout after it died, at most.
	faInterval  = time.Second
	faTimeout   = 500 * time.Millisecond
	faUnhealthy = 1
	// faPushSlack covers the verdict's way from the checker to every node (one snapshot
	// build, one push per node, the node's apply: milliseconds idle) on two cores shared
	// by the whole CI run, and the check's own round of K sessions per tier.
	faPushSlack = 2 * time.Second
	// faK new sessions per tier and check (the L7 tiers: faK fixed keys, hashed). A backend
	// holding a third of a node's table, ring or hash space is missed by all of them with
	// probability (2/3)^40 < 1e-7; a killed one still in the view shows up likewise.
	faK = 40
	// faPoll is the control plane's --poll of the pools file.
	faPoll = 100 * time.Millisecond
	// faNodeMetrics is where each XDP node serves its metrics, on its namespace's loopback.
	faNodeMetrics = "127.0.0.1:9912"
	// The backoff of the XDP and Caddy nodes' ADS client (adsclient's defaults, which
	// neither overrides): each wait is uniform below a ceiling of 250 ms doubled by every
	// failed attempt, at most 30 s.
	faADSInitial, faADSMax = 250 * time.Millisecond, 30 * time.Second
	// faFirstVerdicts bounds a restarted control plane's first verdicts, which it may wait
	// for before it publishes: a target's first probe starts within min(interval/10, 1 s)
	// and ends within timeout; interval x unhealthy_threshold + timeout states it
	// generously.
	faFirstVerdicts = faInterval*faUnhealthy + faTimeout
	// Ports: the VIP's and its health port in the namespaces; the host backends' data and
	// health ports (the same on each 127.0.0.x address).
	faVIPPort, faVIPHealthPort = 80, 81
	faGRPCPort, faGRPCHealth   = 18190, 18191
	faCPPort                   = 18170
)

// faPools is the control plane's pools file over the given backends of each service.
func faPools(vip, rpc []string) string { return twoServicePools(faHosts, faUnhealthy, vip, rpc) }

// twoServicePools is a pools file of the fleet tests' two services, "spread" (a TCP VIP) and
// "rpc" (gRPC), over the given backends, named in hosts, each service checked on a port of
// its own every faInterval, down after unhealthy failures.
func twoServicePools(hosts map[string]string, unhealthy int, vip, rpc []string) string {
	var b strings.Builder
	hc := func(port int) string {
		return fmt.Sprintf("    health_check: {protocol: tcp, port: %d, interval: %s, timeout: %s, healthy_threshold: 1, unhealthy_threshold: %d}\n",
			port, faInterval, faTimeout, unhealthy)
	}
	b.WriteString("services:\n")
	fmt.Fprintf(&b, "  - name: spread\n    protocol: tcp\n    vip: %q\n    affinity: {mode: none}\n    balance: maglev\n", fmt.Sprintf("%s:%d", vip4, faVIPPort))
	b.WriteString(hc(faVIPHealthPort) + "    backends:\n")
	for _, h := range vip {
		fmt.Fprintf(&b, "      - {address: \"%s:%d\"}\n", hosts[h], faVIPPort)
	}
	b.WriteString("  - name: rpc\n    protocol: grpc\n    affinity: {mode: header, header: {name: x-session}}\n    balance: ring_hash\n    hash: {min_ring_size: 1024, max_ring_size: 4096}\n")
	b.WriteString(hc(faGRPCHealth) + "    backends:\n")
	for _, h := range rpc {
		fmt.Fprintf(&b, "      - {address: \"%s:%d\"}\n", hosts[h], faGRPCPort)
	}
	return b.String()
}

// newFleetAllTopo is the fleet test's bridge (own prefix and subnet, so both can run on one
// machine) plus a veth from the host onto it.
func newFleetAllTopo(t *testing.T) *topo {
	tp := newLAN(t, lan{
		prefix: "sla",
		hosts:  []string{"cl", "cl2", "lb", "lb2", "b1", "b2", "b3"},
		v4:     func(h string) string { return faHosts[h] },
		via:    map[string]string{"cl": "lb", "cl2": "lb2"},
	})
	hostOnBridge(tp, "slah0", faHosts["host"])
	return tp
}

// hostOnBridge joins the host to the test's bridge by a veth named ifName (deleted with the
// bridge's namespace; deleted first too, in case a killed run left it) holding addrs.
func hostOnBridge(tp *topo, ifName string, addrs ...string) {
	kit := tp.kit
	_ = exec.Command("ip", "link", "del", ifName).Run()
	kit.Run("ip", "link", "add", ifName, "type", "veth", "peer", "name", "vhost", "netns", kit.Name("br"))
	tp.t.Cleanup(func() { _ = exec.Command("ip", "link", "del", ifName).Run() })
	for _, a := range addrs {
		kit.Run("ip", "addr", "add", a+"/24", "dev", ifName)
	}
	kit.Run("ip", "link", "set", ifName, "up")
	tp.in("br", "ip", "link", "set", "vhost", "up")
	tp.in("br", "ip", "link", "set", "vhost", "master", "br0")
}

// faListener listens on addr and closes whatever connects: a health port.
func faListener(t *testing.T, addr string) *loopback.Server {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return loopback.AcceptAndClose(t, ln)
}

// faGRPCBackend answers health Checks, naming itself in a response header.
type faGRPCBackend struct {
	healthpb.UnimplementedHealthServer
	name string
}

func (b *faGRPCBackend) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	grpc.SetHeader(ctx, metadata.Pairs("backend", b.name))
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func faGRPC(t *testing.T, name, ip string) *grpc.Server {
	t.Helper()
	ln, err := net.Listen("tcp", fmt.Sprintf("%s:%d", ip, faGRPCPort))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, &faGRPCBackend{name: name})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return srv
}

// faBackend is one backend of any tier: stopping data ends its service, closing health
// fails its checks.
type faBackend struct {
	data   func()
	health *loopback.Server
}

func (b *faBackend) kill() { b.data(); b.health.Close() }

// adsReconnectBound is the longest an ADS node waits before its next attempt once its
// stream has ended ends times since it last was healthy (the first end resets the backoff,
// every later one doubles the ceiling).
func adsReconnectBound(ends int) time.Duration {
	c := faADSInitial
	for i := 1; i < ends && c < faADSMax; i++ {
		c *= 2
	}
	return min(c, faADSMax)
}

// adsReconnectBy is when, at the latest, an ADS node whose stream ended ended times during
// a control plane's outage is connected again to the control plane restarted at restarted:
// one more attempt may have ended as the port opened, so its pending wait is at most the
// backoff's ceiling after ended+1 ends, plus the push slack.
func adsReconnectBy(restarted time.Time, ended int) time.Time {
	return restarted.Add(adsReconnectBound(ended+1) + faPushSlack)
}

// tableBackends is the set of names in a VIP's table ("" among them when a slot is empty).
func tableBackends(vt l4xdp.VIPTable) map[string]bool {
	in := map[string]bool{}
	for _, n := range vt.Table {
		in[n] = true
	}
	return in
}

// grpcReconnectBound bounds how long grpc-go takes to reach a control plane back after an
// outage of d. It backs off by gRPC's defaults (1 s, x1.6 per failure, +-20% jitter, at
// most 120 s): the wait pending when the server returns, the n-th, began within d of the
// first failure after waits summing to at least 0.8 s x (1.6^n - 1) / 0.6, so it is at
// most 1.2 s x 1.6^n <= 0.9 d + 1.2 s. Two such backoffs follow each other: the channel's
// reconnect, w, then the ADS stream's retry, whose pending wait began within d + w of its
// first failure.
func grpcReconnectBound(d time.Duration) time.Duration {
	pending := func(d time.Duration) time.Duration {
		return min(time.Duration(0.9*float64(d))+1200*time.Millisecond, 120*time.Second)
	}
	w := pending(d)
	return w + pending(d+w)
}

// seriesValue is the value of series (a metric's name, or its name and labels) in a
// Prometheus text exposition, "absent" when it has none.
func seriesValue(body, series string) string {
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, series+" ") || (!strings.Contains(series, "{") && strings.HasPrefix(l, series+"{")) {
			return l[strings.LastIndex(l, " ")+1:]
		}
	}
	return "absent"
}

// httpBody is the body of GET url, or the error.
func httpBody(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// TestFleetAllTiers: one control plane, every tier (two XDP nodes, Caddy, a grpc-go xDS
// client) follows its edits and verdicts within the stated bounds, keeps serving its last
// view through the control plane's outage (Caddy and one XDP node restarted meanwhile),
// reconnects and converges when it is back, and fails open with it. One phase after another
// on one rig (each phase a subtest; a failed phase stops the rest; run alone, a phase runs
// the phases it needs first).
// CI: about 30 s (stickylb's build, six processes, eight namespaces); about 50 s run alone,
// when it builds Caddy too.
func TestFleetAllTiers(t *testing.T) {
	r := newFleetAllRig(t)
	r.phases([]rigPhase{
		{"start", nil, r.start},
		{"a backend added by editing the pools file", []string{"start"}, r.backendAdded},
		{"a backend killed", []string{"a backend added by editing the pools file"}, r.backendKilled},
		{"the control plane down: every tier keeps serving", []string{"a backend killed"}, r.cpDownKeepsServing},
		{"Caddy and an XDP node restarted while the control plane is down serve their last view", []string{"the control plane down: every tier keeps serving"}, r.restartsServeLastView},
		{"the control plane back: every tier reconnects and converges", []string{"the control plane down: every tier keeps serving"}, r.cpBack},
		{"every backend of a service down: every tier fails open", []string{"the control plane back: every tier reconnects and converges"}, r.failOpen},
		{"an oversized table is NACKed over the wire and changes nothing", []string{"start"}, r.oversizedNACKed},
	})
}

// fleetAllRig is TestFleetAllTiers' rig: the network, the control plane, the XDP nodes,
// Caddy and the grpc-go client, the backends, and what the outage phases record before the
// control plane goes down.
type fleetAllRig struct {
	*topo
	bin, pools, dir string
	cpAddr          string // the control plane's ADS address
	adminAddr       string // its admin (metrics) address
	cpRuns          int    // how many times the control plane was started
	killCP          func() // kills the running control plane, as a crash would
	backends        map[string]*faBackend
	nodes           map[string]*loaderProc // the XDP nodes, lb and lb2
	// Caddy: its Caddyfile and environment, its process, and where it serves.
	caddyfile, caddyEnv     string
	caddy                   *exec.Cmd
	caddyAddr, caddyMetrics string
	// cc: the grpc-go xDS client's connection; caddyCC: the gRPC connection to Caddy.
	cc, caddyCC *grpc.ClientConn
	// What each tier served just before the control plane's outage: the L7 tiers' key to
	// backend, the XDP nodes' tables and an open DR flow through each; each ADS node's
	// stream ends before it, and when it began.
	keysBefore   map[string]map[string]string
	tablesBefore map[string]map[string]l4xdp.VIPTable
	outageFlows  map[string]*vconn
	endsBase     map[string]int
	cpDown       time.Time
}

// The tiers in the order the checks run them, the ADS nodes among them, and the client
// namespace in front of each XDP node.
var (
	faTierOrder = []string{"lb", "lb2", "caddy", "grpc"}
	faADSNodes  = []string{"lb", "lb2", "caddy"}
	faClientOf  = map[string]string{"lb": "cl", "lb2": "cl2"}
)

func newFleetAllRig(t *testing.T) *fleetAllRig {
	tp, bin, pools := startXDPTest(t, newFleetAllTopo)
	builtCaddy(t)
	dir := filepath.Dir(pools)
	r := &fleetAllRig{topo: tp, bin: bin, pools: pools, dir: dir,
		cpAddr:    fmt.Sprintf("%s:%d", faHosts["host"], faCPPort),
		adminAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		backends:  map[string]*faBackend{}, nodes: map[string]*loaderProc{},
		caddyfile: filepath.Join(dir, "Caddyfile"), caddyEnv: "XDG_DATA_HOME=" + filepath.Join(dir, "data"),
		caddyAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t)), caddyMetrics: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		keysBefore: map[string]map[string]string{}, tablesBefore: map[string]map[string]l4xdp.VIPTable{},
		outageFlows: map[string]*vconn{}, endsBase: map[string]int{}}
	tp.root.Cleanup(func() {
		if r.caddyCC != nil {
			r.caddyCC.Close()
		}
	})
	return r
}

// startCP runs the control plane (each run logging to a file of its own) and returns what
// kills it, as a crash would.
func (r *fleetAllRig) startCP() (kill func()) {
	r.cpRuns++
	run := r.cpRuns
	cmd := exec.Command(r.bin, "xds", "--pools", r.pools, "--listen", r.cpAddr, "--poll", faPoll.String(), "--admin", r.adminAddr)
	logf, err := os.Create(filepath.Join(r.dir, fmt.Sprintf("xds-%d.log", run)))
	if err != nil {
		r.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	kill = func() {
		_ = cmd.Process.Kill()
		<-done
	}
	r.root.Cleanup(func() {
		kill()
		if r.root.Failed() {
			b, _ := os.ReadFile(logf.Name())
			r.root.Logf("stickylb xds log (run %d):\n%s", run, b)
		}
	})
	waitPort(r.t, r.cpAddr, 30*time.Second)
	return kill
}

// startNode runs XDP node lb, subscribed to the control plane at server.
func (r *fleetAllRig) startNode(lb, server string) {
	r.nodes[lb] = r.startProc(lb, "", r.bin, "xdp", "--xds", server, "--iface", "eth0", "--mode", "native",
		"--pin-root", r.pinRoot(lb), "--node-id", lb+"/xdp/eth0", "--metrics", faNodeMetrics)
}

// tables are XDP node lb's tables, from its pinned maps.
func (r *fleetAllRig) tables(lb string) (map[string]l4xdp.VIPTable, error) {
	return l4xdp.PinnedTables(l4xdp.Config{Iface: "eth0", PinRoot: r.pinRoot(lb)})
}

// sameTables: both XDP nodes hold equal tables (as backend names), over want.
func (r *fleetAllRig) sameTables(want ...string) (bool, string) {
	a, errA := r.tables("lb")
	b, errB := r.tables("lb2")
	if errA != nil || errB != nil {
		return false, fmt.Sprint(errA, errB)
	}
	if !reflect.DeepEqual(a, b) {
		return false, "the nodes' tables differ"
	}
	in, wantSet := tableBackends(a["spread"]), map[string]bool{}
	for _, h := range want {
		wantSet[fmt.Sprintf("spread/%s:%d", faHosts[h], faVIPPort)] = true
	}
	return reflect.DeepEqual(in, wantSet), fmt.Sprintf("table over %v, want %v", in, wantSet)
}

// panicGauge is the control plane's stickylb_panic of service.
func (r *fleetAllRig) panicGauge(service string) string {
	return seriesValue(httpBody("http://"+r.adminAddr+"/metrics"), fmt.Sprintf("stickylb_panic{service=%q}", service))
}

// adsMetric reads a series of the ADS client of an XDP node (lb, lb2) or of Caddy.
func (r *fleetAllRig) adsMetric(node, name string) string {
	if node == "caddy" {
		return seriesValue(httpBody("http://"+r.caddyMetrics+"/metrics"), name)
	}
	return seriesValue(r.get(node, faNodeMetrics, "/metrics"), name)
}

// allConnected: every ADS node's stickylb_xds_connected is want.
func (r *fleetAllRig) allConnected(want string) func() (bool, string) {
	return func() (bool, string) {
		var saw []string
		for _, n := range faADSNodes {
			if v := r.adsMetric(n, "stickylb_xds_connected"); v != want {
				saw = append(saw, n+"="+v)
			}
		}
		return len(saw) == 0, strings.Join(saw, " ")
	}
}

// ends is ADS node node's stream ends so far.
func (r *fleetAllRig) ends(node string) int {
	n, _ := strconv.Atoi(r.adsMetric(node, "stickylb_xds_stream_ends_total"))
	return n
}

// dialCaddy opens the gRPC connection to Caddy (again after Caddy's restart, rather than
// wait for the old one's reconnect backoff).
func (r *fleetAllRig) dialCaddy() {
	if r.caddyCC != nil {
		r.caddyCC.Close()
	}
	var err error
	if r.caddyCC, err = grpc.NewClient("passthrough:///"+r.caddyAddr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		r.t.Fatal(err)
	}
}

// startCaddy runs Caddy and connects to it; the view it saves lives in its data directory,
// which a restart keeps.
func (r *fleetAllRig) startCaddy() {
	r.caddy = runCaddy(r.root, r.caddyfile, r.caddyEnv)
	waitPort(r.t, r.caddyAddr, 30*time.Second)
	waitPort(r.t, r.caddyMetrics, 30*time.Second)
	r.dialCaddy()
}

// l7 are the gRPC tiers' connections: Caddy's, and the grpc-go xDS client's.
func (r *fleetAllRig) l7() map[string]**grpc.ClientConn {
	return map[string]**grpc.ClientConn{"caddy": &r.caddyCC, "grpc": &r.cc}
}

// keys sends the K fixed keys through *cc (ring_hash keys to the xDS client, header hash
// keys to Caddy): the backend of each.
func (r *fleetAllRig) keys(cc **grpc.ClientConn) (map[string]string, error) {
	got := map[string]string{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range faK {
		key := fmt.Sprintf("key-%02d", i)
		var hdr metadata.MD
		kctx := metadata.AppendToOutgoingContext(ctx, "x-session", key)
		if _, err := healthpb.NewHealthClient(*cc).Check(kctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr)); err != nil {
			return got, fmt.Errorf("%s: %w", key, err)
		}
		got[key] = strings.Join(hdr.Get("backend"), ",")
	}
	return got, nil
}

// sessions are a tier's K new sessions, counted by backend; an error when one fails.
func (r *fleetAllRig) sessions(tier string) (map[string]int, error) {
	if cl, ok := faClientOf[tier]; ok {
		return r.reaches(cl, faK)
	}
	m, err := r.keys(r.l7()[tier])
	got := map[string]int{}
	for _, b := range m {
		got[b]++
	}
	return got, err
}

// servesOnly: every tier's K sessions succeed, each on one of its want backends.
func (r *fleetAllRig) servesOnly(vip, rpc []string) func() (bool, string) {
	return tiersServeOnly(r.sessions, vip, rpc)
}

// tiersServeOnly: every tier's sessions (backend -> count, as sessions gives them) succeed,
// the XDP nodes' on vip's backends only, Caddy's and the grpc-go client's on rpc's.
func tiersServeOnly(sessions func(tier string) (map[string]int, error), vip, rpc []string) func() (bool, string) {
	want := map[string][]string{"lb": vip, "lb2": vip, "caddy": rpc, "grpc": rpc}
	return func() (bool, string) {
		for _, tier := range faTierOrder {
			got, err := sessions(tier)
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

// lastView: the named tiers serve as just before the outage. A tier that lost its view, or
// its verdicts (b1 and g1 are down and still in the file), would show it: a key elsewhere,
// a session to a dead backend.
func (r *fleetAllRig) lastView(only ...string) (bool, string) {
	for _, tier := range only {
		if cc, ok := r.l7()[tier]; ok {
			got, err := r.keys(cc)
			if err != nil {
				return false, fmt.Sprintf("%s: %v", tier, err)
			}
			if !reflect.DeepEqual(got, r.keysBefore[tier]) {
				return false, fmt.Sprintf("%s: keys on %v, before %v", tier, got, r.keysBefore[tier])
			}
			continue
		}
		tb, err := r.tables(tier)
		if err != nil {
			return false, fmt.Sprintf("%s: %v", tier, err)
		}
		if !reflect.DeepEqual(tb, r.tablesBefore[tier]) {
			return false, fmt.Sprintf("%s: tables %v, before %v", tier, tb, r.tablesBefore[tier])
		}
		seen, err := r.reaches(faClientOf[tier], faK)
		if err != nil || seen["b1"] != 0 {
			return false, fmt.Sprintf("%s: new connections %v %v", tier, seen, err)
		}
		if err := r.outageFlows[tier].echo(); err != nil {
			return false, fmt.Sprintf("%s: the DR flow to %s: %v", tier, r.outageFlows[tier].backend, err)
		}
	}
	return true, ""
}

func (r *fleetAllRig) start(t *testing.T) {
	r.readyNodes(r.bin, "lb", "lb2")
	for _, h := range []string{"b1", "b2", "b3"} {
		data, hc := r.serve(h, faVIPPort), r.serve(h, faVIPHealthPort)
		r.backends[h] = &faBackend{data: data.Close, health: hc}
	}
	for _, g := range []string{"g1", "g2", "g3"} {
		gs := faGRPC(r.root, g, faHosts[g])
		r.backends[g] = &faBackend{data: gs.Stop, health: faListener(r.root, fmt.Sprintf("%s:%d", faHosts[g], faGRPCHealth))}
	}
	r.writeFile(r.pools, faPools([]string{"b1", "b2"}, []string{"g1", "g2"}))
	r.killCP = r.startCP()
	r.startNode("lb", r.cpAddr)
	r.startNode("lb2", r.cpAddr)

	r.writeFile(r.caddyfile, fmt.Sprintf(`{
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
			server  %s
			service rpc
			node_id fleet/caddy
			allow_loopback
		}
		lb_policy header x-session
		transport http {
			versions h2c
		}
	}
}
http://%s {
	metrics
}
`, r.caddyAddr, r.cpAddr, r.caddyMetrics))
	r.startCaddy()

	bootstrap := fmt.Sprintf(`{"xds_servers":[{"server_uri":%q,"channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],"node":{"id":"fleet/grpc","locality":{"zone":"zone-a"}}}`, r.cpAddr)
	rb, err := xdsgrpc.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	if r.cc, err = grpc.NewClient("xds:///rpc", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(rb)); err != nil {
		t.Fatal(err)
	}
	r.root.Cleanup(func() { r.cc.Close() })

	// The first view and the first verdicts (Unknown routes too).
	testwait.For(t, 15*time.Second, "every tier serves its two backends", r.servesOnly([]string{"b1", "b2"}, []string{"g1", "g2"}))
	testwait.For(t, 2*time.Second, "identical XDP tables over b1, b2", func() (bool, string) { return r.sameTables("b1", "b2") })
	testwait.For(t, 5*time.Second, "every ADS node connected", r.allConnected("1"))
}

// One edit adds a backend to each service: within 2 s every tier sends one of K new
// sessions to it.
func (r *fleetAllRig) backendAdded(t *testing.T) {
	added := map[string]string{"lb": "b3", "lb2": "b3", "caddy": "g3", "grpc": "g3"}
	got := map[string]bool{}
	edited := time.Now()
	r.writeFile(r.pools, faPools([]string{"b1", "b2", "b3"}, []string{"g1", "g2", "g3"}))
	testwait.For(t, 2*time.Second-time.Since(edited), "every tier sends new sessions to the added backends", func() (bool, string) {
		for _, tier := range faTierOrder {
			if got[tier] {
				continue
			}
			seen, err := r.sessions(tier)
			if err != nil {
				return false, fmt.Sprintf("%s: %v", tier, err)
			}
			if seen[added[tier]] > 0 {
				got[tier] = true
				t.Logf("%s: %s reached %s after the edit", tier, added[tier], time.Since(edited).Round(time.Millisecond))
			}
		}
		return len(got) == len(faTierOrder), fmt.Sprint(got)
	})
	testwait.For(t, 2*time.Second, "identical XDP tables over b1, b2, b3", func() (bool, string) { return r.sameTables("b1", "b2", "b3") })
}

// One backend of each service killed: within interval x unhealthy_threshold + timeout +
// push slack, no tier sends it a new session, and DR flows already open to the other
// backends, through both XDP nodes, keep transferring. g1 dies to the control plane only
// (its health port): grpc-go's ring_hash skips a backend it cannot connect to on its
// own, so a g1 that still answers is what shows the control plane's verdict reached the
// gRPC tiers (a session sent to it would name it). b1 dies whole: a connection sent to
// it fails, so K in a row succeeding on b2 and b3 shows it out of both XDP tables.
// It builds on b3 and g3, added by "a backend added by editing the pools file".
func (r *fleetAllRig) backendKilled(t *testing.T) {
	var flows []*vconn
	for _, cl := range []string{"cl", "cl2"} {
		for len(flows) < 2 || (cl == "cl2" && len(flows) < 4) {
			c, err := r.dialVia(cl, fmt.Sprintf("%s:%d", vip4, faVIPPort))
			if err != nil {
				t.Fatal(err)
			}
			if c.backend == "b1" {
				c.c.Close()
				continue
			}
			flows = append(flows, c)
		}
	}
	killed := time.Now()
	r.backends["b1"].kill()
	r.backends["g1"].health.Close()
	bound := faInterval*faUnhealthy + faTimeout + faPushSlack
	testwait.For(t, bound, "no tier sends new sessions to the killed backends",
		r.servesOnly([]string{"b2", "b3"}, []string{"g2", "g3"}))
	t.Logf("killed backends out of every tier's new sessions %s after the kill (bound %s)", time.Since(killed).Round(time.Millisecond), bound)
	for _, f := range flows {
		if err := f.echo(); err != nil {
			t.Fatalf("a DR flow to %s stopped after the kill: %v", f.backend, err)
		}
	}
	if ok, saw := r.sameTables("b2", "b3"); !ok {
		t.Fatalf("XDP tables: %s", saw)
	}
	r.backends["g1"].data()
}

// The control plane's outage: what each tier serves just before it is recorded (lastView),
// the control plane killed, and every tier serves as before. It builds on b1 and g1 killed
// in "a backend killed" (a tier that lost its verdicts would send them sessions).
func (r *fleetAllRig) cpDownKeepsServing(t *testing.T) {
	for tier, cc := range r.l7() {
		m, err := r.keys(cc)
		if err != nil {
			t.Fatalf("%s: %v", tier, err)
		}
		r.keysBefore[tier] = m
	}
	for lb, cl := range faClientOf {
		tb, err := r.tables(lb)
		if err != nil {
			t.Fatal(err)
		}
		r.tablesBefore[lb] = tb
		if r.outageFlows[lb], err = r.dialVia(cl, fmt.Sprintf("%s:%d", vip4, faVIPPort)); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range faADSNodes {
		r.endsBase[n] = r.ends(n)
	}
	r.killCP()
	r.cpDown = time.Now()
	// The stream's end is seen at once (the server's process is gone, its sockets reset).
	testwait.For(t, 5*time.Second, "every ADS node sees the control plane gone", r.allConnected("0"))
	for _, n := range faADSNodes {
		if r.adsMetric(n, "stickylb_xds_last_update_age_seconds") == "absent" {
			t.Fatalf("%s exports no update age", n)
		}
	}
	if ok, saw := r.lastView(faTierOrder...); !ok {
		t.Fatalf("with the control plane down: %s", saw)
	}
}

// Restarted while the control plane is down, lb2 adopts its pinned maps and Caddy
// loads the view it saved: the same keys reach the same backends, lb2's open flow
// keeps its backend, and neither sends a session to b1 or g1.
// It builds on the outage, and on what the phase before it recorded.
func (r *fleetAllRig) restartsServeLastView(t *testing.T) {
	r.nodes["lb2"].stop()
	r.startNode("lb2", r.cpAddr)
	r.endsBase["lb2"] = 0
	_ = r.caddy.Process.Signal(os.Interrupt)
	testwait.For(t, 15*time.Second, "Caddy stopped", func() (bool, string) {
		return !cxPortOpen(r.caddyAddr), "still listening"
	})
	r.startCaddy()
	r.endsBase["caddy"] = 0
	for _, n := range []string{"lb2", "caddy"} {
		if v := r.adsMetric(n, "stickylb_xds_connected"); v != "0" {
			t.Fatalf("%s restarted: stickylb_xds_connected %s with the control plane down", n, v)
		}
	}
	if ok, saw := r.lastView(faTierOrder...); !ok {
		t.Fatalf("after the restarts: %s", saw)
	}
	t.Logf("control plane down %s so far", time.Since(r.cpDown).Round(time.Millisecond))
}

// The control plane back, on the same file and address: every ADS node reconnects
// within its backoff's ceiling (read from its stream ends) plus the push slack, and one
// edit made after the restart (b2 and g2 leave) reaches every tier: the ADS nodes within
// the poll, the control plane's first verdicts and the push slack; the grpc-go client,
// whose backoff is not exported, within its reconnect bound from the restart plus the
// same.
// It builds on the outage "the control plane down" began (when, and each node's stream ends
// before it).
func (r *fleetAllRig) cpBack(t *testing.T) {
	r.killCP = r.startCP()
	restarted := time.Now()
	outage := restarted.Sub(r.cpDown)
	reconnectBy := map[string]time.Time{}
	lastReconnect := restarted
	for _, n := range faADSNodes {
		reconnectBy[n] = adsReconnectBy(restarted, r.ends(n)-r.endsBase[n])
		lastReconnect = maxTime(lastReconnect, reconnectBy[n])
	}
	reconnected := map[string]time.Duration{}
	testwait.For(t, time.Until(lastReconnect), "every ADS node reconnected", func() (bool, string) {
		var saw []string
		for _, n := range faADSNodes {
			if _, ok := reconnected[n]; ok {
				continue
			}
			if v := r.adsMetric(n, "stickylb_xds_connected"); v != "1" {
				saw = append(saw, n+"="+v)
				continue
			}
			reconnected[n] = time.Since(restarted)
		}
		return len(saw) == 0, strings.Join(saw, " ")
	})
	for _, n := range faADSNodes {
		bound := reconnectBy[n].Sub(restarted)
		t.Logf("%s reconnected %s after the restart (bound %s)", n, reconnected[n].Round(time.Millisecond), bound.Round(time.Millisecond))
		if reconnected[n] > bound {
			t.Errorf("%s reconnected %s after the restart, past its bound %s", n, reconnected[n], bound)
		}
	}

	edited := time.Now()
	r.writeFile(r.pools, faPools([]string{"b1", "b3"}, []string{"g1", "g3"}))
	want := map[string]string{"lb": "b3", "lb2": "b3", "caddy": "g3", "grpc": "g3"}
	by := map[string]time.Time{}
	for _, tier := range faTierOrder {
		by[tier] = edited.Add(faPoll + faFirstVerdicts + faPushSlack)
	}
	by["grpc"] = maxTime(by["grpc"], restarted.Add(grpcReconnectBound(outage)+faPoll+faFirstVerdicts+faPushSlack))
	last := edited
	for _, at := range by {
		last = maxTime(last, at)
	}
	took := map[string]time.Duration{}
	testwait.For(t, time.Until(last), "every tier sends every new session to b3 or g3", func() (bool, string) {
		var saw []string
		for _, tier := range faTierOrder {
			if _, ok := took[tier]; ok {
				continue
			}
			got, err := r.sessions(tier)
			if err == nil && len(got) == 1 && got[want[tier]] == faK {
				took[tier] = time.Since(edited)
				continue
			}
			saw = append(saw, fmt.Sprintf("%s: %v %v", tier, got, err))
		}
		return len(saw) == 0, strings.Join(saw, "; ")
	})
	for _, tier := range faTierOrder {
		t.Logf("%s converged %s after the edit (bound %s; the control plane down %s)", tier, took[tier].Round(time.Millisecond),
			by[tier].Sub(edited).Round(time.Millisecond), outage.Round(time.Millisecond))
		if edited.Add(took[tier]).After(by[tier]) {
			t.Errorf("%s converged %s after the edit, past its bound %s", tier, took[tier], by[tier].Sub(edited))
		}
	}
	testwait.For(t, 2*time.Second, "identical XDP tables over b3", func() (bool, string) { return r.sameTables("b3") })
}

// The dead backends leave the file and b2 and g2 return, and every backend's health
// check fails while the backends still serve: the control plane fails open, so every
// tier keeps forwarding to them, and each service's panic gauge is 1.
// It needs the control plane up and every tier connected: after the outage phases, that
// is "the control plane back".
func (r *fleetAllRig) failOpen(t *testing.T) {
	healthy := []string{"b2", "b3", "g2", "g3"}
	r.writeFile(r.pools, faPools([]string{"b2", "b3"}, []string{"g2", "g3"}))
	downAt := time.Now()
	for _, h := range healthy {
		r.backends[h].health.Close()
	}
	bound := faInterval*faUnhealthy + faTimeout + faPushSlack
	testwait.For(t, bound, "every panic gauge at 1", func() (bool, string) {
		var saw []string
		for _, s := range []string{"spread", "rpc"} {
			if g := r.panicGauge(s); g != "1" {
				saw = append(saw, s+"="+g)
			}
		}
		return len(saw) == 0, strings.Join(saw, " ")
	})
	t.Logf("every service in panic %s after its health ports closed", time.Since(downAt).Round(time.Millisecond))
	testwait.For(t, faPushSlack, "every tier forwards to the unhealthy backends",
		r.servesOnly([]string{"b2", "b3"}, []string{"g2", "g3"}))
	// The panic's push reaches the two nodes at two moments, and b2, new to them again,
	// may wait for its MAC (a node waits up to 3 s for the kernel to resolve one): their
	// tables agree within the push slack and that wait.
	testwait.For(t, faPushSlack+3*time.Second, "identical XDP tables over b2, b3 in panic", func() (bool, string) { return r.sameTables("b2", "b3") })
}

// A table the node's maps cannot hold, over the wire: the pools file's validation
// keeps a vip service's table_size within the forwarder's maps, so the view comes from
// the project's xDS server run here on a file edited past that check (as a control
// plane that allows larger tables would send it). lb2, moved to that server, applies
// its first view, NACKs the oversized one with the reason, keeps its tables and
// forwards with them; the server counts one NACK, rolls lb2 back and sends the version
// no more; the next good version is applied.
func (r *fleetAllRig) oversizedNACKed(t *testing.T) {
	const oversized = 131071 // a prime, about twice the maps' l4xdp.MaxTableSize
	file := func(vip []string, tableSize uint64) *pools.File {
		f, err := pools.Parse("pools.yaml", []byte(faPools(vip, []string{"g2", "g3"})))
		if err != nil {
			t.Fatal(err)
		}
		if tableSize != 0 {
			f.Services[0].Hash.TableSize = tableSize // "spread"
		}
		return f
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	healthy := func(string, *pools.Backend) health.State { return health.Healthy }
	// Logs to the whole test: the server's goroutines may log as it stops, after the phase.
	srv := xds.NewServer(ctx, file([]string{"b2", "b3"}, 0), healthy, zaptest.NewLogger(r.root))
	addr := fmt.Sprintf("%s:%d", faHosts["host"], faCPPort+2)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	srv.Register(g)
	go g.Serve(ln)
	defer g.Stop()

	r.nodes["lb2"].stop()
	r.startNode("lb2", addr)
	var good map[string]l4xdp.VIPTable
	// The server's first view is a table over b2 and b3, healthy: what lb2 adopted from its
	// pinned maps (the main control plane's last view) may be another, or this one in panic.
	first := map[string]bool{}
	for _, h := range []string{"b2", "b3"} {
		first[fmt.Sprintf("spread/%s:%d", faHosts[h], faVIPPort)] = true
	}
	testwait.For(t, 5*time.Second, "lb2 applies the first view (b2, b3 healthy)", func() (bool, string) {
		tb, err := r.tables("lb2")
		if err != nil || tb["spread"].Panic || len(tb["spread"].Down) != 0 || !reflect.DeepEqual(tableBackends(tb["spread"]), first) ||
			r.adsMetric("lb2", "stickylb_xds_connected") != "1" {
			return false, fmt.Sprint(tableBackends(tb["spread"]), tb["spread"].Panic, tb["spread"].Down, err)
		}
		good = tb
		return true, ""
	})

	sent := time.Now()
	if err := srv.Update(file([]string{"b2", "b3"}, oversized)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, faPushSlack, "lb2's NACK counted and lb2 rolled back", func() (bool, string) {
		return srv.Stats.NACKs.Load() == 1 && srv.Stats.Rollbacks.Load() == 1,
			fmt.Sprintf("nacks %d rollbacks %d", srv.Stats.NACKs.Load(), srv.Stats.Rollbacks.Load())
	})
	t.Logf("the oversized table NACKed %s after the update", time.Since(sent).Round(time.Millisecond))
	if reason := fmt.Sprintf("table_size %d", oversized); !strings.Contains(r.nodes["lb2"].String(), reason) {
		t.Fatalf("lb2 logged no reason (%q) for its rejection:\n%s", reason, r.nodes["lb2"].String())
	}
	// Bounded observation: a server re-sending the rejected version would be NACKed
	// again within the node's NACK hold (250 ms, doubling), so 1 s would show it.
	settled := srv.Stats.Pushes.Load()
	for watch := time.Now(); time.Since(watch) < time.Second; time.Sleep(20 * time.Millisecond) {
		if n, p := srv.Stats.NACKs.Load(), srv.Stats.Pushes.Load()-settled; n != 1 || p != 0 {
			t.Fatalf("after the NACK: %d NACKs, %d more pushes", n, p)
		}
	}
	if tb, err := r.tables("lb2"); err != nil || !reflect.DeepEqual(tb, good) {
		t.Fatalf("the rejected view changed lb2's tables: %v %v, before %v", tb, err, good)
	}
	if seen, err := r.reaches("cl2", faK); err != nil || seen["b2"] == 0 || seen["b3"] == 0 {
		t.Fatalf("through lb2 after the NACK: %v %v", seen, err)
	}

	if err := srv.Update(file([]string{"b3"}, 0)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, faPushSlack, "lb2 applies the next good version (b3 only)", func() (bool, string) {
		tb, err := r.tables("lb2")
		return err == nil && slices.Equal(slices.Compact(slices.Sorted(slices.Values(tb["spread"].Table))), []string{fmt.Sprintf("spread/%s:%d", faHosts["b3"], faVIPPort)}), fmt.Sprint(tb, err)
	})
}

// maxTime is the later of a and b.
func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
