package xds

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	maglevv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/maglev/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// ackedOf is the version node id's stream has ACKed of each type, by short type name
// ("cluster", "endpoint", ...), from the server's own state; nil when it has no stream.
func ackedOf(s *Server, id string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.streams {
		if st.admitted && st.node.ID == id {
			out := map[string]string{}
			for t, v := range st.acks.ackedBy {
				out[shortType(t)] = v
			}
			return out
		}
	}
	return nil
}

// spread calls n keys once each and counts the backends that answered.
func spread(ctx context.Context, t *testing.T, cc *grpc.ClientConn, n int) (map[string]int, error) {
	counts := map[string]int{}
	for i := 0; i < n; i++ {
		b, err := call(ctx, cc, fmt.Sprintf("k-%d", i))
		if err != nil {
			return counts, err
		}
		counts[b]++
	}
	return counts, nil
}

// TestPoolsEditFollowedAndInvalidEditIgnored: a pools-file edit reaches a gRPC client within
// 2 s (config: a 50ms poll); an invalid edit is counted and the client keeps working on the
// last good config.
func TestPoolsEditFollowedAndInvalidEditIgnored(t *testing.T) {
	bs := startGRPCBackends(t, 3)
	path := filepath.Join(t.TempDir(), "pools.yaml")
	write := func(f string) {
		if err := os.WriteFile(path+".tmp", []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	src := func(n int) string {
		var b strings.Builder
		b.WriteString("services:\n  - name: api\n    protocol: grpc\n    affinity: {mode: header, header: {name: x-session}}\n    balance: ring_hash\n    backends:\n")
		for _, be := range bs[:n] {
			fmt.Fprintf(&b, "      - {address: %q}\n", be.addr)
		}
		return b.String()
	}
	write(src(3))
	f := grpcPools(t, bs, []int{1, 1, 1}, "")
	s, addr := startXDS(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go Watch(ctx, path, 50*time.Millisecond, s, zaptest.NewLogger(t), nil)
	cc := dialXDS(t, addr, "edit-node", "zone-a", "api")
	if c, err := spread(ctx, t, cc, 60); err != nil || c["b3"] == 0 {
		t.Fatalf("before the edit: %v %v", c, err)
	}
	write(src(2)) // b3 leaves
	took := testwait.For(t, 2*time.Second, "client follows the edit", func() (bool, string) {
		c, err := spread(ctx, t, cc, 60)
		return err == nil && c["b3"] == 0, fmt.Sprint(c, err)
	})
	t.Logf("client followed the edit in %s", took.Round(time.Millisecond))
	write("services:\n  - name: api\n    protocol: grpc\n    balance: maglev-typo\n")
	testwait.For(t, 2*time.Second, "invalid edit counted", func() (bool, string) {
		return s.Stats.ReloadErrors.Load() == 1, fmt.Sprint(s.Stats.ReloadErrors.Load())
	})
	if c, err := spread(ctx, t, cc, 60); err != nil || c["b3"] != 0 || c["b1"] == 0 || c["b2"] == 0 {
		t.Fatalf("after the invalid edit: %v %v", c, err)
	}
}

// TestNACKRollsBack: a cluster whose only policy is Maglev, which gRPC rejects: the NACK is
// counted once, the node goes back to its last acknowledged snapshot, nothing is re-sent in
// a loop, and the client keeps working.
func TestNACKRollsBack(t *testing.T) {
	bs := startGRPCBackends(t, 3)
	f := grpcPools(t, bs, []int{1, 1, 1}, "")
	s, addr := startXDS(t, f)
	cc := dialXDS(t, addr, "nack-node", "zone-a", "api")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := spread(ctx, t, cc, 20); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "first snapshot acknowledged", func() (bool, string) {
		return s.ackedVersion("nack-node") != "", "no ack"
	})
	s.mutateResources(func(r *Resources) {
		for _, m := range r.Clusters {
			c := m.(*clusterv3.Cluster)
			c.LoadBalancingPolicy = &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{
				TypedExtensionConfig: typed("envoy.load_balancing_policies.maglev", &maglevv3.Maglev{TableSize: wrapperspb.UInt64(65537)}),
			}}}
		}
	})
	pushesBefore := s.Stats.Pushes.Load()
	if err := s.Update(grpcPools(t, bs, []int{1, 1, 1}, "")); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "NACK observed", func() (bool, string) {
		return s.Stats.NACKs.Load() == 1, fmt.Sprint(s.Stats.NACKs.Load())
	})
	// The bad push is 4 responses; the rollback re-sends the 3 types the node had accepted
	// at the bad version (its CDS is still at the good one). After that, nothing: let the
	// client run and check that no response follows.
	testwait.For(t, 5*time.Second, "rollback sent", func() (bool, string) {
		p := s.Stats.Pushes.Load() - pushesBefore
		return p == 7, fmt.Sprint(p)
	})
	settled := s.Stats.Pushes.Load()
	for i := 0; i < 20; i++ {
		if _, err := spread(ctx, t, cc, 10); err != nil {
			t.Fatalf("client broke after the NACK: %v", err)
		}
	}
	time.Sleep(300 * time.Millisecond) // bounded: checks that nothing more happens
	if n, p := s.Stats.NACKs.Load(), s.Stats.Pushes.Load()-settled; n != 1 || p != 0 {
		t.Fatalf("after the rollback: %d NACKs, %d more pushes", n, p)
	}
	if s.Stats.Rollbacks.Load() != 1 {
		t.Fatalf("rollbacks %d", s.Stats.Rollbacks.Load())
	}
	t.Logf("NACKs %d, rollbacks %d, pushes since the bad update %d", s.Stats.NACKs.Load(), s.Stats.Rollbacks.Load(), s.Stats.Pushes.Load()-pushesBefore)
}

