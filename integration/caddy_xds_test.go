package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// Caddy nodes fed by the control plane, with the real binaries: `stickylb xds` serving and
// probing a pools file, and the Caddy built from ./cmd/caddy with `dynamic stickylb_xds`.

const (
	// cxPushSlack covers the verdict's way from the checker to Caddy (one snapshot build and
	// one ADS push: milliseconds idle) on two cores shared by the whole CI run.
	cxPushSlack = 2 * time.Second
	// cxPoll is the control plane's --poll of the pools file.
	cxPoll = 100 * time.Millisecond
	// cxK new sessions per check: with at least two live backends and picks at worst
	// uniformly random, all of them miss a given one with probability <= (1/2)^40 < 1e-6,
	// and a dead one among three is missed by all with probability (2/3)^40 < 1e-6.
	cxK = 40
)

// cxPools is the pools file of service api over backends at addrs.
func cxPools(addrs ...string) string { return poolstest.API(poolstest.Addresses(addrs...)...) }

// cxCaddyfile is a Caddy with one site on 127.0.0.1:port proxying to service api of the
// control plane at server as node nodeID; extra goes in the source's block, more after it
// in reverse_proxy's.
func cxCaddyfile(port int, server, nodeID, extra, more string) string {
	return fmt.Sprintf(`{
	admin off
	persist_config off
	auto_https off
}
http://127.0.0.1:%d {
	reverse_proxy {
		dynamic stickylb_xds {
			server  %s
			service api
			node_id %s
			%s
		}%s
	}
}
`, port, server, nodeID, extra, more)
}

// writeAtomic replaces path's content in one rename, so the control plane's watcher never
// reads half a file.
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestCaddyXDSSource(t *testing.T) {
	if testing.Short() {
		t.Skip("builds stickylb, runs it and Caddy (twice): about 15 s, 35 s when it also builds Caddy")
	}
	bin := buildStickylb(t)
	b1, b2, b3 := startBackend(t, "b1"), startBackend(t, "b2"), startBackend(t, "b3")
	dir := t.TempDir()
	poolsFile := filepath.Join(dir, "pools.yaml")
	writeAtomic(t, poolsFile, cxPools(b1.addr, b2.addr))

	cpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cp := exec.Command(bin, "xds", "--pools", poolsFile, "--listen", cpAddr, "--poll", cxPoll.String())
	cpLog, _ := os.Create(filepath.Join(dir, "xds.log"))
	cp.Stdout, cp.Stderr = cpLog, cpLog
	if err := cp.Start(); err != nil {
		t.Fatal(err)
	}
	cpDone := make(chan struct{})
	go func() { _ = cp.Wait(); close(cpDone) }()
	stopCP := func() {
		_ = cp.Process.Kill()
		<-cpDone
	}
	t.Cleanup(func() {
		stopCP()
		if t.Failed() {
			b, _ := os.ReadFile(cpLog.Name())
			t.Logf("stickylb xds log:\n%s", b)
		}
	})
	waitPort(t, cpAddr, 30*time.Second)

	port := freePort(t)
	caddyfile := filepath.Join(dir, "Caddyfile")
	writeAtomic(t, caddyfile, cxCaddyfile(port, cpAddr, "it/caddy", "allow_loopback", `
		lb_policy sticky_cookie {
			secret {env.STICKYLB_SECRET}
		}`))
	env := []string{"XDG_DATA_HOME=" + filepath.Join(dir, "data"), "STICKYLB_SECRET=" + strings.Repeat("k", 32)}
	caddy := runCaddy(t, caddyfile, env...)
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	waitPort(t, fmt.Sprintf("127.0.0.1:%d", port), 30*time.Second)

	// New sessions: no cookie jar, one connection each.
	plain := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	newSessions := func() (map[string]int, error) {
		got := map[string]int{}
		for range cxK {
			resp, err := plain.Get(url)
			if err != nil {
				return got, err
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return got, fmt.Errorf("status %d: %s", resp.StatusCode, body)
			}
			got[string(body)]++
		}
		return got, nil
	}
	// servesOnly holds when K new sessions all succeed, all on want, each of want getting one.
	servesOnly := func(want ...string) func() (bool, string) {
		return func() (bool, string) {
			got, err := newSessions()
			if err != nil {
				return false, fmt.Sprintf("%v after %v", err, got)
			}
			if len(got) != len(want) {
				return false, fmt.Sprint(got)
			}
			for _, w := range want {
				if got[w] == 0 {
					return false, fmt.Sprint(got)
				}
			}
			return true, ""
		}
	}
	testwait.For(t, 2*poolstest.Interval+poolstest.Timeout+cxPushSlack+10*time.Second, "Caddy serves b1 and b2 from the control plane's view", servesOnly("b1", "b2"))

	// A pinned session, to follow through the control plane's outage and Caddy's restart.
	user := newClient(t, "")
	_, pinnedTo := user.get(t, url)
	if pinnedTo != "b1" && pinnedTo != "b2" {
		t.Fatalf("a new session went to %q", pinnedTo)
	}

	// Add b3 by editing the pools file: within 2 s new sessions reach it.
	edited := time.Now()
	writeAtomic(t, poolsFile, cxPools(b1.addr, b2.addr, b3.addr))
	testwait.For(t, 2*time.Second, "a new session on added b3", func() (bool, string) {
		got, err := newSessions()
		return got["b3"] > 0, fmt.Sprint(got, err)
	})
	t.Logf("added backend: new sessions on it %s after the pools edit", time.Since(edited).Round(time.Millisecond))

	// Kill b2: within interval x unhealthy_threshold + timeout + push slack, new sessions
	// all succeed on b1 and b3 (K of them would meet b2 if it were still in the view).
	b2.kill()
	killed := time.Now()
	bound := poolstest.Interval*poolstest.Unhealthy + poolstest.Timeout + cxPushSlack
	if pinnedTo == "b2" {
		pinnedTo = "" // its session moves; checked below only when it was on b1
	}
	testwait.For(t, bound, "no new session on killed b2", servesOnly("b1", "b3"))
	t.Logf("killed backend: out of new sessions %s after the kill (bound %s)", time.Since(killed).Round(time.Millisecond), bound)

	// Stop the control plane: Caddy keeps serving its last view.
	stopCP()
	if ok, seen := servesOnly("b1", "b3")(); !ok {
		t.Fatalf("control plane down: %s", seen)
	}
	if pinnedTo != "" {
		if _, got := user.get(t, url); got != pinnedTo {
			t.Fatalf("control plane down: the session pinned to %s went to %s", pinnedTo, got)
		}
	}

	// Restart Caddy while the control plane is down: it serves the view it saved.
	_ = caddy.Process.Signal(os.Interrupt)
	testwait.For(t, 15*time.Second, "Caddy stopped", func() (bool, string) {
		return !cxPortOpen(fmt.Sprintf("127.0.0.1:%d", port)), "still listening"
	})
	runCaddy(t, caddyfile, env...)
	waitPort(t, fmt.Sprintf("127.0.0.1:%d", port), 30*time.Second)
	if ok, seen := servesOnly("b1", "b3")(); !ok {
		t.Fatalf("Caddy restarted with the control plane down: %s", seen)
	}
	if pinnedTo != "" {
		if _, got := user.get(t, url); got != pinnedTo {
			t.Fatalf("Caddy restarted: the session pinned to %s went to %s", pinnedTo, got)
		}
	}
}

func cxPortOpen(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
