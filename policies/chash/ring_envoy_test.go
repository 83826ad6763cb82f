package chash

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// Golden rings from Envoy's own tests, test/extensions/load_balancing_policies/ring_hash/
// ring_hash_lb_test.cc. Envoy's comments list every ring point with its host; its
// assertions give lookups and histograms. Default maximum_ring_size there is 8M.

type ringPoint struct {
	hash uint64
	host int // index into the test's hosts
}

type ringGolden struct {
	name     string
	hosts    []Host
	min, max uint64
	points   []ringPoint       // the whole ring, ascending (from Envoy's comments)
	lookups  map[uint64]int    // hash -> host (Envoy's assertions)
	minPer   int               // min_hashes_per_host
	maxPer   int               // max_hashes_per_host
	size     int               // ring_hash_lb.size
	spread   *ringSpreadGolden // histogram assertions
	unsorted bool              // Envoy's host order is not identity order; see the test
}

// ringSpreadGolden is Envoy's histogram: n hashes i*(MaxUint64/n), and the hits per host.
type ringSpreadGolden struct {
	n      uint64
	counts []int
}

func ringGoldens() []ringGolden {
	six := ports("127.0.0.1:%d", 90, 95, 1)
	return []ringGolden{
		{
			// Basic (and BasicWithRetryHostPredicate, the same ring).
			name: "Basic", hosts: six, min: 12, max: MaxRingSize, size: 12, minPer: 2, maxPer: 2,
			points: []ringPoint{
				{833437586790550860, 4}, {928266305478181108, 2}, {1033482794131418490, 0},
				{3551244743356806947, 5}, {3851675632748031481, 3}, {5583722120771150861, 1},
				{6311230543546372928, 1}, {7700377290971790572, 3}, {13144177310400110813, 5},
				{13444792449719432967, 2}, {15516499411664133160, 4}, {16117243373044804889, 0},
			},
			lookups: map[uint64]int{
				0: 4, math.MaxUint64: 4, 3551244743356806947: 5, 3551244743356806948: 3,
				16117243373044804880: 0, // Envoy feeds this as the random hash
			},
		},
		{
			// BasicWithHostname, BasicWithMetadataHashKey, BasicWithDoundedLoad.
			name: "BasicWithHostname", hosts: ports("%d", 90, 95, 1), min: 12, max: MaxRingSize,
			size: 12, minPer: 2, maxPer: 2,
			points: []ringPoint{
				{1975508444536362413, 5}, {2376063919839173711, 5}, {2386806903309390596, 3},
				{6749904478991551885, 4}, {6803900775736438537, 3}, {7225015537174310577, 2},
				{8787465352164086522, 0}, {11282020843382717940, 2}, {13723418369486627818, 1},
				{13776502110861797421, 0}, {14338313586354474791, 1}, {15364271037087512980, 4},
			},
			lookups: map[uint64]int{0: 5, math.MaxUint64: 5, 7225015537174310577: 2, 6803900775736438537: 3},
		},
		{
			// UnevenHosts, first host set: 2 hosts, minimum 3 -> 2 hashes each, ring of 4.
			name: "UnevenHosts", hosts: ports("127.0.0.1:%d", 80, 81, 1), min: 3, max: MaxRingSize,
			size: 4, minPer: 2, maxPer: 2,
			points: []ringPoint{
				{5454692015285649509, 0}, {7859399908942313493, 1},
				{13838424394637650569, 0}, {16064866803292627174, 1},
			},
			lookups: map[uint64]int{0: 0},
		},
		{
			// UnevenHosts, second host set: :81 keeps its points when :80 leaves.
			name: "UnevenHostsReplaced", hosts: ports("127.0.0.1:%d", 81, 82, 1), min: 3, max: MaxRingSize,
			size: 4, minPer: 2, maxPer: 2,
			points: []ringPoint{
				{7859399908942313493, 0}, {8241336090459785962, 1},
				{12882406409176325258, 1}, {16064866803292627174, 0},
			},
			lookups: map[uint64]int{0: 0},
		},
		{
			// HostWeightedTinyRing (and LocalityWeightedTinyRing: localities 1,2,3,0 with one
			// host each normalize to the same 1/6, 2/6, 3/6).
			name: "HostWeightedTinyRing",
			hosts: []Host{
				{ID: "127.0.0.1:90", Weight: 1}, {ID: "127.0.0.1:91", Weight: 2}, {ID: "127.0.0.1:92", Weight: 3},
			},
			min: 6, max: 6, size: 6, minPer: 1, maxPer: 3,
			lookups: map[uint64]int{
				928266305478181108: 2, 4443673547860492590: 2, 5583722120771150861: 1,
				6311230543546372928: 1, 13444792449719432967: 2, 16117243373044804889: 0,
			},
		},
		{
			// HostWeightedLargeRing (and LocalityWeightedLargeRing).
			name: "HostWeightedLargeRing",
			hosts: []Host{
				{ID: "127.0.0.1:90", Weight: 1}, {ID: "127.0.0.1:91", Weight: 2}, {ID: "127.0.0.1:92", Weight: 3},
			},
			min: 6144, max: MaxRingSize, size: 6144, minPer: 1024, maxPer: 3072,
			spread: &ringSpreadGolden{n: 6000, counts: []int{987, 1932, 3081}},
		},
		{
			// HostAndLocalityWeightedTinyRing: :90,:91 (weights 1,2) in a locality of weight 1,
			// :92,:93 (1,2) in one of weight 2. Envoy normalizes to 1/9, 2/9, 2/9, 4/9 through
			// the locality weights; host weights 1,2,2,4 give the same doubles here (the golden
			// would catch an ulp that moved an entry).
			name: "HostAndLocalityWeightedTinyRing", hosts: weightedHosts(90, 1, 2, 2, 4),
			min: 9, max: 9, size: 9, minPer: 1, maxPer: 4,
			lookups: map[uint64]int{
				928266305478181108: 2, 3851675632748031481: 3, 5583722120771150861: 1,
				6311230543546372928: 1, 7700377290971790572: 3, 12559126875973811811: 3,
				13444792449719432967: 2, 13784988426630141778: 3, 16117243373044804889: 0,
			},
		},
		{
			// HostAndLocalityWeightedLargeRing.
			name: "HostAndLocalityWeightedLargeRing", hosts: weightedHosts(90, 1, 2, 2, 4),
			min: 9216, max: MaxRingSize, size: 9216, minPer: 1024, maxPer: 4096,
			spread: &ringSpreadGolden{n: 9000, counts: []int{924, 2009, 2053, 4014}},
		},
		{
			// SmallFractionalScale: 4 hosts, exactly 2 points: two hosts get none.
			name: "SmallFractionalScale", hosts: ports("127.0.0.1:%d", 90, 93, 1), min: 2, max: 2,
			size: 2, minPer: 0, maxPer: 1,
		},
		{
			// LargeFractionalScale: 2 hosts, exactly 1023 points: 511 and 512.
			name: "LargeFractionalScale", hosts: ports("127.0.0.1:%d", 90, 91, 1), min: 1023, max: 1023,
			size: 1023, minPer: 511, maxPer: 512,
			spread: &ringSpreadGolden{n: 1023, counts: []int{526, 497}},
		},
		lopsidedGolden(),
	}
}

