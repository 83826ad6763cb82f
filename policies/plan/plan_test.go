package plan

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stickylb/stickylb/policies/pools"
)

func file(t testing.TB, balance string, n int, extra string) *pools.File {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "services:\n  - name: web\n    protocol: http\n    affinity: {mode: header, header: {name: x}}\n    balance: %s\n    backends:\n", balance)
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "      - {address: 10.0.0.%d:80}\n", i)
	}
	b.WriteString(extra)
	f, err := pools.Parse("t.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// sigma4 is four binomial standard deviations of a share p measured over n keys.
func sigma4(p float64, n int) float64 { return 4 * math.Sqrt(p*(1-p)/float64(n)) }

// TestAddOneOfFour is the textbook comparison: going from 3 to 4 backends should move 1/4 of
// the keys with Maglev or the ring, 3/4 with mod N.
func TestAddOneOfFour(t *testing.T) {
	for _, bal := range []string{pools.BalanceMaglev, pools.BalanceRingHash} {
		rs, err := Compare(file(t, bal, 3, ""), file(t, bal, 4, ""), 0)
		if err != nil {
			t.Fatal(err)
		}
		r := rs[0]
		t.Logf("%s: moved %.4f ideal %.4f mod_n %.4f", bal, r.Moved, r.Ideal, r.ModN)
		if math.Abs(r.Ideal-0.25) > 1e-12 {
			t.Errorf("%s: ideal %v, want 0.25", bal, r.Ideal)
		}
		if math.Abs(r.ModN-0.75) > sigma4(0.75, r.Keys)+0.01 {
			t.Errorf("%s: mod_n %v, want 0.75", bal, r.ModN)
		}
		// Maglev moves a little more than ideal (table disruption: measured 0.2511); a ring
		// of 1024 entries places hosts unevenly, so it moves more (measured 0.356 on these
		// fixed keys; a textbook ring of this size moves about 0.34).
		if r.Moved < 0.25-sigma4(0.25, r.Keys) || r.Moved > 0.40 || bal == pools.BalanceMaglev && r.Moved > 0.27 {
			t.Errorf("%s: moved %v, want about 0.25", bal, r.Moved)
		}
		if r.Change != "changed" || r.Keys != DefaultKeys {
			t.Errorf("%s: %+v", bal, r)
		}
	}
}

func TestUnchangedAndDrain(t *testing.T) {
	a := file(t, pools.BalanceMaglev, 4, "")
	rs, err := Compare(a, a, MinKeys)
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Moved != 0 || rs[0].Ideal != 0 || rs[0].ModN != 0 || rs[0].Change != "unchanged" {
		t.Fatalf("no change: %+v", rs[0])
	}
	// Draining one of four: new sessions avoid it, like a removal.
	drained := file(t, pools.BalanceMaglev, 3, "      - {address: 10.0.0.4:80, drain: true}\n")
	rs, _ = Compare(a, drained, MinKeys)
	if math.Abs(rs[0].Ideal-0.25) > 1e-12 || rs[0].Moved < 0.24 || rs[0].Moved > 0.3 {
		t.Fatalf("drain: %+v", rs[0])
	}
}

func TestPinnedModes(t *testing.T) {
	mk := func(n int) *pools.File {
		var b strings.Builder
		b.WriteString("services:\n  - name: web\n    protocol: http\n    affinity: {mode: cookie}\n    backends:\n")
		for i := 1; i <= n; i++ {
			fmt.Fprintf(&b, "      - {address: 10.0.0.%d:80}\n", i)
		}
		f, err := pools.Parse("t.yaml", []byte(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	rs, err := Compare(mk(4), mk(3), 0)
	if err != nil {
		t.Fatal(err)
	}
	if r := rs[0]; math.Abs(r.Moved-0.25) > 1e-12 || r.Algorithm != pools.BalanceLeastConn {
		t.Fatalf("cookie sessions on the removed backend only: %+v", r)
	}
	rs, _ = Compare(mk(3), mk(4), 0)
	if rs[0].Moved != 0 {
		t.Fatalf("adding a backend moves no pinned session: %+v", rs[0])
	}
}

func TestAddedRemoved(t *testing.T) {
	a := file(t, pools.BalanceRingHash, 2, "")
	b, err := pools.Parse("b.yaml", []byte("services:\n  - {name: other, protocol: http, backends: [{address: 10.0.0.1:80}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Compare(a, b, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Change != "added" || rs[1].Change != "removed" || rs[1].Moved != 1 {
		t.Fatalf("%+v", rs)
	}
	if _, err := Compare(a, a, 10); err == nil {
		t.Fatal("too few keys accepted")
	}
}

func BenchmarkCompare(b *testing.B) {
	old, next := file(b, pools.BalanceMaglev, 10, ""), file(b, pools.BalanceMaglev, 11, "")
	for b.Loop() {
		if _, err := Compare(old, next, MinKeys); err != nil {
			b.Fatal(err)
		}
	}
}

// tunnelFile is a tcp vip service of n equal backends forwarded by tunnel.
func tunnelFile(t testing.TB, n int, drain int) *pools.File {
	t.Helper()
	var b strings.Builder
	b.WriteString("services:\n  - name: l4\n    protocol: tcp\n    vip: 10.9.9.9:80\n    forwarding: tunnel\n    backends:\n")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "      - {address: 10.0.0.%d:80, drain: %v}\n", i, i == drain)
	}
	f, err := pools.Parse("t.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestTunnelRendezvous: a tunnel service's table is the rendezvous one, and adding a
// backend to n moves about 1/(n+1) of the keys (the ideal), within the noise of 65,537 rows
// and of the keys measured; draining one of n moves its share, 1/n.
func TestTunnelRendezvous(t *testing.T) {
	for _, n := range []int{3, 9} {
		rs, err := Compare(tunnelFile(t, n, 0), tunnelFile(t, n+1, 0), 0)
		if err != nil {
			t.Fatal(err)
		}
		r := rs[0]
		ideal := 1 / float64(n+1)
		t.Logf("%d -> %d: moved %.4f rendezvous %v maglev %v ideal %.4f", n, n+1, r.Moved, *r.Rendezvous, *r.Maglev, r.Ideal)
		if r.Rendezvous == nil || r.Moved != *r.Rendezvous || !strings.Contains(r.Note, "rendezvous") {
			t.Fatalf("%d -> %d: %+v: want the rendezvous table's share as moved", n, n+1, r)
		}
		if math.Abs(r.Ideal-ideal) > 1e-12 {
			t.Errorf("%d -> %d: ideal %v, want %v", n, n+1, r.Ideal, ideal)
		}
		bound := 4*math.Sqrt(ideal*(1-ideal)/65537) + sigma4(ideal, r.Keys)
		if math.Abs(r.Moved-ideal) > bound {
			t.Errorf("%d -> %d: moved %v, want %v ± %v", n, n+1, r.Moved, ideal, bound)
		}
	}
	rs, err := Compare(tunnelFile(t, 4, 0), tunnelFile(t, 4, 2), 0)
	if err != nil {
		t.Fatal(err)
	}
	if r := rs[0]; math.Abs(r.Moved-0.25) > 4*math.Sqrt(0.25*0.75/65537)+sigma4(0.25, r.Keys) {
		t.Errorf("drain one of 4: moved %v, want 0.25", r.Moved)
	}
}
