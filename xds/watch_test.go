package xds

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap/zaptest"

	"github.com/stickylb/stickylb/policies/pools"
)

// watchedFile writes a pools file of one service and returns its path, its content and a
// server of it (not watching yet).
func watchedFile(ctx context.Context, t *testing.T) (path, src string, s *Server) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "pools.yaml")
	src = "services:\n  - {name: a, protocol: http, listen: 127.0.0.1:1, backends: [{address: 10.0.0.1:80}]}\n"
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := pools.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, src, NewServer(ctx, f, nil, zaptest.NewLogger(t))
}

// TestWatchRefusesOversizeBeforeReading: a pools file over the 32 MiB limit (here a 64 MiB
// sparse file, as a wrong path or a runaway generator would leave) is refused and counted
// without being read: the watcher's allocations stay far below the file's size.
func TestWatchRefusesOversizeBeforeReading(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	path, src, s := watchedFile(ctx, t)
	done := make(chan struct{})
	go func() { defer close(done); Watch(ctx, path, 10*time.Millisecond, s, zaptest.NewLogger(t), nil) }()
	// A valid edit first, so the watcher is known to be polling.
	if err := os.WriteFile(path, []byte(src+"# edited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "valid edit applied", func() (bool, string) {
		return s.Stats.Reloads.Load() >= 1, fmt.Sprint(s.Stats.Reloads.Load())
	})
	const size = 64 << 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "oversize edit counted", func() (bool, string) {
		return s.Stats.ReloadErrors.Load() >= 1, fmt.Sprint(s.Stats.ReloadErrors.Load())
	})
	cancel()
	<-done
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated %d bytes while refusing a %d-byte file", allocated, size)
	if allocated > 4<<20 {
		t.Fatalf("allocated %d bytes refusing a %d-byte file: it was read before the size check", allocated, size)
	}
}

// TestUntranslatableEditCountedOnce: an edit that parses but does not translate (here
// every endpoint list loses its cluster name, which validation refuses) is one rejected
// edit: stickylb_xds_reload_errors_total moves by one, not once in the server and once in
// the watcher.
func TestUntranslatableEditCountedOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	path, src, s := watchedFile(ctx, t)
	s.testNode(t, "n", "") // a view in use: an edit is built for it
	var breaking atomic.Bool
	breaking.Store(true)
	s.mutateResources(func(r *Resources) {
		if !breaking.Load() {
			return
		}
		for _, m := range r.Endpoints {
			m.(*endpointv3.ClusterLoadAssignment).ClusterName = ""
		}
	})
	go Watch(ctx, path, 10*time.Millisecond, s, zaptest.NewLogger(t), nil)
	writeAtomic(t, path, src+"# edited\n")
	testwait.For(t, 5*time.Second, "the edit refused on the status page", func() (bool, string) {
		c := s.edits.Load().File()
		return c != nil && c.Refused != nil, fmt.Sprintf("%+v", c)
	})
	// The watcher counts after it records: a valid edit applied next is read once the
	// watcher is done with this one.
	breaking.Store(false)
	writeAtomic(t, path, src+"# edited again\n")
	testwait.For(t, 5*time.Second, "the next edit applied", func() (bool, string) {
		return s.Stats.Reloads.Load() >= 1, fmt.Sprint(s.Stats.Reloads.Load())
	})
	if got := s.Stats.ReloadErrors.Load(); got != 1 {
		t.Fatalf("one untranslatable edit counted %d times", got)
	}
}

// writeAtomic replaces path's content in one rename: the watcher never reads half of it.
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}