// lopsidedGolden is LopsidedWeightSmallScale: 1024 hosts "127.0.0.1:0".."127.0.0.1:1023", :0
// alone in a locality of weight 127, the others in one of weight 1, a ring of exactly 1024.
// Host weights 127*1023 and 1 give Envoy's normalized doubles exactly (see the Maglev
// lopsided test). Envoy expects :0 to own 1016 points and every 128th light host one.
//
// Envoy walks its hosts in EDS order (numeric here), not sorted: "127.0.0.1:10" comes after
// "127.0.0.1:9" for Envoy but right after "127.0.0.1:1" in identity order, and with
// fractional counts the order decides which light hosts get a point. This golden therefore
// runs on the unsorted build, which is Envoy's walk of the caller's order; it is why our xDS
// server must emit EDS sorted by identity.
func lopsidedGolden() ringGolden {
	hosts := ports("127.0.0.1:%d", 0, 1023, 1)
	hosts[0].Weight = 127 * 1023
	return ringGolden{
		name: "LopsidedWeightSmallScale", hosts: hosts, min: 1024, max: 1024, size: 1024,
		minPer: 0, maxPer: 1016, unsorted: true,
		lookups: map[uint64]int{
			11664790346325243808: 1, 15894554872961148518: 128, 13958138884277627155: 256,
			15803774069438192949: 384, 3829253010855396576: 512, 17918147347826565154: 640,
			6442769608292299103: 768, 5881074926069334434: 896,
		},
	}
}

