package integration

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// The L4 fleet behind a router (see routedFleet): XDP nodes announce the VIPs to BIRD over
// BGP, BIRD spreads flows over them by ECMP, and nodes join, drain, stop, die and restart
// under long-lived connections. Needs root and BIRD 2; about 100 s.
func TestRoutedFleet(t *testing.T) {
	rf := newRoutedFleet(t, "b1", "b2", "b3", "b4")
	all := []string{"lb1", "lb2", "lb3"}

	rf.phase("three nodes announce the VIPs; new connections spread over them and land where the table says", func(t *testing.T) {
		for _, lb := range all {
			rf.startNode(lb, false)
		}
		took := rf.waitRoutes(t, 10*time.Second, all...)
		t.Logf("the router spreads both VIPs over 3 nodes %s after their start", took.Round(time.Millisecond))
		if ok, saw := rf.waitQuiet(t, 5*time.Second); !ok {
			t.Fatalf("tables differ: %s", saw)
		}
		rf.checkObservability(t, "lb1")
		before := map[string]uint64{}
		for _, lb := range all {
			before[lb] = rf.vipPackets(lb, "spread") + rf.vipPackets(lb, "spread6")
		}
		rf.checkPicks(t, vip4, "spread", 150)
		rf.checkPicks(t, vip6, "spread6", 30)
		var shares []string
		for _, lb := range all {
			d := rf.vipPackets(lb, "spread") + rf.vipPackets(lb, "spread6") - before[lb]
			if d == 0 {
				t.Errorf("%s forwarded no packet of 180 connections", lb)
			}
			shares = append(shares, fmt.Sprintf("%s %d", lb, d))
		}
		t.Logf("packets of 180 new connections by node: %s", strings.Join(shares, ", "))
	})

	// Long-lived connections (a stream each) through every change of the nodes below; new
	// connections none (the shares below are the streams' alone).
	var load *fleetLoad
	rf.phase("a fourth node joins: streams keep their backends", func(t *testing.T) {
		const streams = 40
		load = rf.startLoad(vip4+":80", streams, 0, 0, 0, 0)
		testwait.For(t, 10*time.Second, "every stream open and exchanging", func() (bool, string) {
			open, pings := load.progress()
			return open == streams && pings >= 2*streams, fmt.Sprintf("%d open, %d exchanges", open, pings)
		})
		rf.joinNode("lb4", false)
		took := rf.waitRoutes(t, 10*time.Second, "lb1", "lb2", "lb3", "lb4")
		// The join share, measured: each node's share of the streams' packets (they keep one
		// pace) over at least 10 exchanges a stream after the router took lb4 in.
		nodes := []string{"lb1", "lb2", "lb3", "lb4"}
		before := map[string]uint64{}
		for _, lb := range nodes {
			before[lb] = rf.vipPackets(lb, "spread")
		}
		delta := func() (map[string]uint64, uint64) {
			d, total := map[string]uint64{}, uint64(0)
			for _, lb := range nodes {
				d[lb] = rf.vipPackets(lb, "spread") - before[lb]
				total += d[lb]
			}
			return d, total
		}
		var d map[string]uint64
		var total uint64
		testwait.For(t, 20*time.Second, "10 exchanges a stream since the join", func() (bool, string) {
			d, total = delta()
			return total >= 2*10*streams, fmt.Sprintf("%d packets: %v", total, d)
		})
		share := float64(d["lb4"]) / float64(total)
		t.Logf("lb4 routed %s after its start; then the streams' packets by node: %v: lb4 carries %.2f of them (about %.0f of %d streams; ECMP over 4 gives it 1/4)",
			took.Round(time.Millisecond), d, share, share*streams, streams)
		// Which streams the router gives lb4 is a hash of their ports: a binomial(40, 1/4),
		// bounded at 4 sigma.
		if sigma := math.Sqrt(0.25 * 0.75 / streams); d["lb4"] == 0 || math.Abs(share-0.25) > 4*sigma {
			t.Fatalf("lb4's share of the streams %.2f, want 1/4 within %.2f", share, 4*sigma)
		}
		rf.noneBroken(t, load, "the join")
	})

	rf.phase("a node drained with stickylb xdp drain: withdrawn, nothing broken; undrained", func(t *testing.T) {
		rf.drainNode("lb2")
		took := rf.waitRoutes(t, routeSlack, "lb1", "lb3", "lb4")
		t.Logf("lb2 withdrawn %s after the drain", took.Round(time.Millisecond))
		load.waitStreams(t, time.Now()) // the streams go on through the other nodes
		rf.noneBroken(t, load, "the drain")
		if !strings.Contains(rf.nodes["lb2"].proc.String(), `"reason":"drain"`) {
			t.Error("lb2 logged no withdrawal for the drain")
		}
		// Drained, killed and started again (it adopts its pinned program): it stays drained.
		rf.killNode("lb2")
		rf.startNode("lb2", false)
		up := testwait.For(t, 10*time.Second, "the restarted lb2's sessions up", func() (bool, string) {
			log := rf.nodes["lb2"].proc.String()
			return strings.Count(log, "BGP session up") == 2 && strings.Contains(log, "drained before the node restarted"), ""
		})
		rf.neverRouted(t, "lb2", time.Second)
		t.Logf("lb2, drained, restarted: its sessions up %s after its start, not routed 1 s later", up.Round(time.Millisecond))
		rf.undrainNode("lb2")
		rf.waitRoutes(t, routeSlack, "lb1", "lb2", "lb3", "lb4")
	})

	rf.phase("a node stopped with SIGTERM: withdrawn within the drain time, nothing broken", func(t *testing.T) {
		start := time.Now()
		done := make(chan struct{})
		go func() { rf.stopNode("lb3"); close(done) }()
		took := rf.waitRoutes(t, routedDrainTime, "lb1", "lb2", "lb4")
		testwait.Recv(t, done, routedDrainTime+5*time.Second, "lb3 exits after its drain time")
		t.Logf("lb3 withdrawn %s after SIGTERM, exited after %s (drain time %s)", took.Round(time.Millisecond),
			time.Since(start).Round(time.Millisecond), routedDrainTime)
		rf.noneBroken(t, load, "the stop")
		rf.joinNode("lb3", false)
		rf.waitRoutes(t, 10*time.Second, "lb1", "lb2", "lb3", "lb4")
	})

	rf.phase("a node killed: the router withdraws it at once, its moved flows keep their backends", func(t *testing.T) {
		rf.killNode("lb1")
		took := rf.waitRoutes(t, routeSlack, "lb2", "lb3", "lb4")
		t.Logf("lb1 withdrawn %s after SIGKILL", took.Round(time.Millisecond))
		load.waitStreams(t, time.Now())
		rf.noneBroken(t, load, "the kill")
		rf.joinNode("lb1", false) // adopts its pinned program and maps
		rf.waitRoutes(t, 10*time.Second, "lb1", "lb2", "lb3", "lb4")
	})

	rf.phase("a node's link pulled: withdrawn after the hold time, its moved flows keep their backends", func(t *testing.T) {
		rf.pullLink("lb4")
		took := rf.waitRoutes(t, routedHold+routeSlack, "lb1", "lb2", "lb3")
		t.Logf("lb4 withdrawn %s after its link was pulled (hold time %s)", took.Round(time.Millisecond), routedHold)
		again := load.waitStreams(t, time.Now()) // the streams that were on lb4 retransmit through the others
		t.Logf("every stream exchanged again %s after lb4's withdrawal", again.Round(time.Millisecond))
		rf.noneBroken(t, load, "the pulled link")
		rf.restoreLink("lb4")
		took = rf.waitRoutes(t, 5*time.Second+routeSlack, "lb1", "lb2", "lb3", "lb4")
		t.Logf("lb4 routed again %s after its link came back", took.Round(time.Millisecond))
	})

	rf.phase("a VIP removed from the pools file is withdrawn; a bad edit changes nothing", func(t *testing.T) {
		nodes := []string{"lb1", "lb2", "lb3", "lb4"}
		full := routedPools([]string{"b1", "b2", "b3", "b4"}, nil, nil)
		rf.writeFile(rf.poolsFile, full[:strings.Index(full, "  - name: spread6")])
		took := testwait.Until(t, 2*time.Second, 20*time.Millisecond, "the IPv6 VIP withdrawn, the IPv4 one kept", func() (bool, string) {
			r4, r6 := rf.routeNodes(vip4), rf.routeNodes(vip6)
			return len(r6) == 0 && slices.Equal(r4, nodes), fmt.Sprintf("IPv4 over %v, IPv6 over %v", r4, r6)
		})
		t.Logf("the IPv6 VIP left the router %s after the edit removed it", took.Round(time.Millisecond))
		if m := rf.get("lb1", "127.0.0.1:9911", "/metrics"); !strings.Contains(m, `stickylb_bgp_announced{vip="`+vip6+`"} 0`) ||
			!strings.Contains(m, `stickylb_bgp_withdrawals_total{reason="removed"} 1`) {
			t.Errorf("lb1's metrics after the removal:\n%s", m)
		}
		rf.writePools()
		rf.waitRoutes(t, 2*time.Second, nodes...)
		rf.writeFile(rf.poolsFile, "services:\n  - name: spread\n    vip: [nonsense\n")
		testwait.For(t, 2*time.Second, "every node logs the bad edit", func() (bool, string) {
			for _, lb := range nodes {
				if !strings.Contains(rf.nodes[lb].proc.String(), "invalid pools file edit") {
					return false, lb
				}
			}
			return true, ""
		})
		if r4, r6 := rf.routeNodes(vip4), rf.routeNodes(vip6); !slices.Equal(r4, nodes) || !slices.Equal(r6, nodes) {
			t.Fatalf("a bad edit changed the routes: IPv4 over %v, IPv6 over %v", r4, r6)
		}
		rf.writePools()
		rf.noneBroken(t, load, "the edits")
	})

	rf.phase("a graceful restart: the routes stay, nothing moves", func(t *testing.T) {
		rf.stopNode("lb2")
		rf.waitRoutes(t, routedDrainTime+routeSlack, "lb1", "lb3", "lb4")
		rf.startNode("lb2", true) // with --bgp-graceful-restart
		rf.waitRoutes(t, 10*time.Second, "lb1", "lb2", "lb3", "lb4")
		// Sampled every 20 ms from the stop until the new process has ended the restart.
		stop := make(chan struct{})
		missed := make(chan []string, 1)
		go func() {
			var gaps []string
			for {
				select {
				case <-stop:
					missed <- gaps
					return
				case <-time.After(20 * time.Millisecond):
				}
				if r := rf.routeNodes(vip4); len(r) != 4 {
					gaps = append(gaps, fmt.Sprint(r))
				}
			}
		}()
		before := rf.vipPackets("lb2", "spread")
		protos := rf.birdProtocols(routed4("lb2"), routed6("lb2"))
		if len(protos) != 2 {
			t.Fatalf("BIRD's sessions with lb2: %v, want 2\n%s", protos, rf.birdc("show", "protocols", "all"))
		}
		birdFrom := len(rf.bird.String())
		restart := time.Now()
		rf.restartGraceful("lb2")
		testwait.For(t, 10*time.Second, "lb2 restarted with the Restarting bit and its session up", func() (bool, string) {
			log := rf.nodes["lb2"].proc.String()
			return strings.Contains(log, `"restarting":true`) && strings.Contains(log, "BGP session up"), ""
		})
		// BIRD's side: it saw each session restart gracefully (kept lb2's routes, stale) and
		// ended the restart on lb2's End-of-RIB, not on its restart timer.
		testwait.For(t, 10*time.Second, "BIRD ends lb2's graceful restarts on End-of-RIB", func() (bool, string) {
			log := rf.bird.String()[birdFrom:]
			for _, p := range protos {
				if !strings.Contains(log, p+": Neighbor graceful restart detected") || !strings.Contains(log, p+": Neighbor graceful restart done") {
					return false, log
				}
			}
			return true, ""
		})
		if log := rf.bird.String()[birdFrom:]; strings.Contains(log, "graceful restart timeout") || strings.Contains(log, "grace period expired") {
			t.Fatalf("BIRD ended a restart on its timer:\n%s", log)
		}
		t.Logf("BIRD: graceful restart detected and done (End-of-RIB) on %v, at most %s after the restart began", protos, time.Since(restart).Round(time.Millisecond))
		// Past the End-of-RIB no stale route is left to flush; the sampler has looked since.
		rf.waitRoutes(t, routeSlack, "lb1", "lb2", "lb3", "lb4")
		close(stop)
		if gaps := <-missed; len(gaps) > 0 {
			t.Fatalf("the route lost lb2 during its graceful restart: %v", gaps)
		}
		if rf.vipPackets("lb2", "spread") == before {
			t.Fatal("lb2 forwarded nothing through its restart")
		}
		rf.noneBroken(t, load, "the graceful restart")
	})

	// Forwarding never waits on BGP: lb5's only peer does not exist; it forwards its own VIP
	// (static-routed to it by the router) from its start, and says why the peer is down.
	rf.phase("a node whose peer cannot be reached forwards from its start", func(t *testing.T) {
		const vipStatic = "10.77.101.1"
		for _, b := range []string{"b1", "b2"} {
			rf.in(b, "ip", "addr", "add", vipStatic+"/32", "dev", "lo")
		}
		pools := filepath.Join(rf.dir, "lb5.yaml")
		rf.writeFile(pools, strings.NewReplacer("spread6", "static6", "spread", "static", vip4, vipStatic).Replace(
			routedPools([]string{"b1", "b2"}, nil, nil)))
		rf.extra["lb5"], rf.extraArg["lb5"] = pools, []string{"--bgp-peer", "10.77.0.99@65000"}
		rf.in("rt", "ip", "route", "add", vipStatic+"/32", "via", routed4("lb5"))
		start := time.Now()
		rf.startNode("lb5", false)
		ready := time.Since(start)
		for i := 0; i < 20; i++ {
			c, err := rf.dialVia("cl", vipStatic+":80")
			if err != nil {
				t.Fatalf("connection %d through lb5, its peer unreachable: %v", i, err)
			}
			c.c.Close()
		}
		t.Logf("lb5 ready %s after its start, 20 connections through it at once", ready.Round(time.Millisecond))
		testwait.For(t, 10*time.Second-time.Since(start), "lb5 logs why its peer is down", func() (bool, string) {
			return strings.Contains(rf.nodes["lb5"].proc.String(), "BGP peer not reachable"), ""
		})
		for _, line := range strings.Split(rf.nodes["lb5"].proc.String(), "\n") {
			if strings.Contains(line, "BGP peer not reachable") {
				t.Logf("lb5 logged its peer unreachable within %s of its start: %s", time.Since(start).Round(time.Millisecond), line)
			}
		}
	})

	rf.phase("the report", func(t *testing.T) {
		load.end()
		rep := attribute(load.snapshot(), rf.log)
		t.Logf("through join, drain, stop, kill, pulled link and graceful restart:\n%s", rep)
	})

	// After the report (no load: the flows on lb1 would meet a node that no longer forwards
	// until the router moves them).
	rf.phase("a node whose program is detached is withdrawn at once", func(t *testing.T) {
		lnk, err := link.LoadPinnedLink(filepath.Join(rf.pinRoot("lb1"), "eth0", "link"), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer lnk.Close()
		if err := lnk.Detach(); err != nil { // what `bpftool link detach` does
			t.Fatal(err)
		}
		// Checked every second, a certain cause withdraws at the first look.
		took := rf.waitRoutes(t, time.Second+routeSlack, "lb2", "lb3", "lb4")
		t.Logf("lb1 withdrawn %s after its program was detached", took.Round(time.Millisecond))
		if log := rf.nodes["lb1"].proc.String(); !strings.Contains(log, `"reason":"forwarder"`) || !strings.Contains(log, "no longer attached") {
			t.Errorf("lb1 logged no withdrawal for the detached program")
		}
	})
}

// birdProtocols names BIRD's BGP sessions with the neighbours at addrs.
func (rf *routedFleet) birdProtocols(addrs ...string) []string {
	var names []string
	cur := ""
	for _, line := range strings.Split(rf.birdc("show", "protocols", "all"), "\n") {
		if line != "" && line[0] != ' ' && line[0] != '\t' {
			cur = strings.Fields(line)[0]
		}
		if a, ok := strings.CutPrefix(strings.TrimSpace(line), "Neighbor address:"); ok && slices.Contains(addrs, strings.TrimSpace(a)) {
			names = append(names, cur)
		}
	}
	return names
}

// neverRouted fails if the router routes a VIP to node lb within d (polled every 20 ms).
func (rf *routedFleet) neverRouted(t *testing.T, lb string, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); {
		if r4, r6 := rf.routeNodes(vip4), rf.routeNodes(vip6); slices.Contains(r4, lb) || slices.Contains(r6, lb) {
			t.Fatalf("%s routed: IPv4 over %v, IPv6 over %v", lb, r4, r6)
		}
		time.Sleep(20 * time.Millisecond) // polling the router's table
	}
}

