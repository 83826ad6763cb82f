package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
)

// The NAT rig: newTopo's network (one backend, b1, is enough) plus a router namespace "rt"
// on the bridge and a backend "nb" in another subnet behind it. The LB reaches that subnet
// through the router; nb's default route is the router, so nb never sees the client's
// subnet directly.
//
//	cl, lb, b1 ── br ── rt ── nb
//	10.77.0.0/24        .1 | 10.78.0.1 ── 10.78.0.20
//	fd77::/64          ::1 | fd78::1   ── fd78::20
const (
	rtLAN4 = "10.77.0.1"
	rtLAN6 = "fd77::1"
	rtFar4 = "10.78.0.1"
	rtFar6 = "fd78::1"
	nb4    = "10.78.0.20"
	nb6    = "fd78::20"
	// vipTight is the VIP of the port-exhaustion service, routed through the LB as vip4.
	vipTight = "10.77.100.2"
	// natLow and natHigh are the loader's default NAT source ports
	// (l4xdp.DefaultNATPortLow/High), where nb must see the LB's side of each flow.
	natLow  = 61000
	natHigh = 65535
)

// newNATTopo builds the rig: the LAN of a client, the LB and b1 (newTopo's addresses), the
// router on it, and nb behind the router.
func newNATTopo(t *testing.T) *topo {
	tp := newLAN(t, lan{
		prefix: "sn",
		hosts:  []string{"cl", "lb", "b1"},
		v4:     func(h string) string { return hosts[h].v4 },
		v6:     func(h string) string { return hosts[h].v6 },
		via:    map[string]string{"cl": "lb"},
	})
	tp.kit.AddNS("rt", "nb")
	tp.kit.Veth("br", "vrt", "rt", "eth0")
	tp.in("br", "ip", "link", "set", "vrt", "master", "br0")
	tp.in("rt", "ip", "addr", "add", rtLAN4+"/24", "dev", "eth0")
	tp.in("rt", "ip", "addr", "add", rtLAN6+"/64", "dev", "eth0", "nodad")
	tp.kit.Veth("rt", "eth1", "nb", "eth0")
	tp.in("rt", "ip", "addr", "add", rtFar4+"/24", "dev", "eth1")
	tp.in("rt", "ip", "addr", "add", rtFar6+"/64", "dev", "eth1", "nodad")
	tp.in("rt", "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	tp.in("nb", "ip", "addr", "add", nb4+"/24", "dev", "eth0")
	tp.in("nb", "ip", "addr", "add", nb6+"/64", "dev", "eth0", "nodad")
	tp.in("nb", "ip", "route", "add", "default", "via", rtFar4)
	tp.in("nb", "ip", "-6", "route", "add", "default", "via", rtFar6)
	// nb's replies are rewritten by the LB's XDP program, which can neither fill in nor
	// incrementally update a partial checksum: full checksums from nb, as from the client.
	tp.in("nb", "ethtool", "-K", "eth0", "tx", "off")
	tp.in("lb", "ip", "route", "add", "10.78.0.0/24", "via", rtLAN4)
	tp.in("lb", "ip", "-6", "route", "add", "fd78::/64", "via", rtLAN6)
	tp.in("cl", "ip", "route", "add", vipTight+"/32", "via", hosts["lb"].v4)
	return tp
}

// patternAt is byte i of every stream a who server (serveWho) sends: it changes with the offset, so a
// lost, repeated or reordered segment shows as a wrong byte.
func patternAt(i int64) byte { return byte(i ^ i>>8 ^ i>>16 ^ i>>24) }

// serveWho starts a who server in namespace h on the TCP ports tcp (every address) and UDP
// ports udp; it is closed when the test ends. It answers each TCP connection with "NAME
// REMOTE\n", the peer's address as the backend sees it, then serves "get N\n" requests with
// the next N bytes of the connection's pattern stream, and takes "put N\n" and the next N
// bytes of the client's, checks them and answers "ok TOTAL\n". Its UDP sockets answer each
// datagram with "NAME REMOTE DATAGRAM".
func (tp *topo) serveWho(h string, tcp []int, udp []int) *loopback.Server {
	tp.t.Helper()
	var pcs []string
	for _, p := range udp {
		pcs = append(pcs, ":"+strconv.Itoa(p))
	}
	return tp.serveIn(h, tcp, func(c net.Conn) { serveWhoConn(h, c) }, pcs,
		func(from net.Addr, d []byte) []byte { return fmt.Appendf(nil, "%s %s %s", h, from, d) })
}

// serveWhoConn is serveWho's side of one TCP connection, as backend name.
func serveWhoConn(name string, c net.Conn) {
	w := bufio.NewWriterSize(c, 64<<10)
	fmt.Fprintf(w, "%s %s\n", name, c.RemoteAddr())
	w.Flush()
	r := bufio.NewReader(c)
	var off, up int64 // the offsets of the stream sent and of the one received
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		verb, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
		n, err := strconv.ParseInt(arg, 10, 64)
		if err != nil || n < 0 || n > 64<<20 {
			return
		}
		switch verb {
		case "get":
			for end := off + n; off < end; off++ {
				w.WriteByte(patternAt(off))
			}
		case "put":
			for end := up + n; up < end; up++ {
				if b, err := r.ReadByte(); err != nil {
					return
				} else if b != patternAt(up) {
					fmt.Fprintf(w, "bad byte %d\n", up)
					w.Flush()
					return
				}
			}
			fmt.Fprintf(w, "ok %d\n", up)
		default:
			return
		}
		if w.Flush() != nil {
			return
		}
	}
}

