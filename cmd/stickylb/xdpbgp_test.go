package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stickylb/stickylb/l4xdp"
)

// TestForwardingWatchDebounces: a look whose netlink or map read failed withdraws the node
// only once forwardingMisses looks in a row failed; the program detached (or the link
// down) and stale tables withdraw at the first look; one good look announces again.
func TestForwardingWatchDebounces(t *testing.T) {
	readErr := errors.New("reading the XDP link: interrupted")
	detached := fmt.Errorf("the XDP program is no longer attached to eth0: %w", l4xdp.ErrNotForwarding)
	stale := fmt.Errorf("the tables are behind the config: %w", l4xdp.ErrStale)
	var w forwardingWatch
	for i := 1; i < forwardingMisses; i++ {
		if got := w.look(readErr, nil); got != nil {
			t.Fatalf("failed read %d of %d: withdrawn (%v)", i, forwardingMisses, got)
		}
	}
	if got := w.look(readErr, nil); got == nil || !errors.Is(got, readErr) {
		t.Fatalf("failed read %d in a row: %v, want withdrawn", forwardingMisses, got)
	}
	if got := w.look(nil, nil); got != nil {
		t.Fatalf("a good look after the failed reads: %v", got)
	}
	if got := w.look(readErr, nil); got != nil {
		t.Fatalf("one failed read after a good look: %v", got)
	}
	if got := w.look(detached, nil); !errors.Is(got, l4xdp.ErrNotForwarding) {
		t.Fatalf("program detached: %v, want withdrawn at once", got)
	}
	// A failed read while detached does not announce the node again.
	if got := w.look(readErr, nil); !errors.Is(got, l4xdp.ErrNotForwarding) {
		t.Fatalf("a failed read while detached: %v", got)
	}
	if got := w.look(nil, stale); !errors.Is(got, l4xdp.ErrStale) {
		t.Fatalf("stale tables: %v, want withdrawn at once", got)
	}
	if got := w.look(nil, nil); got != nil {
		t.Fatalf("tables current again: %v", got)
	}
}
