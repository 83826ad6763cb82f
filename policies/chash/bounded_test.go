package chash

import (
	"fmt"
	"slices"
	"testing"
)

// The reference output of std::mt19937 (C++11 [rand.predef]): the 10000th value from a
// default-constructed engine (seed 5489) is 4123659995.
func TestMT19937MatchesStdReference(t *testing.T) {
	var m mt19937
	m.seed(5489)
	var v uint32
	for range 10000 {
		v = m.next()
	}
	if v != 4123659995 {
		t.Fatalf("10000th output = %d, std::mt19937 4123659995", v)
	}
}

// envoyShuffle is the probe order Envoy's BoundedLoadHashingLoadBalancer derives from a hash.
func envoyShuffle(hash uint64, n int) []int {
	var m mt19937
	m.seed(uint32(hash))
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	for i := range n {
		j := int(m.uniform(uint32(n - i)))
		idx[i], idx[i+j] = idx[i+j], idx[i]
	}
	return idx
}

// Envoy's bounded_load_hlb_test.cc states the shuffles it relies on.
func TestBoundedShuffleMatchesEnvoy(t *testing.T) {
	for _, c := range []struct {
		seed uint64
		want []int
	}{
		{2, []int{2, 1, 0, 4, 3}}, // "The random shuffle sequence of 5 elements with seed 2 is 2 1 0 4 3."
		{6, []int{4, 0, 2, 3, 1}}, // "with seed 6 is 4 0 2 3 1"
		{7, []int{0, 1, 4, 3, 2}}, // "and with 7 it is 0 1 4 3 2"
	} {
		if got := envoyShuffle(c.seed, 5); !slices.Equal(got, c.want) {
			t.Errorf("seed %d: shuffle %v, Envoy %v", c.seed, got, c.want)
		}
	}
}

// tableWalker is Envoy's TestHashingLoadBalancer: hash h picks ring[h], hosts in index order
// with equal weights.
type tableWalker struct {
	ring []int
	n    int
}

func (w tableWalker) Pick(h uint64) int  { return w.ring[h] }
func (w tableWalker) Len() int           { return w.n }
func (w tableWalker) Weight(int) float64 { return 1.0 / float64(w.n) }
func (w tableWalker) Nth(k int) int      { return k }
func identityRing(n int) tableWalker     { return tableWalker{ring: seq(n), n: n} }
func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}
func loads(l map[int]int64) LoadFunc { return func(i int) int64 { return l[i] } }

// Ports of BoundedLoadHashingLoadBalancerTest. Envoy's tests override hostOverloadFactor with
// fixed factors: listed hosts get 1.02, 1.03, ... in list order, others 0.5. We drive the real
// factor instead: with no active requests overall and factor 100, every host has 1 slot, so a
// load of 0 is factor 0 (acceptable) and loads 2, 3, 4 are factors 2, 3, 4, in the same order.
func TestBoundedEnvoyCases(t *testing.T) {
	for _, c := range []struct {
		name  string
		w     tableWalker
		load  map[int]int64
		hash  uint64
		want  int
		total int64
	}{
		{name: "NoHostEverOverloaded/0", w: identityRing(5), hash: 0, want: 0},
		{name: "NoHostEverOverloaded/4", w: identityRing(5), hash: 4, want: 4},
		// ActualHostOverloaded: host 2 has 2 active requests with 0 overall, so
		// total_slots = ceil(1*factor/100) = 1 and slots = max(ceil(0.2), 1) = 1 < 2.
		{name: "ActualHostOverloaded", w: identityRing(5), load: map[int]int64{2: 2}, hash: 2, want: 1},
		{name: "OneHostOverloaded", w: identityRing(5), load: map[int]int64{2: 2}, hash: 2, want: 1},
		{name: "MultipleHostOverloaded", w: identityRing(5), load: map[int]int64{0: 2, 1: 3, 2: 4}, hash: 2, want: 4},
		{
			name: "MultipleHashSameHostOverloaded/6",
			w:    tableWalker{ring: []int{0, 0, 1, 1, 2, 2, 3, 3, 4, 4}, n: 5},
			load: map[int]int64{3: 2}, hash: 6, want: 4,
		},
		{
			name: "MultipleHashSameHostOverloaded/7",
			w:    tableWalker{ring: []int{0, 0, 1, 1, 2, 2, 3, 3, 4, 4}, n: 5},
			load: map[int]int64{3: 2}, hash: 7, want: 0,
		},
		// AllHostsOverloaded: factors 1.02 (:11), 1.03 (:10), 1.04 (:12); the least
		// overloaded, :11, wins.
		{name: "AllHostsOverloaded", w: identityRing(3), load: map[int]int64{1: 2, 0: 3, 2: 4}, hash: 0, want: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := PickBounded(c.w, c.hash, 1.0, loads(c.load), c.total); got != c.want {
				t.Errorf("PickBounded = %d, Envoy %d", got, c.want)
			}
		})
	}
}

