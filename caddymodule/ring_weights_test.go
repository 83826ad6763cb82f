package caddymodule

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap/zaptest"

	"github.com/stickylb/stickylb/internal/testkit/grpctest"
	"github.com/stickylb/stickylb/internal/testkit/healthtest"
	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds"
)

// The tiers' agreement on a WEIGHTED virtual-node ring: Caddy takes its upstreams and their
// weights from the control plane (`dynamic stickylb_xds`), grpc-go takes the xDS tier's
// resources from the same server, and every key must go to the same backend through both,
// as 3:1:2 grows to 3:1:2:2 and as the lightest backend turns unhealthy (the weight unit
// stays the file's smallest weight, so the others keep their points).

// weightedAgreePools is the pools file of service api over bs with weights ws.
func weightedAgreePools(t *testing.T, bs []*dualBackend, ws []uint32) *pools.File {
	t.Helper()
	var s strings.Builder
	fmt.Fprintf(&s, "services:\n  - name: api\n    protocol: grpc\n    affinity: {mode: header, header: {name: x-session}}\n    balance: ring_hash\n    hash: {virtual_nodes: %d}\n    backends:\n", agreeVNodes)
	for i, b := range bs {
		fmt.Fprintf(&s, "      - {address: %q, weight: %d}\n", b.addr, ws[i])
	}
	return poolstest.Parse(t, s.String())
}

func TestRingAgreementCaddyGRPCWeighted(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Caddy, an xDS server, a grpc-go client and 4 backends: 60,000 requests")
	}
	if !grpctest.ExactWeights(t) {
		return // the child runs it with exact weights: shuffling rounds them
	}
	t.Setenv("XDG_DATA_HOME", t.TempDir()) // where stickylb_xds saves its view
	bs := startDualBackends(t, 4)
	weights := []uint32{3, 1, 2, 2}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	var sw healthtest.Switch
	srv := xds.NewServer(ctx, weightedAgreePools(t, bs[:3], weights), sw.View, zaptest.NewLogger(t))
	xdsAddr := grpctest.Serve(t, srv.Register)
	port := loopback.FreePort(t)
	r := newAgreeRig(t, ctx, bs, xdsAddr, "grpc-agree-w", port, "wsession")
	loadSite(t, port, fmt.Sprintf(`	reverse_proxy {
		dynamic stickylb_xds {
			server  %s
			service api
			node_id agree-w/caddy
			allow_loopback
		}
		lb_policy sticky_header X-Session {
			hash ring
			virtual_nodes %d
			no_table
		}
	}`, xdsAddr, agreeVNodes))
	t.Cleanup(func() { _ = caddy.Stop() })

	r.phase("3:1:2", []int{0, 1, 2}, weights, agreeSlack)
	if err := srv.Update(weightedAgreePools(t, bs, weights)); err != nil {
		t.Fatal(err)
	}
	before := r.phase("3:1:2:2", []int{0, 1, 2, 3}, weights, agreeSlack)
	// The lightest backend turns unhealthy: the unit stays 1, the others keep their points.
	sw.Down(bs[1].addr)
	if err := srv.Refresh(); err != nil {
		t.Fatal(err)
	}
	after := r.phase("3:-:2:2 (the weight-1 backend unhealthy)", []int{0, 2, 3}, weights, agreeSlack)
	t.Logf("moved when the weight-1 backend turned unhealthy: %.4f (its share)", r.onlyLeaverMoved(before, after, bs[1].name))
}

// weightedView is a control-plane view of service api: backends 10.0.15.1.. with weights ws,
// all healthy.
func weightedView(ws ...uint32) *xdsView {
	svc := &xdsService{CrossZone: true}
	for i, w := range ws {
		d := fmt.Sprintf("10.0.15.%d:80", i+1)
		svc.Backends = append(svc.Backends, xdsBackend{ID: d, Dial: d, Weight: w, Health: "healthy"})
	}
	return &xdsView{Services: map[string]*xdsService{"api": svc}}
}

// weightedPool is the pool of the first n backends of weightedView.
func weightedPool(n int) reverseproxy.UpstreamPool {
	pool := make(reverseproxy.UpstreamPool, n)
	for i := range pool {
		pool[i] = &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: fmt.Sprintf("10.0.15.%d:80", i+1)}
	}
	return pool
}

