package chash

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestFastModMatchesRemainder(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	divisors := []uint64{1, 2, 3, 7, 17, 1009, 65535, 65536, DefaultMaglevTableSize, 655373, MaxMaglevTableSize,
		1 << 31, math.MaxInt32, math.MaxUint32}
	for range 200 {
		divisors = append(divisors, 2+rng.Uint64N(1<<32))
	}
	for _, d := range divisors {
		f := newFastMod(d)
		probe := []uint64{0, 1, d - 1, d, d + 1, math.MaxUint64, math.MaxUint64 - 1, math.MaxUint64 / d * d}
		for range 2000 {
			probe = append(probe, rng.Uint64())
		}
		for _, a := range probe {
			if got, want := f.mod(a), a%d; got != want {
				t.Fatalf("%d mod %d = %d, fastMod %d", a, d, want, got)
			}
		}
	}
}