// TestRoutedXDSNode: `stickylb xdp --xds ... --bgp-*`, a node fed by the control plane
// (`stickylb xds`, here in the router's namespace), announces the VIPs of its view: the
// router routes to it and new connections land where its table says; a VIP the control
// plane drops from the view is withdrawn; SIGTERM withdraws it within the drain time.
func TestRoutedXDSNode(t *testing.T) {
	rf := newRoutedFleet(t, "b1", "b2", "b3", "b4")
	cp := routed4("rt") + ":18100"
	rf.startProc("rt", "serving xDS", rf.bin, "xds", "--pools", rf.poolsFile, "--listen", cp, "--poll", "100ms")
	rf.xds["lb1"] = cp
	rf.startNode("lb1", false)
	took := rf.waitRoutes(t, 10*time.Second, "lb1")
	t.Logf("lb1, fed by the control plane, routed %s after its start", took.Round(time.Millisecond))
	testwait.For(t, 5*time.Second, "lb1 applied the view", func() (bool, string) {
		return strings.Contains(rf.nodes["lb1"].proc.String(), "view applied"), ""
	})
	rf.checkPicks(t, vip4, "spread", 40)
	rf.checkPicks(t, vip6, "spread6", 20)

	full := routedPools([]string{"b1", "b2", "b3", "b4"}, nil, nil)
	rf.writeFile(rf.poolsFile, full[:strings.Index(full, "  - name: spread6")])
	took = testwait.Until(t, 5*time.Second, 20*time.Millisecond, "the IPv6 VIP withdrawn, the IPv4 one kept", func() (bool, string) {
		r4, r6 := rf.routeNodes(vip4), rf.routeNodes(vip6)
		return len(r6) == 0 && slices.Equal(r4, []string{"lb1"}), fmt.Sprintf("IPv4 over %v, IPv6 over %v", r4, r6)
	})
	t.Logf("the IPv6 VIP left the router %s after the control plane's pools file dropped it", took.Round(time.Millisecond))

	done := make(chan struct{})
	go func() { rf.stopNode("lb1"); close(done) }()
	took = testwait.Until(t, routedDrainTime, 20*time.Millisecond, "lb1 withdrawn on SIGTERM", func() (bool, string) {
		r4 := rf.routeNodes(vip4)
		return len(r4) == 0, fmt.Sprint(r4)
	})
	testwait.Recv(t, done, routedDrainTime+5*time.Second, "lb1 exits after its drain time")
	t.Logf("lb1 withdrawn %s after SIGTERM", took.Round(time.Millisecond))
}

