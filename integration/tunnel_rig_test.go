package integration

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stickylb/stickylb/l4xdp"
	"github.com/stickylb/stickylb/l4xdp/agent"
	"github.com/stickylb/stickylb/policies/chash"
)

// tunnelFleet is the routed fleet (routedFleet: BIRD spreading the VIPs over XDP nodes by
// ECMP, the client behind it) with its backends on a subnet of their own behind the router,
// which the LB nodes reach only through it: t1..t5 on 10.78.0.0/24 (fd78::/64), a bridge of
// their own (br1) with the router's eth2. The VIPs forward by tunnel: each backend runs
// `stickylb backend`, holds the VIPs on lo and answers the client through the router.
type tunnelFleet struct {
	*routedFleet
	second bool // the pools file's second_chance
}

var tunnelHosts = map[string]string{"t1": "11", "t2": "12", "t3": "13", "t4": "14", "t5": "15"}

func tunnel4(h string) string { return "10.78.0." + tunnelHosts[h] }
func tunnel6(h string) string { return "fd78::" + tunnelHosts[h] }

// tunnelLBSources is every backend's --lb-source: the LB nodes' LAN (their tunnel source is
// their eth0 address).
const tunnelLBSources = "10.77.0.0/24,fd77::/64"

// newTunnelFleet builds the routed fleet and the backends' subnet, starts each backend's
// echo servers (port 80: its name, then echoes; port 81: the client address it sees) and
// agent, and writes the pools file over members (no LB node runs yet). Skipped under -short.
func newTunnelFleet(t *testing.T, second bool, members ...string) *tunnelFleet {
	rf := newRoutedFleet(t)
	tf := &tunnelFleet{routedFleet: rf, second: second}
	rf.in("br", "ip", "link", "add", "br1", "type", "bridge")
	rf.in("br", "ip", "link", "set", "br1", "up")
	rf.kit.Veth("br", "vrt2", "rt", "eth2")
	rf.in("br", "ip", "link", "set", "vrt2", "master", "br1")
	rf.in("rt", "ip", "addr", "add", "10.78.0.1/24", "dev", "eth2")
	rf.in("rt", "ip", "addr", "add", "fd78::1/64", "dev", "eth2", "nodad")
	for _, lb := range []string{"lb1", "lb2", "lb3", "lb4", "lb5"} {
		rf.in(lb, "ip", "route", "add", "10.78.0.0/24", "via", routed4("rt"))
		rf.in(lb, "ip", "-6", "route", "add", "fd78::/64", "via", routed6("rt"))
	}
	for _, h := range slices.Sorted(func(yield func(string) bool) {
		for h := range tunnelHosts {
			if !yield(h) {
				return
			}
		}
	}) {
		rf.kit.AddNS(h)
		rf.kit.Veth("br", "v"+h, h, "eth0")
		rf.in("br", "ip", "link", "set", "v"+h, "master", "br1")
		rf.in(h, "ip", "addr", "add", tunnel4(h)+"/24", "dev", "eth0")
		rf.in(h, "ip", "addr", "add", tunnel6(h)+"/64", "dev", "eth0", "nodad")
		rf.in(h, "ip", "route", "add", "default", "via", "10.78.0.1")
		rf.in(h, "ip", "-6", "route", "add", "default", "via", "fd78::1")
		rf.in(h, "ip", "addr", "add", vip4+"/32", "dev", "lo")
		rf.in(h, "ip", "addr", "add", vip6+"/128", "dev", "lo", "nodad")
		rf.servers[h] = rf.serve(h, 80)
		rf.serveIn(h, []int{81}, func(c net.Conn) { fmt.Fprintf(c, "%s\n", c.RemoteAddr()) }, nil, nil)
		if err := os.MkdirAll(rf.pinRoot(h), 0o700); err != nil {
			t.Fatal(err)
		}
		rf.startProc(h, "", rf.bin, "backend", "--iface", "eth0", "--lb-source", tunnelLBSources, "--pin-root", rf.pinRoot(h),
			"--metrics", "127.0.0.1:9912")
	}
	rf.poolsFor = tf.pools
	rf.members = slices.Clone(members)
	rf.writePools()
	return tf
}

// pools is the fleet's pools file: TCP services spread (IPv4, port 80), spread6 (IPv6, port
// 80) and whoami (IPv4, port 81), Maglev balance, forwarded by tunnel over the members.
func (tf *tunnelFleet) pools(members []string, weights map[string]int, drained map[string]bool) string {
	var b strings.Builder
	b.WriteString("services:\n")
	for _, svc := range []struct {
		name, vip string
		port      int
		v6        bool
	}{{"spread", vip4 + ":80", 80, false}, {"spread6", "[" + vip6 + "]:80", 80, true}, {"whoami", vip4 + ":81", 81, false}} {
		fmt.Fprintf(&b, "  - name: %s\n    protocol: tcp\n    vip: %q\n    balance: maglev\n    forwarding: tunnel\n    second_chance: %v\n",
			svc.name, svc.vip, tf.second)
		b.WriteString("    health_check: {protocol: tcp, port: 80, interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}\n")
		b.WriteString("    backends:\n")
		for _, h := range members {
			fmt.Fprintf(&b, "      - {address: %q, weight: %d, drain: %v}\n", tunnelAddr(h, svc.port, svc.v6), max(1, weights[h]), drained[h])
		}
	}
	return b.String()
}

// tunnelAddr is backend h's address as the pools file writes it.
func tunnelAddr(h string, port int, v6 bool) string {
	if v6 {
		return "[" + tunnel6(h) + "]:" + strconv.Itoa(port)
	}
	return tunnel4(h) + ":" + strconv.Itoa(port)
}

// setSecondChance rewrites the pools file with second chance on or off.
func (tf *tunnelFleet) setSecondChance(on bool) {
	tf.mu.Lock()
	tf.second = on
	tf.mu.Unlock()
	tf.writePools()
}

// agentStats sums the agents' path counters (packets) over the backends.
func (tf *tunnelFleet) agentStats() map[string]uint64 {
	out := map[string]uint64{}
	for h := range tunnelHosts {
		st, err := agent.PinnedStats(agent.Config{Iface: "eth0", PinRoot: tf.pinRoot(h)})
		if err != nil {
			tf.t.Fatal(err)
		}
		for p, c := range st {
			out[p] += c.Packets
		}
	}
	return out
}

// nodePaths is node lb's path counters (packets).
func (tf *tunnelFleet) nodePaths(lb string) map[string]uint64 {
	st, err := l4xdp.PinnedStats(l4xdp.Config{Iface: "eth0", PinRoot: tf.pinRoot(lb)})
	if err != nil {
		tf.t.Fatal(err)
	}
	out := map[string]uint64{}
	for p, c := range st.Paths {
		out[p] = c.Packets
	}
	return out
}

// rowPrimary is the backend (host name) the tunnel's table over members names for a TCP flow
// from the client's port to vip4:80: the rendezvous table policies/chash builds from the
// pools file (equal weights, 65,537 rows), at the program's flow hash.
func rowPrimary(t *testing.T, members []string, cport uint16) string {
	t.Helper()
	hosts := make([]chash.RendezvousHost, len(members))
	for i, h := range members {
		hosts[i] = chash.RendezvousHost{ID: tunnelAddr(h, 80, false), Weight: 1}
	}
	r, err := chash.NewRendezvous(hosts, chash.DefaultMaglevTableSize)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, len(r.Rows()))
	for i, p := range r.Rows() {
		names[i] = members[p.Primary]
	}
	return maglevBackend(names, netipAddrPort("10.79.0.10", cport), netipAddrPort(vip4, 80))
}
