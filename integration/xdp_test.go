package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/netnstest"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"github.com/stickylb/stickylb/policies/status"
)

// The XDP forwarder end to end, in network namespaces made by the test: a client, the LB
// and three backends on one bridge (in its own namespace). The VIP sits on each backend's
// lo with arp_ignore/arp_announce; the LB owns no VIP address and has forwarding off.
// Needs root (CI runs as root).

type topo struct {
	t     *testing.T // fails on an error: the test, or the phase (subtest) running
	root  *testing.T // owns what lasts the whole test: servers, connections, loaders
	kit   *netnstest.Kit
	pinFS string
}

func (tp *topo) in(ns string, args ...string) string {
	tp.t.Helper()
	return tp.kit.For(tp.t).In(ns, args...)
}

var hosts = map[string]struct{ v4, v6 string }{
	"cl": {"10.77.0.10", "fd77::10"}, "lb": {"10.77.0.2", "fd77::2"},
	"b1": {"10.77.0.11", "fd77::11"}, "b2": {"10.77.0.12", "fd77::12"}, "b3": {"10.77.0.13", "fd77::13"},
}

const (
	vip4 = "10.77.100.1"
	vip6 = "fd77:100::1"
)

// newTopo is the XDP tests' network: a client, the LB and three backends, dual stack.
func newTopo(t *testing.T) *topo {
	return newLAN(t, lan{
		prefix: "sl",
		hosts:  []string{"cl", "lb", "b1", "b2", "b3"},
		v4:     func(h string) string { return hosts[h].v4 },
		v6:     func(h string) string { return hosts[h].v6 },
		via:    map[string]string{"cl": "lb"},
	})
}

// phase runs one phase of a test as a subtest (its failures are its own) and stops the test
// after a failed phase: the later ones build on it.
func (tp *topo) phase(name string, fn func(t *testing.T)) {
	root := tp.t
	if !root.Run(name, func(t *testing.T) {
		tp.t = t
		defer func() { tp.t = root }()
		fn(t)
	}) {
		root.FailNow()
	}
}

// A rigPhase is one phase of an end-to-end test on a rig: a subtest of its name. needs names
// the earlier phases whose state it builds on (servers, connections, a loader, an edit of
// the pools file); a phase with none but the rig's start can run alone.
type rigPhase struct {
	name  string
	needs []string
	run   func(t *testing.T)
}

// phases runs ps in order, each as a subtest, and stops the test after a failed one (later
// ones may build on it). A phase that -run selects without the phases it needs runs them
// first, in their order, inside its own subtest (each logged), so `go test -run
// 'TestX/^phase$'` runs one phase with what it builds on, and a failure there still names
// the phase asked for.
func (tp *topo) phases(ps []rigPhase) {
	root := tp.t
	index := map[string]int{}
	for i, p := range ps {
		if _, dup := index[p.name]; dup {
			root.Fatalf("two phases named %q", p.name)
		}
		for _, n := range p.needs {
			if _, ok := index[n]; !ok {
				root.Fatalf("phase %q needs %q, which is not an earlier phase", p.name, n)
			}
		}
		index[p.name] = i
	}
	done := make([]bool, len(ps))
	// missing lists the phases p needs, directly or through another, that have not run.
	var missing func(i int, into map[int]bool)
	missing = func(i int, into map[int]bool) {
		for _, n := range ps[i].needs {
			if j := index[n]; !done[j] && !into[j] {
				into[j] = true
				missing(j, into)
			}
		}
	}
	for i, p := range ps {
		ran := false
		ok := root.Run(p.name, func(t *testing.T) {
			ran = true
			tp.t = t
			defer func() { tp.t = root }()
			first := map[int]bool{}
			missing(i, first)
			for j := range ps[:i] {
				if !first[j] {
					continue
				}
				t.Logf("running phase %q first: %q builds on it", ps[j].name, p.name)
				ps[j].run(t)
				if t.Failed() {
					t.Fatalf("phase %q, which %q builds on, failed", ps[j].name, p.name)
				}
				done[j] = true
			}
			p.run(t)
		})
		if !ok {
			root.FailNow()
		}
		done[i] = done[i] || ran
	}
}

