package fanout

import (
	"errors"
	"sync/atomic"
	"testing"
)

func TestEachCallsEveryIndexOnce(t *testing.T) {
	const n = 1003
	var seen [n]atomic.Int32
	if err := Each(n, 4, func(i int) error { seen[i].Add(1); return nil }); err != nil {
		t.Fatal(err)
	}
	for i := range seen {
		if c := seen[i].Load(); c != 1 {
			t.Fatalf("index %d called %d times, want 1", i, c)
		}
	}
}

// TestEachStopsAWorkerAtItsError: the failing worker takes no further index, the others
// finish theirs, and the error comes back.
func TestEachStopsAWorkerAtItsError(t *testing.T) {
	boom := errors.New("boom")
	var calls atomic.Int32
	err := Each(40, 4, func(i int) error {
		calls.Add(1)
		if i == 1 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Each = %v, want boom", err)
	}
	if c := calls.Load(); c != 31 { // 3 workers x 10 indexes, and index 1 alone of worker 1
		t.Fatalf("%d calls, want 31", c)
	}
}
