package loopback

import (
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
)

func TestFreePortCanBeListenedOn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(FreePort(t)))
	if err != nil {
		t.Fatalf("the free port is taken: %v", err)
	}
	ln.Close()
}

func TestListenIsOnLoopback(t *testing.T) {
	if ip := Listen(t).Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		t.Fatalf("listening on %s, want loopback", ip)
	}
}

func TestRefusedRefusesAndHoldsThePort(t *testing.T) {
	addr := Refused(t)
	c, err := net.Dial("tcp", addr)
	if err == nil {
		c.Close()
		t.Fatalf("a connection to %s was accepted", addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dialing %s: %v, want connection refused", addr, err)
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("another listener could take %s", addr)
	}
}
