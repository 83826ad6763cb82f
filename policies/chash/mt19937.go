package chash

// mt19937 is the 32-bit Mersenne Twister of C++'s std::mt19937. Envoy's bounded load seeds
// one with the request hash to shuffle the hosts it probes; to probe the same hosts in the
// same order, we need the same generator, bit for bit.
type mt19937 struct {
	state [624]uint32
	i     int
}

// seed is std::mt19937(value): the standard reduces the seed modulo 2^32, so Envoy's 64-bit
// hash contributes only its low 32 bits.
func (m *mt19937) seed(v uint32) {
	m.state[0] = v
	for i := 1; i < len(m.state); i++ {
		p := m.state[i-1]
		m.state[i] = 1812433253*(p^(p>>30)) + uint32(i)
	}
	m.i = len(m.state)
}

func (m *mt19937) twist() {
	const n, k = 624, 397
	for i := 0; i < n; i++ {
		y := m.state[i]&0x80000000 | m.state[(i+1)%n]&0x7fffffff
		v := m.state[(i+k)%n] ^ y>>1
		if y&1 != 0 {
			v ^= 0x9908b0df
		}
		m.state[i] = v
	}
	m.i = 0
}

func (m *mt19937) next() uint32 {
	if m.i >= len(m.state) {
		m.twist()
	}
	y := m.state[m.i]
	m.i++
	y ^= y >> 11
	y ^= y << 7 & 0x9d2c5680
	y ^= y << 15 & 0xefc60000
	y ^= y >> 18
	return y
}

// uniform is Envoy's uniform_int lambda: a value in [0, k) by division and rejection, not
// std::uniform_int_distribution, whose algorithm differs between standard libraries.
func (m *mt19937) uniform(k uint32) uint32 {
	x := k
	for x >= k {
		x = uint32(uint64(m.next()) / ((uint64(^uint32(0)) + 1) / uint64(k)))
	}
	return x
}
