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

// echoServer answers each connection with its name and a newline, then echoes lines.
type echoServer struct {
	name  string
	lns   []net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (tp *topo) serve(h string, ports ...int) *echoServer {
	s := &echoServer{name: h}
	tp.inNS(h, func() {
		for _, p := range ports {
			ln, err := net.Listen("tcp", ":"+strconv.Itoa(p))
			if err != nil {
				tp.t.Fatal(err)
			}
			s.lns = append(s.lns, ln)
		}
	})
	for _, ln := range s.lns {
		go func(ln net.Listener) {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				s.mu.Lock()
				s.conns = append(s.conns, c)
				s.mu.Unlock()
				go func() {
					fmt.Fprintf(c, "%s\n", s.name)
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
				}()
			}
		}(ln)
	}
	tp.root.Cleanup(s.kill)
	return s
}

// serveUDP answers each datagram to the VIP's port 53 with the backend's name and the
// datagram, from the VIP (the socket is bound to it): a DR reply.
func (tp *topo) serveUDP(h string) {
	var pc net.PacketConn
	tp.inNS(h, func() {
		var err error
		if pc, err = net.ListenPacket("udp", vip4+":53"); err != nil {
			tp.t.Fatal(err)
		}
	})
	tp.root.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(append([]byte(h+" "), buf[:n]...), from)
		}
	}()
}

