package l4xdp

import (
	"net/netip"
	"testing"
	"time"
)

// Recount: entries over several batches, live ones counted, idle ones (past their VIP's
// timeout, which no packet will touch again) uncounted and their flag cleared, so that a
// later packet cannot subtract them a second time.
func TestRecount(t *testing.T) {
	fx := setup(t)
	// The live entries must stay within the timeout while the test writes them all and
	// recounts: a second was not enough under -race on a loaded machine.
	v := VIP{ID: 9, Addr: netip.AddrPortFrom(vip4, 9090), Proto: 6, Table: fx.table, IdleTimeout: time.Minute}
	if err := fx.f.SetVIP(v); err != nil {
		t.Fatal(err)
	}
	now := monoNow()
	const live, idle = 3*recountBatch + 17, 500
	for i := 0; i < live+idle; i++ {
		k := lbFlow{Proto: 6, Src: netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}).As16(), Dst: vip4.As16(),
			Sport: htons(1000), Dport: htons(9090)}
		c := lbConn{Backend: uint16(i % 2), VipId: 9, Flags: connCounted, LastSeen: now}
		if i >= live {
			c.LastSeen = now - uint64(2*time.Minute) // idle 2 min, past the timeout
		}
		if err := fx.f.objs.Conns.Put(k, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := fx.f.objs.Active.Put(uint32(0), int64(-3)); err != nil { // drifted
		t.Fatal(err)
	}
	if err := fx.f.Recount(); err != nil {
		t.Fatal(err)
	}
	a0, a1 := activeOf(t, fx.f, 0), activeOf(t, fx.f, 1)
	if a0+a1 != live || a0-a1 > 1 || a1-a0 > 1 {
		t.Fatalf("after Recount: slot 0 %d, slot 1 %d; want %d live entries split evenly", a0, a1, live)
	}
	var k lbFlow
	var c lbConn
	counted := 0
	it := fx.f.objs.Conns.Iterate()
	for it.Next(&k, &c) {
		if c.Flags&connCounted != 0 {
			counted++
		}
	}
	if counted != live {
		t.Fatalf("%d entries still flagged counted, want %d (the idle ones cleared)", counted, live)
	}
}
