// Package loopback hands tests listeners and ports on 127.0.0.1.
package loopback

import (
	"net"
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
