package testwait

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fakeTB records a failure and ends its goroutine, as testing.T's Fatalf does, so the
// failing path can be checked from the real test.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls fn with a fakeTB on its own goroutine and returns the failure it recorded.
func run(fn func(tb testing.TB)) string {
	f := &fakeTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f.failed
}

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	n := 0
	Until(t, 5*time.Second, time.Millisecond, "three calls", func() (bool, string) {
		n++
		return n == 3, ""
	})
	if n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}
}

func TestUntilFailsWithWhatItLastSaw(t *testing.T) {
	failed := run(func(tb testing.TB) {
		Until(tb, 10*time.Millisecond, time.Millisecond, "never", func() (bool, string) { return false, "still no" })
	})
	if !strings.Contains(failed, "never") || !strings.Contains(failed, "still no") {
		t.Fatalf("failure %q does not name the wait and what it saw", failed)
	}
}

func TestRecv(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if got := Recv(t, ch, time.Second, "a value"); got != 7 {
		t.Fatalf("got %d, want 7", got)
	}
	failed := run(func(tb testing.TB) { Recv(tb, ch, 10*time.Millisecond, "an empty channel") })
	if !strings.Contains(failed, "an empty channel") {
		t.Fatalf("failure %q does not name the wait", failed)
	}
}