// Envoy's slot arithmetic: total_slots = ((overall+1)*factor + 99)/100 and
// slots = max(ceil(total_slots*weight), 1); a host is acceptable while active <= slots.
func TestBoundedSlotArithmetic(t *testing.T) {
	// Two hosts, weights 3:1 (0.75, 0.25), factor 1.5, 9 requests active overall:
	// total_slots = ceil(10*150/100) = 15; slots = ceil(11.25) = 12 and ceil(3.75) = 4.
	m, err := NewMaglev([]Host{{ID: "a", Weight: 3}, {ID: "b", Weight: 1}}, 7)
	if err != nil {
		t.Fatal(err)
	}
	var hb uint64 // a hash that Maglev maps to b
	for ; m.Pick(hb) != 1; hb++ {
	}
	for _, c := range []struct {
		loadB int64
		want  int
	}{{3, 1}, {4, 1}, {5, 0}} {
		got := PickBounded(m, hb, 1.5, loads(map[int]int64{0: 0, 1: c.loadB}), 9)
		if got != c.want {
			t.Errorf("b with %d active (4 slots): picked %d, want %d", c.loadB, got, c.want)
		}
	}
	// Factor 0 is off: the hashed host even when overloaded, and load is not consulted.
	called := false
	if got := PickBounded(m, hb, 0, func(int) int64 { called = true; return 1 << 40 }, 0); got != 1 || called {
		t.Errorf("factor 0: picked %d, load called %v; want 1 and not called", got, called)
	}
	// Factors below 1 count as 1 (Envoy's minimum, 100).
	if a, b := PickBounded(m, hb, 0.5, loads(map[int]int64{1: 1}), 0),
		PickBounded(m, hb, 1.0, loads(map[int]int64{1: 1}), 0); a != b {
		t.Errorf("factor 0.5 picked %d, factor 1 picked %d", a, b)
	}
}

// Bounded load over a real Maglev table: with every host but a few overloaded, every pick
// lands on an acceptable host, the same hash always probes the same way, and a large host
// set (beyond the stack buffer) works the same.
func TestBoundedOverMaglevAndRing(t *testing.T) {
	for _, n := range []int{10, 300} {
		hosts := ports("10.2.%d.1:80", 0, n-1, 1)
		mg, err := NewMaglev(hosts, DefaultMaglevTableSize)
		if err != nil {
			t.Fatal(err)
		}
		rg, err := NewRing(hosts, DefaultMinRingSize, GRPCRingSizeCap)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []Walker{mg, rg} {
			l := map[int]int64{}
			for i := range n {
				if i%5 != 0 {
					l[i] = 100 // far above any slot count below
				}
			}
			for k := range 2000 {
				h := KeyHash(fmt.Sprintf("s-%d", k))
				got := PickBounded(w, h, 1.25, loads(l), 10)
				if got%5 != 0 {
					t.Fatalf("n=%d: picked overloaded host %d", n, got)
				}
				if again := PickBounded(w, h, 1.25, loads(l), 10); again != got {
					t.Fatalf("n=%d: same hash picked %d then %d", n, got, again)
				}
			}
		}
	}
}

func TestPickBoundedEmpty(t *testing.T) {
	m, err := NewMaglev(nil, 7)
	if err != nil {
		t.Fatal(err)
	}
	if got := PickBounded(m, 1, 1.5, loads(nil), 0); got != -1 {
		t.Errorf("empty: %d, want -1", got)
	}
}
