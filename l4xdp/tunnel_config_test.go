package l4xdp

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/pools"
)

// tunnelPools is a tunnel service of three backends behind a router (one draining) and one
// with second chance off.
const tunnelPools = `services:
  - name: far
    protocol: tcp
    vip: 10.9.0.1:80
    forwarding: tunnel
    hash: {table_size: 4099}
    backends:
      - {address: 10.7.0.1:80}
      - {address: 10.7.0.2:80, weight: 2}
      - {address: 10.7.0.3:80, drain: true}
  - name: plain
    protocol: udp
    vip: 10.9.0.2:53
    forwarding: tunnel
    tunnel_port: 7000
    second_chance: false
    hash: {table_size: 4099}
    backends:
      - {address: 10.7.0.1:53}
      - {address: 10.7.0.2:53}
`

// tunnelRows reads VIP id's second-chance table: its primaries and secondaries by backend
// name ("" for none).
func tunnelRows(t *testing.T, f *Tables, id, size uint32) (primary, second []string) {
	t.Helper()
	byName, err := names(f.objs.BackendNames)
	if err != nil {
		t.Fatal(err)
	}
	var innerID ebpf.MapID
	if err := f.objs.TunnelTables.Lookup(id, &innerID); err != nil {
		t.Fatalf("VIP %d has no second-chance table: %v", id, err)
	}
	inner, err := ebpf.NewMapFromID(innerID)
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	name := func(slot uint32) string {
		if slot == emptySlot {
			return ""
		}
		return byName[slot]
	}
	for i := uint32(0); i < size; i++ {
		var row uint64
		if err := inner.Lookup(i, &row); err != nil {
			t.Fatal(err)
		}
		primary, second = append(primary, name(uint32(row))), append(second, name(uint32(row>>32)))
	}
	return primary, second
}

