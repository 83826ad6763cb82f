package l4xdp

import (
	"strings"
	"testing"

	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// A loader fed by a control plane: the verdicts given decide the tables (the loader
// probes nothing: the backends' addresses do not exist); a view the forwarder cannot hold
// is refused and the maps keep the last view.
func TestLoaderApplyView(t *testing.T) {
	r := newLoaderRig(t)
	l := r.detachAtEnd(r.open())
	f, err := pools.Parse("pools.yaml", []byte(loaderPoolsA))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range f.Services {
		s.HealthCheck = &pools.HealthCheck{} // checked by the control plane, as a view marks it
	}
	verdicts := map[string]health.State{"a/10.9.1.2:80": health.Unhealthy}
	view := func(service, id string) Verdict { return Verdict{State: verdicts[service+"/"+id]} }
	if err := l.ApplyView(f, view); err != nil {
		t.Fatal(err)
	}
	slots := slotsOf(t, l.Tables())
	up, down := slots["a/10.9.1.1:80"], slots["a/10.9.1.2:80"]
	flags, table := vipTable(t, l.Tables(), 1)
	if flags&FlagPanic != 0 || !table[up] || table[down] {
		t.Fatalf("flags %d, table slots %v: want %d only", flags, table, up)
	}
	if _, bflags := backendAt(t, l.Tables(), down); bflags&backendDown == 0 {
		t.Fatalf("the backend the control plane found down is not flagged down: %d", bflags)
	}
	pt, err := PinnedTables(Config{Iface: "v0", PinRoot: r.pin})
	if err != nil {
		t.Fatal(err)
	}
	if a := pt["a"]; len(a.Table) != int(f.Services[0].Hash.TableSize) || a.Table[0] != "a/10.9.1.1:80" ||
		len(a.Down) != 1 || a.Down[0] != "a/10.9.1.2:80" || len(pt["q"].Table) == 0 {
		t.Fatalf("pinned tables by name: a %d slots, first %q, down %v; q %d slots", len(a.Table), a.Table[0], a.Down, len(pt["q"].Table))
	}
	// A table size the maps cannot hold, and an affinity the forwarder does not implement:
	// refused with the reason, nothing written.
	for _, bad := range []struct {
		edit func(*pools.File)
		want string
	}{
		{func(f *pools.File) { f.Services[0].Hash.TableSize = MaxTableSize + 2 }, "table_size 65539"},
		{func(f *pools.File) { f.Services[0].Affinity.Mode = pools.ModeHeader }, `affinity mode "header"`},
	} {
		g, _ := pools.Parse("pools.yaml", []byte(loaderPoolsA))
		bad.edit(g)
		err := l.ApplyView(g, func(string, string) Verdict { return Verdict{State: health.Healthy} })
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Fatalf("got %v, want an error with %q", err, bad.want)
		}
		if flags, table := vipTable(t, l.Tables(), 1); flags&FlagPanic != 0 || !table[up] || table[down] {
			t.Fatalf("a refused view changed the table: flags %d, slots %v", flags, table)
		}
	}
	// No verdict (a backend the control plane cannot probe: a prober fault): UNKNOWN takes
	// new flows, as on Envoy and gRPC nodes. (A restarted control plane publishes nothing
	// until its first probes decide, so this is never its startup state.)
	verdicts = map[string]health.State{}
	if err := l.ApplyView(f, view); err != nil {
		t.Fatal(err)
	}
	if _, table := vipTable(t, l.Tables(), 1); !table[up] || !table[down] {
		t.Fatalf("with no verdict the table holds %v: an UNKNOWN backend takes new flows", table)
	}
	verdicts = map[string]health.State{"a/10.9.1.2:80": health.Unhealthy}
	if err := l.ApplyView(f, view); err != nil {
		t.Fatal(err)
	}
	verdicts = map[string]health.State{"a/10.9.1.2:80": health.Healthy}
	if err := l.ApplyView(f, view); err != nil {
		t.Fatal(err)
	}
	if _, table := vipTable(t, l.Tables(), 1); !table[up] || !table[down] {
		t.Fatalf("found healthy again, the table holds %v", table)
	}
	// A service the control plane does not check: every backend takes new flows.
	verdicts = map[string]health.State{"a/10.9.1.2:80": health.Unhealthy}
	f.Services[0].HealthCheck = nil
	if err := l.ApplyView(f, view); err != nil {
		t.Fatal(err)
	}
	if _, table := vipTable(t, l.Tables(), 1); !table[up] || !table[down] {
		t.Fatalf("an unchecked service's table holds %v", table)
	}
}
