package chash

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// Golden tables from Envoy's own tests, test/extensions/load_balancing_policies/maglev/
// maglev_lb_test.cc. Envoy's tests look up hash i for i = 0..3*size and expect
// hosts_[expected[i % size]]; that is table slot i, so the expected vectors are the tables.

type maglevGolden struct {
	name       string // Envoy's TEST_F name
	hosts      []Host
	size       uint64
	want       []int // slot -> index into hosts, as Envoy's expected_assignments
	minEntries int   // Envoy's maglev_lb.min_entries_per_host gauge
	maxEntries int   // Envoy's maglev_lb.max_entries_per_host gauge
}

func ports(format string, from, to int, weight uint32) []Host {
	var hs []Host
	for p := from; p <= to; p++ {
		hs = append(hs, Host{ID: fmt.Sprintf(format, p), Weight: weight})
	}
	return hs
}

func maglevGoldens() []maglevGolden {
	return []maglevGolden{
		{
			// Basic, BasicStability, BasicWithRetryHostPredicate: hosts keyed by address.
			name: "Basic", hosts: ports("127.0.0.1:%d", 90, 95, 1), size: 7,
			want: []int{2, 4, 0, 1, 5, 0, 3}, minEntries: 1, maxEntries: 2,
		},
		{
			// BasicWithHostName, BasicWithMetadataHashKey, BasicWithBoundedLoad: keyed by
			// hostname / hash_key "90".."95".
			name: "BasicWithHostName", hosts: ports("%d", 90, 95, 1), size: 7,
			want: []int{2, 5, 0, 3, 4, 1, 0}, minEntries: 1, maxEntries: 2,
		},
		{
			name:  "Weighted",
			hosts: []Host{{ID: "127.0.0.1:90", Weight: 1}, {ID: "127.0.0.1:91", Weight: 2}},
			size:  17,
			want:  []int{1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 0, 1}, minEntries: 6, maxEntries: 11,
		},
		{
			// LocalityWeightedSameLocalityWeights and LocalityWeightedGlobalPanic: two
			// localities of weight 1 with one host each, so both normalize to 0.5 whatever the
			// host weights; equal host weights give the same doubles.
			name:  "LocalityWeightedSameLocalityWeights",
			hosts: []Host{{ID: "127.0.0.1:90", Weight: 1}, {ID: "127.0.0.1:91", Weight: 1}},
			size:  17,
			want:  []int{1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 1}, minEntries: 8, maxEntries: 9,
		},
		{
			// LocalityWeightedDifferentLocalityWeights: localities {:90}, {:92}, {:91} with
			// weights 8, 0, 2. :92's locality has weight 0 and is skipped; :90 normalizes to
			// 1*(8/10)/1 = 0.8 and :91 to 2*(2/10)/2 = 0.2, the same doubles as host weights
			// 4 and 1 give (4/5, 1/5).
			name:  "LocalityWeightedDifferentLocalityWeights",
			hosts: []Host{{ID: "127.0.0.1:90", Weight: 4}, {ID: "127.0.0.1:91", Weight: 1}},
			size:  17,
			want:  []int{1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0}, minEntries: 4, maxEntries: 13,
		},
	}
}

// checkMaglevGoldens returns every disagreement between build and Envoy's golden tables.
func checkMaglevGoldens(build func([]Host, uint64) (*Maglev, error)) []string {
	var bad []string
	for _, g := range maglevGoldens() {
		m, err := build(g.hosts, g.size)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", g.name, err))
			continue
		}
		got := make([]int, g.size)
		counts := make([]int, len(g.hosts))
		// Envoy's tests look up 3*size consecutive hashes; so do we.
		for i := uint64(0); i < 3*g.size; i++ {
			p := m.Pick(i)
			if i < g.size {
				got[i] = p
				counts[p]++
			} else if p != got[i%g.size] {
				bad = append(bad, fmt.Sprintf("%s: hash %d -> %d, slot %d -> %d", g.name, i, p, i%g.size, got[i%g.size]))
			}
		}
		if !slices.Equal(got, g.want) {
			bad = append(bad, fmt.Sprintf("%s: table %v, Envoy %v", g.name, got, g.want))
		}
		if mn, mx := slices.Min(counts), slices.Max(counts); mn != g.minEntries || mx != g.maxEntries {
			bad = append(bad, fmt.Sprintf("%s: entries per host min %d max %d, Envoy min %d max %d",
				g.name, mn, mx, g.minEntries, g.maxEntries))
		}
	}
	return bad
}

func TestMaglevEnvoyGoldenTables(t *testing.T) {
	for _, bad := range checkMaglevGoldens(NewMaglev) {
		t.Error(bad)
	}
}

// BasicStability: Envoy shuffles the host list and expects the same host for every slot.
// Our constructor sorts too, so every permutation of the input must give the golden table,
// mapped through the permutation.
func TestMaglevEnvoyBasicStabilityShuffled(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, g := range maglevGoldens() {
		for trial := 0; trial < 20; trial++ {
			perm := rng.Perm(len(g.hosts))
			shuffled := make([]Host, len(g.hosts))
			for i, p := range perm {
				shuffled[i] = g.hosts[p]
			}
			m, err := NewMaglev(shuffled, g.size)
			if err != nil {
				t.Fatal(err)
			}
			for slot, want := range g.want {
				if got := perm[m.Pick(uint64(slot))]; got != want {
					t.Fatalf("%s perm %v: slot %d -> host %d, Envoy %d", g.name, perm, slot, got, want)
				}
			}
		}
	}
}

