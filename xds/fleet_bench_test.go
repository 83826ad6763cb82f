package xds

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/stickylb/stickylb/adsclient"
	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// BenchmarkFleet: the control plane at fleet scale. FLEET_SUBSCRIBERS (default 10,000)
// nodes of the project's ADS client (adsclient), in FLEET_PROCESSES child processes (default
// 2: this test binary run again, see TestMain), on a pools file of 1,000 http services x
// 100 backends in 3 zones. Each node is a Caddy node (by its user agent) of one of the
// zones that subscribes by name to one service's cluster and endpoints (node i to
// svc-(i mod 1000)), as a node serving one service does: a node subscribing to every
// service is sent all 100,000 backends with every version.
//
// Two arms, one after the other (each holds every connection): arm=stickylb, the project's
// server (xds.Server behind the gRPC options `stickylb xds` serves with), and
// arm=go-control-plane, go-control-plane's own server over a snapshot cache keyed by node
// id, fed the snapshots the project's server builds (built before anything is timed): the
// floor for serving them. Each arm reports
//
//	sync-s            from starting the nodes to the last ACK of both types
//	server-B/sub      the server process's heap and stacks per subscriber, after GC, less
//	                  what it held before any node connected
//	server-MB         the server process's heap and stacks with every node connected
//	client-B/sub      the nodes' processes' heap and stacks per node, less what they held
//	                  before starting them
//	edit-p50/p99-ms   from a pools-file edit (one backend's weight; Update of the parsed
//	                  file, parse-ms apart) to the last node's ACK of both types: translate,
//	                  validate, set 10,000 snapshots, serve, ACK. go-control-plane:
//	                  SetSnapshot of the edited snapshot for every node
//	health-p50/p99-ms the same from one backend's health transition (RecordTransition and
//	                  Refresh, as the checker's callback runs them)
//	                  (FLEET_HEAP=DIR writes each arm's heap profile there at this point)
//	restart-s         from a new server on the same address (the old one stopped, every
//	                  stream cut) to the last ACK of both types: the whole fleet served
//	                  again, the nodes' reconnect backoff included
//
// b.N is the edits, and transitions, of each arm: -benchtime 20x. bench/fleet.sh runs it.
func BenchmarkFleet(b *testing.B) {
	subs := envInt(b, "FLEET_SUBSCRIBERS", 10000)
	procs := envInt(b, "FLEET_PROCESSES", 2)
	start := time.Now()
	files := [2]*pools.File{fleetPools(b, 1), fleetPools(b, 2)}
	parse := time.Since(start) / 2
	for _, arm := range []string{"stickylb", "go-control-plane"} {
		b.Run("arm="+arm, func(b *testing.B) {
			r := &fleetRun{b: b, arm: arm, subs: subs, procs: procs, files: files}
			r.run()
			b.ReportMetric(float64(parse.Milliseconds()), "parse-ms")
		})
	}
}

const (
	fleetServices = 1000
	fleetBackends = 100
	fleetZones    = 3
	// fleetChildEnv, set in a child's environment, makes the test binary run nodes instead
	// of tests (TestMain): the server's address, the first node's number and the count.
	fleetChildEnv = "STICKYLB_FLEET_CHILD"
	// fleetFlipped is the backend whose weight edits change and whose health flips.
	fleetFlipped = "10.0.0.1:8080"
)