// checkObservability: node lb exports its sessions and announcements, and its status
// page's JSON shows them.
func (rf *routedFleet) checkObservability(t *testing.T, lb string) {
	t.Helper()
	metrics := rf.get(lb, "127.0.0.1:9911", "/metrics")
	for _, series := range []string{`stickylb_bgp_peer_up{peer="10.77.0.1"} 1`, `stickylb_bgp_peer_up{peer="fd77::1"} 1`,
		`stickylb_bgp_announced{vip="` + vip4 + `"} 1`, `stickylb_bgp_announced{vip="` + vip6 + `"} 1`,
		`stickylb_bgp_withdrawals_total{reason="drain"} 0`} {
		if !strings.Contains(metrics, series) {
			t.Errorf("%s's metrics lack %s", lb, series)
		}
	}
	if routes := rf.birdc("show", "route", "for", vip4, "all"); !strings.Contains(routes, "(65001,"+routedHosts[lb]+")") {
		t.Errorf("the router holds no route with %s's community 65001:%s:\n%s", lb, routedHosts[lb], routes)
	}
	body := rf.get(lb, "127.0.0.1:9911", "/status.json")
	var snap struct {
		Routing struct {
			Peers []struct {
				Address string
				Up      bool
			}
			Announced []struct {
				VIP       string
				Announced bool
			}
			Communities []string
		}
	}
	if err := json.Unmarshal([]byte(body[strings.Index(body, "\r\n\r\n")+4:]), &snap); err != nil {
		t.Fatalf("status.json: %v\n%s", err, body)
	}
	r := snap.Routing
	if len(r.Peers) != 2 || !r.Peers[0].Up || !r.Peers[1].Up || len(r.Announced) != 2 || !r.Announced[0].Announced ||
		!slices.Equal(r.Communities, []string{"65001:" + routedHosts[lb]}) {
		t.Errorf("status.json's routing: %+v", r)
	}
}

