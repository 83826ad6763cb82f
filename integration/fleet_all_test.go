package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	xdsgrpc "google.golang.org/grpc/xds"

	"github.com/stickylb/stickylb/l4xdp"
)

// Every tier on one control plane, with real processes: `stickylb xds` on the host serves
// one pools file with two services — "spread", a TCP VIP forwarded by two
// `stickylb xdp --xds` nodes (lb, lb2, each in its own namespace, in front of backends
// b1..b3 in theirs); "rpc", gRPC, called by a grpc-go xDS client in this process and
// proxied (h2c) by a Caddy built from ./cmd/caddy with `dynamic stickylb_xds`. The
// namespaces share a bridge that a veth joins to the host, so the control plane probes
// every backend and every node reaches it. The gRPC backends listen on the host's
// loopback, each on its own 127.0.0.x address, so one can die alone.
//
// Caddy proxies the gRPC service rather than an HTTP service of its own because the
// control plane's ADS cache answers a gRPC client's named Listener request only when the
// client names every Listener of its view: a second HTTP or gRPC service in the file
// leaves a grpc-go client without a response (go-control-plane's ADS superset check).
//
// Every service is health checked on a port of its own (faVIPHealthPort, faGRPCHealth):
// killing a backend closes both its ports; the outage closes only the health ports, so the
// backends still answer and a tier that fails open is seen to forward.

var faHosts = map[string]string{
	"host": "10.78.0.1", "cl": "10.78.0.10", "cl2": "10.78.0.20", "lb": "10.78.0.2", "lb2": "10.78.0.4",
	"b1": "10.78.0.11", "b2": "10.78.0.12", "b3": "10.78.0.13",
	"g1": "127.0.0.31", "g2": "127.0.0.32", "g3": "127.0.0.33",
}

const (
	// One health check for every service: a dead backend is out of the control plane's
	// view interval x unhealthy_threshold + timeout after it died, at most.
	faInterval  = time.Second
	faTimeout   = 500 * time.Millisecond
	faUnhealthy = 1
	// faPushSlack covers the verdict's way from the checker to every node (one snapshot
	// build, one push per node, the node's apply: milliseconds idle) on two cores shared
	// by the whole CI run, and the check's own round of K sessions per tier.
	faPushSlack = 2 * time.Second
	// faK new sessions per tier and check. A backend holding a third of a node's table (or
	// ring, or of uniformly random picks) is missed by all of them with probability
	// (2/3)^40 < 1e-7; a killed one still in the view shows up likewise.
	faK = 40
	// Ports: the VIP's and its health port in the namespaces; the host backends' data and
	// health ports (the same on each 127.0.0.x address).
	faVIPPort, faVIPHealthPort = 80, 81
	faGRPCPort, faGRPCHealth   = 18190, 18191
	faCPPort                   = 18170
)

// faPools is the control plane's pools file over the given backends of each service.
func faPools(vip, rpc []string) string {
	var b strings.Builder
	hc := func(port int) string {
		return fmt.Sprintf("    health_check: {protocol: tcp, port: %d, interval: %s, timeout: %s, healthy_threshold: 1, unhealthy_threshold: %d}\n",
			port, faInterval, faTimeout, faUnhealthy)
	}
	b.WriteString("services:\n")
	fmt.Fprintf(&b, "  - name: spread\n    protocol: tcp\n    vip: %q\n    affinity: {mode: none}\n    balance: maglev\n", fmt.Sprintf("%s:%d", vip4, faVIPPort))
	b.WriteString(hc(faVIPHealthPort) + "    backends:\n")
	for _, h := range vip {
		fmt.Fprintf(&b, "      - {address: \"%s:%d\"}\n", faHosts[h], faVIPPort)
	}
	b.WriteString("  - name: rpc\n    protocol: grpc\n    affinity: {mode: header, header: {name: x-session}}\n    balance: ring_hash\n    hash: {min_ring_size: 1024, max_ring_size: 4096}\n")
	b.WriteString(hc(faGRPCHealth) + "    backends:\n")
	for _, h := range rpc {
		fmt.Fprintf(&b, "      - {address: \"%s:%d\"}\n", faHosts[h], faGRPCPort)
	}
	return b.String()
}