// weightedHosts returns hosts "127.0.0.1:<port>", "127.0.0.1:<port+1>", ... with weights.
func weightedHosts(port int, weights ...uint32) []Host {
	hs := make([]Host, len(weights))
	for i, w := range weights {
		hs[i] = Host{ID: fmt.Sprintf("127.0.0.1:%d", port+i), Weight: w}
	}
	return hs
}

// checkRingGoldens returns every disagreement between build and Envoy's golden rings.
func checkRingGoldens(build func(g ringGolden) (*Ring, error)) []string {
	var bad []string
	for _, g := range ringGoldens() {
		r, err := build(g)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", g.name, err))
			continue
		}
		if r.Size() != g.size {
			bad = append(bad, fmt.Sprintf("%s: ring size %d, Envoy %d", g.name, r.Size(), g.size))
		}
		per := make([]int, len(g.hosts))
		for _, o := range r.owner {
			per[o]++
		}
		mn, mx := per[0], per[0]
		for _, c := range per {
			mn, mx = min(mn, c), max(mx, c)
		}
		if mn != g.minPer || mx != g.maxPer {
			bad = append(bad, fmt.Sprintf("%s: hashes per host min %d max %d, Envoy min %d max %d",
				g.name, mn, mx, g.minPer, g.maxPer))
		}
		if g.points != nil {
			if len(g.points) != r.Size() {
				bad = append(bad, fmt.Sprintf("%s: %d points, Envoy %d", g.name, r.Size(), len(g.points)))
			} else {
				for i, p := range g.points {
					if r.hashes[i] != p.hash || int(r.owner[i]) != p.host {
						bad = append(bad, fmt.Sprintf("%s: point %d = (%d, host %d), Envoy (%d, host %d)",
							g.name, i, r.hashes[i], r.owner[i], p.hash, p.host))
					}
				}
			}
		}
		for h, want := range g.lookups {
			if got := r.Pick(h); got != want {
				bad = append(bad, fmt.Sprintf("%s: Pick(%d) = %d, Envoy %d", g.name, h, got, want))
			}
		}
		if s := g.spread; s != nil {
			counts := make([]int, len(g.hosts))
			for i := uint64(0); i < s.n; i++ {
				counts[r.Pick(i*(math.MaxUint64/s.n))]++
			}
			for i, want := range s.counts {
				if counts[i] != want {
					bad = append(bad, fmt.Sprintf("%s: host %d got %d of %d hashes, Envoy %d",
						g.name, i, counts[i], s.n, want))
				}
			}
		}
		if g.name == "SmallFractionalScale" {
			// Envoy: of 1024 spread hashes, exactly two hosts get none and two get all.
			counts := make([]int, len(g.hosts))
			for i := uint64(0); i < 1024; i++ {
				counts[r.Pick(i*(math.MaxUint64/1024))]++
			}
			zeroes := 0
			for _, c := range counts {
				if c == 0 {
					zeroes++
				}
			}
			if zeroes != 2 {
				bad = append(bad, fmt.Sprintf("%s: %d hosts without traffic, Envoy 2 (%v)", g.name, zeroes, counts))
			}
		}
	}
	return bad
}

