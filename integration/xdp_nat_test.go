package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// NAT forwarding end to end (newNATTopo's rig): one service under `forwarding: auto` with a
// backend on the LB's subnet (b1, direct routing) and one behind a router (nb, NAT), the
// loader started with --nat-source the LB's own addresses. nb sees the LB as the client;
// b1 sees the client. Needs root (CI runs as root).

// natStats is what the test reads of `stickylb xdp stats`.
type natStats struct {
	Paths map[string]struct{ Packets, Bytes uint64 }
}

func (tp *topo) natStats(bin string) natStats {
	tp.t.Helper()
	var st natStats
	out := tp.in("lb", bin, "xdp", "stats", "--iface", "eth0", "--pin-root", tp.pinFS)
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		tp.t.Fatalf("xdp stats: %v\n%s", err, out)
	}
	return st
}

// reservedPorts is the LB namespace's ip_local_reserved_ports.
func (tp *topo) reservedPorts() string {
	tp.t.Helper()
	return tp.in("lb", "cat", "/proc/sys/net/ipv4/ip_local_reserved_ports")
}

// TestXDPNAT runs NAT and DR side by side through a deployment's life, one phase after
// another on one rig (each phase a subtest; a failed phase stops the rest; run alone, a
// phase runs the phases it needs first).
func TestXDPNAT(t *testing.T) {
	r := newXDPNATRig(t)
	const auto = "auto: DR to the backend on the subnet, NAT to the one behind the router"
	r.phases([]rigPhase{
		{"start", nil, r.start},
		{auto, []string{"start"}, r.auto},
		{"1 MiB download through NAT, and through DR", []string{auto}, r.download},
		{"the NAT ports are reserved from the LB's local ports", []string{"start"}, r.portsReserved},
		{"a loader restart keeps a NAT flow", []string{auto}, r.restartKeepsFlow},
		{"ipv6: DR and NAT, the NAT backend on another port", []string{"start"}, r.ipv6},
		{"udp through NAT", []string{"start"}, r.udp},
		{"an ICMP error from the backend's side reaches the client", []string{"start"}, r.icmpError},
		{"port exhaustion drops a new flow and counts it", []string{"start"}, r.portExhaustion},
		{"detach returns the reserved ports", []string{"start"}, r.detach},
	})
}

// xdpNATRig is TestXDPNAT's rig: the NAT network, the running loader, and the connections
// the phases keep.
type xdpNATRig struct {
	*topo
	bin, pools string
	natFlags   []string // the loader's --nat-source: the LB's own addresses
	loader     *loaderProc
	// natConn and drConn: a connection to nb (NAT) and one to b1 (DR), kept from "auto".
	natConn, drConn *whoConn
	client4, lb4    netip.Addr
	// perRound: with weights 1:1 and each CPU walking the schedule on its own, over n new
	// connections each backend's count is within CPUs of n/2: 2 x CPUs + 2 connections reach
	// both.
	perRound int
}

func newXDPNATRig(t *testing.T) *xdpNATRig {
	tp, bin, pools := startXDPTest(t, newNATTopo)
	return &xdpNATRig{topo: tp, bin: bin, pools: pools, natFlags: []string{"--nat-source", hosts["lb"].v4 + "," + hosts["lb"].v6},
		client4: netip.MustParseAddr(hosts["cl"].v4), lb4: netip.MustParseAddr(hosts["lb"].v4), perRound: 2*runtime.NumCPU() + 2}
}

// checkWho fails unless c was answered by b1 seeing the client (DR) or by nb seeing the LB's
// source address and a port of the NAT range (NAT).
func (r *xdpNATRig) checkWho(t *testing.T, c *whoConn, client, lbSource netip.Addr) {
	t.Helper()
	switch c.backend {
	case "b1":
		if c.seen.Addr() != client {
			t.Fatalf("b1 (direct routing) saw the client as %s, want %s", c.seen, client)
		}
	case "nb":
		if c.seen.Addr() != lbSource || !natPort(c.seen.Port()) {
			t.Fatalf("nb (NAT) saw the client as %s, want %s with a port in %d-%d", c.seen, lbSource, natLow, natHigh)
		}
	default:
		t.Fatalf("answered by %q", c.backend)
	}
}

