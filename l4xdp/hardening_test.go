package l4xdp

import (
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/stickylb/stickylb/policies/pools"
)

// Reproductions of the connection table's faults (each failed before the table's new
// layout), through BPF_PROG_RUN with expected bytes built by gopacket.

// fill returns a table that sends every new flow to backend slot b.
func fill(size int, b uint32) []uint32 {
	t := make([]uint32, size)
	for i := range t {
		t[i] = b
	}
	return t
}

func connCount(t testing.TB, f *Tables) int {
	t.Helper()
	var k lbFlow
	var c lbConn
	n := 0
	it := f.objs.Conns.Iterate()
	for it.Next(&k, &c) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// A spoofed ICMP error about a flow that never existed is routed by its inner header but
// inserts nothing: ICMP errors must not be a way to fill the table.
func TestFixtureICMPErrorInsertsNothing(t *testing.T) {
	fx := setup(t)
	quoted := tcp4(t, vip4, client4, 80, 7070, "A", nil, nil)[14:42]
	icmp := serialize(t, eth(lbMAC, clientMAC, layers.EthernetTypeIPv4),
		&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: []byte{198, 51, 100, 1}, DstIP: vip4.AsSlice()},
		&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(3, 4)}, gopacket.Payload(quoted))
	if ret, _ := run(t, fx.f.Program(), icmp); ret != xdpTX {
		t.Fatalf("icmp error: action %d, want TX", ret)
	}
	if n := connCount(t, fx.f); n != 0 {
		t.Fatalf("a spoofed ICMP error inserted %d connection-table entries", n)
	}
}

// A VIP removed and created again (another id, another table) takes its flows' next packets
// through its own table: an entry made under the old VIP id is a miss.
func TestFixtureRecreatedVIPIsAMiss(t *testing.T) {
	fx := setup(t)
	b := fx.expect(flowHashInput(client4, vip4, 5151, 80, 6, false))
	run(t, fx.f.Program(), tcp4(t, client4, vip4, 5151, 80, "S", nil, nil))
	keep := []VIP{{ID: 2, Addr: netip.AddrPortFrom(vip6, 80), Proto: 6, Flags: FlagSourceIP, Table: fx.table}}
	if err := fx.f.PruneVIPs(keep); err != nil {
		t.Fatal(err)
	}
	other := uint32((b + 1) % len(backMACs))
	if err := fx.f.SetVIP(VIP{ID: 9, Addr: netip.AddrPortFrom(vip4, 80), Proto: 6, Table: fill(len(fx.table), other)}); err != nil {
		t.Fatal(err)
	}
	ret, out := run(t, fx.f.Program(), tcp4(t, client4, vip4, 5151, 80, "A", nil, nil))
	check(t, "flow of the old VIP id", ret, out, xdpTX, tcp4(t, client4, vip4, 5151, 80, "A", nil, backMACs[other]))
}

// A slot handed to another backend (the old one left, a newcomer took its slot) does not
// take the old backend's flows: they re-pick from the table.
func TestFixtureReusedSlotIsAMiss(t *testing.T) {
	fx := setup(t)
	b := uint32(fx.expect(flowHashInput(client4, vip4, 5252, 80, 6, false)))
	run(t, fx.f.Program(), tcp4(t, client4, vip4, 5252, 80, "S", nil, nil))
	other := (b + 1) % uint32(len(backMACs))
	if err := fx.f.SetVIP(VIP{ID: 1, Addr: netip.AddrPortFrom(vip4, 80), Proto: 6, Table: fill(len(fx.table), other)}); err != nil {
		t.Fatal(err)
	}
	newcomer := net.HardwareAddr{0x02, 0, 0, 0, 0x0e, 0x0e}
	if err := fx.f.SetBackend(b, reusedSlot(newcomer)); err != nil {
		t.Fatal(err)
	}
	ret, out := run(t, fx.f.Program(), tcp4(t, client4, vip4, 5252, 80, "A", nil, nil))
	check(t, "flow of the slot's previous backend", ret, out, xdpTX, tcp4(t, client4, vip4, 5252, 80, "A", nil, backMACs[other]))
}

