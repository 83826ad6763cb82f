package integration

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/flowhash"
	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"github.com/stickylb/stickylb/l4xdp"
)

// routedFleet is the L4 fleet behind a router, built in namespaces: client "cl" behind
// router "rt", which runs BIRD 2 and routes the VIPs by ECMP (L4 hash) over the XDP nodes
// lb1..lb5 that announce them over BGP; backends b1..b5 on the nodes' L2 (direct
// routing: they answer the client through the router). All nodes read one pools file.
// Its methods are the events of an LB fleet's day (nodes join, drain, stop, die, lose
// their link, restart gracefully; backends join, leave, drain, die, change weight), for
// the proofs in routed_test.go and for tests that build on them.
type routedFleet struct {
	*topo
	bin, poolsFile, dir string
	bird                *loaderProc

	mu       sync.Mutex
	nodes    map[string]*fleetNode
	servers  map[string]*loopback.Server
	members  []string          // the backends in the pools file, in order
	weights  map[string]int    // their weights (absent: 1)
	drained  map[string]bool   // drained in the pools file
	dead     map[string]bool   // backends whose server is killed
	log      []fleetEvent      // every event, for attributing broken connections
	extra    map[string]string // per node: a pools file of its own (instead of the fleet's)
	extraArg map[string][]string
	// poolsFor writes the fleet's pools file from its members, weights and drains
	// (routedPools when nil: direct routing to the LAN's backends).
	poolsFor func(members []string, weights map[string]int, drained map[string]bool) string
	xds      map[string]string // per node: the control plane it takes its view from (instead of the pools file)
}

// fleetNode is one XDP node of the fleet.
type fleetNode struct {
	name string
	proc *loaderProc // nil while stopped
	// graceful: started with --bgp-graceful-restart.
	graceful bool
	drained  bool
	linkDown bool
}

// fleetEvent is one change of the fleet: its kind (e.g. "node kill", "backend add") and
// whether it changes an LB node (the set the router spreads over) or a backend (the
// tables), from when it was made until the fleet settled after it (the routes and tables
// change in between, not at once).
type fleetEvent struct {
	at, settled time.Time
	kind        string
	target      string
	node        bool
}

// Addresses: the LAN 10.77.0.0/24 (fd77::/64), the client's side 10.79.0.0/24 (fd79::/64).
var routedHosts = map[string]string{"rt": "1", "b1": "11", "b2": "12", "b3": "13", "b4": "14", "b5": "15",
	"lb1": "21", "lb2": "22", "lb3": "23", "lb4": "24", "lb5": "25"}

const (
	routerASN = 65000
	nodeASN   = 65001
	// routedHold is the nodes' --bgp-hold: a node gone silent leaves the router's table
	// within it.
	routedHold = 3 * time.Second
	// routedDrainTime is the nodes' --drain-time.
	routedDrainTime = 3 * time.Second
	// routeSlack is what a route change takes beyond BGP's own timers: an UPDATE, BIRD's
	// best-path run and its kernel sync, the 20 ms polls of the check (generous for a
	// loaded 2-core machine).
	routeSlack = 2 * time.Second
)

func routed4(h string) string { return "10.77.0." + routedHosts[h] }
func routed6(h string) string { return "fd77::" + routedHosts[h] }

