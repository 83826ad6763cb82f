package xds

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/stickylb/stickylb/adsclient"
	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/health"
)

// fleetNode is a node's subscription as `stickylb xdp --xds` or the stickylb_xds source
// makes it (its user agent and decoder say which), applying into memory instead of a
// forwarder or a proxy.
type fleetNode struct {
	c       *adsclient.Client
	mu      sync.Mutex
	views   []*fleetview.View
	rejects int
}

// last is the view the node applied last (nil before the first), how many it applied, and
// how many it rejected.
func (n *fleetNode) last() (*fleetview.View, int, int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.views) == 0 {
		return nil, 0, n.rejects
	}
	return n.views[len(n.views)-1], len(n.views), n.rejects
}

// startXDPNode subscribes an XDP node (or another agent decoding views as XDP does).
func startXDPNode(t *testing.T, addr, id, userAgent string) *fleetNode {
	t.Helper()
	return startFleetNode(t, adsclient.Config{Server: addr, NodeID: id, UserAgentName: userAgent}, nil)
}

// startCaddyNode subscribes a Caddy node of zone (may be "").
func startCaddyNode(t *testing.T, addr, id, zone string) *fleetNode {
	t.Helper()
	return startFleetNode(t, adsclient.Config{Server: addr, NodeID: id, Zone: zone, UserAgentName: fleetview.UserAgentCaddy},
		fleetview.DecodeCaddy)
}

// startFleetNode subscribes a node as cfg says, with a short reconnect backoff, decoding
// views with decode (nil: the XDP view).
func startFleetNode(t *testing.T, cfg adsclient.Config, decode func(clusters, assignments map[string]proto.Message) (*fleetview.View, error)) *fleetNode {
	t.Helper()
	cfg.Backoff = adsclient.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}
	c, err := adsclient.New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	n := &fleetNode{c: c}
	a := &fleetview.Assembler{Decode: decode, Apply: func(v *fleetview.View) error {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.views = append(n.views, v)
		return nil
	}}
	count := func(h adsclient.Handler) adsclient.Handler {
		return func(v string, r map[string]proto.Message) error {
			err := h(v, r)
			if err != nil {
				n.mu.Lock()
				n.rejects++
				n.mu.Unlock()
			}
			return err
		}
	}
	// Wildcard subscriptions: the snapshot cache answers a named one only when it names
	// every resource of the type.
	if err := c.Subscribe(resource.ClusterType, count(a.Clusters)); err != nil {
		t.Fatal(err)
	}
	if err := c.Subscribe(resource.EndpointType, count(a.Endpoints)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); c.Close() })
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitOneNACK waits until s has counted one NACK and rolled its node back.
func waitOneNACK(t *testing.T, s *Server) {
	t.Helper()
	testwait.For(t, 5*time.Second, "NACK counted and node rolled back", func() (bool, string) {
		return s.Stats.NACKs.Load() == 1 && s.Stats.Rollbacks.Load() == 1,
			fmt.Sprintf("nacks %d rollbacks %d", s.Stats.NACKs.Load(), s.Stats.Rollbacks.Load())
	})
}