// udp4 builds client -> vip4:53 UDP (VIP 3 is QUIC on 443; 53 is added by the test).
func udp4(t testing.TB, sport uint16, toBackend net.HardwareAddr) []byte {
	e := eth(lbMAC, clientMAC, layers.EthernetTypeIPv4)
	if toBackend != nil {
		e = eth(toBackend, lbMAC, layers.EthernetTypeIPv4)
	}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: client4.AsSlice(), DstIP: vip4.AsSlice(), Id: 3}
	u := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: 53}
	u.SetNetworkLayerForChecksum(ip)
	return serialize(t, e, ip, u, gopacket.Payload("datagram"))
}

// A backend found down: its UDP flows re-pick (nothing tells a UDP client the backend is
// gone), its established TCP flows stay (the backend may still answer them); in panic
// (every backend down, the table holds them all) nothing moves.
func TestFixtureDownBackendUDPRepicks(t *testing.T) {
	fx := setup(t)
	udpVIP := VIP{ID: 5, Addr: netip.AddrPortFrom(vip4, 53), Proto: 17, Table: fx.table}
	if err := fx.f.SetVIP(udpVIP); err != nil {
		t.Fatal(err)
	}
	const sport, tport = 6161, 6162
	b := uint32(fx.expect(flowHashInput(client4, vip4, sport, 53, 17, false)))
	// The TCP flow to the same backend: a source port whose flow hashes to b.
	tcpPort := uint16(tport + discriminating(t, func(i int) bool {
		return uint32(fx.expect(flowHashInput(client4, vip4, uint16(tport+i), 80, 6, false))) == b
	}))
	run(t, fx.f.Program(), udp4(t, sport, nil))
	run(t, fx.f.Program(), tcp4(t, client4, vip4, tcpPort, 80, "S", nil, nil))
	other := (b + 1) % uint32(len(backMACs))
	udpVIP.Table = fill(len(fx.table), other) // b is out of the table: found down
	if err := fx.f.SetVIP(udpVIP); err != nil {
		t.Fatal(err)
	}
	if err := fx.f.SetVIP(VIP{ID: 1, Addr: netip.AddrPortFrom(vip4, 80), Proto: 6, Table: fill(len(fx.table), other)}); err != nil {
		t.Fatal(err)
	}
	if err := fx.f.SetBackend(b, Backend{MAC: backMACs[b], Alive: true, Down: true}); err != nil {
		t.Fatal(err)
	}
	ret, out := run(t, fx.f.Program(), udp4(t, sport, nil))
	check(t, "UDP flow of a down backend", ret, out, xdpTX, udp4(t, sport, backMACs[other]))
	ret, out = run(t, fx.f.Program(), tcp4(t, client4, vip4, tcpPort, 80, "A", nil, nil))
	check(t, "established TCP flow of a down backend", ret, out, xdpTX, tcp4(t, client4, vip4, tcpPort, 80, "A", nil, backMACs[b]))
	panicTest(t, fx, udpVIP, b)
}

// Fragments of a source_ip VIP hash as its unfragmented packets do: by the source alone.
func TestFixtureSourceIPFragmentsFollowTheClient(t *testing.T) {
	fx := setup(t)
	src := client6
	discriminating(t, func(i int) bool {
		a := client6.As16()
		a[15] += byte(i)
		src = netip.AddrFrom16(a)
		return fx.expect(flowHashInput(src, vip6, 0, 0, 6, false)) != fx.expect(flowHashInput(src, vip6, 0, 0, 6, true))
	})
	b := fx.expect(flowHashInput(src, vip6, 0, 0, 6, true)) // where its unfragmented packets go
	tcpHdr := tcp6(t, src, 7000, nil)[14+40:]
	ret, out := run(t, fx.f.Program(), frag6(t, src, layers.IPProtocolTCP, 0, true, tcpHdr, nil))
	check(t, "first fragment", ret, out, xdpTX, frag6(t, src, layers.IPProtocolTCP, 0, true, tcpHdr, backMACs[b]))
	ret, out = run(t, fx.f.Program(), tcp6(t, src, 7001, nil))
	check(t, "unfragmented packet", ret, out, xdpTX, tcp6(t, src, 7001, backMACs[b]))
}

// A vip service's table_size above the forwarder's largest table is an error with file:line
// (every tier must build the same table; the loader used to cap it silently).
func TestVIPTableSizeAboveTheForwarders(t *testing.T) {
	y := `services:
  - name: edge
    protocol: tcp
    vip: 10.0.0.1:80
    balance: maglev
    hash: {table_size: 65539}
    backends: [{address: 10.0.1.1:80}]
`
	_, err := pools.Parse("pools.yaml", []byte(y))
	if err == nil || !strings.Contains(err.Error(), "pools.yaml:6:") || !strings.Contains(err.Error(), "65537") {
		t.Fatalf("table_size 65539 on a vip service: %v; want an error at pools.yaml:6 naming 65537", err)
	}
}