func envInt(tb testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

// fleetPools is the benchmark's pools file; w is svc-0's first backend's weight (an edit
// sets the other file).
func fleetPools(tb testing.TB, w int) *pools.File {
	var sb strings.Builder
	sb.WriteString("services:\n")
	for s := range fleetServices {
		fmt.Fprintf(&sb, "  - name: svc-%d\n    protocol: http\n    listen: 0.0.0.0:%d\n    affinity: {mode: header, header: {name: x-session}}\n    balance: maglev\n    backends:\n", s, 20000+s)
		for e := range fleetBackends {
			weight := 1 + e%3
			if s == 0 && e == 0 {
				weight = w
			}
			fmt.Fprintf(&sb, "      - {address: \"10.%d.%d.%d:8080\", weight: %d, zone: zone-%c}\n", s/250, s%250, e+1, weight, 'a'+rune(e%fleetZones))
		}
	}
	return poolstest.Parse(tb, sb.String())
}

// fleetRun is one arm's run.
type fleetRun struct {
	b     *testing.B
	arm   string
	subs  int
	procs int
	files [2]*pools.File

	addr     string
	g        *grpc.Server
	xs       *Server               // arm=stickylb
	cache    cachev3.SnapshotCache // arm=go-control-plane
	scratch  *Server               // arm=go-control-plane: builds its snapshots
	version  int
	acks     fleetAcks
	children []*fleetChild

	mu    sync.Mutex
	state fleetState
}

// fleetState is what a version holds: which file, and whether the flipped backend is down.
type fleetState struct {
	file int
	down bool
}

func (r *fleetRun) run() {
	b := r.b
	b.StopTimer()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.serve(ctx, "127.0.0.1:0")
	defer r.stopChildren()
	// Node 0 first: the server then holds what every node shares (the view), so what the
	// others add is what each of them costs.
	r.startChildren(0, 1)
	r.waitACKs(time.Minute)
	base := heapNow()
	start := time.Now()
	r.startChildren(1, r.subs)
	r.waitACKs(5 * time.Minute)
	b.ReportMetric(time.Since(start).Seconds(), "sync-s")
	r.acks.reset(r.version)
	server := heapNow()
	if dir := os.Getenv("FLEET_HEAP"); dir != "" {
		writeHeapProfile(b, filepath.Join(dir, "fleet-"+r.arm+".heap"))
	}
	b.ReportMetric(float64(server-base)/float64(r.subs-1), "server-B/sub")
	b.ReportMetric(float64(server)/1e6, "server-MB")
	var client int64
	for _, c := range r.children {
		client += c.heap(b)
	}
	b.ReportMetric(float64(client)/float64(r.subs), "client-B/sub")

	var edits, flips []time.Duration
	b.StartTimer()
	for range b.N {
		edits = append(edits, r.push(r.edit))
		flips = append(flips, r.push(r.transition))
	}
	b.StopTimer()
	reportQuantiles(b, "edit", edits)
	reportQuantiles(b, "health", flips)

	// A restart: every stream cut, a new server on the same address.
	r.g.Stop()
	cancel()
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	restart := time.Now()
	r.serve(ctx2, r.addr)
	r.waitACKs(5 * time.Minute)
	b.ReportMetric(time.Since(restart).Seconds(), "restart-s")
	r.g.Stop()
}

// reportQuantiles reports the median and 99th percentile of ds in milliseconds.
func reportQuantiles(b *testing.B, what string, ds []time.Duration) {
	slices.Sort(ds)
	at := func(q float64) float64 { return float64(ds[int(q*float64(len(ds)-1))]) / 1e6 }
	b.ReportMetric(at(0.5), what+"-p50-ms")
	b.ReportMetric(at(0.99), what+"-p99-ms")
}

// push times publishing the next version, with the state change applied, to the last node's
// ACK of both types. The go-control-plane arm's snapshot is built before the clock starts.
func (r *fleetRun) push(change func(*fleetState)) time.Duration {
	r.version++
	r.acks.reset(r.version)
	r.mu.Lock()
	change(&r.state)
	st := r.state
	r.mu.Unlock()
	var snap *cachev3.Snapshot
	if r.xs == nil {
		snap = r.snapshotOf(st)
	}
	start := time.Now()
	if snap != nil {
		r.setAll(snap)
	} else {
		r.publish(st)
	}
	r.waitACKs(2 * time.Minute)
	return time.Since(start)
}

func (r *fleetRun) edit(st *fleetState)       { st.file = 1 - st.file }
func (r *fleetRun) transition(st *fleetState) { st.down = !st.down }

// publish has the project's server publish st: an edit of the file (Update), or a health
// transition of the flipped backend (RecordTransition and Refresh, as the checker's
// callback runs them).
func (r *fleetRun) publish(st fleetState) {
	if r.files[st.file] != r.xs.currentFile() {
		if err := r.xs.Update(r.files[st.file]); err != nil {
			r.b.Fatal(err)
		}
		return
	}
	tr := health.Transition{ID: fleetFlipped, Address: fleetFlipped, To: health.Healthy, From: health.Unhealthy, Healthy: true, At: time.Now()}
	if st.down {
		tr.To, tr.From, tr.Healthy = health.Unhealthy, health.Healthy, false
	}
	r.xs.RecordTransition("svc-0", tr)
	if err := r.xs.Refresh(); err != nil {
		r.b.Fatal(err)
	}
}

// healthView is the servers' health: every backend healthy but the flipped one when down.
func (r *fleetRun) healthView(service string, b *pools.Backend) health.State {
	r.mu.Lock()
	down := r.state.down
	r.mu.Unlock()
	if down && service == "svc-0" && b.Identity() == fleetFlipped {
		return health.Unhealthy
	}
	return health.Healthy
}

// serve starts a fresh server of the arm on addr (a restart starts from nothing).
func (r *fleetRun) serve(ctx context.Context, addr string) {
	b := r.b
	var ln net.Listener
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("listening on %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.addr = ln.Addr().String()
	r.g = grpc.NewServer(append(ServerOptions(), grpc.StreamInterceptor(r.acks.intercept))...)
	r.mu.Lock()
	f := r.files[r.state.file]
	r.mu.Unlock()
	if r.arm == "stickylb" {
		r.version = 1 // a new server starts its versions again
		r.acks.reset(r.version)
		// Every node dials from loopback, one identity, where a real fleet's nodes are
		// hosts of their own: the identity's share is the fleet's.
		r.xs = NewServer(ctx, f, r.healthView, zap.NewNop(), WithMaxNodes(max(r.subs, DefaultMaxNodes)), WithMaxNodesPerIdentity(r.subs))
		r.xs.Register(r.g)
	} else {
		if r.scratch == nil {
			r.scratch = NewServer(ctx, r.files[0], r.healthView, zap.NewNop())
		}
		r.version++
		r.acks.reset(r.version)
		r.cache = cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
		r.mu.Lock()
		st := r.state
		r.mu.Unlock()
		r.setAll(r.snapshotOf(st))
		discoverygrpc.RegisterAggregatedDiscoveryServiceServer(r.g, serverv3.NewServer(ctx, r.cache, nil))
	}
	go func() { _ = r.g.Serve(ln) }()
}

// snapshotOf is the go-control-plane arm's snapshot of st under the current version: what
// the project's server builds for the Caddy view (a scratch server builds it).
func (r *fleetRun) snapshotOf(st fleetState) *cachev3.Snapshot {
	f := r.files[st.file]
	snap, err := r.scratch.build(f, viewNode(caddyView), strconv.Itoa(r.version), r.scratch.freeze(f))
	if err != nil {
		r.b.Fatal(err)
	}
	return snap
}

// setAll sets snap for every node (go-control-plane arm).
func (r *fleetRun) setAll(snap *cachev3.Snapshot) {
	for i := range r.subs {
		if err := r.cache.SetSnapshot(context.Background(), fleetNodeID(i), snap); err != nil {
			r.b.Fatal(err)
		}
	}
}

// waitACKs waits until every node ACKed the current version of both types.
func (r *fleetRun) waitACKs(limit time.Duration) {
	select {
	case <-r.acks.done():
	case <-time.After(limit):
		r.b.Fatalf("version %d: %d (node, type) ACKs after %s, want %d", r.version, r.acks.count(), limit, r.acks.wanted())
	}
}

// startChildren starts nodes from..to-1 in processes of at most subs/procs nodes each; the
// ACKs waited for are those of nodes 0..to-1.
func (r *fleetRun) startChildren(from, to int) {
	per := (r.subs + r.procs - 1) / r.procs
	for ; from < to; from += per {
		n := min(per, to-from)
		r.children = append(r.children, startFleetChild(r.b, r.addr, from, n))
	}
	r.acks.setWant(2 * to)
}

func (r *fleetRun) stopChildren() {
	for _, c := range r.children {
		c.stop()
	}
}

// writeHeapProfile writes the process's heap profile to path (FLEET_HEAP: each arm's, with
// every node connected).
func writeHeapProfile(tb testing.TB, path string) {
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		tb.Fatal(err)
	}
}

// heapNow is the process's heap and stacks in use after a collection.
func heapNow() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}