// hostsOf is pool as chash hosts with weights ws.
func hostsOf(pool reverseproxy.UpstreamPool, ws ...uint32) []chash.Host {
	hs := make([]chash.Host, len(pool))
	for i, u := range pool {
		hs[i] = chash.Host{ID: u.Dial, Weight: ws[i]}
	}
	return hs
}

// agreesWith checks that p picks, for 2,000 keys, the upstream of pool that want does.
func agreesWith(t *testing.T, what string, p *hashPicker, pool reverseproxy.UpstreamPool, want chash.Picker) {
	t.Helper()
	counts := map[string]int{}
	for i := range 2000 {
		h := chash.KeyHash(fmt.Sprintf("k-%d", i))
		u := p.pick(pool, h, tried{}, time.Time{})
		if u == nil || u != pool[want.Pick(h)] {
			t.Fatalf("%s: key k-%d went to %v, the weighted table says %s", what, i, u, pool[want.Pick(h)].Dial)
		}
		counts[u.Dial]++
	}
	t.Logf("%s: per upstream %v", what, counts)
}

// TestHashTablesTakeTheControlPlaneWeights: with a stickylb_xds view, Maglev, the sized
// ring and the virtual-node ring weigh upstreams as the view says (the tables Envoy and gRPC
// build from the same endpoint weights); the virtual-node unit is the service's smallest
// weight even when that backend is not in the pool (here: the weight-2 backend is out, as an
// unhealthy one is, and the unit stays 2).
func TestHashTablesTakeTheControlPlaneWeights(t *testing.T) {
	xdsTable.set(t.Name(), weightedView(6, 2, 4, 4))
	t.Cleanup(func() { xdsTable.set(t.Name(), nil) })
	pool := weightedPool(4)

	mg, err := newHashPicker(hashMaglev, 0, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantMaglev, err := chash.NewMaglev(hostsOf(pool, 6, 2, 4, 4), chash.DefaultMaglevTableSize)
	if err != nil {
		t.Fatal(err)
	}
	agreesWith(t, "maglev 6:2:4:4", mg, pool, wantMaglev)

	rg, err := newHashPicker(hashRing, 0, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantRing, err := chash.NewRing(hostsOf(pool, 6, 2, 4, 4), chash.DefaultMinRingSize, chash.DefaultMaxRingSize)
	if err != nil {
		t.Fatal(err)
	}
	agreesWith(t, "ring 6:2:4:4", rg, pool, wantRing)

	vn, err := newHashPicker(hashRing, 0, 0, 0, 160, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantVN, err := chash.NewVirtualNodesRing(hostsOf(pool, 6, 2, 4, 4), 160, 2)
	if err != nil {
		t.Fatal(err)
	}
	agreesWith(t, "virtual nodes 6:2:4:4", vn, pool, wantVN)

	// Without the weight-2 backend: 160 x 14 / 2 points, each backend keeping its own.
	without := reverseproxy.UpstreamPool{pool[0], pool[2], pool[3]}
	wantVN, err = chash.NewVirtualNodesRing(hostsOf(without, 6, 4, 4), 160, 2)
	if err != nil {
		t.Fatal(err)
	}
	if wantVN.Size() != 160*14/2 {
		t.Fatalf("the expected ring has %d points, want %d", wantVN.Size(), 160*14/2)
	}
	agreesWith(t, "virtual nodes 6:-:4:4, unit 2", vn, without, wantVN)
}

// TestStaticUpstreamsWeighOne: upstreams the control plane does not name weigh 1 each, in
// units of 1, so a static pool builds the tables it built before weights came in.
func TestStaticUpstreamsWeighOne(t *testing.T) {
	xdsTable.set(t.Name(), weightedView(6, 2)) // other upstreams than the pool's
	t.Cleanup(func() { xdsTable.set(t.Name(), nil) })
	pool := testPool(4)
	vn, err := newHashPicker(hashRing, 0, 0, 0, 160, 0)
	if err != nil {
		t.Fatal(err)
	}
	want, err := chash.NewVirtualNodesRing(hostsOf(pool, 1, 1, 1, 1), 160, 1)
	if err != nil {
		t.Fatal(err)
	}
	agreesWith(t, "static, virtual nodes", vn, pool, want)
}

// TestWeightChangeRebuildsTheTable: a new weight from the control plane rebuilds the table
// at the next pick (fresh pools of the same upstreams, as the source returns them); a view
// that changes nothing this pool's table depends on (another upstream's weight) costs no
// build.
func TestWeightChangeRebuildsTheTable(t *testing.T) {
	xdsTable.set(t.Name(), weightedView(3, 1, 2))
	t.Cleanup(func() { xdsTable.set(t.Name(), nil) })
	pool := weightedPool(3)
	p, err := newHashPicker(hashMaglev, 0, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		p.pick(freshPool(pool), chash.KeyHash(fmt.Sprint(i)), tried{}, time.Time{})
	}
	if n := p.rebuilds.Load(); n != 1 {
		t.Fatalf("%d builds for one pool and one weight table, want 1", n)
	}

	// Another service's backend changes weight: no build, and the picks stay.
	other := weightedView(3, 1, 2)
	other.Services["other"] = &xdsService{CrossZone: true, Backends: []xdsBackend{{ID: "10.0.16.1:80", Dial: "10.0.16.1:80", Weight: 7, Health: "healthy"}}}
	xdsTable.set(t.Name(), other)
	want, err := chash.NewMaglev(hostsOf(pool, 3, 1, 2), chash.DefaultMaglevTableSize)
	if err != nil {
		t.Fatal(err)
	}
	agreesWith(t, "3:1:2 after another service changed", p, freshPool(pool), want)
	if n := p.rebuilds.Load(); n != 1 {
		t.Fatalf("another service's weight: %d builds, want still 1", n)
	}

	// This pool's weights change: one build, the picks follow.
	xdsTable.set(t.Name(), weightedView(1, 1, 5))
	want, err = chash.NewMaglev(hostsOf(pool, 1, 1, 5), chash.DefaultMaglevTableSize)
	if err != nil {
		t.Fatal(err)
	}
	agreesWith(t, "1:1:5", p, freshPool(pool), want)
	if n := p.rebuilds.Load(); n != 2 {
		t.Fatalf("a weight change: %d builds, want 2", n)
	}
}

// TestWeightUnitFollowsTheService: the virtual-node unit is the smallest weight of the
// service in the view, so when the file's lightest backend leaves the file (not only the
// pool), every backend's points rescale: the ring follows.
func TestWeightUnitFollowsTheService(t *testing.T) {
	xdsTable.set(t.Name(), weightedView(6, 4, 4, 2))
	t.Cleanup(func() { xdsTable.set(t.Name(), nil) })
	pool := weightedPool(3)
	p, err := newHashPicker(hashRing, 0, 0, 0, 160, 0)
	if err != nil {
		t.Fatal(err)
	}
	want, err := chash.NewVirtualNodesRing(hostsOf(pool, 6, 4, 4), 160, 2)
	if err != nil {
		t.Fatal(err)
	}
	agreesWith(t, "6:4:4, unit 2 (the weight-2 backend elsewhere)", p, pool, want)
	xdsTable.set(t.Name(), weightedView(6, 4, 4)) // the weight-2 backend left the file
	want, err = chash.NewVirtualNodesRing(hostsOf(pool, 6, 4, 4), 160, 4)
	if err != nil {
		t.Fatal(err)
	}
	agreesWith(t, "6:4:4, unit 4", p, pool, want)
	if n := p.rebuilds.Load(); n != 2 {
		t.Fatalf("a unit change: %d builds, want 2", n)
	}
}

// TestWeightChangesUnderConcurrentPicks: picks on several goroutines while the control
// plane's weights change (run with -race) always return an upstream of the pool, and once
// the changes stop every pick follows the last weights.
func TestWeightChangesUnderConcurrentPicks(t *testing.T) {
	t.Cleanup(func() { xdsTable.set(t.Name(), nil) })
	pool := weightedPool(3)
	p, err := newHashPicker(hashRing, 0, 0, 0, 160, 0)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				if u := p.pick(freshPool(pool), chash.KeyHash(fmt.Sprint(g, "-", i)), tried{}, time.Time{}); u == nil {
					errs <- fmt.Errorf("goroutine %d: no pick", g)
					return
				}
			}
		}()
	}
	for i := range 200 {
		xdsTable.set(t.Name(), weightedView(uint32(1+i%3), 2, uint32(1+i%5)))
	}
	xdsTable.set(t.Name(), weightedView(3, 2, 5))
	close(stop)
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	want, err := chash.NewVirtualNodesRing(hostsOf(pool, 3, 2, 5), 160, 2)
	if err != nil {
		t.Fatal(err)
	}
	agreesWith(t, "the last weights, 3:2:5", p, pool, want)
}
