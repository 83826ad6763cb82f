package xds

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/proto"

	"github.com/stickylb/stickylb/adsclient"
	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// TestNamedStreamsHoldWhatTheyAsk: a node that subscribes by name is sent those resources,
// and the snapshot its stream is set holds only them (go-control-plane sizes each response,
// which its server keeps, by the snapshot's resources of the type); when it asks for other
// names it gets them, and the snapshot follows; an update reaches it with its names only. A
// wildcard node's stream holds everything.
func TestNamedStreamsHoldWhatTheyAsk(t *testing.T) {
	s, addr := startXDS(t, bigPools(t, 5, 3, 8080))
	type node struct {
		c   *adsclient.Client
		mu  sync.Mutex
		got map[string][]string // type URL -> names of the last update applied
		ver string
	}
	start := func(id string, names ...string) *node {
		n := &node{got: map[string][]string{}}
		c, err := adsclient.New(adsclient.Config{Server: addr, NodeID: id, Zone: "zone-a", UserAgentName: fleetview.UserAgentCaddy},
			zaptest.NewLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, typ := range []string{resource.ClusterType, resource.EndpointType} {
			h := func(version string, res map[string]proto.Message) error {
				n.mu.Lock()
				defer n.mu.Unlock()
				n.got[typ], n.ver = slices.Sorted(maps.Keys(res)), version
				return nil
			}
			if err := c.Subscribe(typ, h, names...); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		n.c = c
		return n
	}
	// holds waits until n was sent want of both types and its stream's snapshot holds want.
	holds := func(n *node, id string, want []string, version string) {
		t.Helper()
		testwait.For(t, 10*time.Second, fmt.Sprintf("%s sent and set %v at version %s", id, want, version), func() (bool, string) {
			n.mu.Lock()
			got := fmt.Sprint(n.got[resource.ClusterType], n.got[resource.EndpointType], n.ver)
			sent := slices.Equal(n.got[resource.ClusterType], want) && slices.Equal(n.got[resource.EndpointType], want) && n.ver == version
			n.mu.Unlock()
			key := s.streamKey(id)
			snap, err := s.cachedSnapshot(key)
			if err != nil {
				return false, got + ": " + err.Error()
			}
			set := fmt.Sprint(slices.Sorted(maps.Keys(snap.GetResources(resource.ClusterType))), slices.Sorted(maps.Keys(snap.GetResources(resource.EndpointType))))
			return sent && set == fmt.Sprint(want, want), got + "; set " + set
		})
	}
	one := start("named", "svc-1")
	holds(one, "named", []string{"svc-1"}, "1")
	all := start("wildcard")
	every := []string{"svc-0", "svc-1", "svc-2", "svc-3", "svc-4"}
	holds(all, "wildcard", every, "1")

	for _, typ := range []string{resource.ClusterType, resource.EndpointType} {
		if err := one.c.SetNames(typ, "svc-2", "svc-3"); err != nil {
			t.Fatal(err)
		}
	}
	holds(one, "named", []string{"svc-2", "svc-3"}, "1")
	if err := s.Update(bigPools(t, 5, 3, 8081)); err != nil {
		t.Fatal(err)
	}
	holds(one, "named", []string{"svc-2", "svc-3"}, "2")
	holds(all, "wildcard", every, "2")
}

// streamKey is the cache key of node id's stream (its only one).
func (s *Server) streamKey(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.streams {
		if st.node.ID == id {
			return st.key
		}
	}
	return ""
}
