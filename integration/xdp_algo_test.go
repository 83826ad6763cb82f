package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"github.com/stickylb/stickylb/l4xdp"
)

// The XDP forwarder's algorithms, zones and slow start end to end, on newTopo's network:
// weighted round robin, weighted least connections, cross-zone off with failover, a
// drained zone, and slow start after a recovery.

// algoService writes a pools file with one TCP service "algo" on vip4:80; backends are
// "host:weight:zone" (zone optional).
func algoService(extra string, backends ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "services:\n  - name: algo\n    protocol: tcp\n    vip: %q\n%s    backends:\n", vip4+":80", extra)
	for _, spec := range backends {
		parts := strings.Split(spec, ":")
		fmt.Fprintf(&b, "      - {address: %q, weight: %s", hosts[parts[0]].v4+":80", parts[1])
		if len(parts) > 2 {
			fmt.Fprintf(&b, ", zone: %s", parts[2])
		}
		b.WriteString("}\n")
	}
	return b.String()
}

type xdpStatsJSON struct {
	ActiveBackends map[string]int64 `json:"active_backends"`
	ActiveZones    map[string]int64 `json:"active_zones"`
}

func (tp *topo) xdpStats(bin string) xdpStatsJSON {
	tp.t.Helper()
	var st xdpStatsJSON
	out := tp.in("lb", bin, "xdp", "stats", "--iface", "eth0", "--pin-root", tp.pinFS)
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		tp.t.Fatalf("xdp stats: %v\n%s", err, out)
	}
	return st
}

// eventually waits until cond holds, failing the test when deadline passes first.
func (tp *topo) eventually(what string, deadline time.Duration, cond func() bool) {
	tp.t.Helper()
	testwait.For(tp.t, deadline, what, func() (bool, string) { return cond(), "" })
}

// openN opens n connections to the VIP's port 80 and returns them (and closes them when
// keep is false), with their count by backend.
func (tp *topo) openN(n int, keep bool) ([]*vconn, map[string]int) {
	tp.t.Helper()
	var out []*vconn
	seen := map[string]int{}
	for i := 0; i < n; i++ {
		c, err := tp.dial(vip4 + ":80")
		if err != nil {
			tp.t.Fatalf("connection %d: %v", i, err)
		}
		seen[c.backend]++
		if keep {
			out = append(out, c)
		} else {
			c.c.Close()
		}
	}
	return out, seen
}

