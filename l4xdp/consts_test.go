package l4xdp

import (
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/stickylb/stickylb/policies/pools"
)

// The Go constants that mirror the C program's are checked against the object file itself
// (its BTF and map definitions), so an edit on one side only fails here, not in traffic.
func TestCConstantsMatchGo(t *testing.T) {
	spec, err := loadLb()
	if err != nil {
		t.Fatal(err)
	}
	enum := func(name string) map[string]uint64 {
		t.Helper()
		var e *btf.Enum
		if err := spec.Types.TypeByName(name, &e); err != nil {
			t.Fatalf("enum %s not in the object's BTF: %v", name, err)
		}
		out := map[string]uint64{}
		for _, v := range e.Values {
			out[v.Name] = v.Value
		}
		return out
	}
	want := func(what string, got, want uint64) {
		t.Helper()
		if got != want {
			t.Errorf("%s: C has %d, Go %d", what, got, want)
		}
	}

	paths := enum("lb_path")
	pathMax := paths["PATH_MAX"]
	want("PATH_MAX >= the Go path names", min(pathMax, uint64(numPaths)), uint64(numPaths))
	delete(paths, "PATH_MAX")
	want("number of paths", uint64(len(paths)), uint64(numPaths))
	for name, v := range paths {
		if v >= uint64(numPaths) || pathNames[v] != strings.ToLower(strings.TrimPrefix(name, "PATH_")) {
			t.Errorf("C path %s = %d; Go names index %d %q", name, v, v, pathNames[min(v, uint64(numPaths)-1)])
		}
	}
	vf := enum("vip_flags")
	want("F_SRC_IP", vf["F_SRC_IP"], FlagSourceIP)
	want("F_QUIC", vf["F_QUIC"], FlagQUIC)
	want("F_PANIC", vf["F_PANIC"], FlagPanic)
	want("F_WRR", vf["F_WRR"], FlagWRR)
	want("F_WLC", vf["F_WLC"], FlagWLC)
	want("F_TUNNEL", vf["F_TUNNEL"], FlagTunnel)
	want("F_SECOND", vf["F_SECOND"], FlagSecondChance)
	cf := enum("conn_flags")
	want("C_COUNTED", cf["C_COUNTED"], connCounted)
	want("C_SYN", cf["C_SYN"], connSYN)
	want("C_NAT", cf["C_NAT"], connNAT)
	want("C_HS", cf["C_HS"], connHS)
	ns := enum("nat_state")
	want("NS_REPLIED", ns["NS_REPLIED"], natReplied)
	want("NS_EMB", ns["NS_EMB"], natEmbryonic)
	want("NS_SHORT", ns["NS_SHORT"], natShort)
	want("NS_RST", ns["NS_RST"], natRST)
	var pool *btf.Struct
	if err := spec.Types.TypeByName("wlc_pool", &pool); err != nil {
		t.Fatal(err)
	}
	want("wlc_pool slots (WLC_SCAN)", uint64(pool.Size/4-2), WLCScan)
	bf := enum("backend_flags")
	want("B_ALIVE", bf["B_ALIVE"], backendAlive)
	want("B_DOWN", bf["B_DOWN"], backendDown)
	want("B_NAT", bf["B_NAT"], backendNAT)
	want("B_TUNNEL", bf["B_TUNNEL"], backendTunnel)

	size := func(name string) uint64 {
		t.Helper()
		m, ok := spec.Maps[name]
		if !ok {
			t.Fatalf("no map %s", name)
		}
		return uint64(m.MaxEntries)
	}
	want("path_stats entries (PATH_MAX)", size("path_stats"), pathMax)
	for _, m := range []string{"vips", "vip_addrs", "maglev", "vip_names", "vip_stats", "schedules", "sched_pos", "wlc_pools", "tunnel_tables"} {
		want(m+" entries (MAX_VIPS)", size(m), MaxVIPs)
	}
	for _, m := range []string{"backends", "backend_names", "backend_stats", "server_ids", "weights", "active", "backend_zones"} {
		want(m+" entries (MAX_BACKENDS)", size(m), MaxBackends)
	}
	want("Maglev table entries (MAGLEV_SIZE)", uint64(spec.Maps["maglev"].InnerMap.MaxEntries), MaxTableSize)
	want("schedule entries (MAGLEV_SIZE)", uint64(spec.Maps["schedules"].InnerMap.MaxEntries), MaxTableSize)
	want("second-chance table entries (MAGLEV_SIZE)", uint64(spec.Maps["tunnel_tables"].InnerMap.MaxEntries), MaxTableSize)
	want("second-chance row bytes (setTunnelTable's)", uint64(spec.Maps["tunnel_tables"].InnerMap.ValueSize), 8)
	want("pools' largest vip table", pools.MaxVIPTableSize, MaxTableSize)
	want("connection table entries", size("conns"), DefaultConnTableSize)
	want("NAT table entries (as conns)", size("nat_rev"), DefaultConnTableSize)
	want("NAT sources (MAX_NAT_SOURCES)", size("nat_sources"), 2*maxNATSources)
	want("TCP idle timeout, s", uint64(pools.DefaultTCPIdleTimeout/time.Second), uint64(defaultTCPIdle/time.Second))
	want("UDP idle timeout, s", uint64(pools.DefaultUDPIdleTimeout/time.Second), uint64(defaultUDPIdle/time.Second))
	var name *btf.Struct
	if err := spec.Types.TypeByName("name", &name); err != nil {
		t.Fatal(err)
	}
	want("struct name bytes", uint64(name.Size), uint64(maxName+1))
	if spec.Maps["maglev"].InnerMap.Type != ebpf.Array {
		t.Errorf("Maglev tables are %s; SetVIP makes arrays", spec.Maps["maglev"].InnerMap.Type)
	}
}
