package pools

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestExampleFile(t *testing.T) {
	f, err := Load(filepath.Join("..", "..", "pools.example.yaml"))
	if err != nil {
		t.Fatalf("pools.example.yaml: %v", err)
	}
	if len(f.Warnings) != 0 {
		t.Errorf("warnings on the example: %v", f.Warnings)
	}
	want := map[string]string{"web": ModeCookie, "shop": ModeAppCookie, "media": ModeURL, "api": ModeHeader, "admin": ModeSourceIP, "edge": ModeNone, "quic": ModeQUICCID}
	if len(f.Services) != len(want) {
		t.Fatalf("%d services, want %d", len(f.Services), len(want))
	}
	for name, mode := range want {
		s := f.Service(name)
		if s == nil || s.Affinity.Mode != mode {
			t.Errorf("service %s: %+v", name, s)
		}
	}
	web := f.Service("web")
	if web.Backends[0].Identity() != "web-1" || web.Line != 5 || web.Backends[0].Line != 18 {
		t.Errorf("web: identity %q line %d backend line %d", web.Backends[0].Identity(), web.Line, web.Backends[0].Line)
	}
	if web.SlowStart.Window != 30*time.Second || web.HealthCheck.UnhealthyThreshold != 3 {
		t.Errorf("web slow start / health: %+v %+v", web.SlowStart, web.HealthCheck)
	}
	if f.Service("edge").Backends[0].HardwareAddr().String() != "02:00:00:00:06:01" {
		t.Error("edge mac")
	}
}

func TestDefaults(t *testing.T) {
	f, err := Parse("d.yaml", []byte(`
services:
  - name: a
    protocol: http
    slow_start: {window: 10s}
    backends: [{address: 10.0.0.1:80}]
  - name: b
    protocol: http
    affinity: {mode: header, header: {name: x-k}}
    health_check: {}
    backends: [{address: 10.0.0.1:80}]
  - name: c
    protocol: tcp
    vip: 10.9.9.9:80
    backends: [{address: 10.0.0.1:80}]
`))
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := f.Services[0], f.Services[1], f.Services[2]
	if a.Affinity.Mode != ModeNone || a.Balance != BalanceLeastConn || !a.CrossZone || a.Backends[0].Weight != 1 || a.Affinity.TTL != DefaultTTL {
		t.Errorf("a: %+v", a)
	}
	if b.Balance != BalanceRingHash || b.Hash.MinRingSize != 1024 || b.Hash.MaxRingSize != 4096 || b.Hash.TableSize != 0 {
		t.Errorf("b balance/hash: %s %+v", b.Balance, b.Hash)
	}
	hc := b.HealthCheck
	if hc.Protocol != HealthHTTP || hc.Path != "/" || hc.Interval != 5*time.Second || hc.Timeout != 2*time.Second || hc.HealthyThreshold != 2 || hc.UnhealthyThreshold != 3 {
		t.Errorf("b health defaults: %+v", hc)
	}
	if a.SlowStart.Aggression != 1 || a.SlowStart.MinWeightPercent != 10 {
		t.Errorf("a slow start defaults: %+v", a.SlowStart)
	}
	if c.Balance != BalanceMaglev || c.Hash.TableSize != 65537 {
		t.Errorf("c: %s %+v", c.Balance, c.Hash)
	}
}