func (r *xdpNATRig) start(t *testing.T) {
	if out := r.in("lb", "ip", "addr"); strings.Contains(out, "10.78.") || strings.Contains(out, "fd78:") {
		t.Fatalf("the LB has an address in nb's subnet:\n%s", out)
	}
	r.passPeer(r.bin, "lb")
	r.serveWho("b1", []int{80}, nil)
	r.serveWho("nb", []int{80, 8080, 8082}, []int{53})
	r.writeFile(r.pools, natPools())
	r.loader = r.startLoader(r.bin, r.pools, r.natFlags...)
}

func (r *xdpNATRig) auto(t *testing.T) {
	seen := map[string]int{}
	for i := 0; i < r.perRound; i++ {
		c, err := r.dialWho(vip4 + ":80")
		if err != nil {
			t.Fatalf("connection %d through the VIP: %v\nloader:\n%s", i, err, r.loader.String())
		}
		r.checkWho(t, c, r.client4, r.lb4)
		seen[c.backend]++
		if c.backend == "nb" && r.natConn == nil {
			r.natConn = c
		} else if c.backend == "b1" && r.drConn == nil {
			r.drConn = c
		} else {
			c.c.Close()
		}
	}
	if r.natConn == nil || r.drConn == nil {
		t.Fatalf("%d connections under WRR 1:1 reached %v; want both backends", r.perRound, seen)
	}
	t.Logf("%d connections: %v; nb saw the client as %s", r.perRound, seen, r.natConn.seen)
}

// The NAT backend's replies come back through the LB, so the LB receives the whole
// download; a DR backend's go straight to the client.
// It builds on the NAT and DR connections of "auto".
func (r *xdpNATRig) download(t *testing.T) {
	st0 := r.natStats(r.bin)
	rx0 := readCounter(r.topo, "lb", "rx_bytes")
	if err := r.natConn.get(1<<20, 10*time.Second); err != nil {
		t.Fatalf("1 MiB from nb through NAT: %v\nstats: %+v", err, r.natStats(r.bin))
	}
	if d := readCounter(r.topo, "lb", "rx_bytes") - rx0; d < 1<<20 {
		t.Fatalf("the LB received %d bytes during a 1 MiB NAT download: the replies did not come through it", d)
	}
	st := r.natStats(r.bin)
	for _, p := range []string{"nat_forward", "nat_reply"} {
		if st.Paths[p].Packets <= st0.Paths[p].Packets {
			t.Fatalf("path %s did not count the download: %d -> %d", p, st0.Paths[p].Packets, st.Paths[p].Packets)
		}
	}
	// 1 MiB in segments of at most 1448 bytes: at least 725 replies translated.
	if n := st.Paths["nat_reply"].Packets - st0.Paths["nat_reply"].Packets; n < (1<<20)/1448 {
		t.Fatalf("nat_reply counted %d packets for a 1 MiB download", n)
	}
	rx0 = readCounter(r.topo, "lb", "rx_bytes")
	if err := r.drConn.get(1<<20, 10*time.Second); err != nil {
		t.Fatalf("1 MiB from b1 through DR: %v", err)
	}
	if d := readCounter(r.topo, "lb", "rx_bytes") - rx0; d > 1<<18 {
		t.Fatalf("the LB received %d bytes during a 1 MiB DR download: its replies went through it", d)
	}
}

// The NAT source is the LB's own address, so its kernel must never pick a port of the
// range for a socket of its own: the loader reserves the range.
func (r *xdpNATRig) portsReserved(t *testing.T) {
	if got := r.reservedPorts(); !strings.Contains(got, fmt.Sprintf("%d-%d", natLow, natHigh)) {
		t.Fatalf("ip_local_reserved_ports in the LB's namespace is %q, want it to hold %d-%d", got, natLow, natHigh)
	}
}

// dialNB connects through the IPv4 VIP's port 80 until a connection reaches nb (NAT), each
// answered as checkWho wants, closing the others; it fails after perRound tries.
func (r *xdpNATRig) dialNB(t *testing.T) *whoConn {
	t.Helper()
	for range r.perRound {
		c, err := r.dialWho(vip4 + ":80")
		if err != nil {
			t.Fatal(err)
		}
		r.checkWho(t, c, r.client4, r.lb4)
		if c.backend == "nb" {
			return c
		}
		c.c.Close()
	}
	t.Fatalf("no connection reached nb in %d", r.perRound)
	return nil
}

