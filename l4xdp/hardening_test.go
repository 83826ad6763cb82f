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
// layout), through BPF_PROG_RUN with expected bytes built by gopacket: hardeningFixtures,
// scenarios of the packet fixtures' table.

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

func flowKey(src, dst netip.Addr, sport, dport uint16, proto uint8) lbFlow {
	var k lbFlow
	k.Src, k.Dst, k.Proto = src.As16(), dst.As16(), proto
	binary.BigEndian.PutUint16((*[2]byte)(unsafeSlice(&k.Sport))[:], sport)
	binary.BigEndian.PutUint16((*[2]byte)(unsafeSlice(&k.Dport))[:], dport)
	return k
}

// hardeningFixtures reproduce the connection table's faults (each failed before the table's
// new layout), on drRig with fx's table.
func hardeningFixtures(t *testing.T, fx *fixture) []packetScenario {
	size := len(fx.table)
	tcpTo := func(sport uint16, flags string, mac net.HardwareAddr) []byte {
		return tcp4(t, client4, vip4, sport, 80, flags, nil, mac)
	}
	hashed := func(sport uint16, dport uint16, proto uint8) uint32 {
		return uint32(fx.expect(flowHash(client4, vip4, sport, dport, proto, false)))
	}
	next := func(b uint32) uint32 { return (b + 1) % uint32(len(backMACs)) }
	tcpToB := func(name string, sport uint16, flags string, b uint32) packetCase {
		return tx(name, tcpTo(sport, flags, nil), tcpTo(sport, flags, backMACs[b]))
	}
	vip1 := func(table []uint32, idle time.Duration) VIP {
		return VIP{ID: 1, Addr: netip.AddrPortFrom(vip4, 80), Proto: 6, Table: table, IdleTimeout: idle}
	}

	// A spoofed ICMP error about a flow that never existed (quoting vip4:80 -> client4:7070)
	// goes by its inner header, swapped.
	spoofed := func(dst, src net.HardwareAddr) []byte {
		quoted := tcp4(t, vip4, client4, 80, 7070, "A", nil, nil)[14:42]
		return serialize(t, eth(dst, src, layers.EthernetTypeIPv4),
			&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: []byte{198, 51, 100, 1}, DstIP: vip4.AsSlice()},
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(3, 4)}, gopacket.Payload(quoted))
	}

	recreated := hashed(5151, 80, 6)
	reused := hashed(5252, 80, 6)

	// A UDP flow and a TCP flow on the same backend (a source port whose flow hashes to it).
	const udpPort, tport, panicPort = 6161, 6162, 6363
	udpVIP := VIP{ID: 5, Addr: netip.AddrPortFrom(vip4, 53), Proto: 17, Table: fx.table}
	downB := hashed(udpPort, 53, 17)
	tcpPort := uint16(tport + discriminating(t, func(i int) bool { return hashed(uint16(tport+i), 80, 6) == downB }))
	udpDown, udpPanic, udpPanicFlags := udpVIP, udpVIP, udpVIP
	udpDown.Table = fill(size, next(downB)) // downB is out of the table: found down
	was := hashed(panicPort, 53, 17)
	udpPanicFlags.Flags |= FlagPanic
	udpPanicFlags.Table = fill(size, next(was))
	allDown := func(t *testing.T, r *packetRig) {
		for i, mac := range backMACs {
			setBackend(uint32(i), Backend{MAC: mac, Alive: true, Down: true})(t, r)
		}
	}

	// Fragments of a source_ip VIP hash as its unfragmented packets do: by the source alone.
	srcOnly := client6Where(t, func(src netip.Addr) bool {
		return fx.expect(flowHash(src, vip6, 0, 0, 6, false)) != fx.expect(flowHash(src, vip6, 0, 0, 6, true))
	})
	srcOnlyB := fx.expect(flowHash(srcOnly, vip6, 0, 0, 6, true)) // where its unfragmented packets go
	srcOnlyTCP := tcp6(t, srcOnly, 7000, nil)[14+40:]

	// An entry idle past its VIP's idle_timeout is a miss (the flow re-picks); one idle less
	// keeps its backend. The entry's age is set in the map: no test waits out a timeout.
	ageFlow := func(port uint16, d time.Duration) func(t *testing.T, r *packetRig) {
		return func(t *testing.T, r *packetRig) {
			t.Helper()
			key := flowKey(client4, vip4, port, 80, 6)
			var c lbConn
			if err := r.f.objs.Conns.Lookup(&key, &c); err != nil {
				t.Fatal(err)
			}
			c.LastSeen -= uint64(d)
			if err := r.f.objs.Conns.Put(&key, &c); err != nil {
				t.Fatal(err)
			}
		}
	}
	const idlePort = 5454
	idleB := hashed(idlePort, 80, 6)
	age := func(d time.Duration) func(t *testing.T, r *packetRig) { return ageFlow(idlePort, d) }
	// A closed flow's port, and an open one's beside it.
	const closedPort, openPort = 5455, 5456
	closedB, openB := hashed(closedPort, 80, 6), hashed(openPort, 80, 6)
	elsewhere := make([]uint32, size) // the table after a change: every flow's pick moved
	for i, b := range fx.table {
		elsewhere[i] = next(b)
	}

	return []packetScenario{
		// An ICMP error must not be a way to fill the table: routed, it inserts nothing.
		{name: "icmp error inserts nothing", rig: drRig, cases: []packetCase{
			tx("spoofed icmp error", spoofed(lbMAC, clientMAC), spoofed(backMACs[hashed(7070, 80, 6)], lbMAC)),
			then("no connection-table entry", func(t *testing.T, r *packetRig) {
				if n := connCount(t, r.f); n != 0 {
					t.Fatalf("a spoofed ICMP error inserted %d connection-table entries", n)
				}
			}),
		}},
		// A VIP removed and created again (another id, another table) takes its flows' next
		// packets through its own table: an entry made under the old VIP id is a miss.
		{name: "recreated VIP is a miss", rig: drRig, cases: []packetCase{
			tcpToB("syn", 5151, "S", recreated),
			step("VIP 1 removed, vip4:80 created again as VIP 9", func(t *testing.T, r *packetRig) {
				if err := r.f.PruneVIPs([]VIP{{ID: 2, Addr: netip.AddrPortFrom(vip6, 80), Proto: 6, Flags: FlagSourceIP, Table: fx.table}}); err != nil {
					t.Fatal(err)
				}
				setVIP(VIP{ID: 9, Addr: netip.AddrPortFrom(vip4, 80), Proto: 6, Table: fill(size, next(recreated))})(t, r)
			}),
			tcpToB("flow of the old VIP id", 5151, "A", next(recreated)),
		}},
		// A slot handed to another backend (the old one left, a newcomer took its slot) does
		// not take the old backend's flows: they re-pick from the table.
		{name: "reused slot is a miss", rig: drRig, cases: []packetCase{
			tcpToB("syn", 5252, "S", reused),
			step("the flow's slot goes to a newcomer, out of the table", steps(
				setVIP(vip1(fill(size, next(reused)), 0)),
				setBackend(reused, reusedSlot(net.HardwareAddr{0x02, 0, 0, 0, 0x0e, 0x0e})))),
			tcpToB("flow of the slot's previous backend", 5252, "A", next(reused)),
		}},
		// A backend found down: its UDP flows re-pick (nothing tells a UDP client the backend
		// is gone), its established TCP flows stay (the backend may still answer them); in
		// panic (every backend down, the table holds them all) nothing moves.
		{name: "down backend: udp re-picks", rig: drRig, cases: []packetCase{
			step("a UDP VIP on vip4:53", setVIP(udpVIP)),
			tx("udp flow", udp4(t, udpPort, nil), udp4(t, udpPort, backMACs[downB])),
			tcpToB("tcp flow to the same backend", tcpPort, "S", downB),
			step("the backend found down: out of both tables", steps(
				setVIP(udpDown), setVIP(vip1(fill(size, next(downB)), 0)),
				setBackend(downB, Backend{MAC: backMACs[downB], Alive: true, Down: true}))),
			tx("UDP flow of a down backend", udp4(t, udpPort, nil), udp4(t, udpPort, backMACs[next(downB)])),
			tcpToB("established TCP flow of a down backend", tcpPort, "A", downB),
			// Panic: every backend of the UDP VIP down, the table holding them all (the
			// loader's fail open): the UDP flow stays where it is.
			step("the UDP VIP's table over every backend again", setVIP(udpPanic)),
			tx("udp flow before the panic", udp4(t, panicPort, nil), udp4(t, panicPort, backMACs[was])),
			step("every backend down, the VIP in panic", steps(allDown, setVIP(udpPanicFlags))),
			tx("UDP flow in panic", udp4(t, panicPort, nil), udp4(t, panicPort, backMACs[was])),
			counts(map[string]uint64{"panic": 1}),
		}},
		{name: "source_ip fragments follow the client", rig: drRig, cases: []packetCase{
			tx("first fragment", frag6(t, srcOnly, layers.IPProtocolTCP, 0, true, srcOnlyTCP, nil), frag6(t, srcOnly, layers.IPProtocolTCP, 0, true, srcOnlyTCP, backMACs[srcOnlyB])),
			tx("unfragmented packet", tcp6(t, srcOnly, 7001, nil), tcp6(t, srcOnly, 7001, backMACs[srcOnlyB])),
		}},
		{name: "idle timeout", rig: drRig, cases: []packetCase{
			step("VIP 1 with an idle timeout of 10 s", setVIP(vip1(fx.table, 10*time.Second))),
			tcpToB("syn", idlePort, "S", idleB),
			step("new flows elsewhere", setVIP(vip1(fill(size, next(idleB)), 10*time.Second))),
			step("idle 9 s", age(9*time.Second)),
			tcpToB("idle 9s of 10s", idlePort, "A", idleB),
			step("idle 11 s", age(11*time.Second)),
			tcpToB("idle 11s of 10s", idlePort, "A", next(idleB)),
			counts(map[string]uint64{"conn_stale": 1}),
		}},
		// A client reuses a closed connection's 5-tuple a minute later (after its TIME_WAIT).
		// When the new connection's SYN reached another node and the flow moves here
		// mid-stream (a node joined or came back), its packets must go by the table, not
		// follow the closed connection's entry to the backend the table picked then: an entry
		// that has seen the client's FIN holds only while packets keep coming (a half-closed
		// connection's ACKs), 10 s idle at most (CLOSE_TIMEOUT_NS). An open flow's entry
		// keeps its idle timeout.
		{name: "closed flow's entry", rig: drRig, cases: []packetCase{
			tcpToB("syn", closedPort, "S", closedB),
			tcpToB("data", closedPort, "A", closedB),
			tcpToB("the client's FIN", closedPort, "F", closedB),
			tcpToB("an open flow's syn", openPort, "S", openB),
			tcpToB("its data", openPort, "A", openB),
			step("new flows elsewhere", setVIP(vip1(elsewhere, 0))),
			step("FIN 9 s ago", ageFlow(closedPort, 9*time.Second)),
			tcpToB("the closing flow's ACK of the server's FIN, 9 s after", closedPort, "A", closedB),
			step("idle 11 s", steps(ageFlow(closedPort, 11*time.Second), ageFlow(openPort, 11*time.Second))),
			tcpToB("a new connection's packet on the closed flow's 5-tuple, 11 s after", closedPort, "A", next(closedB)),
			tcpToB("the open flow, idle 11 s", openPort, "A", openB),
			counts(map[string]uint64{"conn_stale": 1}),
		}},
	}
}