// TestErrors: every rule, with the position it must report. Each case is a whole file;
// want lists "line:col: fragment" (col may be omitted as "line: fragment").
func TestErrors(t *testing.T) {
	svc := func(body string) string {
		return "services:\n  - name: s\n" + body
	}
	cases := []struct {
		name, src string
		want      []string
	}{
		{"unknown field", svc("    protocol: http\n    balnce: maglev\n    backends: [{address: 10.0.0.1:80}]\n"), []string{"4:5: ", "balnce"}},
		{"bad duration", svc("    protocol: http\n    affinity: {mode: cookie, ttl: 30 minutes}\n    backends: [{address: 10.0.0.1:80}]\n"), []string{"4:", "ttl"}},
		{"duplicate name", "services:\n  - {name: s, protocol: http, backends: [{address: 10.0.0.1:80}]}\n  - {name: s, protocol: http, backends: [{address: 10.0.0.1:80}]}\n", []string{"3:", "already used at line 2"}},
		{"duplicate address", svc("    protocol: http\n    backends:\n      - {address: 10.0.0.1:80}\n      - {address: 10.0.0.1:80, hash_key: x}\n"), []string{"6:", "listed twice"}},
		{"duplicate identity", svc("    protocol: http\n    backends:\n      - {address: 10.0.0.1:80, hash_key: k}\n      - {address: 10.0.0.2:80, hash_key: k}\n"), []string{"6:", "identity \"k\""}},
		{"non-prime table", svc("    protocol: http\n    balance: maglev\n    hash: {table_size: 65536}\n    backends: [{address: 10.0.0.1:80}]\n"), []string{"5:", "not prime"}},
		{"weight 0", svc("    protocol: http\n    backends: [{address: 10.0.0.1:80, weight: 0}]\n"), []string{"4:", "weight 0"}},
		{"weight too big", svc("    protocol: http\n    backends: [{address: 10.0.0.1:80, weight: 10001}]\n"), []string{"4:", "out of range"}},
		{"keyed needs hash", svc("    protocol: http\n    affinity: {mode: header, header: {name: x}}\n    balance: weighted_least_conn\n    backends: [{address: 10.0.0.1:80}]\n"), []string{"5:", "maglev or ring_hash"}},
		{"learn needs hash", svc("    protocol: http\n    affinity: {mode: app_cookie, app_cookie: {name: J, mode: learn}}\n    balance: weighted_round_robin\n    backends: [{address: 10.0.0.1:80}]\n"), []string{"5:", "app_cookie learn"}},
		{"vip port", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    backends: [{address: 10.0.0.1:8443}]\n"), []string{"5:", "differs from the vip"}},
		{"vip on http", svc("    protocol: http\n    vip: 10.9.9.9:443\n    backends: [{address: 10.0.0.1:443}]\n"), []string{"4:", "tcp and udp"}},
		{"vip needs maglev", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    balance: ring_hash\n    backends: [{address: 10.0.0.1:443}]\n"), []string{"5:", "must use balance maglev"}},
		{"cookie on tcp", svc("    protocol: tcp\n    listen: 0.0.0.0:1\n    affinity: {mode: cookie}\n    backends: [{address: 10.0.0.1:443}]\n"), []string{"5:", "needs HTTP"}},
		{"block for another mode", svc("    protocol: http\n    affinity: {mode: cookie, header: {name: x}}\n    backends: [{address: 10.0.0.1:80}]\n"), []string{"4:", "applies to mode header"}},
		{"mode needs block", svc("    protocol: http\n    affinity: {mode: url}\n    backends: [{address: 10.0.0.1:80}]\n"), []string{"4:", "needs an affinity.url block"}},
		{"host name", svc("    protocol: http\n    backends: [{address: \"web.local:80\"}]\n"), []string{"4:", "not a host name"}},
		{"bad mac", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    backends: [{address: 10.0.0.1:443, mac: \"02:00:00\"}]\n"), []string{"5:", "mac"}},
		{"mac without vip", svc("    protocol: http\n    backends: [{address: 10.0.0.1:80, mac: \"02:00:00:00:00:01\"}]\n"), []string{"4:", "vip services"}},
		{"ring sizes", svc("    protocol: http\n    balance: ring_hash\n    hash: {min_ring_size: 5000, max_ring_size: 100}\n    backends: [{address: 10.0.0.1:80}]\n"), []string{"5:", "larger than max_ring_size"}},
		{"slow start on hash", svc("    protocol: http\n    balance: maglev\n    slow_start: {window: 10s}\n    backends: [{address: 10.0.0.1:80}]\n"), []string{"5:", "slow_start applies"}},
		{"interval range", svc("    protocol: http\n    health_check: {interval: 500ms}\n    backends: [{address: 10.0.0.1:80}]\n"), []string{"4:", "interval"}},
		{"timeout over interval", svc("    protocol: http\n    health_check: {interval: 1s, timeout: 3s}\n    backends: [{address: 10.0.0.1:80}]\n"), []string{"4:", "shorter than the interval"}},
		{"timeout equal to interval", svc("    protocol: http\n    health_check: {interval: 2s, timeout: 2s}\n    backends: [{address: 10.0.0.1:80}]\n"), []string{"4:", "shorter than the interval"}},
		{"no backends", svc("    protocol: http\n"), []string{"2:", "backends is required"}},
		{"no protocol", svc("    backends: [{address: 10.0.0.1:80}]\n"), []string{"2:", "protocol is required"}},
		{"bad name", "services:\n  - {name: Web_1, protocol: http, backends: [{address: 10.0.0.1:80}]}\n", []string{"2:", "lowercase"}},
		{"duplicate listen", "services:\n  - {name: a, protocol: http, listen: 0.0.0.0:80, backends: [{address: 10.0.0.1:80}]}\n  - {name: b, protocol: tcp, listen: 0.0.0.0:80, backends: [{address: 10.0.0.1:80}]}\n", []string{"3:", "already used by service a"}},
		{"vip hosts differ", "services:\n  - {name: a, protocol: tcp, vip: 10.9.9.9:80, backends: [{address: 10.0.0.1:80}]}\n  - {name: b, protocol: tcp, vip: 10.9.9.9:81, backends: [{address: 10.0.0.2:81}]}\n", []string{"3:", "same hosts"}},
		{"quic on tcp", svc("    protocol: tcp\n    vip: 10.9.9.9:443\n    affinity: {mode: quic_cid}\n    backends: [{address: 10.0.0.1:443}]\n"), []string{"5:", "quic_cid applies to udp"}},
		{"syntax", "services:\n  - name: [\n", []string{"", "yaml"}},
		{"empty", "", []string{"", "empty"}},
		{"not a pools file", "hello: world\n", []string{"1:1:", "hello"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(tc.src))
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.src)
			}
			var list ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("error is not an ErrorList: %T", err)
			}
			msg := err.Error()
			for _, line := range strings.Split(msg, "\n") {
				if !strings.HasPrefix(line, "p.yaml") {
					t.Errorf("line without file name: %q", line)
				}
			}
			if !strings.Contains(msg, "p.yaml:"+tc.want[0]) || !strings.Contains(strings.ToLower(msg), strings.ToLower(tc.want[1])) {
				t.Fatalf("got:\n%s\nwant p.yaml:%s... containing %q", msg, tc.want[0], tc.want[1])
			}
		})
	}
}

