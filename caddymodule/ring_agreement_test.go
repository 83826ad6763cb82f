package caddymodule

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/stickylb/stickylb/internal/testkit/fanout"
	"github.com/stickylb/stickylb/internal/testkit/grpctest"
	"github.com/stickylb/stickylb/internal/testkit/healthtest"
	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds"
)

// The agreement of the tiers on a virtual-node ring, end to end: a real Caddy (in process,
// loaded from a Caddyfile) with sticky_header on `hash ring` + `virtual_nodes 160`, and a
// real grpc-go client subscribed to the xDS server serving the same pools file, send every
// key to the same backend, before and after a backend is added and after one turns
// unhealthy (Caddy finding out by its own active health checks, the xDS server through its
// health view).

const (
	agreeKeys       = 10_000
	agreeVNodes     = 160
	agreeHealthIntv = 200 * time.Millisecond
	agreeHealthTO   = 500 * time.Millisecond
	// agreeSlack is added to every wait computed from the config: two cores shared by the
	// whole test run can delay an xDS push or a health check by seconds.
	agreeSlack = 15 * time.Second
)

// dualBackend serves, on one address (its identity in both tiers), gRPC over h2c for the
// grpc-go client and HTTP/1.1 for Caddy: both answer with its name, and /health with 200,
// or 503 once it is marked down.
type dualBackend struct {
	name, addr string
	down       atomic.Bool
}

func startDualBackends(t *testing.T, n int) []*dualBackend {
	t.Helper()
	var out []*dualBackend
	for i := range n {
		b := &dualBackend{name: fmt.Sprintf("b%d", i+1)}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listening for backend %s: %v", b.name, err)
		}
		b.addr = ln.Addr().String()
		g := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := grpc.SetHeader(ctx, metadata.Pairs(grpctest.BackendHeader, b.name)); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}))
		healthpb.RegisterHealthServer(g, grpchealth.NewServer())
		var protos http.Protocols
		protos.SetHTTP1(true)
		protos.SetUnencryptedHTTP2(true)
		srv := &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc"):
				g.ServeHTTP(w, r)
			case r.URL.Path == "/health" && b.down.Load():
				w.WriteHeader(http.StatusServiceUnavailable)
			case r.URL.Path == "/health":
			default:
				io.WriteString(w, b.name)
			}
		})}
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(ln) }()
		t.Cleanup(func() { srv.Close(); g.Stop(); <-done })
		out = append(out, b)
	}
	return out
}

func agreePools(t *testing.T, bs []*dualBackend) *pools.File {
	t.Helper()
	var s strings.Builder
	fmt.Fprintf(&s, "services:\n  - name: api\n    protocol: grpc\n    affinity: {mode: header, header: {name: x-session}}\n    balance: ring_hash\n    hash: {virtual_nodes: %d}\n    backends:\n", agreeVNodes)
	for _, b := range bs {
		fmt.Fprintf(&s, "      - {address: %q}\n", b.addr)
	}
	f := poolstest.Parse(t, s.String())
	return f
}

// loadCaddy (re)loads the in-process Caddy: one site on port proxying to bs.
func loadCaddy(t *testing.T, port int, bs []*dualBackend) {
	t.Helper()
	var ups []string
	for _, b := range bs {
		ups = append(ups, b.addr)
	}
	loadSite(t, port, fmt.Sprintf(`	reverse_proxy %s {
		lb_policy sticky_header X-Session {
			hash ring
			virtual_nodes %d
			no_table
		}
		health_uri /health
		health_interval %s
		health_timeout %s
	}`, strings.Join(ups, " "), agreeVNodes, agreeHealthIntv, agreeHealthTO))
}

// agreeRig is an agreement test's two tiers over backends bs: a grpc-go client subscribed
// to the xDS server and the in-process Caddy on port, each sending a key's requests to a
// backend, and the virtual-node ring both must follow.
type agreeRig struct {
	t      *testing.T
	ctx    context.Context
	bs     []*dualBackend
	cc     *grpc.ClientConn
	port   int
	client *http.Client
	prefix string // of the keys: prefix-00000 ...
}

// newAgreeRig dials the xDS server at xdsAddr as a grpc-go node and readies the HTTP client
// of the Caddy on port (the test loads it).
func newAgreeRig(t *testing.T, ctx context.Context, bs []*dualBackend, xdsAddr, nodeID string, port int, prefix string) *agreeRig {
	return &agreeRig{t: t, ctx: ctx, bs: bs, cc: grpctest.DialXDS(t, xdsAddr, nodeID, "", "api"), port: port,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}, Timeout: 10 * time.Second}, prefix: prefix}
}

func (r *agreeRig) key(i int) string { return fmt.Sprintf("%s-%05d", r.prefix, i) }

// viaGRPC is the backend the gRPC tier sends key to.
func (r *agreeRig) viaGRPC(key string) (string, error) {
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	b, err := grpctest.Call(ctx, r.cc, key)
	if err != nil {
		return "", fmt.Errorf("gRPC call for %s: %w", key, err)
	}
	return b, nil
}

