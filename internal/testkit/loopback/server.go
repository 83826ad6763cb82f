package loopback

import (
	"net"
	"sync"
	"testing"
)

// Server serves the listeners and packet sockets given to it, each connection on a goroutine
// of its own, until Close, which closes them and every connection still open (a backend that
// dies with its connections) and waits for its goroutines. It is closed when the test ends.
// The sockets may be anyone's: a listener made in another network namespace is served the
// same way.
type Server struct {
	mu     sync.Mutex
	lns    []net.Listener
	pcs    []net.PacketConn
	conns  map[net.Conn]bool
	closed bool
	wg     sync.WaitGroup
}

// NewServer returns a Server with nothing to serve yet.
func NewServer(tb testing.TB) *Server {
	s := &Server{conns: map[net.Conn]bool{}}
	tb.Cleanup(s.Close)
	return s
}

// Serve accepts ln's connections and hands each to handle; the connection is closed when
// handle returns.
func (s *Server) Serve(ln net.Listener, handle func(net.Conn)) {
	if !s.add(func() { s.lns = append(s.lns, ln) }) {
		ln.Close()
		return
	}
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !s.add(func() { s.conns[c] = true }) {
				c.Close()
				return
			}
			go func() {
				defer s.wg.Done()
				defer s.forget(c)
				handle(c)
			}()
		}
	}()
}

// ServePackets answers each datagram pc reads with what reply makes of it (nothing when
// reply returns nil), sent back to where it came from.
func (s *Server) ServePackets(pc net.PacketConn, reply func(from net.Addr, datagram []byte) []byte) {
	if !s.add(func() { s.pcs = append(s.pcs, pc) }) {
		pc.Close()
		return
	}
	go func() {
		defer s.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := reply(from, buf[:n]); out != nil {
				pc.WriteTo(out, from)
			}
		}
	}()
}

// add records a socket or connection (in fn) and one goroutine to wait for, unless the
// server is closed.
func (s *Server) add(fn func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	fn()
	s.wg.Add(1)
	return true
}

func (s *Server) forget(c net.Conn) {
	c.Close()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Close closes every socket and connection of s and waits for its goroutines to end.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	for _, ln := range s.lns {
		ln.Close()
	}
	for _, pc := range s.pcs {
		pc.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// AcceptAndClose serves ln by closing whatever connects: a port a TCP health check finds
// open. The returned Server closes ln.
func AcceptAndClose(tb testing.TB, ln net.Listener) *Server {
	s := NewServer(tb)
	s.Serve(ln, func(net.Conn) {})
	return s
}