// newFleetAllTopo is the fleet test's bridge (own prefix and subnet, so both can run on one
// machine) plus a veth from the host onto it.
func newFleetAllTopo(t *testing.T) *topo {
	tp := newLAN(t, lan{
		prefix: "sla",
		hosts:  []string{"cl", "cl2", "lb", "lb2", "b1", "b2", "b3"},
		v4:     func(h string) string { return faHosts[h] },
		via:    map[string]string{"cl": "lb", "cl2": "lb2"},
	})
	kit := tp.kit
	// The host's end: deleted with the bridge's namespace; deleted first too, in case a
	// killed run left it.
	const hostIf = "slah0"
	_ = exec.Command("ip", "link", "del", hostIf).Run()
	kit.Run("ip", "link", "add", hostIf, "type", "veth", "peer", "name", "vhost", "netns", kit.Name("br"))
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", hostIf).Run() })
	kit.Run("ip", "addr", "add", faHosts["host"]+"/24", "dev", hostIf)
	kit.Run("ip", "link", "set", hostIf, "up")
	tp.in("br", "ip", "link", "set", "vhost", "up")
	tp.in("br", "ip", "link", "set", "vhost", "master", "br0")
	return tp
}

// faListener listens on addr and closes whatever connects: a health port.
func faListener(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln
}

// faGRPCBackend answers health Checks, naming itself in a response header.
type faGRPCBackend struct {
	healthpb.UnimplementedHealthServer
	name string
}

func (b *faGRPCBackend) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	grpc.SetHeader(ctx, metadata.Pairs("backend", b.name))
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func faGRPC(t *testing.T, name, ip string) *grpc.Server {
	t.Helper()
	ln, err := net.Listen("tcp", fmt.Sprintf("%s:%d", ip, faGRPCPort))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, &faGRPCBackend{name: name})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return srv
}

// faBackend is one backend of any tier: stopping data ends its service, closing health
// fails its checks.
type faBackend struct {
	data   func()
	health net.Listener
}

func (b *faBackend) kill() { b.data(); b.health.Close() }