func TestXDPAlgorithms(t *testing.T) {
	tp, bin, poolsFile := startXDPTest(t, newTopo)
	servers := map[string]*loopback.Server{}
	var lp *loaderProc
	restart := func(content string, extra ...string) {
		if lp != nil {
			// The restart leaves the VIP without a program for a moment. A connection the
			// last phase closed whose client's last ACK falls in that moment is not over: its
			// backend sends its FIN again, and the client's answer meets the new program as a
			// flow that moved here, which it forwards by the table and counts as active (one
			// run counted such a flow on b3: 19 entries for 18 connections). So the closings
			// end first, their backends' sockets past LAST_ACK.
			tp.eventually("the last phase's connections closed at their backends", 5*time.Second, func() bool {
				for _, h := range []string{"b1", "b2", "b3"} {
					if strings.TrimSpace(tp.in(h, "ss", "-Htn", "state", "close-wait", "state", "last-ack")) != "" {
						return false
					}
				}
				return true
			})
			lp.stop()
			tp.in("lb", bin, "xdp", "detach", "--iface", "eth0", "--pin-root", tp.pinFS)
		}
		tp.writeFile(poolsFile, content)
		lp = tp.startLoader(bin, poolsFile, extra...)
	}
	tp.phase("start", func(t *testing.T) {
		tp.passPeer(bin, "lb")
		for _, h := range []string{"b1", "b2", "b3"} {
			servers[h] = tp.serve(h, 80)
		}
	})

	// Each CPU walks the schedule on its own: over any run, counts follow the weights
	// within CPUs x the largest weight.
	tp.phase("weighted round robin 3:1", func(t *testing.T) {
		restart(algoService("    balance: weighted_round_robin\n", "b1:3", "b2:1"))
		_, seen := tp.openN(400, false)
		tol := 3 * runtime.NumCPU()
		if d := math.Abs(float64(seen["b1"] - 300)); d > float64(tol) || seen["b1"]+seen["b2"] != 400 {
			t.Fatalf("400 connections: %v, want b1 300 ± %d (CPUs x largest weight)", seen, tol)
		}
		t.Logf("400 connections: %v", seen)
	})

	tp.phase("weighted least connections", func(t *testing.T) {
		restart(algoService("    balance: weighted_least_conn\n", "b1:1"))
		held, _ := tp.openN(6, true) // long-lived, all on b1
		tp.writeFile(poolsFile, algoService("    balance: weighted_least_conn\n", "b1:1", "b2:1", "b3:1"))
		// The backends' names are written first, then the VIP's table, its least-connections
		// pool last: wait for the table and the loader's word that the edit applied (logged
		// once it is all written), so that the next connections meet the new pool.
		tp.eventually("the edit adding b2 and b3 applied", 5*time.Second, func() bool {
			if !strings.Contains(lp.String(), "pools file reloaded") {
				return false
			}
			ts, err := l4xdp.PinnedTables(l4xdp.Config{Iface: "eth0", PinRoot: tp.pinFS})
			if err != nil {
				return false
			}
			in := tableBackends(ts["algo"])
			for _, h := range []string{"b1", "b2", "b3"} {
				if !in["algo/"+hosts[h].v4+":80"] {
					return false
				}
			}
			return true
		})
		more, seen := tp.openN(12, true)
		if seen["b1"] != 0 {
			t.Fatalf("b1 holds 6 connections, yet took %d of the next 12: %v", seen["b1"], seen)
		}
		held = append(held, more...)
		st := tp.xdpStats(bin)
		for _, h := range []string{"b1", "b2", "b3"} {
			if n := st.ActiveBackends["algo/"+hosts[h].v4+":80"]; n != 6 {
				t.Fatalf("active connections %v, want 6 each", st.ActiveBackends)
			}
		}
		for _, c := range held {
			c.c.Close()
		}
		tp.eventually("every count back to 0 after the connections closed", 5*time.Second, func() bool {
			for _, n := range tp.xdpStats(bin).ActiveBackends {
				if n != 0 {
					return false
				}
			}
			return true
		})
	})

	tp.phase("cross-zone off: own zone, then the others", func(t *testing.T) {
		hc := "    cross_zone: false\n    health_check: {protocol: tcp, interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}\n"
		restart(algoService(hc, "b1:1:a", "b2:1:b", "b3:1:b"), "--zone", "a")
		if _, seen := tp.openN(40, false); seen["b1"] != 40 {
			t.Fatalf("a node of zone a sent new flows to %v; want all 40 on b1 (zone a)", seen)
		}
		servers["b1"].Close()
		// Detection: interval x unhealthy_threshold + timeout = 1.5 s; slack to 10 s.
		tp.eventually("zone b takes new flows once zone a is down", 10*time.Second, func() bool {
			c, err := tp.dial(vip4 + ":80")
			if err != nil {
				return false
			}
			c.c.Close()
			return c.backend != "b1"
		})
		if _, seen := tp.openN(40, false); seen["b1"] != 0 {
			t.Fatalf("zone a down: %v", seen)
		}
		servers["b1"] = tp.serve("b1", 80)
	})

	tp.phase("a drained zone takes no new flow, an older connection keeps transferring", func(t *testing.T) {
		restart(algoService("", "b1:1:a", "b2:1:b"))
		var old *vconn
		tp.eventually("a connection on b1 (zone a)", 5*time.Second, func() bool {
			c, err := tp.dial(vip4 + ":80")
			if err != nil {
				return false
			}
			if c.backend == "b1" {
				old = c
				return true
			}
			c.c.Close()
			return false
		})
		tp.writeFile(poolsFile, algoService("    drained_zones: [a]\n", "b1:1:a", "b2:1:b"))
		// The edit applies within the poll (100 ms); then 40 new connections in a row miss
		// zone a.
		tp.eventually("zone a drained", 5*time.Second, func() bool { ok, _ := tp.noneReach("b1", 40); return ok })
		if err := old.echo(); err != nil {
			t.Fatalf("the connection opened before the drain broke: %v", err)
		}
		// And carries a 1 MiB download from its backend.
		old.c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(old.c, "big\n"); err != nil {
			t.Fatal(err)
		}
		if n, err := io.ReadFull(old.r, make([]byte, 1<<20)); err != nil {
			t.Fatalf("1 MiB over the connection opened before the drain: %d bytes, %v", n, err)
		}
		if n := tp.xdpStats(bin).ActiveZones["algo/a"]; n != 1 {
			t.Fatalf("zone a shows %d active flows, want the 1 older connection", n)
		}
		old.c.Close()
		tp.eventually("zone a empty after its last connection closed", 5*time.Second, func() bool {
			return tp.xdpStats(bin).ActiveZones["algo/a"] == 0
		})
	})

	// Slow start: b2 recovers and ramps over a 6 s window (aggression 1, floor 10 %); with
	// weighted round robin its share of new flows is f/(1+f), f its factor: 9 % at the floor,
	// 50 % when done; about 15 %, 32 % and 44 % over the window's thirds. The test sees the
	// recovery up to a few hundred ms late (its first connection to b2), so its buckets lag
	// the ramp. Bounds per 2 s bucket: at most 35 % in the first, at least 35 % in the last,
	// and the last 10 points above the first.
	tp.phase("slow start after a recovery", func(t *testing.T) {
		hc := "    slow_start: {window: 6s}\n    health_check: {protocol: tcp, interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}\n"
		restart(algoService("    balance: weighted_round_robin\n"+hc, "b1:1", "b2:1"))
		servers["b2"].Close()
		tp.eventually("b2 found down", 10*time.Second, func() bool { ok, _ := tp.noneReach("b2", 10); return ok })
		servers["b2"] = tp.serve("b2", 80)
		tp.eventually("b2 back", 10*time.Second, func() bool {
			c, err := tp.dial(vip4 + ":80")
			if err != nil {
				return false
			}
			c.c.Close()
			return c.backend == "b2"
		})
		start := time.Now()
		var buckets [3]struct{ b2, all int }
		// Paced at one connection per 5 ms (400 a bucket): closed connections leave the
		// client's ports in TIME_WAIT, and an unpaced loop runs out of them.
		pace := time.NewTicker(5 * time.Millisecond)
		defer pace.Stop()
		for time.Since(start) < 6*time.Second {
			<-pace.C
			c, err := tp.dial(vip4 + ":80")
			if err != nil {
				t.Fatal(err)
			}
			c.c.Close()
			i := min(int(time.Since(start)/(2*time.Second)), 2)
			buckets[i].all++
			if c.backend == "b2" {
				buckets[i].b2++
			}
		}
		share := func(i int) float64 { return float64(buckets[i].b2) / float64(max(buckets[i].all, 1)) }
		t.Logf("b2's share by 2 s bucket: %.2f %.2f %.2f (%v)", share(0), share(1), share(2), buckets)
		if share(0) > 0.35 || share(2) < 0.35 || share(2) < share(0)+0.1 {
			t.Fatalf("b2's share did not ramp: %.2f, %.2f, %.2f", share(0), share(1), share(2))
		}
	})
}
