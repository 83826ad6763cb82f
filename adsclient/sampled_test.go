package adsclient

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// TestSampled: a burst is one line at once and one when the interval is over (the latest,
// with how many it stands for); a line after a quiet interval is written at once; Stop
// writes what is held.
func TestSampled(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	s := &Sampled{Log: zap.New(core), Every: 50 * time.Millisecond}
	defer s.Stop()
	for i := range 200 {
		s.Info("applied", zap.Int("n", i))
	}
	if n := logs.Len(); n != 1 {
		t.Fatalf("%d lines for a burst of 200 within the interval, want 1 so far", n)
	}
	testwait.For(t, 5*time.Second, "the held line", func() (bool, string) { return logs.Len() == 2, fmt.Sprint(logs.Len()) })
	all := logs.AllUntimed()
	if len(all) != 2 || all[1].ContextMap()["n"] != int64(199) || all[1].ContextMap()["skipped"] != int64(198) {
		t.Fatalf("after the interval: %v, want the latest line (n 199) standing for 198 skipped", all)
	}
	s.p.mu.Lock()
	s.p.last = s.p.last.Add(-s.Every) // a quiet interval
	s.p.mu.Unlock()
	s.Info("applied", zap.Int("n", 200))
	if logs.Len() != 3 {
		t.Fatalf("after a quiet interval: %d lines, want the new one at once", logs.Len())
	}
	s.Info("applied", zap.Int("n", 201))
	s.Stop()
	s.Info("applied", zap.Int("n", 202))
	if all := logs.AllUntimed(); len(all) != 4 || all[3].ContextMap()["n"] != int64(201) {
		t.Fatalf("Stop: %v, want the held line written, nothing after", all)
	}
}
