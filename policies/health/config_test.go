package health

import (
	"net"
	"strings"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want []string // substrings of the error; none means valid
	}{
		{name: "zero config is a default tcp check", cfg: Config{}},
		{name: "design example", cfg: Config{Protocol: HTTP, Path: "/healthz", Interval: 5 * time.Second, Timeout: 2 * time.Second, HealthyThreshold: 2, UnhealthyThreshold: 3}},
		{name: "shortest interval", cfg: Config{Interval: time.Second, Timeout: 999 * time.Millisecond}},
		{name: "longest interval", cfg: Config{Interval: 300 * time.Second}},
		{name: "icmp", cfg: Config{Protocol: ICMP, Interval: time.Second}},
		{name: "http path with query and statuses", cfg: Config{Protocol: HTTP, Path: "/h?deep=1", Host: "svc.internal", ExpectStatus: []int{200, 204}, ExpectRanges: []StatusRange{{300, 399}}, Port: 8081}},
		{name: "interval too short", cfg: Config{Interval: 500 * time.Millisecond, Timeout: 100 * time.Millisecond}, want: []string{"interval 500ms is outside 1s..5m0s"}},
		{name: "interval too long", cfg: Config{Interval: 301 * time.Second}, want: []string{"interval 5m1s is outside"}},
		{name: "negative interval", cfg: Config{Interval: -time.Second}, want: []string{"interval -1s"}},
		{name: "timeout equal to interval", cfg: Config{Interval: 2 * time.Second, Timeout: 2 * time.Second}, want: []string{"timeout 2s must be shorter than the interval 2s"}},
		{name: "timeout longer than interval", cfg: Config{Interval: time.Second, Timeout: 3 * time.Second}, want: []string{"must be shorter"}},
		{name: "negative timeout", cfg: Config{Timeout: -time.Millisecond}, want: []string{"timeout -1ms must be positive"}},
		{name: "thresholds", cfg: Config{HealthyThreshold: -1, UnhealthyThreshold: -2}, want: []string{"healthy threshold -1 must be at least 1", "unhealthy threshold -2 must be at least 1"}},
		{name: "protocol", cfg: Config{Protocol: "udp"}, want: []string{`protocol "udp" is not one of http, tcp, icmp`}},
		{name: "port range", cfg: Config{Port: 70000}, want: []string{"port 70000 is outside 0..65535"}},
		{name: "port on icmp", cfg: Config{Protocol: ICMP, Port: 80}, want: []string{"port 80 has no meaning for icmp"}},
		{name: "relative path", cfg: Config{Protocol: HTTP, Path: "healthz"}, want: []string{`path "healthz" must start with /`}},
		{name: "bad statuses", cfg: Config{Protocol: HTTP, ExpectStatus: []int{99, 600}, ExpectRanges: []StatusRange{{300, 200}}}, want: []string{"expected status 99", "expected status 600", "range 300-200"}},
		{name: "bad host", cfg: Config{Protocol: HTTP, Host: "a b"}, want: []string{`host "a b"`}},
		{name: "http fields on tcp", cfg: Config{Protocol: TCP, Path: "/h", Host: "x", ExpectStatus: []int{200}}, want: []string{"path is only used by http", "host is only used by http", "expected statuses are only used by http"}},
		{name: "every error at once", cfg: Config{Protocol: ICMP, Interval: time.Hour, HealthyThreshold: -1, Port: 1}, want: []string{"interval 1h0m0s", "healthy threshold", "port 1 has no meaning"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate(%+v) = %v, want nil", tc.cfg, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate(%+v) = nil, want errors %q", tc.cfg, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate error %q lacks %q", err, w)
				}
			}
			if _, nerr := NewChecker(tc.cfg); nerr == nil {
				t.Errorf("NewChecker accepted a config Validate rejects")
			}
		})
	}
}

func TestWithDefaults(t *testing.T) {
	got := Config{Protocol: HTTP}.WithDefaults()
	if got.Path != "/" || got.Interval != 5*time.Second || got.Timeout != 2*time.Second || got.HealthyThreshold != 2 || got.UnhealthyThreshold != 3 {
		t.Errorf("defaults: %+v", got)
	}
	if p := (Config{}).WithDefaults().Protocol; p != TCP {
		t.Errorf("default protocol %q, want tcp", p)
	}
	// A short interval gets a timeout that fits it.
	if to := (Config{Interval: time.Second}).WithDefaults().Timeout; to != 500*time.Millisecond {
		t.Errorf("default timeout for a 1s interval = %v, want 500ms", to)
	}
}