// writeFile writes a pools file, failing the phase if it cannot.
func (tp *topo) writeFile(path, content string) {
	tp.t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		tp.t.Fatal(err)
	}
}

// inNS runs fn with the calling goroutine's thread in namespace h: sockets it creates stay
// there.
func (tp *topo) inNS(h string, fn func()) {
	tp.t.Helper()
	tp.kit.For(tp.t).MustDo(h, func() error { fn(); return nil })
}

// get fetches path over HTTP/1.0 from addr inside namespace h (the socket is made on a
// thread in h; Go's HTTP client would dial from another thread).
func (tp *topo) get(h, addr, path string) string { return tp.getHost(h, addr, addr, path) }

// getHost is get with the Host header host.
func (tp *topo) getHost(h, addr, host, path string) string {
	var out []byte
	var err error
	tp.inNS(h, func() {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", addr, 3*time.Second); err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, host)
		out, err = io.ReadAll(c)
	})
	if err != nil {
		tp.t.Fatalf("GET %s%s in %s: %v", addr, path, h, err)
	}
	return string(out)
}

// noneReach opens n new connections to the VIP's port 80, closing each, and reports whether
// none reached backend (and, if one did or a dial failed, what).
func (tp *topo) noneReach(backend string, n int) (bool, string) {
	for i := 0; i < n; i++ {
		c, err := tp.dial(vip4 + ":80")
		if err != nil {
			return false, err.Error()
		}
		c.c.Close()
		if c.backend == backend {
			return false, backend
		}
	}
	return true, ""
}

// serveIn serves, in namespace h, the TCP ports tcp (every address) with handle and the UDP
// sockets bound to udp (each "host:port") with reply, until the test ends or the server is
// closed (a backend that dies with its connections).
func (tp *topo) serveIn(h string, tcp []int, handle func(net.Conn), udp []string, reply func(net.Addr, []byte) []byte) *loopback.Server {
	tp.t.Helper()
	s := loopback.NewServer(tp.root)
	tp.inNS(h, func() {
		for _, p := range tcp {
			ln, err := net.Listen("tcp", ":"+strconv.Itoa(p))
			if err != nil {
				tp.t.Fatal(err)
			}
			s.Serve(ln, handle)
		}
		for _, a := range udp {
			pc, err := net.ListenPacket("udp", a)
			if err != nil {
				tp.t.Fatal(err)
			}
			s.ServePackets(pc, reply)
		}
	})
	return s
}

// serve starts an echo server in namespace h on the TCP ports: it answers each connection
// with its name and a newline, then echoes lines ("big" lines with 1 MiB).
func (tp *topo) serve(h string, ports ...int) *loopback.Server {
	return tp.serveIn(h, ports, func(c net.Conn) {
		fmt.Fprintf(c, "%s\n", h)
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if strings.HasPrefix(line, "big") {
				c.Write(make([]byte, 1<<20))
				continue
			}
			io.WriteString(c, line)
		}
	}, nil, nil)
}

// serveUDP answers each datagram to the VIP's port 53 with the backend's name and the
// datagram, from the VIP (the socket is bound to it): a DR reply.
func (tp *topo) serveUDP(h string) {
	tp.serveIn(h, nil, nil, []string{vip4 + ":53"}, func(_ net.Addr, d []byte) []byte { return append([]byte(h+" "), d...) })
}

type vconn struct {
	c       net.Conn
	r       *bufio.Reader
	backend string
}

// dial connects from the client namespace and reads which backend answered.
func (tp *topo) dial(addr string) (*vconn, error) { return tp.dialVia("cl", addr) }

