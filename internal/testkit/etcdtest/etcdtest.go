// Package etcdtest runs a real etcd cluster for tests: members are processes of the
// member command beside this file (go.etcd.io/etcd/server/v3/embed at the client's
// version), so a test can stop, kill and restart each one alone, and cut a process off
// from them with firewall rules on their ports.
package etcdtest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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

var (
	buildOnce sync.Once
	memberBin string
	buildErr  error
)

// binary builds the member command once per test binary.
func binary(tb testing.TB) string {
	tb.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "etcdtest-")
		if err != nil {
			buildErr = err
			return
		}
		memberBin = filepath.Join(dir, "member")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", memberBin, "github.com/stickylb/stickylb/internal/testkit/etcdtest/member")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building the etcd member: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		tb.Fatal(buildErr)
	}
	return memberBin
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
// waits until every member serves. Everything stops when the test ends.
func Start(tb testing.TB, n int, host string) *Cluster {
	tb.Helper()
	c := &Cluster{tb: tb, bin: binary(tb), host: host, dir: tb.TempDir()}
	for i := range n {
		c.members = append(c.members, &Member{Name: fmt.Sprintf("m%d", i), ClientPort: freePort(tb, host), PeerPort: freePort(tb, host), c: c})
	}
	cluster := c.initialCluster()
	ready := make(chan error, n)
	for _, m := range c.members {
		go func() { ready <- m.start(cluster, "new") }()
	}
	for range n {
		if err := <-ready; err != nil {
			tb.Fatal(err)
		}
	}
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

func freePort(tb testing.TB, host string) int {
	tb.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		tb.Fatalf("etcdtest: a free port on %s: %v", host, err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
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
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	log := &strings.Builder{}
	cmd.Stderr = &lockedWriter{mu: &m.mu, b: log}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting etcd member %s: %w", m.Name, err)
	}
	done := make(chan struct{})
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
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-readyc:
		return nil
	case <-done:
		return fmt.Errorf("etcd member %s exited:\n%s", m.Name, m.Log())
	case <-time.After(ReadyWithin):
		return fmt.Errorf("etcd member %s not ready within %s:\n%s", m.Name, ReadyWithin, m.Log())
	}
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
