package health

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// icmpMode is the kind of socket an ICMP probe uses.
type icmpMode int32

const (
	// icmpAuto tries a ping socket, then a raw socket, and remembers the
	// first that opens.
	icmpAuto icmpMode = iota
	// icmpDatagram is Linux's unprivileged ping socket (SOCK_DGRAM,
	// IPPROTO_ICMP), allowed to the groups in net.ipv4.ping_group_range.
	// The kernel owns the echo identifier and hands the socket only its
	// own replies.
	icmpDatagram
	// icmpRaw needs CAP_NET_RAW; a raw socket sees every ICMP packet, so
	// replies are matched by identifier, sequence, payload and source.
	icmpRaw
)

func (m icmpMode) String() string {
	switch m {
	case icmpDatagram:
		return "ping socket"
	case icmpRaw:
		return "raw socket"
	}
	return "auto"
}

// icmpProber sends one echo request per probe on a socket of its own, so
// a probe's replies and its deadline concern nobody else and a closed
// socket is all the cleanup there is.
type icmpProber struct {
	forced icmpMode
	// learned4 and learned6 hold the mode that last opened for each
	// family, so the fallback is paid once rather than on every probe.
	learned4, learned6 atomic.Int32
	seq                atomic.Uint32
}

// aLongTimeAgo is a deadline in the past, set to unblock a read at once.
var aLongTimeAgo = time.Unix(1, 0)

func (p *icmpProber) probe(ctx context.Context, host string) (outcome, string) {
	ip, err := resolveIP(ctx, host)
	if err != nil {
		return failed, "icmp: " + describe(err)
	}
	v6 := ip.Is6()
	conn, mode, err := p.listen(v6)
	if err != nil {
		// No socket to probe with says nothing about the host.
		return inconclusive, "icmp: prober fault: no ICMP socket: " + err.Error()
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(aLongTimeAgo) })
	defer stop()

	var (
		request, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
		proto                    = 1
	)
	if v6 {
		request, reply, proto = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply, 58
	}
	id := int(rand.Uint32() & 0xffff)
	seq := int(p.seq.Add(1) & 0xffff)
	token := make([]byte, 16)
	binary.BigEndian.PutUint64(token, rand.Uint64())
	binary.BigEndian.PutUint64(token[8:], rand.Uint64())
	msg := icmp.Message{Type: request, Body: &icmp.Echo{ID: id, Seq: seq, Data: token}}
	// For ICMPv6 the kernel fills in the checksum (it needs the pseudo
	// header); for ICMPv4 Marshal computes it.
	wire, err := msg.Marshal(nil)
	if err != nil {
		return failed, "icmp: " + err.Error()
	}
	var dst net.Addr = &net.IPAddr{IP: ip.AsSlice(), Zone: ip.Zone()}
	if mode == icmpDatagram {
		dst = &net.UDPAddr{IP: ip.AsSlice(), Zone: ip.Zone()}
	}
	if _, err := conn.WriteTo(wire, dst); err != nil {
		return failure("icmp", err)
	}
	buf := make([]byte, 1500)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			return failure("icmp", err)
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil || m.Type != reply {
			continue
		}
		echo, ok := m.Body.(*icmp.Echo)
		if !ok || echo.Seq != seq || !bytes.Equal(echo.Data, token) {
			continue
		}
		// A ping socket's identifier is the kernel's, and the kernel already
		// matched it; a raw socket must check its own.
		if mode == icmpRaw && echo.ID != id {
			continue
		}
		if !sameHost(from, ip) {
			continue
		}
		return passed, "icmp: echo reply"
	}
}

// listen opens a socket for one probe: the forced mode, else the learned
// one, else a ping socket and then a raw socket.
func (p *icmpProber) listen(v6 bool) (*icmp.PacketConn, icmpMode, error) {
	learned := &p.learned4
	dgram, raw, wildcard := "udp4", "ip4:icmp", "0.0.0.0"
	if v6 {
		learned = &p.learned6
		dgram, raw, wildcard = "udp6", "ip6:ipv6-icmp", "::"
	}
	open := func(mode icmpMode) (*icmp.PacketConn, error) {
		if mode == icmpDatagram {
			return icmp.ListenPacket(dgram, wildcard)
		}
		c, err := icmp.ListenPacket(raw, wildcard)
		if err != nil {
			return nil, err
		}
		// Best effort: let the kernel drop every ICMP type but echo reply
		// before it reaches this socket.
		if v6 {
			var f ipv6.ICMPFilter
			f.SetAll(true)
			f.Accept(ipv6.ICMPTypeEchoReply)
			c.IPv6PacketConn().SetICMPFilter(&f)
		} else {
			var f ipv4.ICMPFilter
			f.SetAll(true)
			f.Accept(ipv4.ICMPTypeEchoReply)
			c.IPv4PacketConn().SetICMPFilter(&f)
		}
		return c, nil
	}
	mode := p.forced
	if mode == icmpAuto {
		mode = icmpMode(learned.Load())
	}
	if mode != icmpAuto {
		c, err := open(mode)
		if err != nil {
			return nil, mode, fmt.Errorf("opening %s: %w", mode, err)
		}
		return c, mode, nil
	}
	c, derr := open(icmpDatagram)
	if derr == nil {
		learned.Store(int32(icmpDatagram))
		return c, icmpDatagram, nil
	}
	c, rerr := open(icmpRaw)
	if rerr == nil {
		learned.Store(int32(icmpRaw))
		return c, icmpRaw, nil
	}
	return nil, icmpAuto, fmt.Errorf("neither a ping socket (%v; see net.ipv4.ping_group_range) nor a raw socket (%v) can be opened", derr, rerr)
}

func resolveIP(ctx context.Context, host string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap(), nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return netip.Addr{}, err
	}
	if len(addrs) == 0 {
		return netip.Addr{}, errors.New("no address for " + host)
	}
	return addrs[0].Unmap(), nil
}

func sameHost(from net.Addr, ip netip.Addr) bool {
	var got net.IP
	switch a := from.(type) {
	case *net.IPAddr:
		got = a.IP
	case *net.UDPAddr:
		got = a.IP
	default:
		return false
	}
	g, ok := netip.AddrFromSlice(got)
	return ok && g.Unmap() == ip.WithZone("")
}