// checkPicks opens n connections to vip:80 one after another and checks each landed on the
// backend the nodes' table for svc names at its 5-tuple's hash, whichever node carried it.
func (rf *routedFleet) checkPicks(t *testing.T, vip, svc string, n int) {
	t.Helper()
	ts, err := rf.tables("lb1")
	if err != nil {
		t.Fatal(err)
	}
	table := ts[svc].Table
	seen := map[string]int{}
	for i := 0; i < n; i++ {
		c, err := rf.dialVia("cl", net.JoinHostPort(vip, "80"))
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		local := c.c.LocalAddr().(*net.TCPAddr).AddrPort()
		want := hostOf(maglevBackend(table, netip.AddrPortFrom(local.Addr().Unmap(), local.Port()), netip.MustParseAddrPort(net.JoinHostPort(vip, "80"))))
		c.c.Close()
		if c.backend != want {
			t.Fatalf("connection %d from %s reached %s; the table names %s", i, local, c.backend, want)
		}
		seen[c.backend]++
	}
	t.Logf("%d connections to %s, each on the backend the table names: %v", n, vip, seen)
}

// noneBroken fails t if a connection of load broke.
func (rf *routedFleet) noneBroken(t *testing.T, load *fleetLoad, what string) {
	t.Helper()
	if b := load.broken(); len(b) > 0 {
		var s []string
		for _, c := range b {
			s = append(s, fmt.Sprintf("%s via %s: %v", c.local, c.backend, c.err))
		}
		t.Fatalf("%d connections broke through %s:\n%s", len(b), what, strings.Join(s, "\n"))
	}
}
