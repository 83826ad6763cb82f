package chash

import "math/bits"

// fastMod computes a % d for a fixed d without a division instruction (Lemire, Kaser and
// Kurz, "Faster Remainder by Direct Computation", 2019). Pick runs once per request, and on
// the Skylake-era cores still common in fleets a 64-bit DIV has 35-90 cycles of latency,
// several times the rest of a Maglev lookup; three multiplications cost a few. (On recent
// cores with a fast divider the two are about even.) With c = ceil(2^128/d), the
// remainder is the high 128 bits of (c*a mod 2^128) * d; that is exact whenever
// 128 >= 64 + log2(d), so for every 64-bit a and every d >= 2 used here (table sizes are at
// most 5000011, host counts at most 2^31).
type fastMod struct {
	chi, clo uint64 // c = ceil(2^128 / d)
	d        uint64
}

func newFastMod(d uint64) fastMod {
	if d < 2 {
		return fastMod{d: d} // mod handles 0 and 1 itself
	}
	// c = floor((2^128 - 1) / d) + 1, which is ceil(2^128/d) for every d >= 2.
	qhi, r := bits.Div64(0, ^uint64(0), d)
	qlo, _ := bits.Div64(r, ^uint64(0), d)
	clo, carry := bits.Add64(qlo, 1, 0)
	return fastMod{chi: qhi + carry, clo: clo, d: d}
}

func (f fastMod) mod(a uint64) uint64 {
	if f.d < 2 {
		return 0
	}
	// low = c*a mod 2^128.
	phi, lowLo := bits.Mul64(f.clo, a)
	lowHi := phi + f.chi*a
	// (low * d) >> 128.
	h1, _ := bits.Mul64(lowLo, f.d)
	h2, l2 := bits.Mul64(lowHi, f.d)
	_, carry := bits.Add64(h1, l2, 0)
	return h2 + carry
}