// A NAT flow streams through the restart: started before the loader stops, it goes on
// while no loader runs (the program and its pinned maps stay) and after the new loader
// has adopted them, every byte checked.
// It builds on the NAT and DR connections of "auto", which must outlive the restart.
func (r *xdpNATRig) restartKeepsFlow(t *testing.T) {
	c := r.dialNB(t)
	const chunk = 16 << 10
	var streamed atomic.Int64
	var stop atomic.Bool
	defer stop.Store(true) // a failed phase ends the stream too
	done := make(chan error, 1)
	go func() {
		// 16 KiB every 10 ms: a flow that keeps packets in both directions all the time.
		pace := time.NewTicker(10 * time.Millisecond)
		defer pace.Stop()
		for !stop.Load() {
			if err := c.get(chunk, 5*time.Second); err != nil {
				done <- err
				return
			}
			streamed.Store(c.off)
			<-pace.C
		}
		done <- nil
	}()
	// streamedPast waits until the stream has passed n bytes (or has failed).
	streamedPast := func(what string, n int64) {
		t.Helper()
		testwait.For(t, 10*time.Second, what, func() (bool, string) {
			select {
			case err := <-done:
				done <- err
				return true, ""
			default:
			}
			return streamed.Load() >= n, fmt.Sprintf("%d bytes", streamed.Load())
		})
	}
	streamedPast("the NAT stream under way", 256<<10)
	r.loader.stop()
	atStop := streamed.Load()
	// No loader runs: the stream goes on through the program alone.
	streamedPast("the NAT stream going on with no loader", atStop+64<<10)
	r.loader = r.startLoader(r.bin, r.pools, r.natFlags...)
	atReady := streamed.Load()
	streamedPast("the NAT stream going on after the restart", max(atReady+512<<10, 1<<20))
	stop.Store(true)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the NAT flow broke across the restart after %d bytes (%d at the stop, %d when the new loader was ready): %v\nloader:\n%s",
				c.off, atStop, atReady, err, r.loader.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the NAT stream did not end")
	}
	t.Logf("NAT flow through the restart: %d bytes (%d at the stop, %d when the new loader was ready), each checked", c.off, atStop, atReady)
	// The connections made before the restart, NAT and DR, still carry data.
	for _, old := range []*whoConn{r.natConn, r.drConn} {
		if err := old.get(64<<10, 5*time.Second); err != nil {
			t.Fatalf("a connection to %s made before the restart: %v", old.backend, err)
		}
	}
}

// The IPv6 service's NAT backend listens on 8080 behind the VIP's port 80: auto picks
// NAT for it by the port alone, and the port is translated both ways.
func (r *xdpNATRig) ipv6(t *testing.T) {
	seen := map[string]int{}
	for i := 0; i < r.perRound; i++ {
		c, err := r.dialWho("[" + vip6 + "]:80")
		if err != nil {
			t.Fatalf("IPv6 connection %d through the VIP: %v", i, err)
		}
		r.checkWho(t, c, netip.MustParseAddr(hosts["cl"].v6), netip.MustParseAddr(hosts["lb"].v6))
		seen[c.backend]++
		if err := c.get(64<<10, 5*time.Second); err != nil {
			t.Fatalf("64 KiB from %s over IPv6: %v", c.backend, err)
		}
		c.c.Close()
	}
	if seen["nb"] == 0 || seen["b1"] == 0 {
		t.Fatalf("%d IPv6 connections under WRR 1:1 reached %v; want both backends", r.perRound, seen)
	}
}

// A UDP flow keeps its NAT source port: every datagram of one client socket reaches nb
// from the same LB address and port.
func (r *xdpNATRig) udp(t *testing.T) {
	var c net.Conn
	var err error
	r.inNS("cl", func() { c, err = net.Dial("udp", vip4+":53") })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var first netip.AddrPort
	for i := 0; i < 3; i++ {
		msg := fmt.Sprintf("q%d", i)
		var reply string
		// UDP may lose a datagram: each is retried within the bound, not waited on once,
		// and a late reply to an earlier try is skipped.
		testwait.For(t, 5*time.Second, "a UDP reply from nb through NAT", func() (bool, string) {
			c.SetDeadline(time.Now().Add(500 * time.Millisecond))
			if _, err := c.Write([]byte(msg)); err != nil {
				return false, err.Error()
			}
			buf := make([]byte, 200)
			for {
				n, err := c.Read(buf)
				if err != nil {
					return false, err.Error()
				}
				if reply = string(buf[:n]); strings.HasSuffix(reply, " "+msg) {
					return true, ""
				}
			}
		})
		f := strings.Fields(reply)
		if len(f) != 3 || f[0] != "nb" || f[2] != msg {
			t.Fatalf("UDP reply %q to %q", reply, msg)
		}
		ap, err := netip.ParseAddrPort(f[1])
		if err != nil || ap.Addr() != r.lb4 || !natPort(ap.Port()) {
			t.Fatalf("nb saw the UDP client as %s, want %s with a port in %d-%d", f[1], r.lb4, natLow, natHigh)
		}
		if i == 0 {
			first = ap
		} else if ap != first {
			t.Fatalf("the UDP flow's NAT source moved from %s to %s", first, ap)
		}
	}
}

