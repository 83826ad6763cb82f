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
	"github.com/stickylb/stickylb/internal/testkit/testwait"
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

func TestRingAgreementCaddyGRPC(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Caddy, an xDS server, a grpc-go client and 4 backends: 60,000 requests")
	}
	bs := startDualBackends(t, 4)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	// The control plane, with a health view the test flips.
	var sw healthtest.Switch
	srv := xds.NewServer(ctx, agreePools(t, bs[:3]), sw.View, zaptest.NewLogger(t))
	cc := grpctest.DialXDS(t, grpctest.Serve(t, srv.Register), "grpc-agree", "", "api")
	viaGRPC := func(key string) (string, error) {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		defer ccancel()
		b, err := grpctest.Call(cctx, cc, key)
		if err != nil {
			return "", fmt.Errorf("gRPC call for %s: %w", key, err)
		}
		return b, nil
	}

	// Caddy.
	port := loopback.FreePort(t)
	loadCaddy(t, port, bs[:3])
	t.Cleanup(func() { _ = caddy.Stop() })
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}, Timeout: 10 * time.Second}
	viaCaddy := func(key string) (string, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
		req.Header.Set("X-Session", key)
		resp, err := client.Do(req)
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

	key := func(i int) string { return fmt.Sprintf("session-%05d", i) }
	// predicted is the virtual-node ring over live: used to know when both tiers have taken
	// a change in, and checked for every key besides their agreement.
	predicted := func(live []*dualBackend) []string {
		hosts := make([]chash.Host, len(live))
		for i, b := range live {
			hosts[i] = chash.Host{ID: b.addr, Weight: 1}
		}
		r, err := chash.NewVirtualNodesRing(hosts, agreeVNodes, 1)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]string, agreeKeys)
		for i := range out {
			out[i] = live[r.Pick(chash.KeyHash(key(i)))].name
		}
		return out
	}
	// settle waits until a sample of keys goes where want says on both tiers.
	settle := func(what string, want []string, within time.Duration) {
		testwait.Until(t, within, 50*time.Millisecond, what+": the tiers take the change in", func() (bool, string) {
			for i := 0; i < agreeKeys; i += 37 {
				c, err1 := viaCaddy(key(i))
				r, err2 := viaGRPC(key(i))
				if err1 != nil || err2 != nil || c != want[i] || r != want[i] {
					return false, fmt.Sprintf("%s: Caddy %s %v, gRPC %s %v, ring %s", key(i), c, err1, r, err2, want[i])
				}
			}
			return true, ""
		})
	}
	// compare sends every key through both tiers (4 workers each) and checks they agree.
	compare := func(what string, want []string) []string {
		got := make([]string, agreeKeys)
		err := fanout.Each(agreeKeys, 4, func(i int) error {
			c, err := viaCaddy(key(i))
			if err != nil {
				return err
			}
			r, err := viaGRPC(key(i))
			if err != nil {
				return err
			}
			if c != r {
				return fmt.Errorf("%s: %s went to %s through Caddy, %s through gRPC", what, key(i), c, r)
			}
			if c != want[i] {
				return fmt.Errorf("%s: %s went to %s through both tiers, the ring says %s", what, key(i), c, want[i])
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
		t.Logf("%s: %d keys on the same backend through Caddy and gRPC; per backend %v", what, agreeKeys, counts)
		return got
	}
	moved := func(a, b []string) float64 {
		n := 0
		for i := range a {
			if a[i] != b[i] {
				n++
			}
		}
		return float64(n) / float64(len(a))
	}

	want3 := predicted(bs[:3])
	settle("3 backends", want3, agreeSlack)
	got3 := compare("3 backends", want3)

	// A fourth backend, in the pools file and in the Caddyfile.
	if err := srv.Update(agreePools(t, bs)); err != nil {
		t.Fatal(err)
	}
	loadCaddy(t, port, bs)
	want4 := predicted(bs)
	settle("4 backends", want4, agreeSlack)
	got4 := compare("4 backends", want4)

	// b2 turns unhealthy: its /health fails for Caddy's checks, the checker's view says so.
	bs[1].down.Store(true)
	sw.Down(bs[1].addr)
	if err := srv.Refresh(); err != nil {
		t.Fatal(err)
	}
	live := []*dualBackend{bs[0], bs[2], bs[3]}
	wantDown := predicted(live)
	settle("b2 unhealthy", wantDown, agreeHealthIntv+agreeHealthTO+agreeSlack)
	gotDown := compare("b2 unhealthy", wantDown)

	t.Logf("moved: 3 -> 4 backends %.4f (ideal 0.25); b2 unhealthy %.4f (its share)", moved(got3, got4), moved(got4, gotDown))
	for i := range got4 {
		if got4[i] != gotDown[i] && got4[i] != bs[1].name {
			t.Fatalf("%s moved from %s to %s when b2 turned unhealthy: the remaining backends lost points", key(i), got4[i], gotDown[i])
		}
	}
}
