package adsclient

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// TestBackoffGrowth: with the highest draw every wait is the ceiling, which doubles from
// Initial to Max and returns to Initial on reset; with the lowest it is 0 (full jitter).
func TestBackoffGrowth(t *testing.T) {
	ms := time.Millisecond
	top := backoff{cfg: Backoff{Initial: 100 * ms, Max: time.Second}, rand: func(n int64) int64 { return n - 1 }}
	var got []time.Duration
	for range 7 {
		got = append(got, top.next())
	}
	want := []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second, time.Second}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("waits = %v, want %v", got, want)
	}
	top.reset()
	if d := top.next(); d != 100*ms {
		t.Errorf("after reset: %v, want 100ms", d)
	}
	for range 1000 { // far past the cap: no overflow
		top.next()
	}
	if d := top.next(); d != time.Second {
		t.Errorf("after 1000 failures: %v, want the 1s cap", d)
	}
	low := backoff{cfg: Backoff{Initial: 100 * ms, Max: time.Second}, rand: func(int64) int64 { return 0 }}
	for range 5 {
		if d := low.next(); d != 0 {
			t.Errorf("lowest draw gave %v", d)
		}
	}
}

// TestBackoffJitterBounds: real draws at a fixed ceiling stay in [0, ceiling] and their
// mean is the ceiling's half within 4 sigma of the uniform distribution's mean
// (sigma = ceiling / sqrt(12 n)); the PCG source starts from constants, so the test is
// repeatable.
func TestBackoffJitterBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const n = 20000
	ceiling := 400 * time.Millisecond
	var sum float64
	for range n {
		b := backoff{cfg: Backoff{Initial: 100 * time.Millisecond, Max: time.Second}, rand: r.Int64N, attempt: 2}
		d := b.next()
		if d < 0 || d > ceiling {
			t.Fatalf("wait %v outside [0, %v]", d, ceiling)
		}
		sum += float64(d)
	}
	mean, sigma := sum/n, float64(ceiling)/math.Sqrt(12*n)
	if math.Abs(mean-float64(ceiling)/2) > 4*sigma {
		t.Errorf("mean wait %v, want %v within %v", time.Duration(mean), ceiling/2, time.Duration(4*sigma))
	}
}

// TestReconnectBackoffResetsAfterHealthyStream drives the client's own loop with an injected
// clock and the highest draw: while nothing listens the waits double up to Max; once a
// stream has received a response and then fails, the next wait is Initial again.
func TestReconnectBackoffResetsAfterHealthyStream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()                                          // nothing listens there until the server starts
	clock, recorded := recordingClock(time.Millisecond) // the waits are recorded, not waited
	const initial, maxWait = 100 * time.Millisecond, 800 * time.Millisecond
	rec := newRecorder()
	c := newClient(t, Config{Server: addr, NodeID: "n", Backoff: Backoff{Initial: initial, Max: maxWait}}, rec,
		func(c *Client) { c.after, c.rand = clock, func(n int64) int64 { return n - 1 } })
	testwait.For(t, wait, "waits up to the cap", func() (bool, string) { return len(recorded()) >= 6, fmt.Sprint(recorded()) })
	want := []time.Duration{initial, 2 * initial, 4 * initial, maxWait, maxWait, maxWait}
	if got := recorded()[:6]; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("waits while down = %v, want %v", got, want)
	}

	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	if err := cache.SetSnapshot(context.Background(), "n", snapshot(t, "1", 1, clusterv3.Cluster_ROUND_ROBIN)); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, addr, cache)
	testwait.For(t, wait, "ACK", func() (bool, string) { return srv.acked("n", cds, "1"), "" })
	mark := len(recorded()) // the client is in a healthy stream: no wait is being taken
	srv.g.Stop()
	testwait.For(t, wait, "two waits after the stream", func() (bool, string) {
		return len(recorded()) >= mark+2, fmt.Sprint(recorded())
	})
	if got := recorded()[mark : mark+2]; got[0] != initial || got[1] != 2*initial {
		t.Errorf("waits after a healthy stream = %v, want %v then %v", got, initial, 2*initial)
	}
	if c.Connected() {
		t.Error("connected with the server stopped")
	}
}

// TestServersTriedInRounds: with several servers the client tries the next at once when a
// stream fails or is refused, and waits (backoff with jitter) only after a full round of
// the list: a live second server is reached with no wait, and while none listens there is
// one wait per three attempts.
func TestServersTriedInRounds(t *testing.T) {
	closed := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	clock, recorded := recordingClock(20 * time.Millisecond)
	base := 0 // waits recorded before the client counted
	counts := func(c *Client) (int, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(recorded()) - base, c.streamEnds
	}
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	if err := cache.SetSnapshot(context.Background(), "n", snapshot(t, "1", 1, clusterv3.Cluster_ROUND_ROBIN)); err != nil {
		t.Fatal(err)
	}
	live := startServer(t, "", cache)
	c := newClient(t, Config{Servers: []string{closed(), live.addr}, NodeID: "n"}, newRecorder(),
		func(c *Client) { c.after = clock })
	testwait.For(t, wait, "ACK from the second server", func() (bool, string) { return live.acked("n", cds, "1"), "" })
	if w, ends := counts(c); w != 0 || ends != 1 {
		t.Fatalf("reaching the second server took %d waits and %d stream ends, want 0 and 1", w, ends)
	}

	dead := []string{closed(), closed(), closed()}
	base = len(recorded()) // c is connected: it records no wait
	c2 := newClient(t, Config{Servers: dead, NodeID: "n2"}, newRecorder(), func(c *Client) { c.after = clock })
	testwait.For(t, wait, "three rounds", func() (bool, string) {
		w, ends := counts(c2)
		return w >= 3, fmt.Sprint(w, " waits ", ends, " ends")
	})
	if w, ends := counts(c2); ends < uint64(3*w) || ends > uint64(3*(w+1)) {
		t.Fatalf("%d stream ends for %d waits, want 3 per wait", ends, w)
	}
}

// recordingClock is a client clock that records each wait asked of it and waits wait
// instead; recorded returns the waits so far.
func recordingClock(wait time.Duration) (clock func(time.Duration) <-chan time.Time, recorded func() []time.Duration) {
	var mu sync.Mutex
	var waits []time.Duration
	clock = func(d time.Duration) <-chan time.Time {
		mu.Lock()
		waits = append(waits, d)
		mu.Unlock()
		return time.After(wait)
	}
	recorded = func() []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return append([]time.Duration(nil), waits...)
	}
	return clock, recorded
}