func TestAllowShortIntervals(t *testing.T) {
	cfg := Config{Interval: 100 * time.Millisecond, Timeout: 50 * time.Millisecond}
	if _, err := NewChecker(cfg); err == nil || !strings.Contains(err.Error(), "interval 100ms is outside 1s") {
		t.Fatalf("NewChecker without AllowShortIntervals: err %v, want the interval error", err)
	}
	c, err := NewChecker(cfg, AllowShortIntervals())
	if err != nil {
		t.Fatalf("NewChecker with AllowShortIntervals: %v", err)
	}
	if c.Config().Interval != 100*time.Millisecond {
		t.Errorf("interval %v", c.Config().Interval)
	}
	// The option lowers the floor, it does not remove the other rules.
	if _, err := NewChecker(Config{Interval: 100 * time.Millisecond, Timeout: 100 * time.Millisecond}, AllowShortIntervals()); err == nil {
		t.Errorf("timeout == interval accepted with AllowShortIntervals")
	}
	if _, err := NewChecker(Config{Interval: time.Microsecond, Timeout: time.Nanosecond}, AllowShortIntervals()); err == nil {
		t.Errorf("1µs interval accepted; the floor is 1ms")
	}
	// Validate is unaffected.
	if err := cfg.Validate(); err == nil {
		t.Errorf("Validate accepted a 100ms interval")
	}
}

func TestExpects(t *testing.T) {
	def := Config{Protocol: HTTP}
	for status, want := range map[int]bool{100: false, 199: false, 200: true, 204: true, 302: true, 399: true, 400: false, 404: false, 503: false} {
		if def.expects(status) != want {
			t.Errorf("default expects(%d) = %v, want %v", status, !want, want)
		}
	}
	cfg := Config{Protocol: HTTP, ExpectStatus: []int{200, 404}, ExpectRanges: []StatusRange{{500, 502}}}
	for status, want := range map[int]bool{200: true, 204: false, 302: false, 404: true, 499: false, 500: true, 502: true, 503: false} {
		if cfg.expects(status) != want {
			t.Errorf("expects(%d) with %v %v = %v, want %v", status, cfg.ExpectStatus, cfg.ExpectRanges, !want, want)
		}
	}
}

func TestProbeAddress(t *testing.T) {
	cases := []struct {
		proto   Protocol
		port    int
		address string
		want    string // "" = error
	}{
		{TCP, 0, "127.0.0.1:80", "127.0.0.1:80"},
		{TCP, 0, "[::1]:80", "[::1]:80"},
		{TCP, 0, "backend.internal:8080", "backend.internal:8080"},
		{TCP, 9000, "127.0.0.1:80", "127.0.0.1:9000"},
		{TCP, 9000, "127.0.0.1", "127.0.0.1:9000"},
		{TCP, 9000, "::1", "[::1]:9000"},
		{TCP, 9000, "[::1]", "[::1]:9000"},
		{TCP, 9000, "fe80::1%eth0", "[fe80::1%eth0]:9000"},
		{HTTP, 0, "10.0.0.1:8080", "10.0.0.1:8080"},
		{ICMP, 0, "127.0.0.1:80", "127.0.0.1"},
		{ICMP, 0, "::1", "::1"},
		{ICMP, 0, "[::1]:443", "::1"},
		{TCP, 0, "127.0.0.1", ""},
		{TCP, 0, "127.0.0.1:0", ""},
		{TCP, 0, "127.0.0.1:http", ""},
		{TCP, 0, "127.0.0.1:70000", ""},
		{TCP, 0, "", ""},
		{TCP, 0, ":80", ""},
		{TCP, 9000, "1:2:3", ""},
		{ICMP, 0, "[::1", ""},
	}
	for _, tc := range cases {
		got, err := probeAddress(Config{Protocol: tc.proto, Port: tc.port}, tc.address)
		if tc.want == "" {
			if err == nil {
				t.Errorf("probeAddress(%s, port %d, %q) = %q, want an error", tc.proto, tc.port, tc.address, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("probeAddress(%s, port %d, %q) = %q, %v; want %q", tc.proto, tc.port, tc.address, got, err, tc.want)
		}
	}
}

// FuzzProbeAddress: addresses come from the pools file; whatever they are,
// probeAddress must not panic and what it accepts must be dialable syntax.
func FuzzProbeAddress(f *testing.F) {
	for _, s := range []string{"127.0.0.1:80", "[::1]:80", "::1", "[fe80::1%eth0]:1", "host", ":", "[", "]:"} {
		f.Add(s, 0)
		f.Add(s, 8080)
	}
	f.Fuzz(func(t *testing.T, address string, port int) {
		if port < 0 || port > 65535 {
			return
		}
		for _, proto := range []Protocol{TCP, ICMP} {
			got, err := probeAddress(Config{Protocol: proto, Port: port}, address)
			if err != nil {
				continue
			}
			if got == "" {
				t.Fatalf("probeAddress(%q) accepted with an empty result", address)
			}
			if proto == TCP {
				if h, _, err := net.SplitHostPort(got); err != nil || h == "" {
					t.Fatalf("probeAddress(%q) = %q, not host:port: %v", address, got, err)
				}
			}
		}
	})
}
