package l4xdp

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// The flood guard, at CI scale: a 4,096-entry connection table, floods of 10x its size in
// distinct spoofed flows. A DR LB never sees the backend's SYN-ACK, so the floods that can
// reach the table are SYNs, SYN-then-ACK pairs, non-SYN TCP misses and ICMP errors. After a
// Maglev change (the established flow's hash now picks another backend, so losing its entry
// moves it), an established flow that sends a packet at least every second must stay on its
// backend through each flood.
const (
	floodTable = 4096
	floodFlows = 10 * floodTable
	// floodCap: each CPU may insert an eighth of the table a second, so the inserts of the
	// two windows a flood of under a second can span, on both CPUs, fill half of it.
	floodCap = floodTable / 8
)

// floodSource is flood flow i's spoofed client: 198.18.0.0/15 and a source port.
func floodSource(i int) (netip.Addr, uint16) {
	return netip.AddrFrom4([4]byte{198, 18, byte(i / 60000), byte(i / 250 % 240)}), uint16(1024 + i%60000)
}

func TestFloodKeepsEstablishedFlow(t *testing.T) {
	if testing.Short() {
		t.Skip("floods 40,960 flows per kind: skipped under -short")
	}
	syn := tcp4(t, client4, vip4, 1, 80, "S", nil, nil)
	ack := tcp4(t, client4, vip4, 1, 80, "A", nil, nil)
	icmp := func() []byte { // an error quoting the VIP's reply to a flow that never existed
		quoted := tcp4(t, vip4, client4, 80, 1, "A", nil, nil)[14:42]
		return serialize(t, eth(lbMAC, clientMAC, layers.EthernetTypeIPv4),
			&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: []byte{198, 51, 100, 1}, DstIP: vip4.AsSlice()},
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(3, 4)}, gopacket.Payload(quoted))
	}()
	// Each kind's packets for flood flow i, patched into copies of the templates: the client
	// address and port, in the outer header (TCP) or the quoted one (ICMP).
	patch := func(tmpl []byte, addrOff, portOff, i int) []byte {
		a, p := floodSource(i)
		b := append([]byte(nil), tmpl...)
		a4 := a.As4()
		copy(b[addrOff:], a4[:])
		binary.BigEndian.PutUint16(b[portOff:], p)
		return b
	}
	for _, kind := range []struct {
		name    string
		packets func(i int) [][]byte
		inserts bool
	}{
		{"syn", func(i int) [][]byte { return [][]byte{patch(syn, 26, 34, i)} }, true},
		{"syn-then-ack", func(i int) [][]byte { return [][]byte{patch(syn, 26, 34, i), patch(ack, 26, 34, i)} }, true},
		{"non-syn-miss", func(i int) [][]byte { return [][]byte{patch(ack, 26, 34, i)} }, true},
		{"icmp-error", func(i int) [][]byte { return [][]byte{patch(icmp, 42+16, 42+20+2, i)} }, false},
	} {
		t.Run(kind.name, func(t *testing.T) {
			fx := setupWith(t, Options{ConnTableSize: floodTable, InsertCap: floodCap})
			const sport = 4242
			b := fx.expect(flowHash(client4, vip4, sport, 80, 6, false))
			run(t, fx.f.Program(), tcp4(t, client4, vip4, sport, 80, "S", nil, nil))
			other := uint32((b + 1) % len(backMACs))
			if err := fx.f.SetVIP(VIP{ID: 1, Addr: netip.AddrPortFrom(vip4, 80), Proto: 6, Table: fill(len(fx.table), other)}); err != nil {
				t.Fatal(err)
			}
			established := tcp4(t, client4, vip4, sport, 80, "A", nil, nil)
			stays := func(when string) {
				t.Helper()
				ret, out := run(t, fx.f.Program(), established)
				if ret != xdpTX || !bytes.Equal(out[:6], backMACs[b]) {
					t.Fatalf("%s: the established flow went to %x (action %d), want its backend %s", when, out[:6], ret, backMACs[b])
				}
			}
			start, last := time.Now(), time.Now()
			sent := 0
			for i := 0; i < floodFlows; i++ {
				for _, pkt := range kind.packets(i) {
					if ret, err := fx.f.Program().Run(&ebpf.RunOptions{Data: pkt}); err != nil || ret != xdpTX {
						t.Fatalf("flood packet %d: action %d, %v", i, ret, err)
					}
					sent++
				}
				if time.Since(last) >= time.Second {
					stays("during the flood")
					last = time.Now()
				}
			}
			stays("after the flood")
			c := pathCounts(t, fx.f)
			t.Logf("%d packets of %d flows in %s; %d entries, %d inserts refused", sent, floodFlows,
				time.Since(start).Round(time.Millisecond), connCount(t, fx.f), c["insert_refused"])
			if kind.inserts && c["insert_refused"] == 0 {
				t.Errorf("the flood made every insert it tried: %v", c)
			}
			if !kind.inserts && (connCount(t, fx.f) != 1 || c["insert_refused"] != 0) {
				t.Errorf("ICMP errors tried to insert: %d entries, counters %v", connCount(t, fx.f), c)
			}
		})
	}
}
