package l4xdp

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"github.com/stickylb/stickylb/policies/status"
)

// TestLoaderStatus: the forwarder's status, field by field against its live state: a
// loader in a namespace of its own with a real TCP health check (one backend up, one
// refused, one draining), flows sent through the program (each backend's flows are the
// program's active counters), a backend added with slow start ramping, the table
// generation moving with each rebuild and the path counters equal to the program's.
func TestLoaderStatus(t *testing.T) {
	_, port := healthPort(t)
	r := newLoaderRig(t)
	l := r.detachAtEnd(r.open())
	file := func(extra string) string {
		return fmt.Sprintf(`services:
  - name: web
    protocol: tcp
    vip: 10.0.0.100:80
    balance: maglev
    hash: {table_size: 251}
    slow_start: {window: 200s, aggression: 1, min_weight_percent: 10}
    health_check: {protocol: tcp, port: %d, interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}
    backends:
      - {address: 127.0.0.1:80, mac: "02:00:00:00:00:01", zone: zone-a, weight: 2}
      - {address: 127.0.0.2:80, mac: "02:00:00:00:00:02", zone: zone-b}
      - {address: 127.0.0.3:80, mac: "02:00:00:00:00:03", zone: zone-b, drain: true}
%s`, port, extra)
	}
	r.apply(l, file(""))
	snapOf := func() *status.Snapshot {
		t.Helper()
		s, err := l.Status()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		// What the page reads: the snapshot through JSON.
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var out status.Snapshot
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		return &out
	}
	// The first probe comes within interval/10, its verdict within the timeout after; 2 s
	// of slack. The checker's state shows before the loader has applied the verdict (its
	// callback rebuilds the table and records when the state changed), so the wait is on
	// both.
	var snap *status.Snapshot
	testwait.For(t, 100*time.Millisecond+500*time.Millisecond+2*time.Second, "verdicts on every backend (the draining one is probed too), applied", func() (bool, string) {
		snap = snapOf()
		bs := snap.Services[0].Backends
		g := snap.Services[0].Generation
		return bs[0].Health.State == status.Healthy && bs[1].Health.State == status.Unhealthy && bs[2].Health.State == status.Unhealthy &&
				g != nil && *g >= 2 && bs[0].Health.Since != nil && bs[1].Health.Since != nil,
			fmt.Sprintf("generation %v, %+v", g, bs)
	})
	if snap.Tier != status.TierXDP || len(snap.Services) != 1 {
		t.Fatalf("snapshot: %+v", snap)
	}
	web := snap.Services[0]
	if web.VIP != "10.0.0.100:80" || web.Policy != "maglev" || web.Panic.Active || web.Generation == nil || *web.Generation < 2 {
		// One table at the first apply, another for the first verdict that took a backend out.
		t.Fatalf("web: vip %s, policy %s, panic %+v, generation %v", web.VIP, web.Policy, web.Panic, web.Generation)
	}
	up, down, drained := web.Backends[0], web.Backends[1], web.Backends[2]
	if up.ID != "127.0.0.1:80" || up.Zone != "zone-a" || *up.Weight != 2 || *up.EffectiveWeight != 2 || up.Draining || up.Health.Since == nil {
		t.Fatalf("healthy backend: %+v", up)
	}
	if down.Health.Reason == "" || down.Health.Since == nil || *down.EffectiveWeight != 0 || down.Draining {
		t.Fatalf("refused backend: %+v, want unhealthy with a reason and a time, effective weight 0", down)
	}
	if !drained.Draining || *drained.EffectiveWeight != 0 {
		t.Fatalf("drained backend: %+v", drained)
	}
	// The loader probes: every backend's last check is a time of its checker's, no later
	// than the snapshot, and moves with the next probe (one interval, 1 s, later; the
	// timeout and 2 s of slack on top).
	for _, b := range web.Backends {
		if b.Health.LastCheck == nil || b.Health.LastCheck.After(snap.Time) || snap.Time.Sub(*b.Health.LastCheck) > 1500*time.Millisecond+2*time.Second {
			t.Fatalf("backend %s: last check %v, snapshot at %v: want the time of a probe of the last interval", b.ID, b.Health.LastCheck, snap.Time)
		}
	}
	firstCheck := *up.Health.LastCheck
	testwait.For(t, time.Second+500*time.Millisecond+2*time.Second, "the healthy backend's last check moves with the next probe", func() (bool, string) {
		b := snapOf().Services[0].Backends[0]
		return b.Health.LastCheck != nil && b.Health.LastCheck.After(firstCheck), fmt.Sprintf("%v, first %v", b.Health.LastCheck, firstCheck)
	})

	// Flows: SYNs of 20 clients, all to the one healthy backend; the status's flows are the
	// program's active counters, slot by slot.
	const flows = 20
	for i := 0; i < flows; i++ {
		src := netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)})
		if ret, _ := run(t, l.Tables().Program(), tcp4(t, src, vip4, uint16(40000+i), 80, "S", nil, nil)); ret != xdpTX {
			t.Fatalf("SYN %d: action %d, want XDP_TX", i, ret)
		}
	}
	gen := *web.Generation
	// The program also sees what the namespace itself sends on the attached interface (IPv6
	// neighbour and router solicitations pass): the status's path counters must lie between
	// the program's counters read just before and just after it.
	pathsBefore := pathCounts(t, l.Tables())
	snap = snapOf()
	pathsAfter := pathCounts(t, l.Tables())
	web = snap.Services[0]
	slots := slotsOf(t, l.Tables())
	var sum int64
	for _, b := range web.Backends {
		want := activeOf(t, l.Tables(), slots["web/"+b.ID])
		if b.Flows == nil || *b.Flows != want {
			t.Fatalf("backend %s: flows %v, the program counts %d", b.ID, b.Flows, want)
		}
		sum += want
	}
	if *web.Backends[0].Flows != flows || web.Load.Flows == nil || *web.Load.Flows != sum {
		t.Fatalf("flows: healthy backend %d of %d sent, service %v of %d", *web.Backends[0].Flows, flows, web.Load.Flows, sum)
	}
	if *web.Generation != gen {
		t.Fatalf("generation moved from %d to %d with no rebuild", gen, *web.Generation)
	}
	// Flows per zone are the program's per-zone counts: all on zone-a's one backend.
	if zs, _ := json.Marshal(web.Zones); string(zs) != fmt.Sprintf(`[{"name":"zone-a","backends":1,"healthy":1,"draining":0,"flows":%d},`+
		`{"name":"zone-b","backends":2,"healthy":0,"draining":1,"flows":0}]`, flows) {
		t.Fatalf("zones %s", zs)
	}
	if web.Counters["packets"] != flows {
		t.Fatalf("VIP packets %d, want %d", web.Counters["packets"], flows)
	}
	for p, hi := range pathsAfter {
		if lo := pathsBefore[p]; snap.Counters[p] < lo || snap.Counters[p] > hi {
			t.Fatalf("path %s: %d in the status, %d to %d in the program", p, snap.Counters[p], lo, hi)
		}
	}
	if pathsBefore["forward"] < flows {
		t.Fatalf("path forward: %d in the program, want at least the %d SYNs", pathsBefore["forward"], flows)
	}

	// The same file applied again installs the same tables: no new generation.
	r.apply(l, file(""))
	if g := *snapOf().Services[0].Generation; g != gen {
		t.Fatalf("generation moved from %d to %d when the same tables were installed again", gen, g)
	}

	// A backend added ramps with slow start: the status shows the share the tables hold.
	before := time.Now()
	r.apply(l, file(`      - {address: 127.0.0.4:80, mac: "02:00:00:00:00:04", zone: zone-a}`))
	snap = snapOf()
	web = snap.Services[0]
	added := web.Backends[3]
	if ss := added.SlowStart; ss == nil || ss.Factor <= 0 || ss.Factor >= 1 || ss.Since.Before(before.Add(-time.Second)) || ss.Window != "3m20s" {
		t.Fatalf("added backend's slow start: %+v, want a ramp from about %v", added.SlowStart, before)
	} else if added.Health.State != status.Unhealthy && *added.EffectiveWeight != *added.Weight*ss.Factor {
		t.Fatalf("added backend: effective weight %v, want weight %v × %v", *added.EffectiveWeight, *added.Weight, ss.Factor)
	}
	if z := web.Zones[0]; z.Name != "zone-a" || z.Backends != 2 || z.Flows == nil || *z.Flows != flows {
		t.Fatalf("zone-a with the added backend: %+v", z)
	}
	if *web.Generation <= gen {
		t.Fatalf("generation %d after a rebuild, was %d", *web.Generation, gen)
	}
}
