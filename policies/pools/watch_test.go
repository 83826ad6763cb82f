package pools

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

const watchSrc = "services:\n  - {name: a, protocol: http, listen: 127.0.0.1:1, backends: [{address: 10.0.0.1:80}]}\n"

func writeAtomically(t *testing.T, path, src string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// editLog records what a Watcher tells its Edits, one line per edit.
type editLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *editLog) Applied(time.Time) { l.add("applied") }
func (l *editLog) Refused(_ time.Time, errs []string) {
	l.add("refused: " + strings.Join(errs, "; "))
}
func (l *editLog) add(s string) { l.mu.Lock(); defer l.mu.Unlock(); l.lines = append(l.lines, s) }
func (l *editLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// TestWatcher: an edit made before Run (after Load) is applied; an invalid edit is logged
// with file:line, counted once however many polls see it, and not applied; an edit Apply
// refuses is counted; Edits hears each edit once; Run returns when its context ends.
func TestWatcher(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pools.yaml")
	writeAtomically(t, path, watchSrc)
	cur, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	writeAtomically(t, path, watchSrc+"# between Load and Run\n")
	core, logs := observer.New(zap.InfoLevel)
	var (
		mu      sync.Mutex
		applied []*File
		refuse  atomic.Bool
		errs    atomic.Uint64
		edits   editLog
	)
	w := &Watcher{Path: path, Interval: 5 * time.Millisecond, Current: cur, Log: zap.New(core), Errors: &errs, Edits: &edits,
		Apply: func(f *File) error {
			if refuse.Load() {
				return errors.New("refused")
			}
			mu.Lock()
			defer mu.Unlock()
			applied = append(applied, f)
			return nil
		}}
	nApplied := func() int { mu.Lock(); defer mu.Unlock(); return len(applied) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	testwait.For(t, 5*time.Second, "the edit made before Run applied", func() (bool, string) { return nApplied() == 1, "" })

	writeAtomically(t, path, "services:\n  - name: a\n    protocol: http\n    balance: magelv\n")
	testwait.For(t, 5*time.Second, "the invalid edit counted", func() (bool, string) { return errs.Load() == 1, "" })
	var lines []string
	for _, e := range logs.FilterMessageSnippet("invalid pools file edit").All() {
		lines = append(lines, e.ContextMap()["error"].(string))
	}
	if want := path + ":4:14: balance \"magelv\""; !strings.Contains(strings.Join(lines, "\n"), want) {
		t.Fatalf("invalid edit logged as %q, want a line starting %s", lines, want)
	}
	if nApplied() != 1 {
		t.Fatalf("the invalid edit was applied")
	}
	// The bad content stays while the watcher polls on; a later good edit proves it did.
	writeAtomically(t, path, "# a comment first\n"+"services:\n  - name: a\n    protocol: http\n    balance: magelv\n")
	testwait.For(t, 5*time.Second, "the second invalid edit counted", func() (bool, string) { return errs.Load() == 2, "" })
	writeAtomically(t, path, watchSrc+"# good again\n")
	testwait.For(t, 5*time.Second, "the good edit applied", func() (bool, string) { return nApplied() == 2, "" })
	if n := errs.Load(); n != 2 {
		t.Fatalf("%d errors counted for two invalid edits: each must count once however many polls see it", n)
	}

	refuse.Store(true)
	writeAtomically(t, path, watchSrc+"# refused\n")
	testwait.For(t, 5*time.Second, "the refused edit counted", func() (bool, string) { return errs.Load() == 3, "" })
	got := edits.all()
	want := []string{"applied", path + ":4:14: balance \"magelv\"", path + ":5:14: balance \"magelv\"", "applied", "refused: refused"}
	if len(got) != len(want) {
		t.Fatalf("edits heard %q, want %d", got, len(want))
	}
	for i := range want {
		if !strings.Contains(got[i], want[i]) || strings.HasPrefix(want[i], "/") != strings.HasPrefix(got[i], "refused: /") {
			t.Errorf("edit %d heard %q, want %q in it", i, got[i], want[i])
		}
	}

	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// TestReadFileLimit: a file without a size (a character device here, a pipe in life) is
// read through the limit and refused there, not read to its end.
func TestReadFileLimit(t *testing.T) {
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skip("no /dev/zero")
	}
	_, err := ReadFile("/dev/zero")
	if err == nil || !errors.Is(err, errTooLarge) {
		t.Fatalf("ReadFile(/dev/zero): %v, want the size limit", err)
	}
	path := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, MaxFileSize+1); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "the limit is") {
		t.Fatalf("Load of a file over the limit: %v", err)
	}
}
