package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestValidateExample(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"validate", "../../pools.example.yaml"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "ok (7 services") {
		t.Fatalf("output: %q", out.String())
	}
}

func TestValidateReportsEveryError(t *testing.T) {
	p := write(t, "bad.yaml", `services:
  - name: web
    protocol: http
    balance: magelv
    backends:
      - {address: 10.0.0.1:80}
      - {address: 10.0.0.1:80}
  - name: web
    protocol: http
    backends: [{address: 10.0.0.2:80, weight: 0}]
`)
	var out, errb bytes.Buffer
	if code := run([]string{"validate", p}, &out, &errb); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
	want := []string{p + ":4:", p + ":7:", p + ":8:", p + ":10:"}
	if len(lines) < len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), errb.String())
	}
	for _, w := range want {
		if !strings.Contains(errb.String(), w) {
			t.Errorf("missing %s in:\n%s", w, errb.String())
		}
	}
	if code := run([]string{"validate"}, &out, &errb); code != 2 {
		t.Fatalf("no file: exit %d", code)
	}
	if code := run([]string{"validate", filepath.Join(t.TempDir(), "nope.yaml")}, &out, &errb); code != 1 {
		t.Fatalf("missing file: exit %d", code)
	}
}

func pool(n int) string {
	var b strings.Builder
	b.WriteString("services:\n  - name: web\n    protocol: http\n    affinity: {mode: header, header: {name: x-session}}\n    balance: maglev\n    backends:\n")
	for i := 1; i <= n; i++ {
		b.WriteString("      - {address: 10.0.0." + string(rune('0'+i)) + ":80}\n")
	}
	return b.String()
}

func TestPlanJSON(t *testing.T) {
	oldP, nextP := write(t, "old.yaml", pool(3)), write(t, "next.yaml", pool(4))
	var out, errb bytes.Buffer
	if code := run([]string{"plan", "--pools", oldP, "--next", nextP, "--json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var got struct {
		Services []struct {
			Name      string  `json:"name"`
			Algorithm string  `json:"algorithm"`
			Moved     float64 `json:"moved"`
			Ideal     float64 `json:"ideal"`
			ModN      float64 `json:"mod_n"`
		} `json:"services"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v in %s", err, out.String())
	}
	if len(got.Services) != 1 {
		t.Fatalf("%s", out.String())
	}
	s := got.Services[0]
	if s.Name != "web" || s.Algorithm != "maglev" || s.Ideal != 0.25 || s.Moved < 0.24 || s.Moved > 0.27 || s.ModN < 0.73 || s.ModN > 0.77 {
		t.Fatalf("%+v", s)
	}
	out.Reset()
	if code := run([]string{"plan", "--pools", oldP, "--next", nextP}, &out, &errb); code != 0 || !strings.Contains(out.String(), "MOD-N") || !strings.Contains(out.String(), "web") {
		t.Fatalf("table: %d %s", code, out.String())
	}
	bad := write(t, "bad.yaml", "services: 3\n")
	if code := run([]string{"plan", "--pools", oldP, "--next", bad}, &out, &errb); code != 1 {
		t.Fatalf("invalid next: exit %d", code)
	}
}
