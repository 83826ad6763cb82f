// Package loopback hands tests listeners and ports on 127.0.0.1, and serves listeners (its
// own or a network namespace's) until the test ends.
package loopback

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// Listen returns a TCP listener on a free loopback port; it is closed when the test ends.
func Listen(tb testing.TB) net.Listener {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("loopback: listening: %v", err)
	}
	tb.Cleanup(func() { ln.Close() })
	return ln
}

// FreePort returns a loopback port nothing listens on right now, for a server the test
// starts by configuration (Caddy, a child process) rather than on a listener it holds.
func FreePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("loopback: finding a free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Refused returns a loopback address where a TCP connection is refused for the whole test:
// a socket bound to the port but not listening holds it, so no other test can start
// listening there, as one could on a port that was merely closed.
func Refused(tb testing.TB) string {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatalf("loopback: a socket to hold a refused port: %v", err)
	}
	tb.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatalf("loopback: binding a refused port: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		tb.Fatalf("loopback: the refused port's address: %v", err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}