func (v *vconn) echo() error {
	v.c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(v.c, "ping\n"); err != nil {
		return err
	}
	line, err := v.r.ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return fmt.Errorf("echo %q", line)
	}
	return nil
}

func buildStickylb(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "stickylb")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/stickylb")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/stickylb: %v\n%s", err, out)
	}
	return bin
}

type loaderProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  *strings.Builder
	mu   sync.Mutex
}

// startLoader runs `stickylb xdp` in the LB namespace and waits for "ready".
func (tp *topo) startLoader(bin, poolsFile string, extra ...string) *loaderProc {
	return tp.startProc("lb", "", append([]string{bin, "xdp", "--pools", poolsFile, "--iface", "eth0",
		"--mode", "native", "--pin-root", tp.pinFS, "--poll", "100ms"}, extra...)...)
}

type lockedWriter struct{ lp *loaderProc }

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.lp.mu.Lock()
	defer w.lp.mu.Unlock()
	return w.lp.log.Write(b)
}

func (lp *loaderProc) String() string {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	return lp.log.String()
}

func (lp *loaderProc) stop() {
	select {
	case <-lp.done:
		return
	default:
	}
	lp.cmd.Process.Signal(os.Interrupt)
	select {
	case <-lp.done:
	case <-time.After(10 * time.Second):
		lp.cmd.Process.Kill()
		<-lp.done
	}
}

// poolsXDP writes the test's pools file: TCP services spread, sticky and spread6 and the UDP
// service dgram over the given backends (poolsXDPServices: only the services named).
func poolsXDP(backends ...string) string {
	return poolsXDPServices([]string{"spread", "sticky", "spread6", "dgram"}, backends...)
}

func poolsXDPServices(only []string, backends ...string) string {
	var b strings.Builder
	svc := func(name, vip, mode string, port int, v6 bool) {
		if !slices.Contains(only, name) {
			return
		}
		proto := "tcp"
		if name == "dgram" {
			proto = "udp"
		}
		fmt.Fprintf(&b, "  - name: %s\n    protocol: %s\n    vip: %q\n    affinity: {mode: %s}\n    balance: maglev\n", name, proto, vip, mode)
		if proto == "tcp" {
			b.WriteString("    health_check: {protocol: tcp, interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}\n")
		} else { // the backends' TCP echo server stands for their health
			b.WriteString("    health_check: {protocol: tcp, port: 80, interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}\n")
		}
		b.WriteString("    backends:\n")
		for _, h := range backends {
			a := hosts[h].v4 + ":" + strconv.Itoa(port)
			if v6 {
				a = "[" + hosts[h].v6 + "]:" + strconv.Itoa(port)
			}
			fmt.Fprintf(&b, "      - {address: %q}\n", a)
		}
	}
	b.WriteString("services:\n")
	svc("spread", vip4+":80", "none", 80, false)
	svc("sticky", vip4+":81", "source_ip", 81, false)
	svc("spread6", "["+vip6+"]:80", "none", 80, true)
	svc("dgram", vip4+":53", "none", 53, false)
	return b.String()
}

func readCounter(tp *topo, h, what string) int64 {
	v, _ := strconv.ParseInt(tp.in(h, "cat", "/sys/class/net/eth0/statistics/"+what), 10, 64)
	return v
}

