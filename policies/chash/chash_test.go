package chash

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
)

// XXH64 reference values (seed 0) from the xxHash specification's test vectors.
func TestKeyHashIsXXH64Seed0(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
	}{
		{"", 0xef46db3751d8e999},
		{"a", 0xd24ec4f1a98c6e5b},
		{"abc", 0x44bc2cf5ad770999},
	} {
		if got := KeyHash(c.in); got != c.want {
			t.Errorf("KeyHash(%q) = %#x, want %#x", c.in, got, c.want)
		}
	}
}

func TestEmptyHostSet(t *testing.T) {
	m, err := NewMaglev(nil, DefaultMaglevTableSize)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRing([]Host{}, DefaultMinRingSize, DefaultMaxRingSize)
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]Picker{"maglev": m, "ring": r, "modn": NewModN(nil)} {
		if p.Len() != 0 {
			t.Errorf("%s: Len %d", name, p.Len())
		}
		for _, h := range []uint64{0, 1, math.MaxUint64} {
			if got := p.Pick(h); got != -1 {
				t.Errorf("%s: Pick(%d) = %d, want -1", name, h, got)
			}
		}
	}
	if len(m.Table()) != 0 || r.Size() != 0 {
		t.Errorf("empty: table %d slots, ring %d points", len(m.Table()), r.Size())
	}
}

func TestOneHost(t *testing.T) {
	hosts := []Host{{ID: "10.0.0.1:80", Weight: 5}}
	m, err := NewMaglev(hosts, 7)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRing(hosts, 3, 3)
	if err != nil {
		t.Fatal(err)
	}
	if r.Size() != 3 {
		t.Errorf("ring of one host, min=max=3: %d points", r.Size())
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for name, p := range map[string]Picker{"maglev": m, "ring": r, "modn": NewModN(hosts)} {
		for range 1000 {
			if h := rng.Uint64(); p.Pick(h) != 0 {
				t.Fatalf("%s: Pick(%d) = %d", name, h, p.Pick(h))
			}
		}
	}
}

// Weight 0 is rejected, not excluded: Envoy's EDS validation rejects load_balancing_weight 0
// (gRPC outside xDS would read it as 1), so there is no behaviour to be compatible with, and
// silently dropping a configured backend would hide a mistake.
func TestHostValidation(t *testing.T) {
	builders := map[string]func([]Host) error{
		"maglev": func(h []Host) error { _, err := NewMaglev(h, 7); return err },
		"ring":   func(h []Host) error { _, err := NewRing(h, 16, 16); return err },
	}
	cases := []struct {
		name  string
		hosts []Host
		want  error
	}{
		{"zero weight", []Host{{ID: "a", Weight: 1}, {ID: "b", Weight: 0}}, ErrZeroWeight},
		{"duplicate id", []Host{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}, {ID: "a", Weight: 2}}, ErrDuplicateID},
		{"empty id", []Host{{ID: "", Weight: 1}}, ErrNoHostID},
		{"weight sum", []Host{{ID: "a", Weight: math.MaxUint32}, {ID: "b", Weight: 1}}, ErrWeightSum},
	}
	for bname, build := range builders {
		for _, c := range cases {
			err := build(c.hosts)
			if !errors.Is(err, c.want) {
				t.Errorf("%s/%s: err %v, want %v", bname, c.name, err, c.want)
			}
		}
		// The largest valid sum.
		if err := build([]Host{{ID: "a", Weight: math.MaxUint32 - 1}, {ID: "b", Weight: 1}}); err != nil {
			t.Errorf("%s: sum of exactly MaxUint32 rejected: %v", bname, err)
		}
	}
}

