package l4xdp

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/stickylb/stickylb/internal/testkit/zonecases"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/policies/zones"
)

// newTestLoader is a loader over freshly loaded maps, attached nowhere: applyWaitLocked builds
// its tables from a pools file whose backends carry their MACs (no neighbour table, no
// health checks), and BPF_PROG_RUN plays the packets.
func newTestLoader(t *testing.T, zone string) *Loader {
	t.Helper()
	fw, err := loadTables(Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fw.Close() })
	return &Loader{cfg: Config{Zone: zone}, log: zap.NewNop(), maps: fw, slots: map[string]uint32{}, vipIDs: map[string]uint32{},
		lastDown: map[string]bool{}, rampFrom: map[string]time.Time{}, rampBuilt: map[string]int{}}
}

func (l *Loader) applyFile(t *testing.T, src string) *pools.File {
	t.Helper()
	f, err := pools.Parse("zones.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.applyWaitLocked(f, resolveWait); err != nil {
		t.Fatal(err)
	}
	l.file = f
	return f
}

// zoneFile: 2 backends in zone a, 8 in zone b (the MAC's last byte is the backend's
// number), all weight 1.
func zoneFile(extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "services:\n  - name: web\n    protocol: tcp\n    vip: 10.0.0.100:80\n%s    backends:\n", extra)
	for i := 1; i <= 10; i++ {
		z := "b"
		if i <= 2 {
			z = "a"
		}
		fmt.Fprintf(&b, "      - {address: 10.0.5.%d:80, zone: %s, mac: \"02:00:00:00:05:%02x\"}\n", i, z, i)
	}
	return b.String()
}

// sendFlows sends n new flows (fixed keys: source 192.0.2.x and port) starting at key first
// through l's program and counts them by backend number (the MAC's last byte).
func sendFlows(t *testing.T, l *Loader, first, n int, into map[int]int) {
	t.Helper()
	for i := first; i < first+n; i++ {
		src := netip.AddrFrom4([4]byte{192, 0, 2, byte(i % 250)})
		sport := uint16(10000 + i/250)
		ret, out := run(t, l.maps.Program(), tcp4(t, src, vip4, sport, 80, "S", nil, nil))
		if ret != xdpTX {
			t.Fatalf("flow %d: action %d", i, ret)
		}
		into[int(net.HardwareAddr(out[:6])[5])]++
	}
}

// The two-zone example: LB nodes in zones a and b take half the flows each; with cross-zone
// balancing on, each of the 10 backends takes 10 %; off, each node keeps to its zone: 25 %
// each on a's 2 backends, 6.25 % each on b's 8. Bounds: 4 sigma of the binomial.
func TestZonesExampleThroughProgram(t *testing.T) {
	const perNode = 4000
	for _, tc := range []struct {
		name  string
		extra string
		share func(backend int) float64
	}{
		{"cross-zone on", "", func(int) float64 { return 0.10 }},
		{"cross-zone off", "    cross_zone: false\n", func(b int) float64 {
			if b <= 2 {
				return 0.25
			}
			return 0.0625
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := map[int]int{}
			for i, zone := range []string{"a", "b"} {
				l := newTestLoader(t, zone)
				l.applyFile(t, zoneFile(tc.extra))
				sendFlows(t, l, i*perNode, perNode, got)
			}
			// policies/zones computes the same shares from the policy (the model the other
			// tiers share); both must hold.
			var zbs []zones.Backend
			for b := 1; b <= 10; b++ {
				z := "b"
				if b <= 2 {
					z = "a"
				}
				zbs = append(zbs, zones.Backend{ID: fmt.Sprint(b), Zone: z, Weight: 1, Healthy: true})
			}
			model := zones.Shares([]zones.Traffic{{Zone: "a", Share: 0.5}, {Zone: "b", Share: 0.5}}, zbs,
				zones.Policy{CrossZone: tc.extra == ""})
			n := float64(2 * perNode)
			for b := 1; b <= 10; b++ {
				p := tc.share(b)
				if math.Abs(model[fmt.Sprint(b)]-p) > 1e-9 {
					t.Fatalf("policies/zones gives backend %d %.4f, the example %.4f", b, model[fmt.Sprint(b)], p)
				}
				sigma := math.Sqrt(n * p * (1 - p))
				if d := math.Abs(float64(got[b]) - n*p); d > 4*sigma {
					t.Errorf("backend %d: %d of %d flows, want %.0f ± %.0f (4 sigma)", b, got[b], int(n), n*p, 4*sigma)
				}
			}
			t.Logf("flows by backend: %v", got)
		})
	}
}