// newRoutedFleet builds the network, starts BIRD and the backends' echo servers, and
// writes the pools file over backends (no node runs yet). Skipped under -short.
func newRoutedFleet(t *testing.T, backends ...string) *routedFleet {
	if _, err := os.Stat("/usr/sbin/bird"); err != nil {
		t.Skip("BIRD 2 is not installed (scripts/test.sh installs bird2)")
	}
	hostsOrder := []string{"rt", "b1", "b2", "b3", "b4", "b5", "lb1", "lb2", "lb3", "lb4", "lb5"}
	tp, bin, poolsFile := startXDPTest(t, func(t *testing.T) *topo {
		return newLAN(t, lan{prefix: "slr", hosts: hostsOrder, v4: routed4, v6: routed6})
	})
	rf := &routedFleet{topo: tp, bin: bin, poolsFile: poolsFile, dir: t.TempDir(), nodes: map[string]*fleetNode{},
		servers: map[string]*loopback.Server{}, weights: map[string]int{}, drained: map[string]bool{}, dead: map[string]bool{}, xds: map[string]string{},
		extra: map[string]string{}, extraArg: map[string][]string{}}
	// The client, behind the router.
	tp.kit.AddNS("cl")
	tp.kit.Veth("rt", "eth1", "cl", "eth0")
	tp.in("rt", "ip", "addr", "add", "10.79.0.1/24", "dev", "eth1")
	tp.in("rt", "ip", "addr", "add", "fd79::1/64", "dev", "eth1", "nodad")
	tp.in("cl", "ip", "addr", "add", "10.79.0.10/24", "dev", "eth0")
	tp.in("cl", "ip", "addr", "add", "fd79::10/64", "dev", "eth0", "nodad")
	tp.in("cl", "ip", "route", "add", "default", "via", "10.79.0.1")
	tp.in("cl", "ip", "-6", "route", "add", "default", "via", "fd79::1")
	// The client's frames carry partial checksums, which DR passes on unfilled.
	tp.in("cl", "ethtool", "-K", "eth0", "tx", "off")
	// The router forwards, and hashes flows over ECMP next hops by L4 (5-tuple).
	tp.in("rt", "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1",
		"net.ipv4.fib_multipath_hash_policy=1", "net.ipv6.fib_multipath_hash_policy=1")
	for h := range routedHosts {
		if strings.HasPrefix(h, "b") { // backends answer the client through the router
			tp.in(h, "ip", "route", "add", "default", "via", routed4("rt"))
			tp.in(h, "ip", "-6", "route", "add", "default", "via", routed6("rt"))
		}
	}
	rf.startBIRD()
	for _, h := range []string{"b1", "b2", "b3", "b4", "b5"} {
		rf.servers[h] = tp.serve(h, 80)
	}
	rf.members = slices.Clone(backends)
	rf.writePools()
	return rf
}

// birdConfig is the router's: ECMP over every node's route (merge paths), any AS on the
// LAN as an external peer (dynamic BGP, passive), graceful restart helper, nothing sent
// to the nodes, only host routes taken from them, and a short wait after a failed session
// (BIRD's default, 60 s doubling to 300 s, would keep a node whose hold timer expired out
// for a minute after its link is back).
const birdConfig = `log stderr all;
router id 10.77.0.1;
protocol device { scan time 1; }
protocol kernel kernel4 { ipv4 { import none; export all; }; merge paths on; }
protocol kernel kernel6 { ipv6 { import none; export all; }; merge paths on; }
template bgp lbnode {
	local as 65000;
	graceful restart on;
	error wait time 1, 5;
	debug { states, events }; # the graceful restart's steps, which the tests read
}
protocol bgp nodes4 from lbnode {
	neighbor range 10.77.0.0/24 external;
	dynamic name "node4_";
	ipv4 { import filter { if net.len = 32 then accept; reject; }; export none; };
}
protocol bgp nodes6 from lbnode {
	neighbor range fd77::/64 external;
	dynamic name "node6_";
	ipv6 { import filter { if net.len = 128 then accept; reject; }; export none; };
}
`

// startBIRD runs bird in the router's namespace with the test's own config, control
// socket and pid file.
func (rf *routedFleet) startBIRD() {
	conf := filepath.Join(rf.dir, "bird.conf")
	if err := os.WriteFile(conf, []byte(birdConfig), 0o644); err != nil {
		rf.t.Fatal(err)
	}
	rf.bird = rf.startProc("rt", "Started", "bird", "-f", "-c", conf, "-s", filepath.Join(rf.dir, "bird.ctl"),
		"-P", filepath.Join(rf.dir, "bird.pid"))
}

// birdc runs a BIRD command (for the log of a failed test).
func (rf *routedFleet) birdc(args ...string) string {
	return rf.kit.Run(append([]string{"ip", "netns", "exec", rf.kit.Name("rt"), "birdc", "-s", filepath.Join(rf.dir, "bird.ctl")}, args...)...)
}

// writePools writes the fleet's pools file: TCP services spread (IPv4) and spread6 (IPv6)
// on port 80, Maglev, over the members with their weights and drains.
func (rf *routedFleet) writePools() {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	pools := routedPools
	if rf.poolsFor != nil {
		pools = rf.poolsFor
	}
	rf.writeFile(rf.poolsFile, pools(rf.members, rf.weights, rf.drained))
}

func routedPools(members []string, weights map[string]int, drained map[string]bool) string {
	var b strings.Builder
	b.WriteString("services:\n")
	for _, svc := range []struct{ name, vip string }{{"spread", vip4 + ":80"}, {"spread6", "[" + vip6 + "]:80"}} {
		fmt.Fprintf(&b, "  - name: %s\n    protocol: tcp\n    vip: %q\n    affinity: {mode: none}\n    balance: maglev\n", svc.name, svc.vip)
		b.WriteString("    health_check: {protocol: tcp, interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}\n")
		b.WriteString("    backends:\n")
		for _, h := range members {
			addr := routed4(h) + ":80"
			if svc.name == "spread6" {
				addr = "[" + routed6(h) + "]:80"
			}
			fmt.Fprintf(&b, "      - {address: %q, weight: %d, drain: %v}\n", addr, max(1, weights[h]), drained[h])
		}
	}
	return b.String()
}

