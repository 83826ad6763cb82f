package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"github.com/stickylb/stickylb/l4xdp"
)

// One control plane for two XDP nodes: `stickylb xds` serves a pools file from its own
// namespace; two `stickylb xdp --xds` nodes (lb, lb2) in front of the same three backends;
// client cl reaches the VIP through lb, cl2 through lb2. All on one bridge. Needs root.

var fleetHosts = map[string]string{
	"cl": "10.77.0.10", "cl2": "10.77.0.20", "lb": "10.77.0.2", "lb2": "10.77.0.4", "cp": "10.77.0.3",
	"b1": "10.77.0.11", "b2": "10.77.0.12", "b3": "10.77.0.13",
}

// The health check of the fleet test's service, and the slack a verdict has to reach both
// nodes once the control plane has it: a Refresh, one push per node, the node's apply
// (MACs resolved already) — milliseconds on loopback; 1 s states it generously.
const (
	fleetInterval  = time.Second
	fleetTimeout   = 500 * time.Millisecond
	fleetUnhealthy = 1
	pushSlack      = time.Second
)

func newFleetTopo(t *testing.T) *topo {
	return newLAN(t, lan{
		prefix: "slf",
		hosts:  []string{"cl", "cl2", "lb", "lb2", "cp", "b1", "b2", "b3"},
		v4:     func(h string) string { return fleetHosts[h] },
		via:    map[string]string{"cl": "lb", "cl2": "lb2"},
	})
}

// fleetPools is the control plane's pools file: one TCP VIP over the given backends.
func fleetPools(backends ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "services:\n  - name: spread\n    protocol: tcp\n    vip: %q\n    affinity: {mode: none}\n    balance: maglev\n", vip4+":80")
	fmt.Fprintf(&b, "    health_check: {protocol: tcp, interval: %s, timeout: %s, healthy_threshold: 1, unhealthy_threshold: %d}\n",
		fleetInterval, fleetTimeout, fleetUnhealthy)
	b.WriteString("    backends:\n")
	for _, h := range backends {
		fmt.Fprintf(&b, "      - {address: %q}\n", fleetHosts[h]+":80")
	}
	return b.String()
}

