package adsclient

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds"
)

func peerPools(t testing.TB, services int) *pools.File {
	var sb strings.Builder
	sb.WriteString("services:\n")
	for s := range services {
		fmt.Fprintf(&sb, "  - name: svc-%d\n    protocol: http\n    listen: 0.0.0.0:%d\n    balance: maglev\n    backends:\n      - {address: \"10.0.%d.1:80\"}\n", s, 20000+s, s)
	}
	f, err := pools.Parse("peer.yaml", []byte(sb.String()))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestWithStickylbXDS: a node subscribed as Envoy is (listeners, routes, clusters,
// endpoints, all by wildcard) to the project's own control plane applies its snapshot; a
// pools edit the node refuses is NACKed once with the reason, the server counts it and
// rolls the node back (no re-send loop), the node keeps version 1, and the next edit it
// accepts applies.
func TestWithStickylbXDS(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	xs := xds.NewServer(ctx, peerPools(t, 2), nil, zaptest.NewLogger(t))
	srv := &testServer{}
	srv.serve(t, "", func(g *grpc.Server) { xs.Register(g) })
	c, err := New(Config{Server: srv.addr, NodeID: "n", Zone: "zone-a"}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	const reason = "this node holds at most 2 clusters"
	var mu sync.Mutex
	var clusters []int // cluster counts applied
	applied := func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprint(clusters)
	}
	accept := func(string, map[string]proto.Message) error { return nil }
	for _, typeURL := range []string{resource.ListenerType, resource.RouteType, eds} {
		if err := c.Subscribe(typeURL, accept); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Subscribe(cds, func(_ string, res map[string]proto.Message) error {
		if len(res) > 2 {
			return errors.New(reason)
		}
		mu.Lock()
		clusters = append(clusters, len(res))
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testwait.For(t, wait, "ACK of version 1", func() (bool, string) {
		return srv.acked("n", cds, "1") && srv.acked("n", eds, "1"), fmt.Sprint(srv.requests())
	})

	if err := xs.Update(peerPools(t, 3)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, wait, "NACK counted and rolled back", func() (bool, string) {
		return xs.Stats.NACKs.Load() == 1 && xs.Stats.Rollbacks.Load() == 1,
			fmt.Sprint(xs.Stats.NACKs.Load(), xs.Stats.Rollbacks.Load())
	})
	nacks := srv.nacks("n", cds)
	if len(nacks) != 1 || nacks[0].GetErrorDetail().GetMessage() != reason || nacks[0].GetVersionInfo() != "1" {
		t.Errorf("NACKs = %v, want one with %q at version 1", nacks, reason)
	}
	if v := c.Version(cds); v != "1" {
		t.Errorf("CDS version = %q, want 1", v)
	}

	if err := xs.Update(peerPools(t, 1)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, wait, "ACK of version 3", func() (bool, string) { return srv.acked("n", cds, "3"), applied() })
	if applied() != "[2 1]" || len(srv.nacks("n", cds)) != 1 {
		t.Errorf("applied cluster counts %v, NACKs %d; want [2 1] and 1", applied(), len(srv.nacks("n", cds)))
	}
}
