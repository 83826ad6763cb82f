// Package etcdtest runs a real etcd cluster for tests: members are processes of the
// member command beside this file (go.etcd.io/etcd/server/v3/embed at the client's
// version), so a test can stop, kill and restart each one alone, and cut a process off
// from them with firewall rules on their ports.
package etcdtest

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// ReadyWithin bounds a member's start (its build excluded): a new cluster's members wait
// for each other's first election.
const ReadyWithin = 60 * time.Second

// Member ports are drawn from below Linux's ephemeral range (32768-60999 by default), where
// no outgoing connection takes its source port: a killed member's port stays free for its
// restart, which an ephemeral port (what binding port 0 gives) does not.
const (
	portLow  = 20000
	portHigh = 32000
)

// startAttempts: a new cluster whose member finds a port taken after all (another test
// bound it between the check and the member's start) starts again on other ports.
const startAttempts = 3

var (
	buildMu   sync.Mutex
	memberBin string
)

// binary is the member command, built once for every test binary of this checkout and Go
// version: it lives in os.TempDir()/stickylb-etcdtest/ under a name taken from what it is
// built from (the Go version, go.mod and go.sum, the member's source), so the test binaries
// of one `go test ./...` share one build (a lock file orders them) and a change of any of
// those builds a new one. Builds unused for a day are removed, as are the folders earlier
// versions of this kit left in os.TempDir (etcdtest-*, one per test binary).
func binary(tb testing.TB) string {
	tb.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if memberBin != "" {
		return memberBin
	}
	bin, err := buildCached()
	if err != nil {
		tb.Fatal(err)
	}
	memberBin = bin
	return bin
}

func buildCached() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("etcdtest: finding the module: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	h := sha256.New()
	io.WriteString(h, runtime.Version())
	for _, f := range []string{"go.mod", "go.sum", "internal/testkit/etcdtest/member/main.go"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return "", fmt.Errorf("etcdtest: %w", err)
		}
		h.Write(b)
	}
	dir := filepath.Join(os.TempDir(), "stickylb-etcdtest")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("etcdtest: locking %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	bin := filepath.Join(dir, "member-"+hex.EncodeToString(h.Sum(nil))[:16])
	pruneStale(dir, bin)
	if _, err := os.Stat(bin); err == nil {
		now := time.Now()
		_ = os.Chtimes(bin, now, now) // in use: not stale
		return bin, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tmp := bin + ".building"
	cmd := exec.CommandContext(ctx, "go", "build", "-o", tmp, "github.com/stickylb/stickylb/internal/testkit/etcdtest/member")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("building the etcd member: %v\n%s", err, out)
	}
	return bin, os.Rename(tmp, bin)
}

// A cached member build unused for staleAfter is removed; so is a folder an earlier
// version of this kit left, after legacyAfter (no test binary runs that long).
const (
	staleAfter  = 24 * time.Hour
	legacyAfter = 2 * time.Hour
)

// pruneStale removes the builds in dir other than keep that were not used for staleAfter,
// and the etcdtest-* folders earlier versions of this kit made in os.TempDir.
func pruneStale(dir, keep string) {
	remove := func(pattern string, after time.Duration) {
		paths, _ := filepath.Glob(pattern)
		for _, p := range paths {
			if fi, err := os.Stat(p); err == nil && p != keep && time.Since(fi.ModTime()) > after {
				_ = os.RemoveAll(p)
			}
		}
	}
	remove(filepath.Join(dir, "member-*"), staleAfter)
	remove(filepath.Join(os.TempDir(), "etcdtest-*"), legacyAfter)
}

// Cluster is a running etcd cluster of the test.
type Cluster struct {
	tb      testing.TB
	bin     string
	host    string
	dir     string
	members []*Member
}

// Member is one etcd process.
type Member struct {
	Name                 string
	ClientPort, PeerPort int
	c                    *Cluster
	mu                   sync.Mutex
	cmd                  *exec.Cmd
	done                 chan struct{}
	log                  *strings.Builder
}

// Start runs an n-member cluster whose members listen on host (an address of this
// network namespace: 127.0.0.1, or the host's side of a test bridge), on free ports, and
// waits until every member serves. Everything stops when the test ends; a member also dies
// with the test binary (SIGKILL on its parent's death), so a killed test leaves no etcd.
func Start(tb testing.TB, n int, host string) *Cluster {
	tb.Helper()
	bin := binary(tb)
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		c := &Cluster{tb: tb, bin: bin, host: host, dir: tb.TempDir()}
		if err = c.start(n); err == nil {
			tb.Cleanup(func() {
				for _, m := range c.members {
					m.Kill()
					if tb.Failed() {
						tb.Logf("etcd member %s log:\n%s", m.Name, m.Log())
					}
				}
			})
			return c
		}
		for _, m := range c.members {
			m.Kill()
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
		tb.Logf("etcdtest: a port was taken (attempt %d of %d), starting on others: %v", attempt, startAttempts, err)
	}
	tb.Fatal(err)
	return nil
}

