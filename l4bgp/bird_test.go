package l4bgp

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// router is BIRD 2 as the node's router, in a process of its own, on loopback at a port of
// its own: passive, a graceful-restart helper, taking every route the node sends. A
// process, not a second GoBGP in the test's: GoBGP servers in one process race on GoBGP's
// package state (its route-selection options), and on a helper's stale marking, which -race
// would report against the speaker's tests.
type router struct {
	t    *testing.T
	port int
	ctl  string
	opts routerOpts
	cmd  *exec.Cmd
	done chan struct{}

	mu  sync.Mutex
	log strings.Builder
}

// routerOpts: a TCP MD5 password, and how many /32 routes (10.200.0.0 up) the router sends
// the node, as one misconfigured to export its table would.
type routerOpts struct {
	password  string
	originate int
}

const (
	routerASN = 65000
	nodeASN   = 65001
)

// newRouter starts BIRD at a free port, or skips the test when BIRD is not installed
// (scripts/test.sh installs bird2). A port taken between its finding and BIRD's bind (by
// some other process's connection: the machine is shared) is given up for another.
func newRouter(t *testing.T, o routerOpts) *router {
	t.Helper()
	for try := 1; ; try++ {
		r, ok := startRouter(t, loopback.FreePort(t), o)
		if ok || try == 3 {
			return r
		}
		t.Logf("BIRD could not listen on port %d: another", r.port)
	}
}

// newRouterAt starts BIRD at port.
func newRouterAt(t *testing.T, port int, o routerOpts) *router {
	t.Helper()
	r, ok := startRouter(t, port, o)
	if !ok {
		t.Fatalf("BIRD could not listen on port %d:\n%s", port, r.logText())
	}
	return r
}

// startRouter starts BIRD at port and says whether it listens there.
func startRouter(t *testing.T, port int, o routerOpts) (*router, bool) {
	t.Helper()
	if _, err := exec.LookPath("bird"); err != nil {
		t.Skip("BIRD 2 is not installed (scripts/test.sh installs bird2)")
	}
	dir := t.TempDir()
	r := &router{t: t, port: port, ctl: filepath.Join(dir, "bird.ctl"), opts: o, done: make(chan struct{})}
	path := filepath.Join(dir, "bird.conf")
	if err := os.WriteFile(path, []byte(r.config()), 0o600); err != nil {
		t.Fatal(err)
	}
	r.cmd = exec.Command("bird", "-f", "-c", path, "-s", r.ctl, "-P", filepath.Join(dir, "bird.pid"))
	stderr, err := r.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			r.mu.Lock()
			r.log.WriteString(sc.Text() + "\n")
			r.mu.Unlock()
		}
		r.cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		r.stop()
		if t.Failed() {
			t.Logf("BIRD's log (port %d):\n%s", r.port, r.logText())
		}
	})
	var listens bool
	testwait.For(t, 10*time.Second, "BIRD listening, or failing to", func() (bool, string) {
		out, err := r.birdc("show", "protocols", "node")
		listens = err == nil && strings.Contains(out, "Passive")
		return listens || strings.Contains(r.logText(), "Cannot open listening socket"), out
	})
	if !listens {
		r.stop()
	}
	return r, listens
}

// config is BIRD's: the node as a multihop neighbour (its next hop, 192.0.2.10, is not on a
// connected network; a blackhole route to it makes its routes reachable), a short wait
// after a failed session, and the routes to send the node, if any.
func (r *router) config() string {
	var b strings.Builder
	fmt.Fprintf(&b, "log stderr all;\nrouter id 192.0.2.1;\nprotocol device { }\n")
	b.WriteString("protocol static { ipv4; route 192.0.2.0/24 blackhole; }\n")
	export := "none"
	if r.opts.originate > 0 {
		b.WriteString("protocol static leak { ipv4;\n")
		for i := 0; i < r.opts.originate; i++ {
			fmt.Fprintf(&b, "\troute 10.%d.%d.%d/32 blackhole;\n", 200+i>>16, i>>8&0xff, i&0xff)
		}
		b.WriteString("}\n")
		export = `where proto = "leak"`
	}
	fmt.Fprintf(&b, `protocol bgp node {
	local 127.0.0.1 port %d as %d;
	neighbor 127.0.0.1 as %d;
	passive on;
	multihop;
	graceful restart on;
	error wait time 1, 2;
	hold time 9;
	ipv4 { import all; export %s; next hop address 192.0.2.1; };
	debug { states, events, packets };
`, r.port, routerASN, nodeASN, export)
	if r.opts.password != "" {
		fmt.Fprintf(&b, "\tpassword %q;\n", r.opts.password)
	}
	b.WriteString("}\n")
	return b.String()
}

// stop kills BIRD (a router that dies: its sessions end without a NOTIFICATION).
func (r *router) stop() {
	select {
	case <-r.done:
		return
	default:
	}
	r.cmd.Process.Kill()
	<-r.done
}

func (r *router) logText() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.log.String()
}

// birdc runs a BIRD command.
func (r *router) birdc(args ...string) (string, error) {
	out, err := exec.Command("birdc", append([]string{"-s", r.ctl}, args...)...).CombinedOutput()
	return string(out), err
}

// show is birdc's answer, failing the test when BIRD does not answer.
func (r *router) show(args ...string) string {
	r.t.Helper()
	out, err := r.birdc(args...)
	if err != nil {
		r.t.Fatalf("birdc %v: %v\n%s", args, err, out)
	}
	return out
}

// route is one route the router holds from the node.
type route struct {
	hop         string
	communities string // as BIRD prints them: (65001,7)
}

// routes lists the router's routes from the node by prefix.
func (r *router) routes() map[string]route {
	r.t.Helper()
	out := map[string]route{}
	var cur string
	for _, line := range strings.Split(r.show("show", "route", "protocol", "node", "all"), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 0 && strings.Contains(f[0], "/"):
			cur = f[0]
			out[cur] = route{}
		case cur != "" && len(f) == 2 && f[0] == "BGP.next_hop:":
			rt := out[cur]
			rt.hop = f[1]
			out[cur] = rt
		case cur != "" && len(f) >= 2 && f[0] == "BGP.community:":
			rt := out[cur]
			rt.communities = strings.Join(f[1:], " ")
			out[cur] = rt
		}
	}
	return out
}

// holds says whether the router holds exactly prefixes from the node.
func (r *router) holds(prefixes ...string) (bool, string) {
	got := r.routes()
	names := make([]string, 0, len(got))
	for p := range got {
		names = append(names, p)
	}
	slices.Sort(names)
	return slices.Equal(names, slices.Sorted(slices.Values(prefixes))), fmt.Sprint(names)
}

// waitRoutes waits until the router holds exactly prefixes from the node.
func (r *router) waitRoutes(within time.Duration, prefixes ...string) time.Duration {
	r.t.Helper()
	return testwait.For(r.t, within, fmt.Sprintf("the router holds %v", prefixes), func() (bool, string) {
		return r.holds(prefixes...)
	})
}