// nodeArgs is node lb's command line.
func (rf *routedFleet) nodeArgs(lb string, graceful bool) []string {
	pools := rf.poolsFile
	if p, ok := rf.extra[lb]; ok {
		pools = p
	}
	source := []string{"--pools", pools, "--poll", "100ms"}
	if a := rf.xds[lb]; a != "" {
		source = []string{"--xds", a, "--node-id", lb + "/xdp/eth0"}
	}
	args := append([]string{rf.bin, "xdp"}, source...)
	args = append(args, "--iface", "eth0", "--mode", "native", "--pin-root", rf.pinRoot(lb), "--run-dir", rf.runDir(lb),
		"--metrics", "127.0.0.1:9911",
		"--bgp-asn", strconv.Itoa(nodeASN), "--bgp-peer", routed4("rt")+"@"+strconv.Itoa(routerASN)+","+routed6("rt")+"@"+strconv.Itoa(routerASN),
		"--bgp-hold", routedHold.String(), "--drain-time", routedDrainTime.String(), "--bgp-community", "65001:"+routedHosts[lb])
	if graceful {
		args = append(args, "--bgp-graceful-restart")
	}
	if rf.extraArg[lb] != nil {
		args = append(args, rf.extraArg[lb]...)
	}
	return args
}

// runDir is node lb's --run-dir (its control socket and drain state).
func (rf *routedFleet) runDir(lb string) string { return filepath.Join(rf.dir, "run-"+lb) }

// startNode starts (or restarts) node lb and waits until the router routes the VIPs to it.
func (rf *routedFleet) startNode(lb string, graceful bool) {
	rf.t.Helper()
	rf.mu.Lock()
	n := rf.nodes[lb]
	if n == nil {
		n = &fleetNode{name: lb}
		rf.nodes[lb] = n
		rf.mu.Unlock()
		rf.readyNodes(rf.bin, lb)
		rf.mu.Lock()
	}
	n.graceful = graceful // a drained node stays drained through a restart
	rf.mu.Unlock()
	proc := rf.startProc(lb, "", rf.nodeArgs(lb, graceful)...)
	rf.mu.Lock()
	n.proc = proc
	rf.mu.Unlock()
}

// routeNodes are the nodes the router's route to addr (vip4 or vip6) goes to now.
func (rf *routedFleet) routeNodes(addr string) []string {
	family := "-4"
	if strings.Contains(addr, ":") {
		family = "-6"
	}
	out := rf.kit.For(rf.t).In("rt", "ip", family, "route", "show", addr)
	var nodes []string
	fields := strings.Fields(out)
	for i, f := range fields {
		if f != "via" || i+1 >= len(fields) {
			continue
		}
		hop := fields[i+1]
		for h := range routedHosts {
			if routed4(h) == hop || routed6(h) == hop {
				nodes = append(nodes, h)
			}
		}
	}
	sort.Strings(nodes)
	return nodes
}

// waitRoutes waits until the router spreads both VIPs over exactly nodes, within d, and
// returns how long that took.
func (rf *routedFleet) waitRoutes(t *testing.T, d time.Duration, nodes ...string) time.Duration {
	t.Helper()
	want := slices.Sorted(slices.Values(nodes))
	return testwait.Until(t, d, 20*time.Millisecond, fmt.Sprintf("the router's routes over %v", want), func() (bool, string) {
		r4, r6 := rf.routeNodes(vip4), rf.routeNodes(vip6)
		return slices.Equal(r4, want) && slices.Equal(r6, want), fmt.Sprintf("IPv4 over %v, IPv6 over %v", r4, r6)
	})
}