// The router's link to nb carries 1400-byte packets, less than the client's path to the
// VIP. The client's full-sized segments, translated toward nb, meet it; the router's
// "fragmentation needed" goes to the LB's NAT source, and only its translation (to the
// client, about the client's own packet to the VIP) tells the client to send smaller:
// without it the upload stalls (path MTU black hole; TCP MTU probing is off by default).
func (r *xdpNATRig) icmpError(t *testing.T) {
	r.in("rt", "ip", "link", "set", "eth1", "mtu", "1400")
	// Only for this phase: a veth drops what its peer sends above its MTU, and nb's
	// full-sized segments of a download would meet it.
	defer r.kit.For(t).In("rt", "ip", "link", "set", "eth1", "mtu", "1500")
	c := r.dialNB(t)
	st0 := r.natStats(r.bin)
	if err := c.put(1<<20, 10*time.Second); err != nil {
		t.Fatalf("1 MiB upload to nb across a 1400-byte link: %v\nstats: %+v", err, r.natStats(r.bin))
	}
	if st := r.natStats(r.bin); st.Paths["icmp_error"].Packets <= st0.Paths["icmp_error"].Packets {
		t.Fatalf("the upload went through, but no ICMP error was translated (%d before, %d after): did the path MTU apply?",
			st0.Paths["icmp_error"].Packets, st.Paths["icmp_error"].Packets)
	}
}

// Ports are allocated per (source, backend, protocol): with a range of two ports, two
// flows to nb:8082 hold both, and a third finds none: its SYN is dropped and counted,
// never sent from a port in use, and the two go on.
func (r *xdpNATRig) portExhaustion(t *testing.T) {
	r.loader.stop()
	r.loader = r.startLoader(r.bin, r.pools, append(r.natFlags, "--nat-ports", fmt.Sprintf("%d-%d", natLow, natLow+1))...)
	var held []*whoConn
	for i := 0; i < 2; i++ {
		c, err := r.dialWho(vipTight + ":82")
		if err != nil {
			t.Fatalf("flow %d of 2 with 2 NAT ports: %v", i+1, err)
		}
		if c.backend != "nb" || c.seen.Addr() != r.lb4 || c.seen.Port() < natLow || c.seen.Port() > natLow+1 {
			t.Fatalf("flow %d: %s saw %s, want nb to see %s with port %d or %d", i+1, c.backend, c.seen, r.lb4, natLow, natLow+1)
		}
		held = append(held, c)
	}
	if held[0].seen == held[1].seen {
		t.Fatalf("two flows to one backend share the NAT source %s", held[0].seen)
	}
	st0 := r.natStats(r.bin)
	var err error
	r.inNS("cl", func() {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", vipTight+":82", time.Second); err == nil {
			c.Close()
		}
	})
	if err == nil {
		t.Fatal("a third flow connected with both NAT ports taken")
	}
	if st := r.natStats(r.bin); st.Paths["nat_no_port"].Packets <= st0.Paths["nat_no_port"].Packets {
		t.Fatalf("the third flow failed (%v) but nat_no_port did not count it: %d -> %d", err, st0.Paths["nat_no_port"].Packets, st.Paths["nat_no_port"].Packets)
	}
	for i, c := range held {
		if err := c.get(64<<10, 5*time.Second); err != nil {
			t.Fatalf("flow %d holding a NAT port: %v", i+1, err)
		}
	}
}

func (r *xdpNATRig) detach(t *testing.T) {
	r.loader.stop()
	r.in("lb", r.bin, "xdp", "detach", "--iface", "eth0", "--pin-root", r.pinFS)
	if got := r.reservedPorts(); strings.Contains(got, fmt.Sprintf("%d-%d", natLow, natHigh)) {
		t.Fatalf("ip_local_reserved_ports still holds the NAT range after detach: %q", got)
	}
}
