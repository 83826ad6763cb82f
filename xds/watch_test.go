package xds

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap/zaptest"

	"github.com/stickylb/stickylb/policies/pools"
)

// TestWatchRefusesOversizeBeforeReading: a pools file over the 32 MiB limit (here a 64 MiB
// sparse file, as a wrong path or a runaway generator would leave) is refused and counted
// without being read: the watcher's allocations stay far below the file's size.
func TestWatchRefusesOversizeBeforeReading(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pools.yaml")
	src := "services:\n  - {name: a, protocol: http, listen: 127.0.0.1:1, backends: [{address: 10.0.0.1:80}]}\n"
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := pools.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := NewServer(ctx, f, nil, zaptest.NewLogger(t))
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
