package chash

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func rendezvousHosts(n int, weight func(i int) uint32) []RendezvousHost {
	hs := make([]RendezvousHost, n)
	for i := range hs {
		hs[i] = RendezvousHost{ID: fmt.Sprintf("10.0.1.%d:80", i+1), Weight: weight(i)}
	}
	return hs
}

func one(int) uint32 { return 1 }

func mustRendezvous(t testing.TB, hs []RendezvousHost, rows uint64) *Rendezvous {
	t.Helper()
	r, err := NewRendezvous(hs, rows)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// ids names each row's pair by identity, so tables over differently ordered host lists
// compare.
func ids(r *Rendezvous, hs []RendezvousHost) [][2]string {
	out := make([][2]string, len(r.Rows()))
	name := func(i int32) string {
		if i < 0 {
			return ""
		}
		return hs[i].ID
	}
	for i, p := range r.Rows() {
		out[i] = [2]string{name(p.Primary), name(p.Secondary)}
	}
	return out
}

// TestRendezvousOrderFree: the pairs depend on the host set, not on the order the hosts
// were given in (every node builds the same table from the same view).
func TestRendezvousOrderFree(t *testing.T) {
	for _, weighted := range []bool{false, true} {
		hs := rendezvousHosts(9, func(i int) uint32 {
			if weighted {
				return uint32(1 + i%3)
			}
			return 1
		})
		hs[4].Draining = true
		a := ids(mustRendezvous(t, hs, 4099), hs)
		shuffled := append([]RendezvousHost(nil), hs...)
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		b := ids(mustRendezvous(t, shuffled, 4099), shuffled)
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("weighted %v: row %d is %v in file order, %v shuffled", weighted, i, a[i], b[i])
			}
		}
	}
}

// TestRendezvousShares: a host's share of primaries follows its weight, within 4 sigma of
// the binomial over the rows (each row is an independent draw).
func TestRendezvousShares(t *testing.T) {
	const rows = 65537
	for _, tc := range []struct {
		name    string
		weights []uint32
	}{
		{"equal", []uint32{1, 1, 1, 1, 1}},
		{"1:2:3:4", []uint32{1, 2, 3, 4}},
		{"1:100", []uint32{1, 100}},
	} {
		hs := rendezvousHosts(len(tc.weights), func(i int) uint32 { return tc.weights[i] })
		r := mustRendezvous(t, hs, rows)
		count := make([]int, len(hs))
		seconds := make([]int, len(hs))
		for _, p := range r.Rows() {
			count[p.Primary]++
			if p.Secondary == p.Primary || p.Secondary < 0 {
				t.Fatalf("%s: row %v: the secondary must be another host", tc.name, p)
			}
			seconds[p.Secondary]++
		}
		sum := 0.0
		for _, w := range tc.weights {
			sum += float64(w)
		}
		for i, w := range tc.weights {
			p := float64(w) / sum
			mean, sd := rows*p, math.Sqrt(rows*p*(1-p))
			if d := math.Abs(float64(count[i]) - mean); d > 4*sd {
				t.Errorf("%s: host %d (weight %d) is primary of %d rows, want %.0f ± %.0f", tc.name, i, w, count[i], mean, 4*sd)
			}
		}
	}
}

// TestRendezvousAdd: a host that joins takes exactly the rows where it ranks first, and in
// each of them the previous primary becomes the secondary; every other row keeps its primary.
// The share it takes is about 1/(n+1).
func TestRendezvousAdd(t *testing.T) {
	const rows = 65537
	for _, weighted := range []bool{false, true} {
		w := one
		if weighted {
			w = func(i int) uint32 { return uint32(1 + i%4) }
		}
		all := rendezvousHosts(8, w)
		before := mustRendezvous(t, all[:7], rows)
		after := mustRendezvous(t, all, rows)
		took := 0
		for i, p := range after.Rows() {
			old := before.Rows()[i]
			if p.Primary == 7 {
				took++
				if p.Secondary != old.Primary {
					t.Fatalf("weighted %v: row %d taken by the newcomer: secondary %d, want the previous primary %d", weighted, i, p.Secondary, old.Primary)
				}
				continue
			}
			if p.Primary != old.Primary {
				t.Fatalf("weighted %v: row %d moved from %d to %d, which is not the newcomer", weighted, i, old.Primary, p.Primary)
			}
		}
		share := float64(all[7].Weight) / float64(sumWeights(all))
		mean, sd := rows*share, math.Sqrt(rows*share*(1-share))
		if math.Abs(float64(took)-mean) > 4*sd {
			t.Errorf("weighted %v: the newcomer took %d rows, want %.0f ± %.0f", weighted, took, mean, 4*sd)
		}
	}
}

func sumWeights(hs []RendezvousHost) uint64 {
	var s uint64
	for _, h := range hs {
		s += uint64(h.Weight)
	}
	return s
}