func TestMaglevTableSizeValidation(t *testing.T) {
	hosts := ports("10.0.0.%d:80", 1, 3, 1)
	for _, size := range []uint64{0, 1, 4, 8, 9, 65535, 65536, 1 << 20, 5000010} {
		if _, err := NewMaglev(hosts, size); err == nil {
			t.Errorf("table size %d accepted; Envoy requires a prime", size)
		}
	}
	for _, size := range []uint64{3, 7, 17, 251, DefaultMaglevTableSize, MaxMaglevTableSize} {
		m, err := NewMaglev(hosts, size)
		if err != nil {
			t.Errorf("prime table size %d rejected: %v", size, err)
			continue
		}
		if uint64(len(m.Table())) != size {
			t.Errorf("table size %d: %d slots", size, len(m.Table()))
		}
	}
	if !IsPrime(MaxMaglevTableSize) {
		t.Fatal("Envoy's limit 5000011 is prime; IsPrime disagrees")
	}
	if _, err := NewMaglev(hosts, 5000077); err == nil { // prime, above Envoy's limit
		t.Error("prime table size above 5000011 accepted; Envoy rejects it")
	}
	// Size 2 is prime and the smallest possible: skip = h % 1 + 1 = 1.
	if _, err := NewMaglev(hosts[:2], 2); err != nil {
		t.Errorf("table size 2: %v", err)
	}
	if _, err := NewMaglev(hosts, 2); err == nil {
		t.Error("3 hosts in 2 slots accepted")
	}
}

func TestRingSizeValidation(t *testing.T) {
	hosts := ports("10.0.0.%d:80", 1, 3, 1)
	for _, c := range [][2]uint64{{0, 10}, {10, 0}, {20, 10}, {1, MaxRingSize + 1}, {MaxRingSize + 1, MaxRingSize + 1}} {
		if _, err := NewRing(hosts, c[0], c[1]); err == nil {
			t.Errorf("ring sizes min %d max %d accepted", c[0], c[1])
		}
	}
	if _, err := NewRing(hosts, 20, 10); err == nil || err.Error() != "building ring: minimum_ring_size (20) > maximum_ring_size (10)" {
		t.Errorf("min > max: %v", err)
	}
	for _, c := range [][2]uint64{{1, 1}, {10, 10}, {DefaultMinRingSize, GRPCRingSizeCap}, {1, MaxRingSize}} {
		if _, err := NewRing(hosts[:1], c[0], c[1]); err != nil {
			t.Errorf("ring sizes min %d max %d rejected: %v", c[0], c[1], err)
		}
	}
}