// TestXDPEndToEnd runs the forwarder through the life of a deployment, one phase after
// another on one rig (each phase a subtest; a failed phase stops the rest; run alone, a
// phase runs the phases it needs first).
func TestXDPEndToEnd(t *testing.T) {
	r := newXDPE2E(t)
	r.phases([]rigPhase{
		{"start", nil, r.start},
		{"tcp 5-tuple spreads", []string{"start"}, r.tcpSpreads},
		{"source_ip keeps a client on one backend", []string{"start"}, r.sourceIPSticks},
		{"ipv6", []string{"start"}, r.ipv6},
		{"udp 5-tuple", []string{"start"}, r.udpSpreads},
		{"replies bypass the LB", []string{"tcp 5-tuple spreads"}, r.repliesBypass},
		{"a backend added mid-stream", []string{"start"}, r.backendAdded},
		{"a backend killed", []string{"start"}, r.backendKilled},
		{"a UDP flow leaves a down backend", []string{"udp 5-tuple", "a backend killed"}, r.udpLeavesDown},
		{"loader restart", []string{"a backend killed"}, r.loaderRestart},
		{"counters in stats and metrics", []string{"source_ip keeps a client on one backend", "ipv6", "udp 5-tuple", "a backend added mid-stream", "loader restart"}, r.counters},
		{"a bad edit changes nothing", []string{"loader restart"}, r.badEdit},
		{"a drained backend keeps its connections", []string{"tcp 5-tuple spreads"}, r.drained},
		{"a removed VIP stops being forwarded", []string{"start"}, r.removedVIP},
		{"detach", []string{"start"}, r.detach},
	})
}

// xdpE2E is TestXDPEndToEnd's rig: the network, the running loader, and what the phases
// leave for the later ones.
type xdpE2E struct {
	*topo
	bin, pools string
	servers    map[string]*loopback.Server
	loader     *loaderProc // the loader running now
	conns      []*vconn    // connections the phases keep open, echoed through every change
	udpOnB1    net.Conn    // a UDP socket whose flow went to b1
}

func newXDPE2E(t *testing.T) *xdpE2E {
	tp, bin, pools := startXDPTest(t, newTopo)
	return &xdpE2E{topo: tp, bin: bin, pools: pools, servers: map[string]*loopback.Server{}}
}

// echoAll fails unless every kept connection, but those to backend skip, still echoes.
func (r *xdpE2E) echoAll(t *testing.T, skip string) {
	t.Helper()
	for i, c := range r.conns {
		if c.backend == skip {
			continue
		}
		if err := c.echo(); err != nil {
			t.Fatalf("connection %d to %s broke: %v", i, c.backend, err)
		}
	}
}

func (r *xdpE2E) start(t *testing.T) {
	if got := r.in("lb", "sysctl", "-n", "net.ipv4.ip_forward"); got != "0" {
		t.Fatalf("the LB forwards (ip_forward=%s); DR must not rely on it", got)
	}
	if out := r.in("lb", "ip", "addr"); strings.Contains(out, vip4) || strings.Contains(out, vip6) {
		t.Fatalf("the LB holds the VIP:\n%s", out)
	}
	// XDP_TX out of a veth delivers only when its peer runs an XDP program.
	r.passPeer(r.bin, "lb")
	for _, h := range []string{"b1", "b2", "b3"} {
		r.servers[h] = r.serve(h, 80, 81)
		r.serveUDP(h)
	}
	r.writeFile(r.pools, poolsXDP("b1", "b2"))
	r.loader = r.startLoader(r.bin, r.pools)
}

func (r *xdpE2E) tcpSpreads(t *testing.T) {
	seen := map[string]int{}
	for i := 0; i < 30; i++ {
		c, err := r.dial(vip4 + ":80")
		if err != nil {
			t.Fatalf("connection %d through XDP: %v\nloader:\n%s", i, err, r.loader.String())
		}
		r.conns = append(r.conns, c)
		seen[c.backend]++
	}
	if len(seen) != 2 {
		t.Fatalf("30 connections reached %v; 5-tuple hashing should use both backends", seen)
	}
}

func (r *xdpE2E) sourceIPSticks(t *testing.T) {
	sticky := map[string]int{}
	for i := 0; i < 10; i++ {
		c, err := r.dial(vip4 + ":81")
		if err != nil {
			t.Fatal(err)
		}
		sticky[c.backend]++
	}
	if len(sticky) != 1 {
		t.Fatalf("source_ip: one client reached %v", sticky)
	}
}