// TestXDPNodeView: a node with the XDP user agent gets the vip services with the control
// plane's verdicts (and when they changed), nothing else; an Envoy node on the same server
// gets the Envoy resources, as before; a health transition reaches the XDP node.
func TestXDPNodeView(t *testing.T) {
	f := poolstest.Parse(t, poolstest.Fleet)
	states := newStateView(map[string]health.State{"10.0.6.1:443": health.Healthy})
	s, addr := startXDSWithView(t, f, states.view)

	x := startXDPNode(t, addr, "h1/xdp/eth0", fleetview.UserAgentXDP)
	testwait.For(t, 5*time.Second, "the XDP node's first view", func() (bool, string) {
		v, _, _ := x.last()
		return v != nil, "none"
	})
	v, _, _ := x.last()
	if len(v.File.Services) != 1 || v.File.Services[0].Name != "web" || len(v.File.Services[0].Backends) != 2 {
		t.Fatalf("XDP view: %+v", v.File.Services)
	}
	if st := v.Verdict("web", "10.0.6.2:443").State; st != health.Unknown {
		t.Fatalf("web/10.0.6.2:443 (no verdict yet): %v, want unknown", st)
	}
	if st := v.Verdict("web", "10.0.6.1:443").State; st != health.Healthy {
		t.Fatalf("web/10.0.6.1:443: %v, want healthy", st)
	}

	// An Envoy node (any other user agent) sees the Envoy clusters: no XDP metadata.
	var envoyClusters sync.Map
	e, err := adsclient.New(adsclient.Config{Server: addr, NodeID: "envoy-1", UserAgentName: "envoy"}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	e.Subscribe(resource.ClusterType, func(_ string, r map[string]proto.Message) error {
		for n, m := range r {
			envoyClusters.Store(n, m)
		}
		return nil
	})
	ectx, ecancel := context.WithCancel(context.Background())
	t.Cleanup(func() { ecancel(); e.Close() })
	e.Start(ectx)
	testwait.For(t, 5*time.Second, "the Envoy node's clusters", func() (bool, string) {
		_, ok := envoyClusters.Load("api")
		return ok, "no api cluster"
	})
	envoyClusters.Range(func(k, m any) bool {
		if m.(*clusterv3.Cluster).GetMetadata().GetFilterMetadata()[fleetview.MetadataKey] != nil {
			t.Errorf("Envoy cluster %v carries the XDP view's metadata", k)
		}
		return true
	})
	if _, ok := envoyClusters.Load("web"); ok {
		t.Error("an Envoy node got the VIP-only service web")
	}

	// A transition: the XDP node gets the verdict and its time.
	at := time.Now().Add(-time.Second).UTC()
	states.set("10.0.6.1:443", health.Unhealthy)
	s.RecordTransition("web", health.Transition{ID: "10.0.6.1:443", Healthy: false, At: at})
	if err := s.Refresh(); err != nil {
		t.Fatal(err)
	}
	took := testwait.For(t, 5*time.Second, "the verdict reaches the XDP node", func() (bool, string) {
		v, _, _ := x.last()
		vd := v.Verdicts[fleetview.Key("web", "10.0.6.1:443")]
		return vd.State == health.Unhealthy && vd.Since.Equal(at), fmt.Sprint(vd)
	})
	t.Logf("verdict propagated in %s", took)
}

// TestXDPNodeNACK: a view the node cannot apply (an unknown affinity mode) is NACKed: the
// server counts it once, rolls the node back to the snapshot it acknowledged on the two
// types it subscribed to (CDS and EDS), and does not send the rejected version again; the
// node keeps its last view; the next good version is applied.
func TestXDPNodeNACK(t *testing.T) {
	f := poolstest.Parse(t, poolstest.Fleet)
	s, addr := startXDS(t, f)
	x := startXDPNode(t, addr, "h1/xdp/eth0", fleetview.UserAgentXDP)
	testwait.For(t, 5*time.Second, "first view acknowledged on CDS and EDS", func() (bool, string) {
		return s.ackedVersion("h1/xdp/eth0") != "", "no ack"
	})
	_, applied, _ := x.last()
	s.mutateFleetViews(func(clusters, _ []types.Resource) {
		for _, c := range clusters {
			c.(*clusterv3.Cluster).Metadata.FilterMetadata[fleetview.MetadataKey].Fields["affinity_mode"] = structpb.NewStringValue("telepathy")
		}
	})
	pushes := s.Stats.Pushes.Load()
	if err := s.Refresh(); err != nil {
		t.Fatal(err)
	}
	waitOneNACK(t, s)
	// The rollback is pushed after the NACK is counted, by go-control-plane's goroutine:
	// settled is the count once pushes have stopped for 200 ms (a server re-sending the
	// rejected version never stops, within the NACK hold's 200 ms cap, and fails here).
	last, since := s.Stats.Pushes.Load(), time.Now()
	testwait.For(t, 5*time.Second, "pushes settled after the rollback", func() (bool, string) {
		if p := s.Stats.Pushes.Load(); p != last {
			last, since = p, time.Now()
		}
		return time.Since(since) >= 200*time.Millisecond, fmt.Sprintf("%d pushes since the bad version", last-pushes)
	})
	settled := last
	// Bounded observation: a server re-sending the rejected version would do so within the
	// client's NACK hold (20 ms doubling to 200 ms here), so 1 s would show several.
	time.Sleep(time.Second)
	_, nowApplied, rejects := x.last()
	if n, p := s.Stats.NACKs.Load(), s.Stats.Pushes.Load()-settled; n != 1 || p != 0 || rejects != 1 || nowApplied != applied {
		t.Fatalf("after the NACK: %d NACKs, %d more pushes, %d rejections at the node, views applied %d -> %d",
			n, p, rejects, applied, nowApplied)
	}
	t.Logf("pushes for the bad version and its rollback: %d", settled-pushes)
	s.mutateFleetViews(nil)
	f2 := poolstest.Parse(t, poolstest.Fleet+"      - {address: 10.0.6.3:443}\n")
	if err := s.Update(f2); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "the next good version applied", func() (bool, string) {
		v, _, _ := x.last()
		return len(v.File.Services[0].Backends) == 3, fmt.Sprint(len(v.File.Services[0].Backends))
	})
}