// TestFleetAllTiers: one control plane, every tier (two XDP nodes, Caddy, a grpc-go xDS
// client) follows its edits and verdicts within the stated bounds, and fails open with it.
// CI: about 35 s (two builds, four processes, eight namespaces).
func TestFleetAllTiers(t *testing.T) {
	tp, bin, poolsFile := startXDPTest(t, newFleetAllTopo)
	builtCaddy(t)
	dir := filepath.Dir(poolsFile)
	cpAddr := fmt.Sprintf("%s:%d", faHosts["host"], faCPPort)
	adminAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	backends := map[string]*faBackend{}

	startCP := func() {
		cmd := exec.Command(bin, "xds", "--pools", poolsFile, "--listen", cpAddr, "--poll", "100ms", "--admin", adminAddr)
		logf, err := os.Create(filepath.Join(dir, "xds.log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-done
			if t.Failed() {
				b, _ := os.ReadFile(logf.Name())
				t.Logf("stickylb xds log:\n%s", b)
			}
		})
		waitPort(t, cpAddr, 30*time.Second)
	}
	startNode := func(lb string) *loaderProc {
		return tp.startProc(lb, "", bin, "xdp", "--xds", cpAddr, "--iface", "eth0", "--mode", "native",
			"--pin-root", tp.pinRoot(lb), "--node-id", lb+"/xdp/eth0")
	}
	// sameTables: both XDP nodes hold equal tables (as backend names), over want.
	sameTables := func(want ...string) (bool, string) {
		a, errA := l4xdp.PinnedTables(l4xdp.Config{Iface: "eth0", PinRoot: tp.pinRoot("lb")})
		b, errB := l4xdp.PinnedTables(l4xdp.Config{Iface: "eth0", PinRoot: tp.pinRoot("lb2")})
		if errA != nil || errB != nil {
			return false, fmt.Sprint(errA, errB)
		}
		if !reflect.DeepEqual(a, b) {
			return false, "the nodes' tables differ"
		}
		in, wantSet := map[string]bool{}, map[string]bool{}
		for _, n := range a["spread"].Table {
			in[n] = true
		}
		for _, h := range want {
			wantSet[fmt.Sprintf("spread/%s:%d", faHosts[h], faVIPPort)] = true
		}
		return reflect.DeepEqual(in, wantSet), fmt.Sprintf("table over %v, want %v", in, wantSet)
	}
	panicGauge := func(service string) string {
		resp, err := http.Get("http://" + adminAddr + "/metrics")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		prefix := fmt.Sprintf("stickylb_panic{service=%q} ", service)
		for _, l := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(l, prefix) {
				return strings.TrimPrefix(l, prefix)
			}
		}
		return "absent"
	}

	// The tiers' K new sessions each, counted by backend; an error when one fails. The
	// gRPC tiers send K fixed keys: to the xDS client they are ring_hash keys, to Caddy
	// (lb_policy random) K independent picks.
	caddyPort := freePort(t)
	var cc, caddyCC *grpc.ClientConn
	calls := func(cc **grpc.ClientConn) func() (map[string]int, error) {
		return func() (map[string]int, error) {
			got := map[string]int{}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for i := range faK {
				var hdr metadata.MD
				kctx := metadata.AppendToOutgoingContext(ctx, "x-session", fmt.Sprintf("key-%02d", i))
				if _, err := healthpb.NewHealthClient(*cc).Check(kctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr)); err != nil {
					return got, err
				}
				got[strings.Join(hdr.Get("backend"), ",")]++
			}
			return got, nil
		}
	}
	tiers := map[string]func() (map[string]int, error){
		"lb":    func() (map[string]int, error) { return tp.reaches("cl", faK) },
		"lb2":   func() (map[string]int, error) { return tp.reaches("cl2", faK) },
		"caddy": calls(&caddyCC),
		"grpc":  calls(&cc),
	}
	tierOrder := []string{"lb", "lb2", "caddy", "grpc"}
	// servesOnly: every tier's K sessions succeed, each on one of its want backends.
	servesOnly := func(vip, rpc []string) func() (bool, string) {
		want := map[string][]string{"lb": vip, "lb2": vip, "caddy": rpc, "grpc": rpc}
		return func() (bool, string) {
			for _, tier := range tierOrder {
				got, err := tiers[tier]()
				if err != nil {
					return false, fmt.Sprintf("%s: %v after %v", tier, err, got)
				}
				for b := range got {
					if !slices.Contains(want[tier], b) {
						return false, fmt.Sprintf("%s: %v, want only %v", tier, got, want[tier])
					}
				}
			}
			return true, ""
		}
	}

	tp.phase("start", func(t *testing.T) {
		tp.readyNodes(bin, "lb", "lb2")
		for _, h := range []string{"b1", "b2", "b3"} {
			data, hc := tp.serve(h, faVIPPort), tp.serve(h, faVIPHealthPort)
			backends[h] = &faBackend{data: data.kill, health: hc.lns[0]}
		}
		for _, g := range []string{"g1", "g2", "g3"} {
			gs := faGRPC(tp.root, g, faHosts[g])
			backends[g] = &faBackend{data: gs.Stop, health: faListener(tp.root, fmt.Sprintf("%s:%d", faHosts[g], faGRPCHealth))}
		}
		tp.writeFile(poolsFile, faPools([]string{"b1", "b2"}, []string{"g1", "g2"}))
		startCP()
		startNode("lb")
		startNode("lb2")

		caddyfile := filepath.Join(dir, "Caddyfile")
		tp.writeFile(caddyfile, fmt.Sprintf(`{
	admin off
	persist_config off
	auto_https off
	servers {
		protocols h1 h2c
	}
}
http://127.0.0.1:%d {
	reverse_proxy {
		dynamic stickylb_xds {
			server  %s
			service rpc
			node_id fleet/caddy
		}
		lb_policy random
		transport http {
			versions h2c
		}
	}
}
`, caddyPort, cpAddr))
		runCaddy(tp.root, caddyfile, "XDG_DATA_HOME="+filepath.Join(dir, "data"))
		caddyAddr := fmt.Sprintf("127.0.0.1:%d", caddyPort)
		waitPort(t, caddyAddr, 30*time.Second)
		var err error
		if caddyCC, err = grpc.NewClient("passthrough:///"+caddyAddr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			t.Fatal(err)
		}
		tp.root.Cleanup(func() { caddyCC.Close() })

		bootstrap := fmt.Sprintf(`{"xds_servers":[{"server_uri":%q,"channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],"node":{"id":"fleet/grpc","locality":{"zone":"zone-a"}}}`, cpAddr)
		rb, err := xdsgrpc.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
		if err != nil {
			t.Fatal(err)
		}
		if cc, err = grpc.NewClient("xds:///rpc", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(rb)); err != nil {
			t.Fatal(err)
		}
		tp.root.Cleanup(func() { cc.Close() })

		// The first view and the first verdicts (Unknown routes too).
		waitFor(t, 15*time.Second, "every tier serves its two backends", servesOnly([]string{"b1", "b2"}, []string{"g1", "g2"}))
		waitFor(t, 2*time.Second, "identical XDP tables over b1, b2", func() (bool, string) { return sameTables("b1", "b2") })
	})

	// One edit adds a backend to each service: within 2 s every tier sends one of K new
	// sessions to it.
	tp.phase("a backend added by editing the pools file", func(t *testing.T) {
		added := map[string]string{"lb": "b3", "lb2": "b3", "caddy": "g3", "grpc": "g3"}
		got := map[string]bool{}
		edited := time.Now()
		tp.writeFile(poolsFile, faPools([]string{"b1", "b2", "b3"}, []string{"g1", "g2", "g3"}))
		waitFor(t, 2*time.Second-time.Since(edited), "every tier sends new sessions to the added backends", func() (bool, string) {
			for _, tier := range tierOrder {
				if got[tier] {
					continue
				}
				seen, err := tiers[tier]()
				if err != nil {
					return false, fmt.Sprintf("%s: %v", tier, err)
				}
				if seen[added[tier]] > 0 {
					got[tier] = true
					t.Logf("%s: %s reached %s after the edit", tier, added[tier], time.Since(edited).Round(time.Millisecond))
				}
			}
			return len(got) == len(tierOrder), fmt.Sprint(got)
		})
		waitFor(t, 2*time.Second, "identical XDP tables over b1, b2, b3", func() (bool, string) { return sameTables("b1", "b2", "b3") })
	})

	// One backend of each service killed: within interval x unhealthy_threshold + timeout +
	// push slack, no tier sends it a new session, and DR flows already open to the other
	// backends, through both XDP nodes, keep transferring. g1 dies to the control plane only
	// (its health port): grpc-go's ring_hash skips a backend it cannot connect to on its
	// own, so a g1 that still answers is what shows the control plane's verdict reached the
	// gRPC tiers (a session sent to it would name it). b1 dies whole: a connection sent to
	// it fails, so K in a row succeeding on b2 and b3 shows it out of both XDP tables.
	tp.phase("a backend killed", func(t *testing.T) {
		var flows []*vconn
		for _, cl := range []string{"cl", "cl2"} {
			for len(flows) < 2 || (cl == "cl2" && len(flows) < 4) {
				c, err := tp.dialVia(cl, fmt.Sprintf("%s:%d", vip4, faVIPPort))
				if err != nil {
					t.Fatal(err)
				}
				if c.backend == "b1" {
					c.c.Close()
					continue
				}
				flows = append(flows, c)
			}
		}
		killed := time.Now()
		backends["b1"].kill()
		backends["g1"].health.Close()
		bound := faInterval*faUnhealthy + faTimeout + faPushSlack
		waitFor(t, bound, "no tier sends new sessions to the killed backends",
			servesOnly([]string{"b2", "b3"}, []string{"g2", "g3"}))
		t.Logf("killed backends out of every tier's new sessions %s after the kill (bound %s)", time.Since(killed).Round(time.Millisecond), bound)
		for _, f := range flows {
			if err := f.echo(); err != nil {
				t.Fatalf("a DR flow to %s stopped after the kill: %v", f.backend, err)
			}
		}
		if ok, saw := sameTables("b2", "b3"); !ok {
			t.Fatalf("XDP tables: %s", saw)
		}
		backends["g1"].data()
	})

	// The dead backends leave the file, and every remaining backend's health check fails
	// while the backends still serve: the control plane fails open, so every tier keeps
	// forwarding to them, and each service's panic gauge is 1.
	tp.phase("every backend of a service down: every tier fails open", func(t *testing.T) {
		healthy := []string{"b2", "b3", "g2", "g3"}
		tp.writeFile(poolsFile, faPools([]string{"b2", "b3"}, []string{"g2", "g3"}))
		downAt := time.Now()
		for _, h := range healthy {
			backends[h].health.Close()
		}
		bound := faInterval*faUnhealthy + faTimeout + faPushSlack
		waitFor(t, bound, "every panic gauge at 1", func() (bool, string) {
			var saw []string
			for _, s := range []string{"spread", "rpc"} {
				if g := panicGauge(s); g != "1" {
					saw = append(saw, s+"="+g)
				}
			}
			return len(saw) == 0, strings.Join(saw, " ")
		})
		t.Logf("every service in panic %s after its health ports closed", time.Since(downAt).Round(time.Millisecond))
		waitFor(t, faPushSlack, "every tier forwards to the unhealthy backends",
			servesOnly([]string{"b2", "b3"}, []string{"g2", "g3"}))
		if ok, saw := sameTables("b2", "b3"); !ok {
			t.Fatalf("XDP tables in panic: %s", saw)
		}
	})
}
