package health

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// step applies a string of results ('S' success, 'F' failure) one second
// apart and returns the transitions as "index:from->to".
func step(m *machine, seq string, h, u int) []string {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	var out []string
	for i, r := range seq {
		ok := r == 'S'
		at := t0.Add(time.Duration(i) * time.Second)
		if changed, from := m.observe(ok, at, string(r), h, u); changed {
			out = append(out, fmt.Sprintf("%d:%v->%v", i, from, m.state))
			if !m.since.Equal(at) || m.reason != string(r) {
				out = append(out, fmt.Sprintf("bad since/reason %v %q", m.since, m.reason))
			}
		}
	}
	return out
}

func TestMachineThresholds(t *testing.T) {
	cases := []struct {
		name string
		h, u int
		seq  string
		want string
	}{
		{"first success decides", 2, 3, "S", "0:unknown->healthy"},
		{"first failure decides", 2, 3, "F", "0:unknown->unhealthy"},
		{"healthy needs U failures in a row", 2, 3, "SFFF", "0:unknown->healthy 3:healthy->unhealthy"},
		{"a success resets the failure run", 2, 3, "SFFSFFSFF", "0:unknown->healthy"},
		{"flapping never goes down", 2, 3, "SFSFSFSFSF", "0:unknown->healthy"},
		{"unhealthy needs H successes in a row", 2, 3, "FSS", "0:unknown->unhealthy 2:unhealthy->healthy"},
		{"flapping never comes up", 2, 3, "FSFSFSFS", "0:unknown->unhealthy"},
		{"full cycle", 2, 3, "SFFFSSFFF", "0:unknown->healthy 3:healthy->unhealthy 5:unhealthy->healthy 8:healthy->unhealthy"},
		{"long failure runs count once", 2, 3, "SFFFFFFFSSS", "0:unknown->healthy 3:healthy->unhealthy 9:unhealthy->healthy"},
		{"thresholds of one follow every result", 1, 1, "SFSF", "0:unknown->healthy 1:healthy->unhealthy 2:unhealthy->healthy 3:healthy->unhealthy"},
		{"high thresholds", 5, 4, "SFFFSFFFF" + "SSSSFSSSSS", "0:unknown->healthy 8:healthy->unhealthy 18:unhealthy->healthy"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var m machine
			got := strings.Join(step(&m, tc.seq, tc.h, tc.u), " ")
			if got != tc.want {
				t.Fatalf("sequence %s (H=%d U=%d): transitions %q, want %q", tc.seq, tc.h, tc.u, got, tc.want)
			}
		})
	}
}

func TestMachineCounters(t *testing.T) {
	var m machine
	step(&m, "SSFF", 2, 3)
	if m.state != Healthy || m.failRun != 2 || m.okRun != 0 || m.lastResult != "F" {
		t.Fatalf("after SSFF: state %v okRun %d failRun %d last %q; want healthy 0 2 F", m.state, m.okRun, m.failRun, m.lastResult)
	}
}

func TestStateRoutable(t *testing.T) {
	for s, want := range map[State]bool{Unknown: true, Healthy: true, Unhealthy: false} {
		if s.Routable() != want {
			t.Errorf("%v.Routable() = %v, want %v", s, s.Routable(), want)
		}
	}
	if State(9).String() != "invalid" {
		t.Errorf("State(9).String() = %q", State(9).String())
	}
}

func BenchmarkObserve(b *testing.B) {
	b.ReportAllocs()
	var m machine
	at := time.Now()
	for i := 0; b.Loop(); i++ {
		// A flapping pattern that crosses both thresholds.
		m.observe(i%7 < 4, at, "tcp: connected", 2, 3)
	}
}

// BenchmarkRecordTransition: one probe result that changes state, with two
// reading subscribers — the checker-side cost of a transition.
func BenchmarkRecordTransition(b *testing.B) {
	b.ReportAllocs()
	c, err := NewChecker(Config{HealthyThreshold: 1, UnhealthyThreshold: 1})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.SetTargets([]Target{{ID: "a", Address: "127.0.0.1:1"}}); err != nil {
		b.Fatal(err)
	}
	c.mu.Lock()
	tg := c.targets["a"]
	c.mu.Unlock()
	for range 2 {
		ch, cancel := c.Subscribe(1024)
		defer cancel()
		go func() {
			for range ch {
			}
		}()
	}
	at := time.Now()
	for i := 0; b.Loop(); i++ {
		c.record(tg, outcome(i%2), "tcp: connected", at)
	}
}