func TestIsPrime(t *testing.T) {
	const n = 200000
	sieve := make([]bool, n) // true = composite
	for i := 2; i*i < n; i++ {
		if !sieve[i] {
			for j := i * i; j < n; j += i {
				sieve[j] = true
			}
		}
	}
	for i := uint64(0); i < n; i++ {
		want := i >= 2 && !sieve[i]
		if IsPrime(i) != want {
			t.Fatalf("IsPrime(%d) = %v", i, !want)
		}
	}
	for _, c := range []struct {
		n     uint64
		prime bool
	}{
		{3215031751, false},          // strong pseudoprime to bases 2, 3, 5, 7
		{3825123056546413051, false}, // strong pseudoprime to bases 2..23
		{561, false},                 // Carmichael number
		{1<<61 - 1, true},
		{math.MaxUint64, false},
		{18446744073709551557, true}, // largest prime below 2^64
		{4294967291 * 4294967279, false},
	} {
		if got := IsPrime(c.n); got != c.prime {
			t.Errorf("IsPrime(%d) = %v, want %v", c.n, got, c.prime)
		}
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for range 2000 {
		v := rng.Uint64() | 1
		if got, want := IsPrime(v), new(big.Int).SetUint64(v).ProbablyPrime(0); got != want {
			t.Fatalf("IsPrime(%d) = %v, math/big (exact below 2^64) says %v", v, got, want)
		}
	}
}

// Shuffled input must give the same backend for every hash, by ID: the constructors sort.
func TestOrderIndependence(t *testing.T) {
	var hosts []Host
	for i := range 20 {
		hosts = append(hosts, Host{ID: fmt.Sprintf("backend-%02d", i), Weight: uint32(1 + i%4)})
	}
	type build func([]Host) Picker
	builders := map[string]build{
		"maglev": func(h []Host) Picker { m, _ := NewMaglev(h, 1009); return m },
		"ring":   func(h []Host) Picker { r, _ := NewRing(h, 100, 100); return r }, // fractional counts: order-sensitive if unsorted
		"modn":   func(h []Host) Picker { return NewModN(h) },
	}
	rng := rand.New(rand.NewPCG(9, 10))
	probes := make([]uint64, 5000)
	for i := range probes {
		probes[i] = rng.Uint64()
	}
	for name, b := range builders {
		ref := b(hosts)
		for trial := range 10 {
			shuffled := slices.Clone(hosts)
			rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			p := b(shuffled)
			for _, h := range probes {
				if a, b := hosts[ref.Pick(h)].ID, shuffled[p.Pick(h)].ID; a != b {
					t.Fatalf("%s trial %d: hash %d -> %s, shuffled input -> %s", name, trial, h, a, b)
				}
			}
		}
	}
}

// Table() is what the XDP loader installs: one entry per slot, each a valid caller index,
// Pick(h) == table[h % size], slot shares following the weights, and a copy the caller may
// keep or modify.
func TestMaglevTableForXDP(t *testing.T) {
	hosts := []Host{{ID: "10.0.2.3:443", Weight: 1}, {ID: "10.0.2.1:443", Weight: 2}, {ID: "10.0.2.2:443", Weight: 1}}
	m, err := NewMaglev(hosts, 1009)
	if err != nil {
		t.Fatal(err)
	}
	tab := m.Table()
	if len(tab) != 1009 {
		t.Fatalf("table has %d slots", len(tab))
	}
	counts := make([]int, len(hosts))
	for slot, i := range tab {
		if i < 0 || int(i) >= len(hosts) {
			t.Fatalf("slot %d holds %d", slot, i)
		}
		counts[i]++
	}
	rng := rand.New(rand.NewPCG(11, 12))
	for range 10000 {
		h := rng.Uint64()
		if got, want := m.Pick(h), int(tab[h%1009]); got != want {
			t.Fatalf("Pick(%d) = %d, table says %d", h, got, want)
		}
	}
	// Weight 2 of 4 -> half the slots; the fill gives the heavy host a slot every iteration
	// and the light ones every other, so shares are exact to one slot per host.
	if d := counts[1] - 1009/2; d < -1 || d > 1 {
		t.Errorf("weight-2 host has %d of 1009 slots, want 504 or 505 (counts %v)", counts[1], counts)
	}
	tab[0] = 99
	if m.Table()[0] == 99 || m.Pick(0) == 99 {
		t.Error("modifying the returned table changed the Maglev")
	}
}

// Pick must not allocate: it runs once per request (and bounded load on its fast path).
func TestPickDoesNotAllocate(t *testing.T) {
	hosts := ports("10.3.0.%d:80", 1, 50, 1)
	m, _ := NewMaglev(hosts, DefaultMaglevTableSize)
	r, _ := NewRing(hosts, DefaultMinRingSize, GRPCRingSizeCap)
	mod := NewModN(hosts)
	hot := func(i int) int64 { return 1000 } // every host overloaded: the slow path too
	cold := func(i int) int64 { return 0 }
	var h uint64 = 12345
	for name, f := range map[string]func(){
		"maglev":         func() { h = h*6364136223846793005 + 1; _ = m.Pick(h) },
		"ring":           func() { h = h*6364136223846793005 + 1; _ = r.Pick(h) },
		"modn":           func() { h = h*6364136223846793005 + 1; _ = mod.Pick(h) },
		"bounded/fast":   func() { h = h*6364136223846793005 + 1; _ = PickBounded(m, h, 1.25, cold, 10) },
		"bounded/probe":  func() { h = h*6364136223846793005 + 1; _ = PickBounded(r, h, 1.25, hot, 10) },
		"keyhash+maglev": func() { _ = m.Pick(KeyHash("session-1234567")) },
		"keyhash+ring":   func() { _ = r.Pick(KeyHash("session-1234567")) },
	} {
		if a := testing.AllocsPerRun(200, f); a != 0 {
			t.Errorf("%s: %v allocations per pick", name, a)
		}
	}
}