// TestDeltaADS subscribes with a delta stream (grpc-go speaks only state of the world).
func TestDeltaADS(t *testing.T) {
	bs := startGRPCBackends(t, 2)
	s, addr := startXDS(t, grpcPools(t, bs, []int{1, 1}, ""))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "delta-node", Locality: &corev3.Locality{Zone: "zone-a"}}
	if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Resources) != 1 || resp.Resources[0].Name != "api" {
		t.Fatalf("delta response: %v", resp)
	}
	var c clusterv3.Cluster
	if err := resp.Resources[0].Resource.UnmarshalTo(&c); err != nil || c.GetLoadBalancingPolicy() == nil {
		t.Fatalf("cluster: %v %v", err, &c)
	}
	// ACK, then an update arrives as a delta.
	stream.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: resp.Nonce})
	next := grpcPools(t, bs, []int{1, 1}, "")
	next.Services[0].Balance = "weighted_least_conn"
	if err := s.Update(next); err != nil {
		t.Fatal(err)
	}
	resp, err = stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Resources[0].Resource.UnmarshalTo(&c); err != nil || !strings.Contains(prototext.Format(&c), "least_request") {
		t.Fatalf("updated cluster: %v %v", err, &c)
	}
}

func TestAdminEndpoints(t *testing.T) {
	bs := startGRPCBackends(t, 2)
	s, addr := startXDS(t, grpcPools(t, bs, []int{1, 1}, ""))
	cc := dialXDS(t, addr, "admin-node", "zone-a", "api")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := spread(ctx, t, cc, 5); err != nil {
		t.Fatal(err)
	}
	h := httptest.NewServer(s.AdminHandler())
	defer h.Close()
	get := func(p string) string {
		resp, err := http.Get(h.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if get("/healthz") != "ok\n" || get("/livez") != "ok\n" {
		t.Fatal("healthz")
	}
	if m := get("/metrics"); !strings.Contains(m, "stickylb_xds_nodes 1") || !strings.Contains(m, "stickylb_xds_pushes_total") {
		t.Fatalf("metrics:\n%s", m)
	}
	if c := get("/config"); !strings.Contains(c, `"node":"admin-node"`) || !strings.Contains(c, "api") {
		t.Fatalf("config: %s", c)
	}
}

// Nodes of one zone share one snapshot: a reload translates and validates once per zone,
// not once per node, and what each node gets is what a build for it alone would give.
func TestSnapshotSharedByZone(t *testing.T) {
	f := bigPools(t, 3, 4, 8080)
	s := NewServer(t.Context(), f, nil, zaptest.NewLogger(t))
	zoneOf := func(i int) string { return []string{"zone-a", "zone-b", ""}[i%3] }
	for i := 0; i < 12; i++ {
		s.testNode(t, fmt.Sprintf("n%d", i), zoneOf(i))
	}
	if got := s.Stats.Builds.Load(); got != 3 {
		t.Fatalf("12 nodes in 3 zones joined: %d builds, want 3", got)
	}
	before := s.Stats.Builds.Load()
	if err := s.Update(bigPools(t, 3, 5, 8080)); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats.Builds.Load() - before; got != 3 {
		t.Fatalf("a reload with 12 nodes in 3 zones: %d builds, want 3", got)
	}
	for i := 0; i < 12; i++ {
		s.mu.Lock()
		ns := s.nodeStreamsLocked(fmt.Sprintf("n%d", i))[0]
		s.mu.Unlock()
		alone, err := s.build(s.currentFile(), Node{ID: ns.node.ID, Zone: ns.node.Zone}, ns.acks.current.GetVersion(resource.ClusterType), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, typ := range typeURLs {
			got, want := ns.acks.current.GetResources(typ), alone.GetResources(typ)
			if len(got) != len(want) {
				t.Fatalf("node %d, %s: %d resources, want %d", i, typ, len(got), len(want))
			}
			for name, r := range want {
				if !proto.Equal(got[name], r) {
					t.Fatalf("node %d (zone %q), %s %s differs from its own build", i, ns.node.Zone, typ, name)
				}
			}
		}
	}
}
