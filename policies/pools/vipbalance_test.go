package pools

import (
	"strings"
	"testing"
	"time"
)

// The XDP forwarder's algorithms: weighted round robin and weighted least connections for
// affinity none, each with a Maglev table (for flows that moved between LB nodes) sized by
// default; slow start on any vip balance, Maglev included.
func TestVIPBalances(t *testing.T) {
	for _, bal := range []string{BalanceMaglev, BalanceRoundRobin, BalanceLeastConn} {
		src := "services:\n  - name: s\n    protocol: tcp\n    vip: 10.9.9.9:80\n    balance: " + bal +
			"\n    slow_start: {window: 20s}\n    backends: [{address: 10.0.0.1:80, weight: 3}, {address: 10.0.0.2:80}]\n"
		f, err := Parse("p.yaml", []byte(src))
		if err != nil {
			t.Fatalf("%s: %v", bal, err)
		}
		s := f.Services[0]
		if s.Balance != bal || s.Hash.TableSize != DefaultTableSize || s.SlowStart == nil || s.SlowStart.Window != 20*time.Second {
			t.Errorf("%s: balance %s, table_size %d, slow_start %+v", bal, s.Balance, s.Hash.TableSize, s.SlowStart)
		}
		if len(f.Warnings) != 0 {
			t.Errorf("%s: warnings %v", bal, f.Warnings)
		}
	}
	src := "services:\n  - name: s\n    protocol: tcp\n    vip: 10.9.9.9:80\n    balance: weighted_least_conn\n    hash: {table_size: 251}\n    backends: [{address: 10.0.0.1:80}]\n"
	f, err := Parse("p.yaml", []byte(src))
	if err != nil || f.Services[0].Hash.TableSize != 251 {
		t.Fatalf("table_size on a wlc vip: %v", err)
	}
	// A listener beside the vip: Envoy's Maglev does not ramp, which the file is told.
	src = "services:\n  - name: s\n    protocol: tcp\n    vip: 10.9.9.9:80\n    listen: 0.0.0.0:80\n    slow_start: {window: 20s}\n    backends: [{address: 10.0.0.1:80}]\n"
	f, err = Parse("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Warnings) != 1 || !strings.Contains(f.Warnings[0].Error(), "p.yaml:6:5") || !strings.Contains(f.Warnings[0].Error(), "Envoy's Maglev does not ramp") {
		t.Errorf("warnings %v", f.Warnings)
	}
}
