package pools

import (
	"testing"

	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/sessions"
)

// TestUnifiedDefaults: the pools file's defaults are the ones the libraries every tier runs
// define, so a Caddy node, an Envoy or gRPC node fed by xDS, and the XDP loader given no
// setting build the same ring and the same tables.
func TestUnifiedDefaults(t *testing.T) {
	f, err := Parse("d.yaml", []byte(`services:
  - name: a
    protocol: http
    affinity: {mode: header, header: {name: x-k}}
    health_check: {}
    backends: [{address: 10.0.0.1:80}]
`))
	if err != nil {
		t.Fatal(err)
	}
	s := f.Services[0]
	if s.Hash.MinRingSize != chash.DefaultMinRingSize || s.Hash.MaxRingSize != chash.DefaultMaxRingSize {
		t.Errorf("ring sizes %d..%d, chash's defaults %d..%d", s.Hash.MinRingSize, s.Hash.MaxRingSize, chash.DefaultMinRingSize, chash.DefaultMaxRingSize)
	}
	if s.Hash.MaxRingSize != chash.GRPCRingSizeCap {
		t.Errorf("default max ring %d is not gRPC's cap %d: gRPC clients would build another ring", s.Hash.MaxRingSize, chash.GRPCRingSizeCap)
	}
	if s.Affinity.MaxSessions != sessions.DefaultMaxEntries || s.Affinity.TTL != sessions.DefaultTTL {
		t.Errorf("sessions %d ttl %s, the session table's defaults %d %s", s.Affinity.MaxSessions, s.Affinity.TTL, sessions.DefaultMaxEntries, sessions.DefaultTTL)
	}
	want := health.Config{Protocol: health.HTTP}.WithDefaults()
	if got := s.HealthCheck.CheckerConfig(); got.Path != want.Path || got.Interval != want.Interval || got.Timeout != want.Timeout ||
		got.HealthyThreshold != want.HealthyThreshold || got.UnhealthyThreshold != want.UnhealthyThreshold {
		t.Errorf("health defaults %+v, the checker's %+v", got, want)
	}
}

// TestShortIntervalValidates: `health_check: {interval: 1s}` was rejected with "timeout 2s
// is longer than the interval 1s", a timeout nobody wrote. The default timeout follows the
// interval, and the checker accepts what validate accepts.
func TestShortIntervalValidates(t *testing.T) {
	for _, iv := range []string{"1s", "3s", "4s", "5m"} {
		f, err := Parse("h.yaml", []byte("services:\n  - name: a\n    protocol: tcp\n    listen: 0.0.0.0:9\n    health_check: {interval: "+iv+"}\n    backends: [{address: 10.0.0.1:80}]\n"))
		if err != nil {
			t.Fatalf("interval %s: %v", iv, err)
		}
		hc := f.Services[0].HealthCheck
		want := min(health.DefaultTimeout, hc.Interval/2)
		if hc.Timeout != want {
			t.Errorf("interval %s: timeout %s, want %s", iv, hc.Timeout, want)
		}
		if err := hc.CheckerConfig().Validate(); err != nil {
			t.Errorf("interval %s: validate accepts it, the checker does not: %v", iv, err)
		}
	}
	if _, err := Parse("h.yaml", []byte("services:\n  - name: a\n    protocol: tcp\n    listen: 0.0.0.0:9\n    health_check: {interval: 1s}\n    backends: [{address: 10.0.0.1:80}]\n")); err != nil {
		t.Fatal(err)
	}
}

// TestRingNames: "ring" (the Caddyfile's first name) and "ring_hash" are one algorithm, and
// the file keeps the canonical name.
func TestRingNames(t *testing.T) {
	for _, name := range []string{"ring", "ring_hash"} {
		f, err := Parse("r.yaml", []byte("services:\n  - name: a\n    protocol: http\n    balance: "+name+"\n    backends: [{address: 10.0.0.1:80}]\n"))
		if err != nil {
			t.Fatalf("balance %s: %v", name, err)
		}
		if got := f.Services[0].Balance; got != BalanceRingHash {
			t.Errorf("balance %s parsed as %q, want %q", name, got, BalanceRingHash)
		}
	}
	if _, err := Parse("r.yaml", []byte("services:\n  - name: a\n    protocol: http\n    balance: rings\n    backends: [{address: 10.0.0.1:80}]\n")); err == nil {
		t.Error("balance rings accepted")
	}
}
