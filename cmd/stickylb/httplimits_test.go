package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The change API's server bounds its clients: a request whose body never comes is closed
// at the read timeout (with only a header timeout it held its connection for good); headers
// over the limit are refused; connections over the cap wait in the queue until one closes.
func TestAPIServerLimits(t *testing.T) {
	rf := replicaFlags{api: "127.0.0.1:0"}
	ln, err := apiListener(rf)
	if err != nil {
		t.Fatal(err)
	}
	l := httpLimits{readHeader: time.Second, read: 2 * time.Second, write: 5 * time.Second, idle: 10 * time.Second, maxHeaderBytes: 4 << 10}
	stop := serveHTTP(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("ok"))
	}), l)
	defer stop()
	addr := ln.Addr().String()
	dial := func() net.Conn {
		c, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// A body that never comes: the server closes the connection at the read timeout.
	slow := dial()
	defer slow.Close()
	fmt.Fprintf(slow, "PUT /v1/pools HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
	start := time.Now()
	slow.SetReadDeadline(time.Now().Add(l.read + 5*time.Second))
	_, err = io.ReadAll(slow)
	took := time.Since(start)
	if err != nil || took > l.read+3*time.Second {
		t.Fatalf("a stalled body held its connection %s (read timeout %s): %v", took, l.read, err)
	}
	t.Logf("a stalled body's connection closed after %s (read timeout %s)", took.Round(10*time.Millisecond), l.read)

	// Headers over the limit: 431.
	big := dial()
	defer big.Close()
	fmt.Fprintf(big, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 16<<10))
	line, _ := bufio.NewReader(big).ReadString('\n')
	if !strings.Contains(line, "431") {
		t.Fatalf("headers over %d bytes: %q", l.maxHeaderBytes, line)
	}

	// apiMaxConns connections held open (each served a request, idle now): one more is not
	// served until one of them closes.
	var held []net.Conn
	for range apiMaxConns {
		c := dial()
		defer c.Close()
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.Contains(line, "200") {
			t.Fatalf("held connection %d: %q %v", len(held), line, err)
		}
		held = append(held, c)
	}
	extra := dial()
	defer extra.Close()
	fmt.Fprintf(extra, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	r := bufio.NewReader(extra)
	extra.SetReadDeadline(time.Now().Add(time.Second))
	if line, err := r.ReadString('\n'); err == nil {
		t.Fatalf("connection %d served over the cap of %d: %q", apiMaxConns+1, apiMaxConns, line)
	}
	held[0].Close()
	extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := r.ReadString('\n'); err != nil || !strings.Contains(line, "200") {
		t.Fatalf("the waiting connection once another closed: %q %v", line, err)
	}
}
