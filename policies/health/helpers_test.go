package health

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// runChecker runs c until the returned stop (also run at cleanup) cancels it,
// and checks that Run returns promptly.
func runChecker(t *testing.T, c *Checker) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("Run did not return within 5s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// collector reads a subscription into a list until the channel closes.
type collector struct {
	mu   sync.Mutex
	got  []Transition
	done chan struct{}
}

func collect(ch <-chan Transition) *collector {
	c := &collector{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for tr := range ch {
			c.mu.Lock()
			c.got = append(c.got, tr)
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *collector) all() []Transition {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Transition(nil), c.got...)
}

// waitTransition waits for the first transition after index from that
// matches; it returns it and its index.
func (c *collector) waitTransition(t *testing.T, timeout time.Duration, from int, what string, match func(Transition) bool) (Transition, int) {
	t.Helper()
	var found Transition
	idx := -1
	testwait.For(t, timeout, what, func() (bool, string) {
		all := c.all()
		for i := from; i < len(all); i++ {
			if match(all[i]) {
				found, idx = all[i], i
				return true, ""
			}
		}
		return false, fmt.Sprintf("transitions %+v", all)
	})
	return found, idx
}

// tcpBackend is a real listener on 127.0.0.1 that can be closed (connections
// refused) and reopened on the same port.
type tcpBackend struct {
	t    *testing.T
	addr string
	mu   sync.Mutex
	srv  *loopback.Server // nil while down
}

func newTCPBackend(t *testing.T) *tcpBackend {
	t.Helper()
	ln := loopback.Listen(t)
	b := &tcpBackend{t: t, addr: ln.Addr().String()}
	b.serve(ln)
	t.Cleanup(b.down)
	return b
}

func (b *tcpBackend) serve(ln net.Listener) {
	srv := loopback.AcceptAndClose(b.t, ln)
	b.mu.Lock()
	b.srv = srv
	b.mu.Unlock()
}

// down closes the listener; from its return on, connections are refused.
func (b *tcpBackend) down() {
	b.mu.Lock()
	srv := b.srv
	b.srv = nil
	b.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// up listens again on the same port.
func (b *tcpBackend) up() {
	b.t.Helper()
	ln, err := net.Listen("tcp", b.addr)
	if err != nil {
		b.t.Fatalf("re-listen on %s: %v", b.addr, err)
	}
	b.serve(ln)
}