// start picks the members' ports and starts them together.
func (c *Cluster) start(n int) error {
	taken := map[int]bool{}
	for i := range n {
		m := &Member{Name: fmt.Sprintf("m%d", i), c: c}
		m.ClientPort, m.PeerPort = freePort(c.tb, c.host, taken), freePort(c.tb, c.host, taken)
		c.members = append(c.members, m)
	}
	cluster := c.initialCluster()
	ready := make(chan error, n)
	for _, m := range c.members {
		go func() { ready <- m.start(cluster, "new") }()
	}
	var errs []error
	for range n {
		if err := <-ready; err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// freePort is a port of host below the ephemeral range that nothing listens on now and
// that taken does not hold (it is added there).
func freePort(tb testing.TB, host string, taken map[int]bool) int {
	tb.Helper()
	for range 1000 {
		p := portLow + rand.IntN(portHigh-portLow)
		if taken[p] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			continue
		}
		ln.Close()
		taken[p] = true
		return p
	}
	tb.Fatalf("etcdtest: no free port on %s in %d..%d", host, portLow, portHigh)
	return 0
}

// initialCluster is etcd's --initial-cluster of the members: NAME=PEER-URL,...
func (c *Cluster) initialCluster() string {
	var initial []string
	for _, m := range c.members {
		initial = append(initial, fmt.Sprintf("%s=http://%s", m.Name, net.JoinHostPort(c.host, strconv.Itoa(m.PeerPort))))
	}
	return strings.Join(initial, ",")
}

// Endpoints are the members' client URLs.
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.Endpoint()
	}
	return out
}

// Members are the cluster's members, in the order of Endpoints.
func (c *Cluster) Members() []*Member { return c.members }

// ClientPorts are the members' client ports (what a firewall rule cutting a process off
// from the store names).
func (c *Cluster) ClientPorts() []int {
	out := make([]int, len(c.members))
	for i, m := range c.members {
		out[i] = m.ClientPort
	}
	return out
}

// Client is a client of every member, closed when the test ends.
func (c *Cluster) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// Endpoint is the member's client URL.
func (m *Member) Endpoint() string {
	return "http://" + net.JoinHostPort(m.c.host, strconv.Itoa(m.ClientPort))
}

func (m *Member) start(cluster, state string) error {
	peer := "http://" + net.JoinHostPort(m.c.host, strconv.Itoa(m.PeerPort))
	cmd := exec.Command(m.c.bin, "--name", m.Name, "--data-dir", filepath.Join(m.c.dir, m.Name),
		"--client", m.Endpoint(), "--peer", peer, "--initial-cluster", cluster, "--state", state)
	// The member dies with the thread that started it: startLocked keeps that thread for
	// the member's life, so only the test binary's death ends it unasked.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	log := &strings.Builder{}
	cmd.Stderr = &lockedWriter{mu: &m.mu, b: log}
	done := make(chan struct{})
	if err := startLocked(cmd, done); err != nil {
		return fmt.Errorf("starting etcd member %s: %w", m.Name, err)
	}
	m.mu.Lock()
	m.cmd, m.done, m.log = cmd, done, log
	m.mu.Unlock()
	readyc := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				close(readyc)
			}
		}
	}()
	select {
	case <-readyc:
		return nil
	case <-done:
		return fmt.Errorf("etcd member %s exited:\n%s", m.Name, m.Log())
	case <-time.After(ReadyWithin):
		return fmt.Errorf("etcd member %s not ready within %s:\n%s", m.Name, ReadyWithin, m.Log())
	}
}

// startLocked starts cmd from a goroutine locked to its OS thread until cmd exits (then
// closes done): Pdeathsig fires when the thread that forked the child ends, and Go ends
// threads on its own (a goroutine that exits locked to one), which would kill the member
// under a live test.
func startLocked(cmd *exec.Cmd, done chan struct{}) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(done)
	}()
	return <-started
}

// Log is what the member wrote to stderr.
func (m *Member) Log() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.log == nil {
		return ""
	}
	return m.log.String()
}

// Kill ends the member at once (SIGKILL), as a crash; its data stays for Restart.
func (m *Member) Kill() { m.signal(syscall.SIGKILL) }

// Stop ends the member with SIGTERM and waits for it (at most 10 s, then SIGKILL).
func (m *Member) Stop() { m.signal(syscall.SIGTERM) }

func (m *Member) signal(sig syscall.Signal) {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Restart starts a stopped member again on its data directory and waits until it serves
// (which needs a quorum of members up).
func (m *Member) Restart(tb testing.TB) {
	tb.Helper()
	if err := m.start(m.c.initialCluster(), "existing"); err != nil {
		tb.Fatal(err)
	}
}

// RestartAll restarts every stopped member at once (a cluster whose quorum is gone needs
// them together) and waits until each serves.
func (c *Cluster) RestartAll(tb testing.TB) {
	tb.Helper()
	errs := make(chan error, len(c.members))
	for _, m := range c.members {
		go func() { errs <- m.start(c.initialCluster(), "existing") }()
	}
	for range c.members {
		if err := <-errs; err != nil {
			tb.Fatal(err)
		}
	}
}

// StopAll stops every member.
func (c *Cluster) StopAll() {
	for _, m := range c.members {
		m.Stop()
	}
}

// WaitHealthy waits until a linearizable read through cli succeeds.
func WaitHealthy(tb testing.TB, cli *clientv3.Client, within time.Duration) {
	tb.Helper()
	testwait.For(tb, within, "etcd answers a linearizable read", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := cli.Get(ctx, "health")
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