// cross_zone off with the node's zone down, and drained zones as the last resort: the
// rule candidates applies, through the program.
func TestZonesFailoverAndDrainThroughProgram(t *testing.T) {
	l := newTestLoader(t, "a")
	// Zone a drained: new flows go to zone b only.
	l.applyFile(t, zoneFile("    cross_zone: false\n    drained_zones: [a]\n"))
	got := map[int]int{}
	sendFlows(t, l, 0, 400, got)
	if got[1]+got[2] != 0 {
		t.Fatalf("drained zone a took %d of 400 new flows", got[1]+got[2])
	}
	// Every backend of zone b draining: the drained zone is the last resort.
	src := zoneFile("    cross_zone: false\n    drained_zones: [a]\n")
	for i := 3; i <= 10; i++ {
		src = strings.Replace(src, fmt.Sprintf("10.0.5.%d:80, zone: b,", i), fmt.Sprintf("10.0.5.%d:80, zone: b, drain: true,", i), 1)
	}
	l.applyFile(t, src)
	got = map[int]int{}
	sendFlows(t, l, 1000, 400, got)
	if got[1]+got[2] != 400 {
		t.Fatalf("with zone b draining, zone a (drained, the last resort) took %d of 400: %v", got[1]+got[2], got)
	}
}

func TestCandidates(t *testing.T) {
	ms := []member{
		{slot: 1, zone: "a", weight: 100}, {slot: 2, zone: "a", weight: 100, down: true},
		{slot: 3, zone: "b", weight: 100}, {slot: 4, zone: "c", weight: 100, zoneDrained: true},
		{slot: 5, zone: "b", weight: 100, drain: true},
	}
	slots := func(ms []member) string {
		var s []string
		for _, m := range ms {
			s = append(s, fmt.Sprint(m.slot))
		}
		return strings.Join(s, ",")
	}
	for _, tc := range []struct {
		name       string
		ms         []member
		zone       string
		cross      bool
		pick, glob string
		panicking  bool
	}{
		{"cross-zone on", ms, "a", true, "1,3", "1,3", false},
		{"own zone", ms, "a", false, "1", "1,3", false},
		{"a node in no zone of the service", ms, "z", false, "1,3", "1,3", false},
		{"own zone down: the others", []member{ms[1], ms[2], ms[3]}, "a", false, "3", "3", false},
		{"only the drained zone left", []member{ms[1], ms[3], ms[4]}, "a", false, "4", "4", false},
		{"down, and a draining one: panic, never the draining", []member{ms[1], ms[4]}, "a", true, "2", "2", true},
		{"all down, none drained: panic", []member{ms[1]}, "a", false, "2", "2", true},
		{"draining only", []member{ms[4]}, "a", false, "", "", false},
	} {
		pick, glob, p := candidates(tc.ms, tc.zone, tc.cross)
		if slots(pick) != tc.pick || slots(glob) != tc.glob || p != tc.panicking {
			t.Errorf("%s: pick %s global %s panic %v; want %s %s %v", tc.name, slots(pick), slots(glob), p, tc.pick, tc.glob, tc.panicking)
		}
	}
}

// TestCandidatesFollowTheRule: candidates gives, for every case of the zone rule, the
// rule's Local (pick), Fleet (global) and FailOpen (panic).
func TestCandidatesFollowTheRule(t *testing.T) {
	for _, c := range zonecases.Cases {
		var ms []member
		for i, b := range c.Backends {
			ms = append(ms, member{slot: uint32(i + 1), id: b.ID, zone: b.Zone, weight: 100, down: !b.Healthy, drain: b.Drain,
				zoneDrained: slices.Contains(c.Policy.DrainedZones, b.Zone)})
		}
		ids := func(ms []member) []string {
			var out []string
			for _, m := range ms {
				out = append(out, m.id)
			}
			return out
		}
		pick, global, panicking := candidates(ms, c.NodeZone, c.Policy.CrossZone)
		if !slices.Equal(ids(pick), c.Local) || !slices.Equal(ids(global), c.Fleet) || panicking != c.FailOpen {
			t.Errorf("%s: pick %v global %v panic %v; want %v %v %v", c.Name, ids(pick), ids(global), panicking, c.Local, c.Fleet, c.FailOpen)
		}
	}
}