// TestLoaderTunnel: a tunnel service's backends are written as tunnel backends (address, the
// service's tunnel port), its VIP gets the second-chance table policies/chash builds from the
// file (the draining backend a secondary only, weights as written), second_chance false
// leaves no secondary, the interface's address is the tunnel's source, and forwarding is on
// for the FIB's lookups.
func TestLoaderTunnel(t *testing.T) {
	r := newLoaderRig(t)
	r.kit.In("lb", "ip", "address", "add", "10.0.0.1/24", "dev", "v0")
	r.kit.In("lb", "ip", "route", "add", "10.7.0.0/24", "via", "10.0.0.254", "dev", "v0")
	r.kit.In("lb", "ip", "neigh", "replace", "10.0.0.254", "lladdr", "02:00:00:00:fe:01", "nud", "permanent", "dev", "v0")
	l := r.detachAtEnd(r.open())
	if l.tunnel4 != netip.MustParseAddr("10.0.0.1") || l.tunnel6.IsValid() {
		t.Fatalf("tunnel sources %v %v, want v0's 10.0.0.1 and none", l.tunnel4, l.tunnel6)
	}
	applyIn := func(yaml string) {
		t.Helper()
		f, err := pools.Parse("pools.yaml", []byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		r.kit.MustDo("lb", func() error { return l.Apply(t.Context(), f) }) // the sysctls of its namespace
	}
	applyIn(tunnelPools)
	f := l.Tables()
	var cfg lbLbConfig
	if err := f.objs.Config.Lookup(uint32(0), &cfg); err != nil || cfg.TunnelV4 != [4]byte{10, 0, 0, 1} {
		t.Fatalf("config %+v (%v): want the tunnel source 10.0.0.1", cfg, err)
	}
	slots := slotsOf(t, f)
	for name, port := range map[string]uint16{"far/10.7.0.1:80": 80, "plain/10.7.0.2:53": 7000} {
		var b lbBackend
		if err := f.objs.Backends.Lookup(slots[name], &b); err != nil {
			t.Fatal(err)
		}
		if b.Flags&backendTunnel == 0 || b.Flags&backendNAT != 0 || b.Port != netOrder(map[bool]uint16{true: pools.DefaultTunnelPort, false: port}[port == 80]) ||
			b.Addr != netip.MustParseAddrPort(strings.SplitN(name, "/", 2)[1]).Addr().As16() {
			t.Errorf("backend %s: flags %d port %d addr %v; want a tunnel backend at its address, port %d", name, b.Flags, b.Port, b.Addr, port)
		}
	}
	hosts := []chash.RendezvousHost{{ID: "10.7.0.1:80", Weight: 1}, {ID: "10.7.0.2:80", Weight: 2}, {ID: "10.7.0.3:80", Weight: 1, Draining: true}}
	want, err := chash.NewRendezvous(hosts, 4099)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]uint32{}
	for n, id := range mustNames(t, f.objs.VipNames) {
		ids[id] = n
	}
	primary, second := tunnelRows(t, f, ids["far"], 4099)
	drainSecond := 0
	for i, p := range want.Rows() {
		if wp, ws := "far/"+hosts[p.Primary].ID, "far/"+hosts[p.Secondary].ID; primary[i] != wp || second[i] != ws {
			t.Fatalf("far row %d: %s/%s, want %s/%s", i, primary[i], second[i], wp, ws)
		}
		if second[i] == "far/10.7.0.3:80" {
			drainSecond++
		}
	}
	if drainSecond == 0 {
		t.Fatal("the draining backend is no row's secondary: the test shows nothing")
	}
	flags, _ := vipTable(t, f, ids["far"])
	if flags&FlagTunnel == 0 || flags&FlagSecondChance == 0 {
		t.Errorf("far's VIP flags %d: want FlagTunnel and FlagSecondChance", flags)
	}
	if flags, _ := vipTable(t, f, ids["plain"]); flags&FlagTunnel == 0 || flags&FlagSecondChance != 0 {
		t.Errorf("plain's VIP flags %d: want FlagTunnel without FlagSecondChance", flags)
	}
	primary, second = tunnelRows(t, f, ids["plain"], 4099)
	for i := range primary {
		if primary[i] == "" || second[i] != "" {
			t.Fatalf("plain row %d: %q/%q, want a primary and no secondary (second_chance: false)", i, primary[i], second[i])
		}
	}
	var fwd []byte
	r.kit.MustDo("lb", func() (err error) {
		fwd, err = os.ReadFile("/proc/sys/net/ipv4/conf/v0/forwarding")
		return err
	})
	if strings.TrimSpace(string(fwd)) != "1" {
		t.Errorf("v0's IPv4 forwarding %q, want 1 (the tunnel's FIB lookups)", fwd)
	}
	// Back to direct routing: the second-chance table goes.
	applyIn(`services:
  - name: far
    protocol: tcp
    vip: 10.9.0.1:80
    backends: [{address: 10.7.0.1:80, mac: "02:00:00:00:00:01"}]
`)
	if err := f.objs.TunnelTables.Lookup(ids["far"], new(ebpf.MapID)); err == nil {
		t.Error("far forwards by DR now, and its second-chance table is still installed")
	}
}

func mustNames(t *testing.T, m *ebpf.Map) map[uint32]string {
	t.Helper()
	n, err := names(m)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTunnelNeedsASource: a tunnel service of a family the loader has no tunnel source for
// is refused with file:line and what to do.
func TestTunnelNeedsASource(t *testing.T) {
	f, err := pools.Parse("pools.yaml", []byte(`services:
  - {name: six, protocol: tcp, vip: "[fd00::9]:80", forwarding: tunnel, backends: [{address: "[fd07::1]:80"}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	l := &Loader{cfg: Config{Iface: "eth9"}, tunnel4: netip.MustParseAddr("10.0.0.1")}
	err = l.planTunnel(f, f.Services)
	if err == nil || !strings.Contains(err.Error(), "pools.yaml:2: service six: forwarding tunnel") || !strings.Contains(err.Error(), "--tunnel-source") {
		t.Fatalf("got %v", err)
	}
}