// startProc runs bin in namespace ns and waits until its stdout prints "ready" or its
// stderr contains readyLog.
func (tp *topo) startProc(ns, readyLog string, args ...string) *loaderProc {
	t := tp.t
	cmd := exec.Command("ip", append([]string{"netns", "exec", tp.kit.Name(ns)}, args...)...)
	stdout, _ := cmd.StdoutPipe()
	lp := &loaderProc{cmd: cmd, done: make(chan struct{}), log: &strings.Builder{}}
	cmd.Stderr = &lockedWriter{lp}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				close(ready)
			}
		}
	}()
	go func() { cmd.Wait(); close(lp.done) }()
	tp.root.Cleanup(func() {
		lp.stop()
		if tp.root.Failed() {
			tp.root.Logf("%s log:\n%s", ns, lp.String())
		}
	})
	deadline := time.After(30 * time.Second)
	for {
		if readyLog != "" && strings.Contains(lp.String(), readyLog) {
			return lp
		}
		select {
		case <-ready:
			return lp
		case <-lp.done:
			t.Fatalf("%s exited:\n%s", ns, lp.String())
		case <-deadline:
			t.Fatalf("%s not ready:\n%s", ns, lp.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// kill ends a process at once (a control plane that crashes).
func (lp *loaderProc) kill() {
	select {
	case <-lp.done:
		return
	default:
	}
	lp.cmd.Process.Kill()
	<-lp.done
}

// dialVia connects from client namespace ns and reads which backend answered.
func (tp *topo) dialVia(ns, addr string) (*vconn, error) {
	var c net.Conn
	var err error
	tp.inNS(ns, func() { c, err = net.DialTimeout("tcp", addr, 3*time.Second) })
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(3 * time.Second))
	r := bufio.NewReader(c)
	name, err := r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("reading the backend's name: %w", err)
	}
	tp.root.Cleanup(func() { c.Close() })
	return &vconn{c: c, r: r, backend: strings.TrimSpace(name)}, nil
}

// reaches opens n new connections from ns and counts them by backend (a failed dial is an
// error).
func (tp *topo) reaches(ns string, n int) (map[string]int, error) {
	seen := map[string]int{}
	for i := 0; i < n; i++ {
		c, err := tp.dialVia(ns, vip4+":80")
		if err != nil {
			return seen, err
		}
		c.c.Close()
		seen[c.backend]++
	}
	return seen, nil
}

// TestFleetXDPNodes: two XDP nodes fed by one control plane hold the same tables at every
// step, follow its verdicts and edits, and keep forwarding through its outage.
// CI: about 30 s (the build, three processes, eight namespaces).
func TestFleetXDPNodes(t *testing.T) {
	tp, bin, poolsFile := startXDPTest(t, newFleetTopo)
	cpAddr := fleetHosts["cp"] + ":18000"
	servers := map[string]*loopback.Server{}
	nodes := map[string]*loaderProc{}
	startCP := func() *loaderProc {
		return tp.startProc("cp", "serving xDS", bin, "xds", "--pools", poolsFile, "--listen", cpAddr, "--poll", "100ms",
			"--admin", "127.0.0.1:18001")
	}
	startNode := func(lb string) *loaderProc {
		return tp.startProc(lb, "", bin, "xdp", "--xds", cpAddr, "--iface", "eth0", "--mode", "native",
			"--pin-root", tp.pinRoot(lb), "--node-id", lb+"/xdp/eth0", "--metrics", "127.0.0.1:9911")
	}
	tables := func(lb string) (map[string]l4xdp.VIPTable, error) {
		return l4xdp.PinnedTables(l4xdp.Config{Iface: "eth0", PinRoot: tp.pinRoot(lb)})
	}
	// same: both nodes hold equal tables (as backend names), the VIP's table only over want.
	same := func(want ...string) (bool, string) {
		a, errA := tables("lb")
		b, errB := tables("lb2")
		if errA != nil || errB != nil {
			return false, fmt.Sprint(errA, errB)
		}
		if !reflect.DeepEqual(a, b) {
			return false, fmt.Sprintf("lb %d VIPs, lb2 %d VIPs; tables differ (down lb %v, lb2 %v)", len(a), len(b), a["spread"].Down, b["spread"].Down)
		}
		in, wantSet := tableBackends(a["spread"]), map[string]bool{}
		for _, h := range want {
			wantSet["spread/"+fleetHosts[h]+":80"] = true
		}
		return reflect.DeepEqual(in, wantSet), fmt.Sprintf("table over %v, want %v", in, wantSet)
	}
	metric := func(lb, name string) string {
		out := tp.get(lb, "127.0.0.1:9911", "/metrics")
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
				return line[strings.LastIndex(line, " ")+1:]
			}
		}
		return ""
	}
	// ends counts a node's ADS streams that ended (failed attempts included); endsBase is
	// its count before the outage.
	ends := func(lb string) int {
		n, _ := strconv.Atoi(metric(lb, "stickylb_xds_stream_ends_total"))
		return n
	}
	endsBase := map[string]int{}
	var cp *loaderProc

	tp.phase("start", func(t *testing.T) {
		tp.readyNodes(bin, "lb", "lb2")
		for _, h := range []string{"b1", "b2", "b3"} {
			servers[h] = tp.serve(h, 80)
		}
		tp.writeFile(poolsFile, fleetPools("b1", "b2"))
		cp = startCP()
		nodes["lb"], nodes["lb2"] = startNode("lb"), startNode("lb2")
		// The first view, and the control plane's first verdicts (Unknown routes too).
		testwait.For(t, 10*time.Second, "both nodes hold the view", func() (bool, string) { return same("b1", "b2") })
		// What an operator compares: `stickylb xdp tables` on each node, equal digests.
		var digests []string
		for _, lb := range []string{"lb", "lb2"} {
			var out map[string]struct{ Digest string }
			js := tp.in(lb, bin, "xdp", "tables", "--iface", "eth0", "--pin-root", tp.pinRoot(lb))
			if err := json.Unmarshal([]byte(js), &out); err != nil || out["spread"].Digest == "" {
				t.Fatalf("xdp tables on %s: %v\n%s", lb, err, js)
			}
			digests = append(digests, out["spread"].Digest)
		}
		if digests[0] != digests[1] {
			t.Fatalf("table digests differ: %v", digests)
		}
		for _, cl := range []string{"cl", "cl2"} {
			if seen, err := tp.reaches(cl, 20); err != nil || len(seen) != 2 {
				t.Fatalf("through %s: %v %v", cl, seen, err)
			}
		}
	})

	var moved *vconn
	// Within 2 s of the edit each node sends one of K new connections to b3. While b3 is in
	// a node's table (a third of it), K = 36 all miss it with probability (2/3)^36 < 5e-7.
	tp.phase("a backend added by editing the pools file", func(t *testing.T) {
		const k = 36
		edited := time.Now()
		tp.writeFile(poolsFile, fleetPools("b1", "b2", "b3"))
		got := map[string]bool{}
		testwait.For(t, 2*time.Second-time.Since(edited), "b3 takes new connections through both nodes", func() (bool, string) {
			for _, cl := range []string{"cl", "cl2"} {
				if got[cl] {
					continue
				}
				seen, err := tp.reaches(cl, k)
				if err != nil {
					return false, err.Error()
				}
				got[cl] = seen["b3"] > 0
			}
			return got["cl"] && got["cl2"], fmt.Sprint(got)
		})
		t.Logf("b3 reached through both nodes %s after the edit", time.Since(edited).Round(time.Millisecond))
		testwait.For(t, 2*time.Second, "identical tables over b1, b2, b3", func() (bool, string) { return same("b1", "b2", "b3") })
	})

	// Opened through lb, continued through lb2 (cl's route moves): lb2 has no entry for it
	// and finds the same backend in its table.
	tp.phase("a connection moved between nodes keeps its backend", func(t *testing.T) {
		var err error
		if moved, err = tp.dialVia("cl", vip4+":80"); err != nil {
			t.Fatal(err)
		}
		if err := moved.echo(); err != nil {
			t.Fatal(err)
		}
		vipPackets := func() uint64 {
			st, err := l4xdp.PinnedStats(l4xdp.Config{Iface: "eth0", PinRoot: tp.pinRoot("lb2")})
			if err != nil {
				t.Fatal(err)
			}
			return st.VIPs["spread"].Packets
		}
		before := vipPackets()
		tp.in("cl", "ip", "route", "replace", vip4+"/32", "via", fleetHosts["lb2"])
		for i := 0; i < 5; i++ {
			if err := moved.echo(); err != nil {
				t.Fatalf("the connection to %s broke after moving to lb2: %v", moved.backend, err)
			}
		}
		if after := vipPackets(); after < before+5 {
			t.Fatalf("lb2 forwarded %d packets of the VIP: the connection did not move", after-before)
		}
		tp.in("cl", "ip", "route", "replace", vip4+"/32", "via", fleetHosts["lb"])
	})

	// Both nodes stop sending new flows to a killed backend within interval x
	// unhealthy_threshold + timeout, plus the push slack, plus the 20 ms polls of this check.
	tp.phase("a backend killed", func(t *testing.T) {
		killed := time.Now()
		servers["b1"].Close()
		bound := fleetInterval*fleetUnhealthy + fleetTimeout + pushSlack
		// 48 connections in a row missing b1 while it holds a third of a table: (2/3)^48 < 1e-8.
		for _, cl := range []string{"cl", "cl2"} {
			testwait.For(t, bound-time.Since(killed), "b1 out of new flows through "+cl, func() (bool, string) {
				seen, err := tp.reaches(cl, 48)
				if err != nil {
					return false, err.Error()
				}
				return seen["b1"] == 0, fmt.Sprint(seen)
			})
		}
		t.Logf("b1 out of both nodes' new flows %s after the kill (bound %s)", time.Since(killed).Round(time.Millisecond), bound)
		if ok, saw := same("b2", "b3"); !ok {
			t.Fatalf("tables: %s", saw)
		}
	})

	// A backend without a MAC the nodes can resolve (no host answers ARP for it): a valid
	// pools file, a view no node can apply. Each node NACKs it once with the reason and keeps
	// its tables; the control plane counts the NACKs, rolls the nodes back and sends the
	// version no more.
	tp.phase("a view the nodes cannot apply is NACKed and changes nothing", func(t *testing.T) {
		cpMetric := func(name string) string {
			for _, line := range strings.Split(tp.get("cp", "127.0.0.1:18001", "/metrics"), "\n") {
				if strings.HasPrefix(line, name+" ") {
					return strings.TrimPrefix(line, name+" ")
				}
			}
			return ""
		}
		before := cpMetric("stickylb_xds_nacks_total")
		good := fleetPools("b1", "b2", "b3")
		tp.writeFile(poolsFile, good+"      - {address: \"10.77.0.99:80\"}\n")
		// 100 ms poll, the nodes' 3 s of neighbour resolution, and 2 s of slack.
		testwait.For(t, 5100*time.Millisecond, "both nodes NACK", func() (bool, string) {
			return cpMetric("stickylb_xds_nacks_total") == "2" && before == "0", before + " -> " + cpMetric("stickylb_xds_nacks_total")
		})
		for _, lb := range []string{"lb", "lb2"} {
			if !strings.Contains(nodes[lb].String(), "no MAC in the neighbour table") {
				t.Fatalf("%s logged no reason for its rejection", lb)
			}
		}
		// Bounded observation: a server re-sending the rejected version would show more
		// NACKs within the client's NACK hold (250 ms, doubling).
		time.Sleep(2 * time.Second)
		if n := cpMetric("stickylb_xds_nacks_total"); n != "2" {
			t.Fatalf("NACKs kept coming: %s", n)
		}
		if ok, saw := same("b2", "b3"); !ok {
			t.Fatalf("a rejected view changed the tables: %s", saw)
		}
		tp.writeFile(poolsFile, good)
		if seen, err := tp.reaches("cl2", 10); err != nil || seen["b1"] != 0 {
			t.Fatalf("through lb2 after the rejection: %v %v", seen, err)
		}
	})

	tp.phase("the control plane down: nodes keep serving", func(t *testing.T) {
		open, err := tp.dialVia("cl", vip4+":80") // established through the outage
		if err != nil {
			t.Fatal(err)
		}
		for _, lb := range []string{"lb", "lb2"} {
			endsBase[lb] = ends(lb)
		}
		cp.kill()
		for _, lb := range []string{"lb", "lb2"} {
			testwait.For(t, 5*time.Second, lb+" sees the control plane gone", func() (bool, string) {
				v := metric(lb, "stickylb_xds_connected")
				return v == "0", v
			})
			if age := metric(lb, "stickylb_xds_last_update_age_seconds"); age == "" {
				t.Fatalf("%s exports no update age", lb)
			}
		}
		for _, cl := range []string{"cl", "cl2"} {
			if seen, err := tp.reaches(cl, 20); err != nil || seen["b1"] != 0 {
				t.Fatalf("through %s with the control plane down: %v %v", cl, seen, err)
			}
		}
		if err := open.echo(); err != nil {
			t.Fatalf("a connection to %s through the outage: %v", open.backend, err)
		}
	})

	tp.phase("a node restarted while the control plane is down serves its last view", func(t *testing.T) {
		nodes["lb2"].stop()
		nodes["lb2"] = startNode("lb2")
		endsBase["lb2"] = 0 // a new process: its count and its backoff start over
		if seen, err := tp.reaches("cl2", 20); err != nil || seen["b1"] != 0 || len(seen) != 2 {
			t.Fatalf("through the restarted lb2: %v %v", seen, err)
		}
		if ok, saw := same("b2", "b3"); !ok {
			t.Fatalf("tables after the restart: %s", saw)
		}
	})

	// An edit made while the control plane was down (b2 leaves) reaches both nodes once it
	// is back.
	tp.phase("the control plane back: nodes reconnect and converge", func(t *testing.T) {
		tp.writeFile(poolsFile, fleetPools("b1", "b3"))
		cp = startCP()
		restarted := time.Now()
		// A node's pending wait grows with the attempts that failed during the outage.
		for _, lb := range []string{"lb", "lb2"} {
			by := adsReconnectBy(restarted, ends(lb)-endsBase[lb])
			testwait.For(t, time.Until(by), lb+" reconnected", func() (bool, string) {
				v := metric(lb, "stickylb_xds_connected")
				return v == "1", v
			})
		}
		testwait.For(t, 10*time.Second, "both nodes converge on b3 (b1 down, b2 removed)", func() (bool, string) { return same("b3") })
		for _, cl := range []string{"cl", "cl2"} {
			if seen, err := tp.reaches(cl, 10); err != nil || seen["b3"] != 10 {
				t.Fatalf("through %s after converging: %v %v", cl, seen, err)
			}
		}
	})
}