func TestRingEnvoyGoldenRings(t *testing.T) {
	bad := checkRingGoldens(func(g ringGolden) (*Ring, error) {
		return newRing(g.hosts, g.min, g.max, ringVariant{unsorted: g.unsorted})
	})
	for _, b := range bad {
		t.Error(b)
	}
}

// The lopsided golden needs Envoy's EDS order; the sorted build must give a ring that is
// just as valid (1016 points for :0, 8 single-point light hosts) but other light hosts.
// This pins down that our sort is a real choice, made for gRPC agreement, not a no-op.
func TestRingEnvoyLopsidedSortedDiffersOnlyInWhichLightHosts(t *testing.T) {
	g := lopsidedGolden()
	r, err := NewRing(g.hosts, g.min, g.max)
	if err != nil {
		t.Fatal(err)
	}
	per := make([]int, len(g.hosts))
	for _, o := range r.owner {
		per[o]++
	}
	light := 0
	for _, c := range per[1:] {
		light += c
	}
	if per[0] != 1016 || light != 8 {
		t.Errorf("sorted build: heavy host %d points, light hosts %d points; want 1016 and 8", per[0], light)
	}
	mismatch := 0
	for h, want := range g.lookups {
		if r.Pick(h) != want {
			mismatch++
		}
	}
	if mismatch == 0 {
		t.Error("sorted build agrees with Envoy's EDS-order golden; expected the walk order to matter")
	}
}

// The ring goldens must be able to fail: a changed key format or first entry number has to
// disagree with Envoy's rings. (Dropping the sort is caught by the grpc-go comparison and by
// the lopsided test above.)
func TestRingGoldenRingsCatchVariants(t *testing.T) {
	variants := map[string]ringVariant{
		`key "ID-i"`:     {sep: "-"},
		"entries from 1": {firstIdx: 1},
	}
	for name, v := range variants {
		bad := checkRingGoldens(func(g ringGolden) (*Ring, error) {
			vv := v
			vv.unsorted = g.unsorted
			return newRing(g.hosts, g.min, g.max, vv)
		})
		if len(bad) == 0 {
			t.Errorf("variant %q agrees with every Envoy golden ring; the golden test could not catch it", name)
		} else {
			t.Logf("variant %q: %d disagreements, first: %s", name, len(bad), bad[0])
		}
	}
}

// ketamaPick is Envoy's RingHashLoadBalancer::Ring::chooseHost, transcribed literally
// (signed lowp/highp/midp, as its comment insists) to check that our binary search returns
// the same point for every hash, including 0, the largest hash, exact points and neighbours.
func ketamaPick(ring []uint64, h uint64) int {
	lowp, highp := int64(0), int64(len(ring))
	var midp int64
	for {
		midp = (lowp + highp) / 2
		if midp == int64(len(ring)) {
			return 0
		}
		midval := ring[midp]
		midval1 := uint64(0)
		if midp != 0 {
			midval1 = ring[midp-1]
		}
		if h <= midval && h > midval1 {
			return int(midp)
		}
		if midval < h {
			lowp = midp + 1
		} else {
			highp = midp - 1
		}
		if lowp > highp {
			return 0
		}
	}
}

func TestRingPickMatchesEnvoyKetama(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 2, 3, 7, 100} {
		for _, size := range []uint64{1, 2, 5, 12, 1000, 4096} {
			if uint64(n) > size*4 {
				continue
			}
			r, err := NewRing(ports("10.1.0.%d:443", 1, n, 1), size, size)
			if err != nil {
				t.Fatal(err)
			}
			if r.Size() == 0 {
				continue
			}
			probe := []uint64{0, 1, math.MaxUint64, math.MaxUint64 - 1}
			for _, p := range r.hashes {
				probe = append(probe, p, p-1, p+1)
			}
			for range 2000 {
				probe = append(probe, rng.Uint64())
			}
			for _, h := range probe {
				want := int(r.owner[ketamaPick(r.hashes, h)])
				if got := r.Pick(h); got != want {
					t.Fatalf("n=%d size=%d: Pick(%d) = %d, ketama %d", n, size, h, got, want)
				}
			}
		}
	}
}