// viaCaddy is the backend Caddy sends key to.
func (r *agreeRig) viaCaddy(key string) (string, error) {
	req, _ := http.NewRequestWithContext(r.ctx, "GET", fmt.Sprintf("http://127.0.0.1:%d/", r.port), nil)
	req.Header.Set("X-Session", key)
	resp, err := r.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("Caddy request for %s: %w", key, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("Caddy request for %s: %d %q %v", key, resp.StatusCode, body, err)
	}
	return string(body), nil
}

// predicted is the virtual-node ring over the live backends (indexes into bs) with
// weights ws (nil: 1 each) in units of 1, the file's smallest weight whatever is live: the
// backend of every key, and the ring's size.
func (r *agreeRig) predicted(live []int, ws []uint32) ([]string, int) {
	hosts := make([]chash.Host, len(live))
	for i, k := range live {
		hosts[i] = chash.Host{ID: r.bs[k].addr, Weight: 1}
		if ws != nil {
			hosts[i].Weight = ws[k]
		}
	}
	ring, err := chash.NewVirtualNodesRing(hosts, agreeVNodes, 1)
	if err != nil {
		r.t.Fatal(err)
	}
	out := make([]string, agreeKeys)
	for i := range out {
		out[i] = r.bs[live[ring.Pick(chash.KeyHash(r.key(i)))]].name
	}
	return out, ring.Size()
}

// phase waits (within) until a sample of keys goes where the ring over live says on both
// tiers, then sends every key through both (4 workers each), checks that they agree with
// each other and with the ring, and returns where the keys went.
func (r *agreeRig) phase(what string, live []int, ws []uint32, within time.Duration) []string {
	t := r.t
	want, points := r.predicted(live, ws)
	testwait.Until(t, within, 50*time.Millisecond, what+": the tiers take the change in", func() (bool, string) {
		for i := 0; i < agreeKeys; i += 37 {
			c, err1 := r.viaCaddy(r.key(i))
			g, err2 := r.viaGRPC(r.key(i))
			if err1 != nil || err2 != nil || c != want[i] || g != want[i] {
				return false, fmt.Sprintf("%s: Caddy %s %v, gRPC %s %v, ring %s", r.key(i), c, err1, g, err2, want[i])
			}
		}
		return true, ""
	})
	got := make([]string, agreeKeys)
	err := fanout.Each(agreeKeys, 4, func(i int) error {
		c, err := r.viaCaddy(r.key(i))
		if err != nil {
			return err
		}
		g, err := r.viaGRPC(r.key(i))
		if err != nil {
			return err
		}
		if c != g {
			return fmt.Errorf("%s: %s went to %s through Caddy, %s through gRPC", what, r.key(i), c, g)
		}
		if c != want[i] {
			return fmt.Errorf("%s: %s went to %s through both tiers, the ring says %s", what, r.key(i), c, want[i])
		}
		got[i] = c
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, b := range got {
		counts[b]++
	}
	t.Logf("%s: %d keys on the same backend through Caddy and gRPC (ring of %d points); per backend %v", what, agreeKeys, points, counts)
	return got
}

// onlyLeaverMoved fails the test when a key moved between before and after other than off
// backend leaver (the others kept their points), and returns the share of keys moved.
func (r *agreeRig) onlyLeaverMoved(before, after []string, leaver string) float64 {
	n := 0
	for i := range before {
		if before[i] == after[i] {
			continue
		}
		n++
		if before[i] != leaver {
			r.t.Fatalf("%s moved from %s to %s when %s turned unhealthy: the remaining backends lost points", r.key(i), before[i], after[i], leaver)
		}
	}
	return float64(n) / float64(len(before))
}

func TestRingAgreementCaddyGRPC(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Caddy, an xDS server, a grpc-go client and 4 backends: 60,000 requests")
	}
	bs := startDualBackends(t, 4)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	// The control plane, with a health view the test flips, and Caddy with its own checks.
	var sw healthtest.Switch
	srv := xds.NewServer(ctx, agreePools(t, bs[:3]), sw.View, zaptest.NewLogger(t))
	port := loopback.FreePort(t)
	r := newAgreeRig(t, ctx, bs, grpctest.Serve(t, srv.Register), "grpc-agree", port, "session")
	loadCaddy(t, port, bs[:3])
	t.Cleanup(func() { _ = caddy.Stop() })

	got3 := r.phase("3 backends", []int{0, 1, 2}, nil, agreeSlack)

	// A fourth backend, in the pools file and in the Caddyfile.
	if err := srv.Update(agreePools(t, bs)); err != nil {
		t.Fatal(err)
	}
	loadCaddy(t, port, bs)
	got4 := r.phase("4 backends", []int{0, 1, 2, 3}, nil, agreeSlack)

	// b2 turns unhealthy: its /health fails for Caddy's checks, the checker's view says so.
	bs[1].down.Store(true)
	sw.Down(bs[1].addr)
	if err := srv.Refresh(); err != nil {
		t.Fatal(err)
	}
	gotDown := r.phase("b2 unhealthy", []int{0, 2, 3}, nil, agreeHealthIntv+agreeHealthTO+agreeSlack)

	moved4 := 0
	for i := range got3 {
		if got3[i] != got4[i] {
			moved4++
		}
	}
	t.Logf("moved: 3 -> 4 backends %.4f (ideal 0.25); b2 unhealthy %.4f (its share)",
		float64(moved4)/agreeKeys, r.onlyLeaverMoved(got4, gotDown, bs[1].name))
}