// fleetAcks counts the (node, type) pairs that ACKed the version waited for.
type fleetAcks struct {
	mu      sync.Mutex
	want    int
	version string
	seen    map[string]uint8 // node -> bit 1 clusters, bit 2 endpoints
	n       int
	ch      chan struct{}
}

func (a *fleetAcks) setWant(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.want = n
	if a.n < n && a.ch != nil {
		select {
		case <-a.ch:
			a.ch = make(chan struct{}) // reached the previous want: wait for the new one
		default:
		}
	}
}

func (a *fleetAcks) reset(version int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.version, a.seen, a.n, a.ch = strconv.Itoa(version), map[string]uint8{}, 0, make(chan struct{})
}

func (a *fleetAcks) done() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ch
}

func (a *fleetAcks) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

func (a *fleetAcks) wanted() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.want
}

func (a *fleetAcks) see(node string, r *discoverygrpc.DiscoveryRequest) {
	if r.GetResponseNonce() == "" || r.GetErrorDetail() != nil {
		return
	}
	bit := uint8(1)
	if r.GetTypeUrl() == resource.EndpointType {
		bit = 2
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.GetVersionInfo() != a.version || a.seen[node]&bit != 0 {
		return
	}
	a.seen[node] |= bit
	if a.n++; a.n == a.want {
		close(a.ch)
	}
}

// intercept sees every request of every stream, with the node its first request named.
func (a *fleetAcks) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, &ackStream{ServerStream: ss, a: a})
}