// TestEveryErrorReported: a file with several independent mistakes reports all of them.
func TestEveryErrorReported(t *testing.T) {
	src := `services:
  - name: a
    protocol: http
    balance: magelv
    backends: [{address: 10.0.0.1:80, weight: -1}]
  - name: b
    protocol: ftp
    backends: [{address: 300.0.0.1:80}]
`
	_, err := Parse("p.yaml", []byte(src))
	if err == nil {
		t.Fatal("accepted")
	}
	got := err.Error()
	for _, want := range []string{"p.yaml:4:14", "maglev", "p.yaml:5:", "p.yaml:7:15", "p.yaml:8:"} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if n := len(strings.Split(got, "\n")); n < 4 {
		t.Errorf("%d errors reported, want at least 4:\n%s", n, got)
	}
}

func TestWarnings(t *testing.T) {
	f, err := Parse("w.yaml", []byte(`services:
  - name: g
    protocol: grpc
    affinity: {mode: header, header: {name: x}}
    balance: maglev
    drained_zones: [nowhere]
    backends: [{address: 10.0.0.1:80}]
`))
	if err != nil {
		t.Fatal(err)
	}
	w := f.Warnings.Error()
	if !strings.Contains(w, "w.yaml:5:") || !strings.Contains(w, "no Maglev") || !strings.Contains(w, "nowhere") {
		t.Fatalf("warnings: %s", w)
	}
}

func TestLoadErrors(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestAliasBomb(t *testing.T) {
	src := "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\ng: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\nservices: *g\n"
	done := make(chan error, 1)
	go func() { _, err := Parse("bomb.yaml", []byte(src)); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("accepted")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("alias expansion not bounded")
	}
}

func FuzzParse(f *testing.F) {
	data, err := os.ReadFile(filepath.Join("..", "..", "pools.example.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte("services: []"))
	f.Fuzz(func(t *testing.T, b []byte) {
		pf, err := Parse("f.yaml", b)
		if err == nil {
			for _, s := range pf.Services {
				if s.Name == "" || len(s.Backends) == 0 {
					t.Fatalf("accepted an incomplete service: %+v", s)
				}
			}
		}
	})
}

func BenchmarkParseExample(b *testing.B) {
	data, err := os.ReadFile(filepath.Join("..", "..", "pools.example.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := Parse("p.yaml", data); err != nil {
			b.Fatal(err)
		}
	}
}
