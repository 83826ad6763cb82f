package loopback

import (
	"net"
	"strconv"
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
