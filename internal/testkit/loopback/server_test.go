package loopback

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

func TestAcceptAndCloseClosesWhatConnects(t *testing.T) {
	ln := Listen(t)
	AcceptAndClose(t, ln)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read %d bytes, %v; want EOF", n, err)
	}
}

// Close ends the connections in progress too, and the listener: what a backend that dies
// does to its clients.
func TestServerCloseEndsConnectionsAndListener(t *testing.T) {
	ln := Listen(t)
	addr := ln.Addr().String()
	s := NewServer(t)
	s.Serve(ln, func(c net.Conn) { io.Copy(c, c) })
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	io.WriteString(c, "ping\n")
	if line, err := r.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("echo: %q, %v", line, err)
	}
	s.Close()
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("the connection survived Close")
	}
	if c2, err := net.Dial("tcp", addr); err == nil {
		c2.Close()
		t.Fatal("the listener survived Close")
	}
}

func TestServePacketsAnswersTheSender(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	NewServer(t).ServePackets(pc, func(_ net.Addr, d []byte) []byte { return append([]byte("re "), d...) })
	c, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte("hi"))
	buf := make([]byte, 16)
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "re hi" {
		t.Fatalf("reply %q, %v", buf[:n], err)
	}
}
