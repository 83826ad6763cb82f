// Package integration runs stickylb end to end: a real Caddy (in process through caddytest,
// and the built binary) serving real sockets in front of real backends on loopback.
//
// caddytest binds a fixed admin port (2999), so every Caddy test lives in this one package
// and runs sequentially.
package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// backend is a real HTTP server on loopback that answers with its name.
type backend struct {
	name     string
	addr     string
	srv      *http.Server
	ln       net.Listener
	hits     atomic.Int64
	inflight atomic.Int64
	release  chan struct{} // /slow requests wait on it
	sessions atomic.Int64
	seen     sync.Map // Cookie header values seen, for app_cookie checks
}

func startBackend(t *testing.T, name string) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{name: name, addr: ln.Addr().String(), ln: ln, release: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		b.hits.Add(1)
		b.inflight.Add(1)
		defer b.inflight.Add(-1)
		select {
		case <-b.release:
		case <-r.Context().Done():
		case <-time.After(20 * time.Second):
		}
		io.WriteString(w, name)
	})
	mux.HandleFunc("/login", func(w http.ResponseWriter, r *http.Request) {
		b.hits.Add(1)
		n := b.sessions.Add(1)
		w.Header().Add("Set-Cookie", fmt.Sprintf("JSESSIONID=%s-%d; Path=/; HttpOnly", name, n))
		io.WriteString(w, name)
	})
	// What a typical application does: a request without its session cookie gets a fresh one.
	mux.HandleFunc("/app", func(w http.ResponseWriter, r *http.Request) {
		b.hits.Add(1)
		if _, err := r.Cookie("JSESSIONID"); err != nil {
			w.Header().Add("Set-Cookie", fmt.Sprintf("JSESSIONID=%s-%d; Path=/; HttpOnly", name, b.sessions.Add(1)))
		}
		io.WriteString(w, name)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		b.hits.Add(1)
		if c := r.Header.Get("Cookie"); c != "" {
			b.seen.Store(c, true)
		}
		io.WriteString(w, name)
	})
	b.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go b.srv.Serve(ln)
	t.Cleanup(b.kill)
	return b
}

// kill stops the backend at once: listener and every connection closed.
func (b *backend) kill() { _ = b.srv.Close() }

func startBackends(t *testing.T, n int) []*backend {
	bs := make([]*backend, n)
	for i := range bs {
		bs[i] = startBackend(t, fmt.Sprintf("backend-%d", i+1))
	}
	return bs
}

func addrs(bs []*backend) string {
	var s []string
	for _, b := range bs {
		s = append(s, b.addr)
	}
	return strings.Join(s, " ")
}

func byName(bs []*backend, name string) *backend {
	for _, b := range bs {
		if b.name == name {
			return b
		}
	}
	return nil
}

// freePort returns a loopback port nothing listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	return loopback.FreePort(t)
}

// client is one user agent: its own cookie jar, optionally its own source address.
type client struct {
	*http.Client
}

func newClient(t *testing.T, localIP string) *client {
	jar, _ := cookiejar.New(nil)
	d := &net.Dialer{Timeout: 5 * time.Second}
	if localIP != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(localIP)}
	}
	// A new connection per request: sessions must hold across connections, not ride one.
	tr := &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &client{&http.Client{Jar: jar, Transport: tr, Timeout: 10 * time.Second}}
}

// get returns status and body of GET url with extra headers ("Name: value").
func (c *client) get(t testing.TB, url string, headers ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Add(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func waitPort(t testing.TB, addr string, within time.Duration) {
	t.Helper()
	testwait.For(t, within, "port "+addr+" open", func() (bool, string) {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return false, err.Error()
		}
		c.Close()
		return true, ""
	})
}

var (
	buildOnce sync.Once
	caddyBin  string
	buildErr  error
)

// builtCaddy builds ./cmd/caddy once per test binary.
func builtCaddy(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "stickylb-caddy-")
		if err != nil {
			buildErr = err
			return
		}
		caddyBin = filepath.Join(dir, "caddy")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", caddyBin, "./cmd/caddy")
		cmd.Dir = ".."
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/caddy: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return caddyBin
}

// runCaddy starts the built binary with a Caddyfile (a path) and stops it at cleanup.
func runCaddy(t *testing.T, caddyfile string, env ...string) *exec.Cmd {
	t.Helper()
	bin := builtCaddy(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	cmd := exec.CommandContext(ctx, bin, "run", "--config", caddyfile, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), env...)
	logf, err := os.CreateTemp(t.TempDir(), "caddy-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		cancel()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("caddy log:\n%s", b)
		}
	})
	return cmd
}
