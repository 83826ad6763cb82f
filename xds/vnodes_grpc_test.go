package xds

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/stickylb/stickylb/internal/testkit/grpctest"
	"github.com/stickylb/stickylb/internal/testkit/healthtest"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/pools"
)

// TestGRPCVirtualNodesWeighted: grpc-go, subscribed to our server, builds the virtual-node
// ring policies/chash builds, with unequal weights, when a backend is added and when the
// lightest one turns unhealthy (the sizes then follow the remaining backends, in units of
// the file's smallest weight, so they keep their points). Exact weights need
// GRPC_EXPERIMENTAL_PF_WEIGHTED_SHUFFLING=false (see TestGRPCRingHashFollowsPolicies): the
// test re-runs itself in a child process with it set.
func TestGRPCVirtualNodesWeighted(t *testing.T) {
	if testing.Short() {
		t.Skip("real grpc-go client and backends")
	}
	if !grpctest.ExactWeights(t) {
		return // the child runs it with exact weights
	}
	const (
		vnodes = 160
		keys   = 2000
		// slack for an xDS push to reach the client on a loaded machine.
		slack = 15 * time.Second
	)
	bs := startGRPCBackends(t, 4)
	weights := []uint32{3, 1, 2, 2}
	file := func(n int) *pools.File {
		var b strings.Builder
		fmt.Fprintf(&b, "services:\n  - name: api\n    protocol: grpc\n    affinity: {mode: header, header: {name: x-session}}\n    balance: ring_hash\n    hash: {virtual_nodes: %d}\n    backends:\n", vnodes)
		for i := range n {
			fmt.Fprintf(&b, "      - {address: %q, weight: %d}\n", bs[i].addr, weights[i])
		}
		f := poolstest.Parse(t, b.String())
		return f
	}
	var sw healthtest.Switch
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	srv := NewServer(ctx, file(3), sw.View, zaptest.NewLogger(t))
	cc := dialXDS(t, grpctest.Serve(t, srv.Register), "grpc-w", "", "api")

	predict := func(live []int) (*chash.Ring, []chash.Host) {
		hosts := make([]chash.Host, len(live))
		for i, k := range live {
			hosts[i] = chash.Host{ID: bs[k].addr, Weight: weights[k]}
		}
		r, err := chash.NewVirtualNodesRing(hosts, vnodes, 1)
		if err != nil {
			t.Fatal(err)
		}
		return r, hosts
	}
	name := map[string]string{}
	for _, b := range bs {
		name[b.addr] = b.name
	}
	phase := func(what string, live []int) []string {
		r, hosts := predict(live)
		want := make([]string, keys)
		for i := range want {
			want[i] = name[hosts[r.Pick(chash.KeyHash(fmt.Sprintf("w-%d", i)))].ID]
		}
		// Wait for the push: every 50th key where the ring says.
		settled := func() string {
			for i := 0; i < keys; i += 50 {
				if got, err := call(ctx, cc, fmt.Sprintf("w-%d", i)); err != nil || got != want[i] {
					return fmt.Sprintf("w-%d on %s (%v), the ring says %s", i, got, err, want[i])
				}
			}
			return ""
		}
		for deadline := time.Now().Add(slack); ; {
			off := settled()
			if off == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: after %s: %s", what, slack, off)
			}
			time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
		}
		counts := map[string]int{}
		for i := range keys {
			got, err := call(ctx, cc, fmt.Sprintf("w-%d", i))
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if got != want[i] {
				t.Fatalf("%s: w-%d went to %s; the virtual-node ring (%d points) says %s", what, i, got, r.Size(), want[i])
			}
			counts[got]++
		}
		t.Logf("%s: %d keys on the predicted backend, ring of %d points; per backend %v", what, keys, r.Size(), counts)
		return want
	}
	phase("3:1:2", []int{0, 1, 2})
	if err := srv.Update(file(4)); err != nil {
		t.Fatal(err)
	}
	before := phase("3:1:2:2", []int{0, 1, 2, 3})
	sw.Down(bs[1].addr) // the lightest backend
	if err := srv.Refresh(); err != nil {
		t.Fatal(err)
	}
	after := phase("3:-:2:2 (weight-1 backend unhealthy)", []int{0, 2, 3})
	for i := range before {
		if before[i] != after[i] && before[i] != bs[1].name {
			t.Fatalf("w-%d moved from %s to %s: the remaining backends lost points", i, before[i], after[i])
		}
	}
}
