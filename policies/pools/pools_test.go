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