func (r *xdpE2E) ipv6(t *testing.T) {
	for i := 0; i < 5; i++ {
		if _, err := r.dial("[" + vip6 + "]:80"); err != nil {
			t.Fatalf("IPv6 through XDP: %v", err)
		}
	}
}

// Each client socket stays on one backend, the sockets spread, and the replies come
// from the VIP (a connected socket takes no others).
func (r *xdpE2E) udpSpreads(t *testing.T) {
	udpSeen := map[string]int{}
	for i := 0; i < 20; i++ {
		var c net.Conn
		var err error
		r.inNS("cl", func() { c, err = net.Dial("udp", vip4+":53") })
		if err != nil {
			t.Fatal(err)
		}
		first := ""
		for j := 0; j < 3; j++ {
			c.SetDeadline(time.Now().Add(3 * time.Second))
			msg := fmt.Sprintf("q%d-%d", i, j)
			buf := make([]byte, 100)
			if _, err := c.Write([]byte(msg)); err != nil {
				t.Fatal(err)
			}
			n, err := c.Read(buf)
			if err != nil {
				t.Fatalf("UDP socket %d, datagram %d through XDP: %v\nstats: %s", i, j, err, r.in("lb", r.bin, "xdp", "stats", "--iface", "eth0", "--pin-root", r.pinFS))
			}
			name, echoed, _ := strings.Cut(string(buf[:n]), " ")
			if echoed != msg {
				t.Fatalf("UDP reply %q to %q", buf[:n], msg)
			}
			if first == "" {
				first = name
			} else if name != first {
				t.Fatalf("UDP socket %d moved from %s to %s", i, first, name)
			}
		}
		if first == "b1" && r.udpOnB1 == nil {
			r.udpOnB1 = c
			r.root.Cleanup(func() { c.Close() })
		} else {
			c.Close()
		}
		udpSeen[first]++
	}
	if len(udpSeen) != 2 {
		t.Fatalf("20 UDP sockets reached %v; 5-tuple hashing should use both backends", udpSeen)
	}
}