// TestRendezvousDrain: a draining host is never primary; in the rows where it was primary
// it is now the secondary, and the primary is the host that was second there; elsewhere
// primaries stay. A host removed is neither, and its rows go to their second.
func TestRendezvousDrain(t *testing.T) {
	const rows = 20011
	hs := rendezvousHosts(6, func(i int) uint32 { return uint32(1 + i%2) })
	before := mustRendezvous(t, hs, rows)
	drained := append([]RendezvousHost(nil), hs...)
	drained[2].Draining = true
	during := mustRendezvous(t, drained, rows)
	gone := append(append([]RendezvousHost(nil), hs[:2]...), hs[3:]...)
	after := mustRendezvous(t, gone, rows)
	idOf := func(set []RendezvousHost, i int32) string {
		if i < 0 {
			return ""
		}
		return set[i].ID
	}
	held := 0
	for i, p := range during.Rows() {
		old := before.Rows()[i]
		if p.Primary == 2 {
			t.Fatalf("row %d: the draining host is primary", i)
		}
		if old.Primary == 2 {
			held++
			if p.Secondary != 2 || p.Primary != old.Secondary {
				t.Fatalf("row %d was the draining host's: now %v, want primary %d (its second) and secondary 2", i, p, old.Secondary)
			}
		} else if p.Primary != old.Primary {
			t.Fatalf("row %d: primary moved from %d to %d though the draining host did not hold it", i, old.Primary, p.Primary)
		}
		q := after.Rows()[i]
		if idOf(gone, q.Primary) != idOf(drained, p.Primary) {
			t.Fatalf("row %d: removing the drained host moved the primary from %s to %s", i, idOf(drained, p.Primary), idOf(gone, q.Primary))
		}
		if idOf(gone, q.Secondary) == hs[2].ID {
			t.Fatalf("row %d: the removed host is still secondary", i)
		}
	}
	if held == 0 {
		t.Fatal("the drained host held no row: the test shows nothing")
	}
}

// TestRendezvousEdges: one host has no secondary; only draining hosts leave rows without a
// primary (drops, as an empty Maglev table); bad input is refused.
func TestRendezvousEdges(t *testing.T) {
	r := mustRendezvous(t, rendezvousHosts(1, one), 7)
	for _, p := range r.Rows() {
		if p != (Pair{0, -1}) {
			t.Fatalf("one host: row %v, want {0 -1}", p)
		}
	}
	hs := rendezvousHosts(2, one)
	hs[0].Draining, hs[1].Draining = true, true
	for _, p := range mustRendezvous(t, hs, 7).Rows() {
		if p.Primary != -1 || p.Secondary < 0 {
			t.Fatalf("every host draining: row %v, want no primary and a draining secondary", p)
		}
	}
	if r := mustRendezvous(t, nil, 3); r.Pick(5) != -1 || r.Len() != 0 {
		t.Fatal("no hosts: want -1")
	}
	for _, bad := range []struct {
		hs   []RendezvousHost
		rows uint64
	}{
		{rendezvousHosts(2, one), 0},
		{[]RendezvousHost{{ID: "a", Weight: 0}}, 5},
		{[]RendezvousHost{{ID: "a", Weight: 1}, {ID: "a", Weight: 1}}, 5},
		{[]RendezvousHost{{ID: "", Weight: 1}}, 5},
	} {
		if _, err := NewRendezvous(bad.hs, bad.rows); err == nil {
			t.Errorf("%v over %d rows accepted", bad.hs, bad.rows)
		}
	}
}

// TestRendezvousGolden pins the table's bits: nodes of two versions must build the same
// pairs, so any change to the hash, the score or the ranking has to be a deliberate one
// (it moves flows between backends during an upgrade).
func TestRendezvousGolden(t *testing.T) {
	digest := func(r *Rendezvous) uint64 {
		h := fnv.New64a()
		for _, p := range r.Rows() {
			fmt.Fprintf(h, "%d,%d;", p.Primary, p.Secondary)
		}
		return h.Sum64()
	}
	equal := mustRendezvous(t, rendezvousHosts(5, one), 65537)
	weighted := rendezvousHosts(5, func(i int) uint32 { return uint32(i + 1) })
	weighted[1].Draining = true
	for _, tc := range []struct {
		name  string
		r     *Rendezvous
		first []Pair
		want  uint64
	}{
		{"equal", equal, []Pair{{2, 0}, {2, 1}, {0, 3}}, 0xf7c08de222ce72f2},
		{"weighted, one draining", mustRendezvous(t, weighted, 65537), []Pair{{2, 3}, {2, 1}, {3, 0}}, 0xdf86690b50384116},
	} {
		if d := digest(tc.r); d != tc.want || !slices.Equal(tc.r.Rows()[:3], tc.first) {
			t.Errorf("%s: digest %#x, want %#x; first rows %v", tc.name, d, tc.want, tc.r.Rows()[:3])
		}
	}
}

// TestLnUnit: the portable logarithm agrees with math.Log to within 4 ulp over (0, 1).
func TestLnUnit(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 200000; i++ {
		h := rng.Uint64()
		if i < 64 {
			h = 1<<63>>i | 1 // every exponent
		}
		u := (float64(h>>11) + 0.5) / (1 << 53)
		got, want := lnUnit(h), math.Log(u)
		if math.Abs(got-want) > 4*math.Abs(want)*0x1p-52 {
			t.Fatalf("lnUnit(%#x) = %v, math.Log(%v) = %v", h, got, u, want)
		}
	}
}

// BenchmarkRendezvous builds a 65,537-row table, as the XDP loader does for a tunnel VIP at
// each change (equal weights compare hashes; weights need a logarithm per host and row).
func BenchmarkRendezvous(b *testing.B) {
	for _, n := range []int{10, 100} {
		for _, weighted := range []bool{false, true} {
			w := one
			if weighted {
				w = func(i int) uint32 { return uint32(1 + i%3) }
			}
			hs := rendezvousHosts(n, w)
			b.Run(fmt.Sprintf("hosts=%d/weighted=%v", n, weighted), func(b *testing.B) {
				for b.Loop() {
					if _, err := NewRendezvous(hs, 65537); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