// routed lists the nodes that should be routed now: running, not drained, link up.
func (rf *routedFleet) routed() []string {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	var out []string
	for name, n := range rf.nodes {
		if n.proc != nil && !n.drained && !n.linkDown && rf.extra[name] == "" {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// tables reads node lb's pinned tables, as backend names per row.
func (rf *routedFleet) tables(lb string) (map[string]l4xdp.VIPTable, error) {
	return l4xdp.PinnedTables(l4xdp.Config{Iface: "eth0", PinRoot: rf.pinRoot(lb)})
}

// tablesAgree says whether every routed node holds the same tables (backend names per
// row), and what differs when not.
func (rf *routedFleet) tablesAgree() (bool, string) {
	var first map[string]l4xdp.VIPTable
	var firstName string
	for _, lb := range rf.routed() {
		ts, err := rf.tables(lb)
		if err != nil {
			return false, err.Error()
		}
		if first == nil {
			first, firstName = ts, lb
			continue
		}
		if !reflect.DeepEqual(first, ts) {
			return false, fmt.Sprintf("%s and %s differ (down %v and %v)", firstName, lb, first["spread"].Down, ts["spread"].Down)
		}
	}
	return first != nil, "no routed node"
}

// tablesExpected says whether every routed node's tables hold the backends they should:
// those in the pools file, not drained, alive (when none is, every backend: fail open),
// with the dead ones among the down.
func (rf *routedFleet) tablesExpected() (bool, string) {
	rf.mu.Lock()
	var want, dead []string
	for _, b := range rf.members {
		switch {
		case rf.dead[b]:
			dead = append(dead, b)
		case !rf.drained[b]:
			want = append(want, b)
		}
	}
	rf.mu.Unlock()
	slices.Sort(want)
	slices.Sort(dead)
	for _, lb := range rf.routed() {
		ts, err := rf.tables(lb)
		if err != nil {
			return false, err.Error()
		}
		for svc, vt := range ts {
			hosts := func(names []string) []string {
				var out []string
				for _, n := range names {
					if h := hostOf(n); !slices.Contains(out, h) {
						out = append(out, h)
					}
				}
				slices.Sort(out)
				return out
			}
			if in, down := hosts(vt.Table), hosts(vt.Down); len(want) > 0 && !slices.Equal(in, want) || !slices.Equal(down, dead) {
				return false, fmt.Sprintf("%s's %s holds %v with %v down; want %v with %v down", lb, svc, in, down, want, dead)
			}
		}
	}
	return true, ""
}

// vipPackets is node lb's count of packets forwarded for service svc.
func (rf *routedFleet) vipPackets(lb, svc string) uint64 {
	st, err := l4xdp.PinnedStats(l4xdp.Config{Iface: "eth0", PinRoot: rf.pinRoot(lb)})
	if err != nil {
		rf.t.Fatal(err)
	}
	return st.VIPs[svc].Packets
}

// record adds an event to the fleet's log.
func (rf *routedFleet) record(kind, target string, node bool) {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	rf.log = append(rf.log, fleetEvent{at: time.Now(), kind: kind, target: target, node: node})
}

// settled marks the last event's effects over: the fleet is quiet again.
func (rf *routedFleet) settled() {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	if n := len(rf.log); n > 0 {
		rf.log[n-1].settled = time.Now()
	}
}

// The events of a fleet's day. Each changes the fleet and records itself; none waits for
// the router or the tables (waitQuiet does).

// joinNode starts node lb (new, or back after a stop or a kill).
func (rf *routedFleet) joinNode(lb string, graceful bool) {
	rf.record("node join", lb, true)
	rf.startNode(lb, graceful)
}

// drainNode runs `stickylb xdp drain` against node lb.
func (rf *routedFleet) drainNode(lb string) {
	rf.record("node drain", lb, true)
	rf.in(lb, rf.bin, "xdp", "drain", "--iface", "eth0", "--pin-root", rf.pinRoot(lb), "--run-dir", rf.runDir(lb), "--reason", "test")
	rf.mark(lb, func(n *fleetNode) { n.drained = true })
}

// undrainNode runs `stickylb xdp undrain` against node lb.
func (rf *routedFleet) undrainNode(lb string) {
	rf.record("node undrain", lb, true)
	rf.in(lb, rf.bin, "xdp", "undrain", "--iface", "eth0", "--pin-root", rf.pinRoot(lb), "--run-dir", rf.runDir(lb))
	rf.mark(lb, func(n *fleetNode) { n.drained = false })
}

// stopNode sends node lb SIGINT and waits for it to exit (after its drain time).
func (rf *routedFleet) stopNode(lb string) {
	rf.record("node stop", lb, true)
	rf.takeProc(lb).stop()
}

// killNode kills node lb (SIGKILL): its kernel closes the BGP session, its pinned program
// forwards on.
func (rf *routedFleet) killNode(lb string) {
	rf.record("node kill", lb, true)
	rf.takeProc(lb).kill()
}

// takeProc takes node lb's process away from it (it is being stopped).
func (rf *routedFleet) takeProc(lb string) *loaderProc {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	n := rf.nodes[lb]
	proc := n.proc
	n.proc = nil
	return proc
}

// mark changes what the rig knows of node lb.
func (rf *routedFleet) mark(lb string, set func(*fleetNode)) {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	set(rf.nodes[lb])
}

// pullLink takes node lb's link down at the bridge: a silent death, seen by the router
// after the hold time.
func (rf *routedFleet) pullLink(lb string) {
	rf.record("node link pulled", lb, true)
	rf.in("br", "ip", "link", "set", "v"+lb, "down")
	rf.mark(lb, func(n *fleetNode) { n.linkDown = true })
}

// restoreLink brings node lb's link back.
func (rf *routedFleet) restoreLink(lb string) {
	rf.record("node link restored", lb, true)
	rf.in("br", "ip", "link", "set", "v"+lb, "up")
	rf.mark(lb, func(n *fleetNode) { n.linkDown = false })
}

// restartGraceful stops node lb (started with --bgp-graceful-restart) and starts it again.
func (rf *routedFleet) restartGraceful(lb string) {
	rf.record("node graceful restart", lb, true)
	rf.takeProc(lb).stop()
	rf.startNode(lb, true)
}

// addBackend adds backend b to the pools file (its server restarted if it was killed).
func (rf *routedFleet) addBackend(b string) {
	rf.record("backend add", b, false)
	rf.mu.Lock()
	rf.members = append(rf.members, b)
	rf.mu.Unlock()
	rf.writePools()
}

// removeBackend takes backend b out of the pools file: its flows re-pick.
func (rf *routedFleet) removeBackend(b string) {
	rf.record("backend remove", b, false)
	rf.mu.Lock()
	rf.members = slices.DeleteFunc(rf.members, func(m string) bool { return m == b })
	rf.mu.Unlock()
	rf.writePools()
}

// drainBackend sets drain on backend b (or clears it).
func (rf *routedFleet) drainBackend(b string, drain bool) {
	rf.record(map[bool]string{true: "backend drain", false: "backend undrain"}[drain], b, false)
	rf.mu.Lock()
	rf.drained[b] = drain
	rf.mu.Unlock()
	rf.writePools()
}

// setWeight changes backend b's weight.
func (rf *routedFleet) setWeight(b string, w int) {
	rf.record("backend weight", b, false)
	rf.mu.Lock()
	rf.weights[b] = w
	rf.mu.Unlock()
	rf.writePools()
}

// killBackend kills backend b's server (listener and connections): the nodes' checks take
// it out of the tables.
func (rf *routedFleet) killBackend(b string) {
	rf.record("backend kill", b, false)
	rf.mu.Lock()
	s := rf.servers[b]
	rf.dead[b] = true
	rf.mu.Unlock()
	s.Close()
}

// reviveBackend starts backend b's server again: the checks put it back.
func (rf *routedFleet) reviveBackend(b string) {
	rf.record("backend revive", b, false)
	s := rf.serve(b, 80)
	rf.mu.Lock()
	rf.servers[b] = s
	delete(rf.dead, b)
	rf.mu.Unlock()
}

// waitQuiet waits until the router routes the VIPs over the nodes that should carry them
// and every routed node holds the same tables, and tables that are the rig's config (the
// backends in the pools file, not drained, their servers alive, and the dead ones marked
// down: every node has seen the last event's effect, not only agreed on the table before
// it), within d; it reports whether the tables agreed, and what it saw.
func (rf *routedFleet) waitQuiet(t *testing.T, d time.Duration) (bool, string) {
	t.Helper()
	rf.waitRoutes(t, d, rf.routed()...)
	deadline := time.Now().Add(d)
	var seen string
	defer rf.settled()
	for time.Now().Before(deadline) {
		ok, s := rf.tablesAgree()
		if ok {
			ok, s = rf.tablesExpected()
		}
		if ok {
			return true, ""
		}
		seen = s
		time.Sleep(50 * time.Millisecond) // polling the pinned maps
	}
	return false, seen
}

// maglevBackend is the backend the nodes' table names for a TCP flow from src to dst (the
// program's flow hash modulo the table size).
func maglevBackend(table []string, src, dst netip.AddrPort) string {
	return table[flowhash.Sum(src.Addr(), dst.Addr(), src.Port(), dst.Port(), 6, false)%uint32(len(table))]
}

// hostOf is the host a backend name ("spread/10.77.0.11:80", or a tunnel backend's
// "whoami/10.78.0.11:81") is on.
func hostOf(backend string) string {
	for h := range routedHosts {
		if strings.Contains(backend, "/"+routed4(h)+":") || strings.Contains(backend, "/["+routed6(h)+"]:") {
			return h
		}
	}
	for h := range tunnelHosts {
		if strings.Contains(backend, "/"+tunnel4(h)+":") || strings.Contains(backend, "/["+tunnel6(h)+"]:") {
			return h
		}
	}
	return backend
}