// whoConn is a client connection to a who server (serveWho) through the VIP.
type whoConn struct {
	c       net.Conn
	r       *bufio.Reader
	backend string         // the name of the backend that answered
	seen    netip.AddrPort // the client's address as that backend saw it
	off     int64          // the stream's offset: bytes read so far
	up      int64          // the offset of the stream sent: bytes put so far
}

// dialWho connects from the client namespace to addr and reads who answered.
func (tp *topo) dialWho(addr string) (*whoConn, error) {
	var c net.Conn
	var err error
	tp.inNS("cl", func() { c, err = net.DialTimeout("tcp", addr, 3*time.Second) })
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(3 * time.Second))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("reading who answered: %w", err)
	}
	name, remote, _ := strings.Cut(strings.TrimSpace(line), " ")
	seen, err := netip.ParseAddrPort(remote)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("the backend's greeting %q: %w", line, err)
	}
	tp.root.Cleanup(func() { c.Close() })
	return &whoConn{c: c, r: r, backend: name, seen: seen}, nil
}

// get reads the next n bytes of the connection's stream within d and checks each one.
func (w *whoConn) get(n int64, d time.Duration) error {
	w.c.SetDeadline(time.Now().Add(d))
	if _, err := fmt.Fprintf(w.c, "get %d\n", n); err != nil {
		return fmt.Errorf("asking for %d bytes at offset %d: %w", n, w.off, err)
	}
	buf := make([]byte, 32<<10)
	for left := n; left > 0; {
		k, err := io.ReadFull(w.r, buf[:min(left, int64(len(buf)))])
		for i := 0; i < k; i++ {
			if buf[i] != patternAt(w.off) {
				return fmt.Errorf("byte %d of the stream is %#x, want %#x", w.off, buf[i], patternAt(w.off))
			}
			w.off++
		}
		left -= int64(k)
		if err != nil {
			return fmt.Errorf("reading at offset %d, %d bytes short: %w", w.off, left, err)
		}
	}
	return nil
}

// put sends the next n bytes of the client's pattern stream and waits, within d, for the
// backend to confirm every byte.
func (w *whoConn) put(n int64, d time.Duration) error {
	w.c.SetDeadline(time.Now().Add(d))
	buf := fmt.Appendf(nil, "put %d\n", n)
	for i := int64(0); i < n; i++ {
		buf = append(buf, patternAt(w.up+i))
	}
	if _, err := w.c.Write(buf); err != nil {
		return fmt.Errorf("sending %d bytes at offset %d: %w", n, w.up, err)
	}
	w.up += n
	line, err := w.r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("waiting for the backend to confirm %d bytes: %w", w.up, err)
	}
	if want := fmt.Sprintf("ok %d\n", w.up); line != want {
		return fmt.Errorf("the backend answered %q, want %q", line, want)
	}
	return nil
}

// natPools writes the NAT test's pools file: TCP service "mixed" on vip4:80 and "mixed6"
// on [vip6]:80, each with b1 (on the LB's subnet, holding the VIP: DR) and nb (behind the
// router: NAT; on port 8080 for mixed6, which needs NAT by its port alone) under
// forwarding auto, weights 1:1 by weighted round robin; UDP service "dgram" on vip4:53
// with nb alone; TCP service "tight" on vipTight:82 with nb alone on 8082 (NAT by its port,
// and the only flows to that backend port: its NAT ports are its own; another VIP address,
// since every port of one VIP address has the same backend hosts).
func natPools() string {
	return fmt.Sprintf(`services:
  - name: mixed
    protocol: tcp
    vip: %q
    affinity: {mode: none}
    balance: weighted_round_robin
    forwarding: auto
    backends:
      - {address: %q}
      - {address: %q}
  - name: mixed6
    protocol: tcp
    vip: %q
    affinity: {mode: none}
    balance: weighted_round_robin
    forwarding: auto
    backends:
      - {address: %q}
      - {address: %q}
  - name: dgram
    protocol: udp
    vip: %q
    affinity: {mode: none}
    forwarding: auto
    backends:
      - {address: %q}
  - name: tight
    protocol: tcp
    vip: %q
    affinity: {mode: none}
    backends:
      - {address: %q}
`, vip4+":80", hosts["b1"].v4+":80", nb4+":80",
		"["+vip6+"]:80", "["+hosts["b1"].v6+"]:80", "["+nb6+"]:8080",
		vip4+":53", nb4+":53", vipTight+":82", nb4+":8082")
}

// natPort says whether p is a port of the LB's NAT range.
func natPort(p uint16) bool { return p >= natLow && p <= natHigh }