type ackStream struct {
	grpc.ServerStream
	a    *fleetAcks
	node string
}

func (s *ackStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if r, ok := m.(*discoverygrpc.DiscoveryRequest); ok {
		if r.GetNode().GetId() != "" {
			s.node = r.GetNode().GetId()
		}
		s.a.see(s.node, r)
	}
	return nil
}

// fleetChild is a process of nodes: this test binary run with fleetChildEnv.
type fleetChild struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startFleetChild(tb testing.TB, addr string, from, n int) *fleetChild {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%d", fleetChildEnv, addr, from, n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	c := &fleetChild{cmd: cmd, in: stdin, out: bufio.NewScanner(stdout)}
	c.expect(tb, "started")
	return c
}

// expect reads the child's next line, which must start with word; it returns the rest.
func (c *fleetChild) expect(tb testing.TB, word string) string {
	tb.Helper()
	if !c.out.Scan() {
		tb.Fatalf("a node process ended: %v", c.out.Err())
	}
	rest, ok := strings.CutPrefix(c.out.Text(), word+" ")
	if !ok {
		tb.Fatalf("a node process said %q, want %s", c.out.Text(), word)
	}
	return rest
}

// heap asks the child for its heap and stacks over what it held before its nodes started.
func (c *fleetChild) heap(tb testing.TB) int64 {
	fmt.Fprintln(c.in, "heap")
	n, err := strconv.ParseInt(c.expect(tb, "heap"), 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

func (c *fleetChild) stop() {
	c.in.Close()
	_ = c.cmd.Wait()
}

// fleetNodeID names node i.
func fleetNodeID(i int) string { return "fleet-" + strconv.Itoa(i) }

// runFleetNodes is a child process's life (TestMain): spec is "ADDR,FROM,N", the nodes it
// runs. It says "started N" once they are, answers "heap" with its heap and stacks over
// what it held before them, and ends when its stdin closes.
func runFleetNodes(spec string) int {
	parts := strings.Split(spec, ",")
	if len(parts) != 3 {
		fmt.Fprintf(os.Stderr, "%s=%q: want ADDR,FROM,N\n", fleetChildEnv, spec)
		return 2
	}
	from, err1 := strconv.Atoi(parts[1])
	n, err2 := strconv.Atoi(parts[2])
	if err1 != nil || err2 != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: want ADDR,FROM,N\n", fleetChildEnv, spec)
		return 2
	}
	base := heapNow()
	accept := func(string, map[string]proto.Message) error { return nil }
	for i := from; i < from+n; i++ {
		c, err := adsclient.New(adsclient.Config{Server: parts[0], NodeID: fleetNodeID(i), Zone: fmt.Sprintf("zone-%c", 'a'+rune(i%fleetZones)),
			UserAgentName: fleetview.UserAgentCaddy}, zap.NewNop())
		if err == nil {
			svc := "svc-" + strconv.Itoa(i%fleetServices)
			for _, t := range []string{resource.ClusterType, resource.EndpointType} {
				if err == nil {
					err = c.Subscribe(t, accept, svc)
				}
			}
		}
		if err == nil {
			err = c.Start(context.Background())
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "node %d: %v\n", i, err)
			return 1
		}
	}
	fmt.Printf("started %d\n", n)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "heap" {
			fmt.Printf("heap %d\n", heapNow()-base)
		}
	}
	return 0
}
