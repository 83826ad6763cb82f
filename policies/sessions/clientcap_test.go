package sessions

import (
	"errors"
	"net/netip"
	"testing"
	"time"
	"unsafe"
)

func TestClientCapBoundsEachClient(t *testing.T) {
	clk := &fakeClock{}
	c, err := NewClientCap(5, clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	admitted := func(a netip.Addr, n int) int {
		got := 0
		for range n {
			if c.Admit(a) {
				got++
			}
		}
		return got
	}
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	if got := admitted(a, 8); got != 5 {
		t.Fatalf("a client admitted %d of 8 in a minute, want 5", got)
	}
	if got := admitted(b, 8); got != 5 {
		t.Fatalf("another client admitted %d of 8, want 5 (counted apart)", got)
	}
	if got := admitted(netip.MustParseAddr("::ffff:192.0.2.1"), 1); got != 0 {
		t.Fatalf("the first client, IPv4-mapped, admitted again")
	}
	// One IPv6 /64 is one client; another /64 is another.
	if got := admitted(netip.MustParseAddr("2001:db8:1:2::1"), 3) + admitted(netip.MustParseAddr("2001:db8:1:2:ffff::9"), 3); got != 5 {
		t.Fatalf("one /64 admitted %d of 6, want 5", got)
	}
	if got := admitted(netip.MustParseAddr("2001:db8:1:3::1"), 1); got != 1 {
		t.Fatalf("another /64 refused")
	}
	clk.Advance(time.Minute)
	if got := admitted(a, 8); got != 5 {
		t.Fatalf("the next minute: %d of 8 admitted, want 5", got)
	}
	for _, n := range []int{0, MaxNewPerClient + 1} {
		if _, err := NewClientCap(n, nil); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewClientCap(%d): %v, want ErrInvalidConfig", n, err)
		}
	}
}

// Client addresses are the attacker's to choose: a cap's memory is the same however many
// there are, and after a hundred thousand clients in one minute a new client still starts
// nearly its whole bound (colliding counters count it over by little).
func TestClientCapBoundedUnderManyClients(t *testing.T) {
	const bound, clients = 60, 100_000
	c, err := NewClientCap(bound, nil)
	if err != nil {
		t.Fatal(err)
	}
	if size := unsafe.Sizeof(*c); size > 70<<10 {
		t.Fatalf("a cap is %d bytes", size)
	}
	for i := range clients {
		c.Admit(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
	}
	worst := bound
	for i := range 200 {
		n := 0
		for c.Admit(netip.AddrFrom4([4]byte{172, 16, byte(i >> 8), byte(i)})) {
			n++
		}
		worst = min(worst, n)
	}
	t.Logf("after %d clients in a minute, the worst of 200 new clients started %d of %d", clients, worst, bound)
	if worst < bound*3/4 {
		t.Fatalf("after %d clients, a new client started only %d of %d", clients, worst, bound)
	}
}