// reusedSlot is a newcomer's backend entry in a slot another backend had: the loader bumps
// the slot's generation.
func reusedSlot(mac net.HardwareAddr) Backend { return Backend{MAC: mac, Alive: true, Gen: 1} }

// panicTest: every backend of the UDP VIP down, the table holding them all (the loader's
// fail open): the UDP flow stays where it is.
func panicTest(t *testing.T, fx *fixture, v VIP, b uint32) {
	t.Helper()
	const sport = 6363
	v.Table = fx.table
	if err := fx.f.SetVIP(v); err != nil {
		t.Fatal(err)
	}
	run(t, fx.f.Program(), udp4(t, sport, nil))
	was := uint32(fx.expect(flowHashInput(client4, vip4, sport, 53, 17, false)))
	for i, mac := range backMACs {
		if err := fx.f.SetBackend(uint32(i), Backend{MAC: mac, Alive: true, Down: true}); err != nil {
			t.Fatal(err)
		}
	}
	v.Flags |= FlagPanic
	v.Table = fill(len(fx.table), (was+1)%uint32(len(backMACs)))
	if err := fx.f.SetVIP(v); err != nil {
		t.Fatal(err)
	}
	ret, out := run(t, fx.f.Program(), udp4(t, sport, nil))
	check(t, "UDP flow in panic", ret, out, xdpTX, udp4(t, sport, backMACs[was]))
	if c := pathCounts(t, fx.f); c["panic"] != 1 {
		t.Fatalf("a packet forwarded in panic is not counted: %v", c)
	}
}

func flowKey(src, dst netip.Addr, sport, dport uint16, proto uint8) lbFlow {
	var k lbFlow
	k.Src, k.Dst, k.Proto = src.As16(), dst.As16(), proto
	binary.BigEndian.PutUint16((*[2]byte)(unsafeSlice(&k.Sport))[:], sport)
	binary.BigEndian.PutUint16((*[2]byte)(unsafeSlice(&k.Dport))[:], dport)
	return k
}

// An entry idle past its VIP's idle_timeout is a miss (the flow re-picks); one idle less
// keeps its backend. The entry's age is set in the map: no test waits out a timeout.
func TestFixtureIdleTimeout(t *testing.T) {
	fx := setup(t)
	v := VIP{ID: 1, Addr: netip.AddrPortFrom(vip4, 80), Proto: 6, Table: fx.table, IdleTimeout: 10 * time.Second}
	if err := fx.f.SetVIP(v); err != nil {
		t.Fatal(err)
	}
	const sport = 5454
	b := uint32(fx.expect(flowHashInput(client4, vip4, sport, 80, 6, false)))
	run(t, fx.f.Program(), tcp4(t, client4, vip4, sport, 80, "S", nil, nil))
	other := (b + 1) % uint32(len(backMACs))
	v.Table = fill(len(fx.table), other)
	if err := fx.f.SetVIP(v); err != nil {
		t.Fatal(err)
	}
	key := flowKey(client4, vip4, sport, 80, 6)
	age := func(d time.Duration) {
		t.Helper()
		var c lbConn
		if err := fx.f.objs.Conns.Lookup(&key, &c); err != nil {
			t.Fatal(err)
		}
		c.LastSeen -= uint64(d)
		if err := fx.f.objs.Conns.Put(&key, &c); err != nil {
			t.Fatal(err)
		}
	}
	age(9 * time.Second)
	ret, out := run(t, fx.f.Program(), tcp4(t, client4, vip4, sport, 80, "A", nil, nil))
	check(t, "idle 9s of 10s", ret, out, xdpTX, tcp4(t, client4, vip4, sport, 80, "A", nil, backMACs[b]))
	age(11 * time.Second)
	ret, out = run(t, fx.f.Program(), tcp4(t, client4, vip4, sport, 80, "A", nil, nil))
	check(t, "idle 11s of 10s", ret, out, xdpTX, tcp4(t, client4, vip4, sport, 80, "A", nil, backMACs[other]))
	if c := pathCounts(t, fx.f); c["conn_stale"] != 1 {
		t.Fatalf("counters: %v", c)
	}
}