// WeightedSingleHost: one host of weight 7 takes every slot.
func TestMaglevEnvoyWeightedSingleHost(t *testing.T) {
	m, err := NewMaglev([]Host{{ID: "127.0.0.1:90", Weight: 7}}, 17)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(0); i < 17; i++ {
		if got := m.Pick(i); got != 0 {
			t.Fatalf("hash %d -> %d, want 0", i, got)
		}
	}
}

// LocalityWeightedLopsided: 1024 hosts "127.0.0.1:0".."127.0.0.1:1023" in a default-size
// table, host :0 alone in a locality of weight 127 and the rest sharing a locality of
// weight 1. Envoy normalizes :0 to 127/128 and every other host to (1/128)/1023; host weights
// 127*1023 and 1 give exactly those doubles (129921/130944 = 127/128 exactly, and 1/130944 is
// the correctly rounded (1/128)/1023). Envoy expects each light host to get exactly one slot
// (every host gets one on the first iteration) and the heavy one the remaining 65537-1023.
func TestMaglevEnvoyLocalityWeightedLopsided(t *testing.T) {
	hosts := ports("127.0.0.1:%d", 0, 1023, 1)
	hosts[0].Weight = 127 * 1023
	m, err := NewMaglev(hosts, DefaultMaglevTableSize)
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, len(hosts))
	for i := uint64(0); i < DefaultMaglevTableSize; i++ {
		counts[m.Pick(i)]++
	}
	if counts[0] != DefaultMaglevTableSize-1023 {
		t.Errorf("heavy host has %d slots, Envoy %d", counts[0], DefaultMaglevTableSize-1023)
	}
	for i := 1; i < len(counts); i++ {
		if counts[i] != 1 {
			t.Fatalf("light host %d has %d slots, Envoy 1", i, counts[i])
		}
	}
}

// The golden tests must be able to fail: each of these one-line changes to Envoy's
// algorithm has to disagree with at least one of Envoy's tables.
func TestMaglevGoldenTablesCatchVariants(t *testing.T) {
	variants := map[string]maglevVariant{
		"skip from seed 0":     {skipSeed0: true},
		"offset and skip swap": {swapOffsetSkip: true},
	}
	for name, v := range variants {
		bad := checkMaglevGoldens(func(h []Host, size uint64) (*Maglev, error) { return newMaglev(h, size, v) })
		if len(bad) == 0 {
			t.Errorf("variant %q agrees with every Envoy golden table; the golden test could not catch it", name)
		} else {
			t.Logf("variant %q: %d disagreements, first: %s", name, len(bad), bad[0])
		}
	}
	// Dropping the sort is caught by BasicStability: some permutation of the golden hosts
	// must then give another table.
	g := maglevGoldens()[0]
	caught := false
	for p := range 50 {
		perm := rand.New(rand.NewPCG(uint64(p), 7)).Perm(len(g.hosts))
		shuffled := make([]Host, len(g.hosts))
		for i, q := range perm {
			shuffled[i] = g.hosts[q]
		}
		m, err := newMaglev(shuffled, g.size, maglevVariant{unsorted: true})
		if err != nil {
			t.Fatal(err)
		}
		for slot, want := range g.want {
			if perm[m.Pick(uint64(slot))] != want {
				caught = true
			}
		}
	}
	if !caught {
		t.Error("building in caller order agreed with Envoy for 50 permutations; BasicStability could not catch it")
	}
}

// Envoy does not reject more hosts than table slots: its fill loop stops when the table is
// full, so on the first iteration the first tableSize hosts in identity order take one slot
// each and the others get none (silently no traffic). We reject that configuration; the
// unvalidated build shows what Envoy would do.
func TestMaglevMoreHostsThanSlots(t *testing.T) {
	hosts := ports("10.0.0.%d:80", 1, 10, 1)
	if _, err := NewMaglev(hosts, 7); err == nil {
		t.Fatal("NewMaglev accepted 10 hosts in a 7-slot table")
	}
	m, err := newMaglev(hosts, 7, maglevVariant{noValidate: true})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(hosts))
	for i, h := range hosts {
		ids[i] = h.ID
	}
	slices.Sort(ids)
	got := map[string]int{}
	for _, i := range m.Table() {
		got[hosts[i].ID]++
	}
	for k, id := range ids {
		want := 0
		if k < 7 {
			want = 1
		}
		if got[id] != want {
			t.Errorf("host %s (identity position %d) has %d slots, Envoy's fill gives %d", id, k, got[id], want)
		}
	}
	// Exactly as many hosts as slots is valid: one slot each.
	if _, err := NewMaglev(hosts[:7], 7); err != nil {
		t.Errorf("7 hosts in 7 slots: %v", err)
	}
}
