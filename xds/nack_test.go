package xds

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap/zaptest"
	"google.golang.org/genproto/googleapis/rpc/status"
)

// rawNode is an ADS stream that subscribes to every type, as Envoy does, and ACKs only
// when told to.
type rawNode struct {
	t      *testing.T
	stream discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node   *corev3.Node
	last   map[string]*discoverygrpc.DiscoveryResponse
}

func newRawNode(t *testing.T, ctx context.Context, s *Server, id string) *rawNode {
	t.Helper()
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(bufXDS(t, s)()).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := &rawNode{t: t, stream: stream, node: &corev3.Node{Id: id, Locality: &corev3.Locality{Zone: "zone-a"}}, last: map[string]*discoverygrpc.DiscoveryResponse{}}
	for _, typ := range typeURLs {
		if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: n.node, TypeUrl: typ}); err != nil {
			t.Fatal(err)
		}
	}
	n.receive(len(typeURLs))
	n.ackAll()
	return n
}

// receive reads n responses.
func (n *rawNode) receive(count int) {
	n.t.Helper()
	for i := 0; i < count; i++ {
		resp, err := n.stream.Recv()
		if err != nil {
			n.t.Fatal(err)
		}
		n.last[resp.TypeUrl] = resp
	}
}

func (n *rawNode) ackAll() {
	n.t.Helper()
	for _, typ := range typeURLs {
		r := n.last[typ]
		if err := n.stream.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: typ, VersionInfo: r.VersionInfo, ResponseNonce: r.Nonce}); err != nil {
			n.t.Fatal(err)
		}
	}
}

// servedVersion is the cluster version the cache holds for the node's first live stream.
func servedVersion(t *testing.T, s *Server, id string) string {
	t.Helper()
	keys := s.cacheKeys(id)
	if len(keys) == 0 {
		t.Fatalf("node %s has no stream", id)
	}
	snap, err := s.cachedSnapshot(keys[0])
	if err != nil {
		t.Fatal(err)
	}
	return snap.GetVersion(resource.ClusterType)
}

// TestForgedNACKLeavesTheVictimAlone: right after a reload, before the victim has ACKed the
// new version, another stream under the victim's node id NACKs it. The victim must stay on
// the new version: a NACK applies only to the stream that sent it.
func TestForgedNACKLeavesTheVictimAlone(t *testing.T) {
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zaptest.NewLogger(t))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	victim := newRawNode(t, ctx, s, "victim")
	testwait.For(t, 5*time.Second, "the victim's first version acknowledged", func() (bool, string) {
		return s.ackedVersion("victim") == "1", s.ackedVersion("victim")
	})
	if err := s.Update(bigPools(t, 1, 4, 8080)); err != nil {
		t.Fatal(err)
	}
	victim.receive(len(typeURLs)) // version 2, not ACKed yet
	forger, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(bufXDS(t, s)()).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	forger.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "victim"}, TypeUrl: resource.ClusterType})
	if resp, err := forger.Recv(); err == nil {
		forger.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: "1", ResponseNonce: resp.Nonce,
			ErrorDetail: &status.Status{Message: "forged"}})
		// The forger's own stream may be rolled back; wait until its NACK was handled.
		testwait.For(t, 5*time.Second, "the forged NACK handled", func() (bool, string) {
			return s.Stats.NACKs.Load() == 1, "no NACK yet"
		})
	}
	if v := servedVersion(t, s, "victim"); v != "2" {
		t.Fatalf("the victim is served version %s after a NACK it did not send, want 2", v)
	}
}

// TestNACKAfterLateACKsRollsBack: a reload lands after a node has ACKed some types of
// version 1 and before it has ACKed the others; their ACKs of version 1 arrive after the
// server has moved the node to version 2. When the node then NACKs version 2, the server
// must still roll it back to version 1, which it has by then ACKed on every type: without a
// rollback the cache keeps offering version 2 and the node NACKs it again and again.
func TestNACKAfterLateACKsRollsBack(t *testing.T) {
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zaptest.NewLogger(t))
	const sid = -1
	if err := s.open(context.Background(), sid); err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "late", Locality: &corev3.Locality{Zone: "zone-a"}}
	key := ""
	for _, typ := range typeURLs {
		n, err := s.request(sid, node, typ, "", "", false, "")
		if err != nil {
			t.Fatal(err)
		}
		key = n.GetId()
	}
	ack := func(typ, version string) {
		t.Helper()
		if _, err := s.request(sid, nil, typ, "nonce", "", false, version); err != nil {
			t.Fatal(err)
		}
	}
	ack(resource.ClusterType, "1")
	ack(resource.EndpointType, "1")
	if err := s.Update(bigPools(t, 1, 4, 8080)); err != nil {
		t.Fatal(err)
	}
	ack(resource.ListenerType, "1")
	ack(resource.RouteType, "1")
	if _, err := s.request(sid, nil, resource.ClusterType, "nonce", "cannot apply", true, "1"); err != nil {
		t.Fatal(err)
	}
	snap, err := s.cachedSnapshot(key)
	if err != nil {
		t.Fatal(err)
	}
	if n, r, v := s.Stats.NACKs.Load(), s.Stats.Rollbacks.Load(), snap.GetVersion(resource.ClusterType); n != 1 || r != 1 || v != "1" {
		t.Fatalf("NACKs %d, rollbacks %d, served version %q; want 1, 1, \"1\"", n, r, v)
	}
}
