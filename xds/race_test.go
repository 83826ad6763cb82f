package xds

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap/zaptest"
)

// endpointCount is how many endpoints service svc-0 has in what the cache holds for key.
func endpointCount(t *testing.T, s *Server, key string) int {
	t.Helper()
	snap, err := s.cachedSnapshot(key)
	if err != nil {
		t.Fatalf("no snapshot for %s: %v", key, err)
	}
	cla, ok := snap.GetResources(resource.EndpointType)["svc-0"].(*endpointv3.ClusterLoadAssignment)
	if !ok {
		t.Fatal("no svc-0 endpoints")
	}
	n := 0
	for _, l := range cla.Endpoints {
		n += len(l.LbEndpoints)
	}
	return n
}

// TestRefreshNeverRestoresAReplacedFile: a health refresh that has read the current file
// while a reload replaces it must not publish the old file over the new one. The hook runs
// the reload in the refresh's window and waits until the reload has either finished (the
// old code: nothing orders them) or queued behind the refresh.
func TestRefreshNeverRestoresAReplacedFile(t *testing.T) {
	old, next := bigPools(t, 1, 3, 8080), bigPools(t, 1, 6, 8080)
	s := NewServer(t.Context(), old, nil, zaptest.NewLogger(t))
	key := s.testNode(t, "race-node", "zone-a")
	queued := make(chan struct{}, 1)
	s.onUpdateQueued(func() { queued <- struct{}{} })
	reloaded := make(chan error, 1)
	s.onRefreshRead(func() {
		s.onRefreshRead(nil)
		go func() { reloaded <- s.Update(next) }()
		select {
		case err := <-reloaded:
			reloaded <- err
		case <-queued:
		case <-time.After(10 * time.Second):
			t.Error("the reload neither finished nor queued")
		}
	})
	if err := s.Refresh(); err != nil {
		t.Fatal(err)
	}
	if err := testwait.Recv(t, reloaded, 10*time.Second, "the reload"); err != nil {
		t.Fatal(err)
	}
	if s.currentFile() != next {
		t.Errorf("the server's file is the replaced one")
	}
	if n := endpointCount(t, s, key); n != 6 {
		t.Errorf("the node is served %d endpoints of svc-0; the reload's file has 6 (the replaced one 3)", n)
	}
}

// testNode opens a stream without a transport, as the server's callbacks would for a real
// one, sends its first request and returns the key its snapshot is cached under.
func (s *Server) testNode(t *testing.T, id, zone string) string {
	t.Helper()
	s.mu.Lock()
	sid := -int64(len(s.streams)) - 1 // below the ids go-control-plane hands out
	s.mu.Unlock()
	if err := s.open(context.Background(), sid); err != nil {
		t.Fatal(err)
	}
	n, err := s.request(sid, &corev3.Node{Id: id, Locality: &corev3.Locality{Zone: zone}}, resource.ClusterType, "", "", false, "")
	if err != nil {
		t.Fatal(err)
	}
	return n.GetId()
}

// TestRefreshesCoalesce: refreshes asked for while a build runs cost one more rebuild, not
// one each; the rebuild that runs reads the health view after all of them.
func TestRefreshesCoalesce(t *testing.T) {
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zaptest.NewLogger(t))
	s.testNode(t, "n", "zone-a")
	building, release := make(chan struct{}), make(chan struct{})
	first := true
	s.mutateResources(func(*Resources) {
		if first {
			first = false
			close(building)
			<-release
		}
	})
	done := make(chan error, 1)
	go func() { done <- s.Update(bigPools(t, 1, 4, 8080)) }()
	<-building
	reloads := s.Stats.Reloads.Load()
	errs := make(chan error, 10)
	for i := 0; i < 10; i++ {
		go func() { errs <- s.Refresh() }()
	}
	// Nine return at once; one waits for the build.
	for i := 0; i < 9; i++ {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d refreshes returned while a build ran", i)
		}
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if got := s.Stats.Reloads.Load() - reloads; got != 2 {
		t.Fatalf("an update and 10 refreshes published %d versions, want 2", got)
	}
	if n := endpointCount(t, s, s.cacheKeys("n")[0]); n != 4 {
		t.Fatalf("%d endpoints served, want the update's 4", n)
	}
}