func (s *echoServer) kill() {
	for _, ln := range s.lns {
		ln.Close()
	}
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
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
// another (each a subtest; a failed phase stops the rest, which build on it).
func TestXDPEndToEnd(t *testing.T) {
	tp, bin, poolsFile := startXDPTest(t, newTopo)
	servers := map[string]*echoServer{}
	var lp, lp2 *loaderProc
	var conns []*vconn
	var udpOnB1 net.Conn // a UDP socket whose flow went to b1
	echoAll := func(t *testing.T, skip string) {
		t.Helper()
		for i, c := range conns {
			if c.backend == skip {
				continue
			}
			if err := c.echo(); err != nil {
				t.Fatalf("connection %d to %s broke: %v", i, c.backend, err)
			}
		}
	}

	tp.phase("start", func(t *testing.T) {
		if got := tp.in("lb", "sysctl", "-n", "net.ipv4.ip_forward"); got != "0" {
			t.Fatalf("the LB forwards (ip_forward=%s); DR must not rely on it", got)
		}
		if out := tp.in("lb", "ip", "addr"); strings.Contains(out, vip4) || strings.Contains(out, vip6) {
			t.Fatalf("the LB holds the VIP:\n%s", out)
		}
		// XDP_TX out of a veth delivers only when its peer runs an XDP program.
		tp.passPeer(bin, "lb")
		for _, h := range []string{"b1", "b2", "b3"} {
			servers[h] = tp.serve(h, 80, 81)
			tp.serveUDP(h)
		}
		tp.writeFile(poolsFile, poolsXDP("b1", "b2"))
		lp = tp.startLoader(bin, poolsFile)
	})

	tp.phase("tcp 5-tuple spreads", func(t *testing.T) {
		seen := map[string]int{}
		for i := 0; i < 30; i++ {
			c, err := tp.dial(vip4 + ":80")
			if err != nil {
				t.Fatalf("connection %d through XDP: %v\nloader:\n%s", i, err, lp.String())
			}
			conns = append(conns, c)
			seen[c.backend]++
		}
		if len(seen) != 2 {
			t.Fatalf("30 connections reached %v; 5-tuple hashing should use both backends", seen)
		}
	})

	tp.phase("source_ip keeps a client on one backend", func(t *testing.T) {
		sticky := map[string]int{}
		for i := 0; i < 10; i++ {
			c, err := tp.dial(vip4 + ":81")
			if err != nil {
				t.Fatal(err)
			}
			sticky[c.backend]++
		}
		if len(sticky) != 1 {
			t.Fatalf("source_ip: one client reached %v", sticky)
		}
	})

	tp.phase("ipv6", func(t *testing.T) {
		for i := 0; i < 5; i++ {
			if _, err := tp.dial("[" + vip6 + "]:80"); err != nil {
				t.Fatalf("IPv6 through XDP: %v", err)
			}
		}
	})

	// Each client socket stays on one backend, the sockets spread, and the replies come
	// from the VIP (a connected socket takes no others).
	tp.phase("udp 5-tuple", func(t *testing.T) {
		udpSeen := map[string]int{}
		for i := 0; i < 20; i++ {
			var c net.Conn
			var err error
			tp.inNS("cl", func() { c, err = net.Dial("udp", vip4+":53") })
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
					t.Fatalf("UDP socket %d, datagram %d through XDP: %v\nstats: %s", i, j, err, tp.in("lb", bin, "xdp", "stats", "--iface", "eth0", "--pin-root", tp.pinFS))
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
			if first == "b1" && udpOnB1 == nil {
				udpOnB1 = c
				tp.root.Cleanup(func() { c.Close() })
			} else {
				c.Close()
			}
			udpSeen[first]++
		}
		if len(udpSeen) != 2 {
			t.Fatalf("20 UDP sockets reached %v; 5-tuple hashing should use both backends", udpSeen)
		}
	})

	// A 1 MiB download from a backend adds little to what the LB receives (only the
	// client's ACKs pass it).
	tp.phase("replies bypass the LB", func(t *testing.T) {
		rx0 := readCounter(tp, "lb", "rx_bytes")
		if _, err := io.WriteString(conns[0].c, "big\n"); err != nil {
			t.Fatal(err)
		}
		conns[0].c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(conns[0].r, make([]byte, 1<<20)); err != nil {
			t.Fatal(err)
		}
		if d := readCounter(tp, "lb", "rx_bytes") - rx0; d > 1<<18 {
			t.Fatalf("the LB received %d bytes during a 1 MiB download: replies went through it", d)
		} else {
			t.Logf("1 MiB download: the LB saw %d bytes (client ACKs)", d)
		}
	})

	tp.phase("a backend added mid-stream", func(t *testing.T) {
		tp.writeFile(poolsFile, poolsXDP("b1", "b2", "b3"))
		testwait.For(t, 5*time.Second, "b3 takes new connections", func() (bool, string) {
			c, err := tp.dial(vip4 + ":80")
			if err != nil {
				return false, err.Error()
			}
			if c.backend == "b3" { // kept: its backend slot must survive the loader restart below
				conns = append(conns, c)
			}
			return c.backend == "b3", c.backend
		})
		echoAll(t, "")
	})

	// A killed backend drops out within interval x unhealthy_threshold + timeout (1s x 1 +
	// 0.5s) plus 2s of slack; connections to the others survive.
	tp.phase("a backend killed", func(t *testing.T) {
		killed := time.Now()
		servers["b1"].kill()
		took := time.Duration(0)
		// A round passes only if 48 new connections in a row miss b1: while b1 is still in
		// the table that happens by luck with probability (2/3)^48, under 1e-8.
		testwait.For(t, 3500*time.Millisecond, "b1 out of the tables", func() (bool, string) {
			if ok, saw := tp.noneReach("b1", 48); !ok {
				return false, saw
			}
			took = time.Since(killed)
			return true, ""
		})
		t.Logf("killed backend out of new flows after %s", took.Round(time.Millisecond))
		echoAll(t, "b1")
	})

	// b1's UDP server still answers, but b1 is down (its TCP check fails): a UDP flow does
	// not stay on a down backend (nothing would tell its client), it re-picks. Within the
	// same detection bound as above.
	tp.phase("a UDP flow leaves a down backend", func(t *testing.T) {
		if udpOnB1 == nil {
			t.Fatal("no UDP socket reached b1")
		}
		testwait.For(t, 3500*time.Millisecond, "the UDP flow of b1 re-picked", func() (bool, string) {
			udpOnB1.SetDeadline(time.Now().Add(300 * time.Millisecond))
			if _, err := udpOnB1.Write([]byte("still there?")); err != nil {
				return false, err.Error()
			}
			buf := make([]byte, 100)
			n, err := udpOnB1.Read(buf)
			if err != nil {
				return false, err.Error()
			}
			name, _, _ := strings.Cut(string(buf[:n]), " ")
			return name != "b1", name
		})
	})

	// SIGTERM leaves the program forwarding; a new loader adopts the maps.
	tp.phase("loader restart", func(t *testing.T) {
		lp.stop()
		echoAll(t, "b1")
		lp2 = tp.startLoader(bin, poolsFile, "--metrics", "127.0.0.1:9901")
		echoAll(t, "b1")
		// The new loader read b1's last verdict (down) from the pinned state: no new flow goes
		// to b1 while its own checker has none yet, so every connection succeeds at once.
		for i := 0; i < 12; i++ {
			c, err := tp.dial(vip4 + ":80")
			if err != nil {
				t.Fatalf("new connection %d right after the restart: %v", i, err)
			}
			conns = append(conns, c)
		}
	})

	tp.phase("counters in stats and metrics", func(t *testing.T) {
		var st struct {
			Paths, VIPs, Backends map[string]struct{ Packets, Bytes uint64 }
		}
		stats := tp.in("lb", bin, "xdp", "stats", "--iface", "eth0", "--pin-root", tp.pinFS)
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
		metrics := tp.get("lb", "127.0.0.1:9901", "/metrics")
		// Only the address's own names: a page from another name (DNS rebinding) reads nothing.
		for _, p := range []string{"/metrics", "/", "/status.json"} {
			if resp := tp.getHost("lb", "127.0.0.1:9901", "evil.example:9901", p); !strings.HasPrefix(resp, "HTTP/1.0 421 ") {
				t.Errorf("GET %s with Host evil.example: %.200q, want 421", p, resp)
			}
		}
		for _, m := range []string{`stickylb_xdp_vip_packets_total{service="spread"}`, `stickylb_xdp_backend_bytes_total{backend="` + hosts["b2"].v4 + `:80",service="spread"}`,
			`stickylb_xdp_conn_table_lookups_total{result="hit"}`, `stickylb_xdp_packets_total{path="forward"}`,
			`stickylb_xdp_backend_active_connections{backend="` + hosts["b2"].v4 + `:80",service="spread"}`} {
			if !strings.Contains(metrics, m) {
				t.Errorf("metrics lack %s:\n%s", m, metrics)
			}
		}
	})

	tp.phase("a bad edit changes nothing", func(t *testing.T) {
		tp.writeFile(poolsFile, "services:\n  - name: spread\n    protocol: tcp\n    vip: nonsense\n")
		testwait.For(t, 5*time.Second, "the bad edit logged", func() (bool, string) {
			return strings.Contains(lp2.String(), "invalid pools file edit"), ""
		})
		// The status page says so too, with the edit's errors; the log line has no Go stack.
		testwait.For(t, 5*time.Second, "status.json shows the refused edit", func() (bool, string) {
			_, body, _ := strings.Cut(tp.get("lb", "127.0.0.1:9901", "/status.json"), "\r\n\r\n")
			var snap status.Snapshot
			if err := json.Unmarshal([]byte(body), &snap); err != nil {
				return false, err.Error()
			}
			c := snap.Config
			return c != nil && c.Path == poolsFile && c.Refused != nil && len(c.Refused.Errors) > 0 &&
				strings.HasPrefix(c.Refused.Errors[0], poolsFile+":"), body
		})
		if strings.Contains(lp2.String(), "stacktrace") {
			t.Fatalf("the loader logged a stack trace:\n%s", lp2.String())
		}
		echoAll(t, "b1")
	})

	tp.phase("a drained backend keeps its connections", func(t *testing.T) {
		b2 := fmt.Sprintf("{address: %q}", hosts["b2"].v4+":80")
		tp.writeFile(poolsFile, strings.Replace(poolsXDP("b1", "b2", "b3"), b2, strings.TrimSuffix(b2, "}")+", drain: true}", 1))
		testwait.For(t, 5*time.Second, "no new connection to the drained b2", func() (bool, string) {
			return tp.noneReach("b2", 32) // missing b2 by luck while it is in the table: 2^-32
		})
		drainedConns := 0
		for _, c := range conns {
			if c.backend == "b2" {
				drainedConns++
			}
		}
		if drainedConns == 0 {
			t.Fatal("no connection to b2 to watch through the drain")
		}
		echoAll(t, "b1")
	})

	tp.phase("a removed VIP stops being forwarded", func(t *testing.T) {
		tp.writeFile(poolsFile, poolsXDPServices([]string{"spread", "spread6"}, "b1", "b2", "b3"))
		testwait.For(t, 5*time.Second, "sticky gone from the forwarder", func() (bool, string) {
			out := tp.in("lb", bin, "xdp", "stats", "--iface", "eth0", "--pin-root", tp.pinFS)
			return !strings.Contains(out, `"sticky"`), out
		})
		var err error
		tp.inNS("cl", func() {
			var c net.Conn
			if c, err = net.DialTimeout("tcp", vip4+":81", 500*time.Millisecond); err == nil {
				c.Close()
			}
		})
		if err == nil {
			t.Fatal("a connection to the removed VIP succeeded")
		}
		echoAll(t, "b1")
	})

	tp.phase("detach", func(t *testing.T) {
		lp2.stop()
		tp.in("lb", bin, "xdp", "detach", "--iface", "eth0", "--pin-root", tp.pinFS)
		if out := tp.in("lb", "ip", "link", "show", "eth0"); strings.Contains(out, "xdp") {
			t.Fatalf("still attached after detach: %s", out)
		}
	})
}