// A 1 MiB download from a backend adds little to what the LB receives (only the
// client's ACKs pass it).
// It builds on a connection of "tcp 5-tuple spreads".
func (r *xdpE2E) repliesBypass(t *testing.T) {
	rx0 := readCounter(r.topo, "lb", "rx_bytes")
	if _, err := io.WriteString(r.conns[0].c, "big\n"); err != nil {
		t.Fatal(err)
	}
	r.conns[0].c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(r.conns[0].r, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if d := readCounter(r.topo, "lb", "rx_bytes") - rx0; d > 1<<18 {
		t.Fatalf("the LB received %d bytes during a 1 MiB download: replies went through it", d)
	} else {
		t.Logf("1 MiB download: the LB saw %d bytes (client ACKs)", d)
	}
}

func (r *xdpE2E) backendAdded(t *testing.T) {
	r.writeFile(r.pools, poolsXDP("b1", "b2", "b3"))
	testwait.For(t, 5*time.Second, "b3 takes new connections", func() (bool, string) {
		c, err := r.dial(vip4 + ":80")
		if err != nil {
			return false, err.Error()
		}
		if c.backend == "b3" { // kept: its backend slot must survive the loader restart below
			r.conns = append(r.conns, c)
		}
		return c.backend == "b3", c.backend
	})
	r.echoAll(t, "")
}

// A killed backend drops out within interval x unhealthy_threshold + timeout (1s x 1 +
// 0.5s) plus 2s of slack; connections to the others survive.
func (r *xdpE2E) backendKilled(t *testing.T) {
	killed := time.Now()
	r.servers["b1"].Close()
	took := time.Duration(0)
	// A round passes only if 48 new connections in a row miss b1: while b1 is still in
	// the table that happens by luck with probability (2/3)^48, under 1e-8.
	testwait.For(t, 3500*time.Millisecond, "b1 out of the tables", func() (bool, string) {
		if ok, saw := r.noneReach("b1", 48); !ok {
			return false, saw
		}
		took = time.Since(killed)
		return true, ""
	})
	t.Logf("killed backend out of new flows after %s", took.Round(time.Millisecond))
	r.echoAll(t, "b1")
}

// b1's UDP server still answers, but b1 is down (its TCP check fails): a UDP flow does
// not stay on a down backend (nothing would tell its client), it re-picks. Within the
// same detection bound as above.
// It builds on the UDP socket on b1 of "udp 5-tuple" and on b1 killed in "a backend
// killed".
func (r *xdpE2E) udpLeavesDown(t *testing.T) {
	if r.udpOnB1 == nil {
		t.Fatal("no UDP socket reached b1")
	}
	testwait.For(t, 3500*time.Millisecond, "the UDP flow of b1 re-picked", func() (bool, string) {
		r.udpOnB1.SetDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := r.udpOnB1.Write([]byte("still there?")); err != nil {
			return false, err.Error()
		}
		buf := make([]byte, 100)
		n, err := r.udpOnB1.Read(buf)
		if err != nil {
			return false, err.Error()
		}
		name, _, _ := strings.Cut(string(buf[:n]), " ")
		return name != "b1", name
	})
}

// SIGTERM leaves the program forwarding; a new loader adopts the maps.
// It builds on b1 killed in "a backend killed": the new loader keeps its verdict.
func (r *xdpE2E) loaderRestart(t *testing.T) {
	r.loader.stop()
	r.echoAll(t, "b1")
	r.loader = r.startLoader(r.bin, r.pools, "--metrics", "127.0.0.1:9901")
	r.echoAll(t, "b1")
	// The new loader read b1's last verdict (down) from the pinned state: no new flow goes
	// to b1 while its own checker has none yet, so every connection succeeds at once.
	for i := 0; i < 12; i++ {
		c, err := r.dial(vip4 + ":80")
		if err != nil {
			t.Fatalf("new connection %d right after the restart: %v", i, err)
		}
		r.conns = append(r.conns, c)
	}
}

// The counters count the traffic of the phases this one needs, and the metrics are those of
// the loader "loader restart" starts.
func (r *xdpE2E) counters(t *testing.T) {
	var st struct {
		Paths, VIPs, Backends map[string]struct{ Packets, Bytes uint64 }
	}
	stats := r.in("lb", r.bin, "xdp", "stats", "--iface", "eth0", "--pin-root", r.pinFS)
	if err := json.Unmarshal([]byte(stats), &st); err != nil {
		t.Fatalf("stats: %v\n%s", err, stats)
	}
	for what, c := range map[string]uint64{"paths conn_hit": st.Paths["conn_hit"].Packets, "paths conn_miss": st.Paths["conn_miss"].Packets,
		"vips spread": st.VIPs["spread"].Packets, "vips dgram": st.VIPs["dgram"].Packets, "vips spread6": st.VIPs["spread6"].Packets, "vips sticky bytes": st.VIPs["sticky"].Bytes,
		"backends spread/b3": st.Backends["spread/"+hosts["b3"].v4+":80"].Packets} {
		if c == 0 {
			t.Errorf("stats: %s is 0:\n%s", what, stats)
		}
	}
	metrics := r.get("lb", "127.0.0.1:9901", "/metrics")
	// Only the address's own names: a page from another name (DNS rebinding) reads nothing.
	for _, p := range []string{"/metrics", "/", "/status.json"} {
		if resp := r.getHost("lb", "127.0.0.1:9901", "evil.example:9901", p); !strings.HasPrefix(resp, "HTTP/1.0 421 ") {
			t.Errorf("GET %s with Host evil.example: %.200q, want 421", p, resp)
		}
	}
	for _, m := range []string{`stickylb_xdp_vip_packets_total{service="spread"}`, `stickylb_xdp_backend_bytes_total{backend="` + hosts["b2"].v4 + `:80",service="spread"}`,
		`stickylb_xdp_conn_table_lookups_total{result="hit"}`, `stickylb_xdp_packets_total{path="forward"}`,
		`stickylb_xdp_nat_holds_reclaimed_total 0`, `stickylb_xdp_packets_total{path="nat_reclaim"}`,
		`stickylb_xdp_backend_active_connections{backend="` + hosts["b2"].v4 + `:80",service="spread"}`} {
		if !strings.Contains(metrics, m) {
			t.Errorf("metrics lack %s:\n%s", m, metrics)
		}
	}
}

// It reads the status page of the loader "loader restart" starts (with --metrics).
func (r *xdpE2E) badEdit(t *testing.T) {
	r.writeFile(r.pools, "services:\n  - name: spread\n    protocol: tcp\n    vip: nonsense\n")
	testwait.For(t, 5*time.Second, "the bad edit logged", func() (bool, string) {
		return strings.Contains(r.loader.String(), "invalid pools file edit"), ""
	})
	// The status page says so too, with the edit's errors; the log line has no Go stack.
	testwait.For(t, 5*time.Second, "status.json shows the refused edit", func() (bool, string) {
		_, body, _ := strings.Cut(r.get("lb", "127.0.0.1:9901", "/status.json"), "\r\n\r\n")
		var snap status.Snapshot
		if err := json.Unmarshal([]byte(body), &snap); err != nil {
			return false, err.Error()
		}
		c := snap.Config
		return c != nil && c.Path == r.pools && c.Refused != nil && len(c.Refused.Errors) > 0 &&
			strings.HasPrefix(c.Refused.Errors[0], r.pools+":"), body
	})
	if strings.Contains(r.loader.String(), "stacktrace") {
		t.Fatalf("the loader logged a stack trace:\n%s", r.loader.String())
	}
	r.echoAll(t, "b1")
}

// A drained backend's connections go on: those to b2 of "tcp 5-tuple spreads" are watched.
func (r *xdpE2E) drained(t *testing.T) {
	b2 := fmt.Sprintf("{address: %q}", hosts["b2"].v4+":80")
	r.writeFile(r.pools, strings.Replace(poolsXDP("b1", "b2", "b3"), b2, strings.TrimSuffix(b2, "}")+", drain: true}", 1))
	testwait.For(t, 5*time.Second, "no new connection to the drained b2", func() (bool, string) {
		return r.noneReach("b2", 32) // missing b2 by luck while it is in the table: 2^-32
	})
	drainedConns := 0
	for _, c := range r.conns {
		if c.backend == "b2" {
			drainedConns++
		}
	}
	if drainedConns == 0 {
		t.Fatal("no connection to b2 to watch through the drain")
	}
	r.echoAll(t, "b1")
}

func (r *xdpE2E) removedVIP(t *testing.T) {
	r.writeFile(r.pools, poolsXDPServices([]string{"spread", "spread6"}, "b1", "b2", "b3"))
	testwait.For(t, 5*time.Second, "sticky gone from the forwarder", func() (bool, string) {
		out := r.in("lb", r.bin, "xdp", "stats", "--iface", "eth0", "--pin-root", r.pinFS)
		return !strings.Contains(out, `"sticky"`), out
	})
	var err error
	r.inNS("cl", func() {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", vip4+":81", 500*time.Millisecond); err == nil {
			c.Close()
		}
	})
	if err == nil {
		t.Fatal("a connection to the removed VIP succeeded")
	}
	r.echoAll(t, "b1")
}

func (r *xdpE2E) detach(t *testing.T) {
	r.loader.stop()
	r.in("lb", r.bin, "xdp", "detach", "--iface", "eth0", "--pin-root", r.pinFS)
	if out := r.in("lb", "ip", "link", "show", "eth0"); strings.Contains(out, "xdp") {
		t.Fatalf("still attached after detach: %s", out)
	}
}
