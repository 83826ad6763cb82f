package api

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/stickylb/stickylb/internal/testkit/etcdtest"
	"github.com/stickylb/stickylb/xds/store"
)

const testToken = "a-token-of-sixteen-chars"

// Unauthenticated requests on paths and methods the client picks count under a fixed
// set of operations: 600 of them, every one different, make at most one series per
// operation, not one per request; and their log lines are sampled.
func TestRefusedRequestsGrowNothing(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	s := New(nil, store.KeysOf(""), NewAuth(map[string]string{testToken: "alice"}, nil), zap.New(core))
	h := s.Handler()
	methods := []string{"POST", "PUT", "DELETE", "PATCH", "X-MINE"}
	for i := range 600 {
		path := fmt.Sprintf("/v1/services/web/backends/b%d/%x", i, rand.Uint64())
		if i%3 == 0 {
			path = fmt.Sprintf("/v1/services/web/backends/10.0.0.%d:80", i%250)
		}
		req := httptest.NewRequest(methods[i%len(methods)], path, nil)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusUnauthorized {
			t.Fatalf("%s %s: %d", req.Method, path, w.Code)
		}
	}
	known := map[string]bool{opPoolsPut: true, opBackendAdd: true, opBackendPut: true, opBackendDelete: true,
		opBackendDrain: true, opBackendUndrain: true, opZoneDrain: true, opZoneUndrain: true, opOther: true}
	series := counts(t, s.changes)
	total := 0.0
	for labels, v := range series {
		if op := labels[0]; !known[op] || labels[1] != "unauthorized" {
			t.Errorf("series %v", labels)
		}
		total += v
	}
	if len(series) > len(known) || total != 600 {
		t.Errorf("600 refused requests made %d series counting %v, want at most %d (one per operation) counting 600", len(series), total, len(known))
	}
	if got := logs.FilterMessage("api: request refused").Len(); got == 0 || got > refusedBurst {
		t.Errorf("%d log lines for 600 refusals, want 1..%d (sampled)", got, refusedBurst)
	}
}

// counts are a counter vector's series: label values (in the vector's order) -> value.
func counts(t *testing.T, c prometheus.Collector) map[[2]string]float64 {
	ch := make(chan prometheus.Metric, 1024)
	c.Collect(ch)
	close(ch)
	out := map[[2]string]float64{}
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		var k [2]string
		for i, l := range pb.GetLabel() {
			k[i] = l.GetValue() // sorted by name: op, result
		}
		out[k] = pb.GetCounter().GetValue()
	}
	return out
}

// The bearer scheme is matched without regard to case (RFC 7235); a client certificate
// authenticates only when one of its names is on the allow-list.
func TestAuthSchemesAndCertificateNames(t *testing.T) {
	a := NewAuth(map[string]string{testToken: "alice"}, []string{"ops.example.net", "spiffe://example.net/console"})
	for _, h := range []string{"Bearer " + testToken, "bearer " + testToken, "BEARER  " + testToken} {
		r := httptest.NewRequest("GET", "/v1/pools", nil)
		r.Header.Set("Authorization", h)
		if who, why := a.who(r); who != "token:alice" {
			t.Errorf("%q: %q (%s)", h, who, why)
		}
	}
	cert := func(cn string, dns []string, uri string) *http.Request {
		c := &x509.Certificate{Subject: pkix.Name{CommonName: cn}, DNSNames: dns, SerialNumber: big.NewInt(7)}
		if uri != "" {
			u, _ := url.Parse(uri)
			c.URIs = []*url.URL{u}
		}
		r := httptest.NewRequest("GET", "/v1/pools", nil)
		r.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{c}}}
		return r
	}
	for _, tc := range []struct {
		r    *http.Request
		want string
	}{
		{cert("ops.example.net", nil, ""), "cert:ops.example.net"},
		{cert("", []string{"x.example.net", "ops.example.net"}, ""), "cert:ops.example.net"},
		{cert("node-1", nil, "spiffe://example.net/console"), "cert:spiffe://example.net/console"},
		{cert("node-1", []string{"node-1.example.net"}, "spiffe://example.net/xdp/node-1"), ""}, // a node's certificate
	} {
		if who, why := a.who(tc.r); who != tc.want {
			t.Errorf("%v: %q (%s), want %q", tc.r.TLS.VerifiedChains[0][0].Subject, who, why, tc.want)
		}
	}
	if who, _ := NewAuth(nil, nil).who(cert("ops.example.net", nil, "")); who != "" {
		t.Errorf("no allow-list: a certificate authenticated as %q", who)
	}
	if who, _ := NewAuth(nil, []string{AnyCertificate}).who(cert("", nil, "")); who != "cert:serial:7" {
		t.Errorf("%q admitted %q", AnyCertificate, who)
	}
}

// A tokens file others than its owner can read is refused.
func TestTokensFileOthersMayReadRefused(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tokens")
	for _, mode := range []os.FileMode{0o600, 0o644} {
		if err := os.WriteFile(p, []byte("alice "+testToken+"\n"), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		tokens, err := LoadTokens(p)
		if (mode == 0o644) != (err != nil) || (err == nil && tokens[testToken] != "alice") {
			t.Errorf("mode %v: %v %v", mode, tokens, err)
		}
	}
}

// apiServer is the API over a one-member etcd holding file.
func apiServer(t *testing.T, file string) (*observer.ObservedLogs, func(method, path, body string) (int, string)) {
	if testing.Short() {
		t.Skip("runs etcd: skipped under -short")
	}
	c := etcdtest.Start(t, 1, "127.0.0.1")
	cli := c.Client(t)
	keys := store.KeysOf("/api")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := store.PutDocument(ctx, cli, keys, []byte(file), 0, store.Change{By: "test"}); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	srv := httptest.NewServer(New(cli, keys, NewAuth(map[string]string{testToken: "alice"}, nil), zap.New(core)).Handler())
	t.Cleanup(srv.Close)
	do := func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	return logs, do
}

const apiFile = `services:
  - name: web
    protocol: http
    listen: 0.0.0.0:10000
    backends:
      - {address: 10.0.1.1:8080, weight: 3}
`

// A change of a backend the service lacks is a 404 and adds nothing (a mistyped address
// must not become a new, routable backend); POST to the service's backends adds, and a
// second add of the same backend is a 409.
func TestChangeNeverAddsAndAddNeverChanges(t *testing.T) {
	logs, do := apiServer(t, apiFile)
	file := func() string { _, b := do("GET", "/v1/pools", ""); return b }
	before := file()
	if code, body := do("PUT", "/v1/services/web/backends/10.0.1.7:8080", `{"weight": 5}`); code != http.StatusNotFound {
		t.Fatalf("PUT of a backend the service lacks: %d %s, want 404", code, body)
	}
	if file() != before {
		t.Fatalf("a refused change was stored:\n%s", file())
	}
	if code, body := do("POST", "/v1/services/web/backends", `{"address": "10.0.1.7:8080", "weight": 5}`); code != http.StatusCreated {
		t.Fatalf("add: %d %s", code, body)
	}
	if code, body := do("POST", "/v1/services/web/backends", `{"address": "10.0.1.7:8080", "weight": 6}`); code != http.StatusConflict || !strings.Contains(body, "already") {
		t.Fatalf("second add: %d %s, want 409", code, body)
	}
	if code, body := do("POST", "/v1/services/web/backends", `{"weight": 6}`); code != http.StatusBadRequest {
		t.Fatalf("add without an address: %d %s, want 400", code, body)
	}
	if code, body := do("PUT", "/v1/services/web/backends/10.0.1.7:8080", `{"weight": 9}`); code != http.StatusOK {
		t.Fatalf("change: %d %s", code, body)
	}
	if f := file(); !strings.Contains(f, `10.0.1.7:8080', weight: 9}`) {
		t.Fatalf("after add and change:\n%s", f)
	}
	// Each refusal is logged with its status, who asked and why.
	var refused []string
	for _, e := range logs.FilterMessage("api: request refused").All() {
		m := e.ContextMap()
		refused = append(refused, fmt.Sprintf("%v %v %v", m["status"], m["who"], m["why"] != ""))
	}
	if want := []string{"404 token:alice true", "409 token:alice true", "400 token:alice true"}; !slices.Equal(refused, want) {
		t.Errorf("refusals logged: %q, want %q", refused, want)
	}
}

// A body of null, or one object followed by more, is a 400 that stores nothing (null
// panicked the handler), and the API keeps serving.
func TestBackendBodyMustBeOneObject(t *testing.T) {
	_, do := apiServer(t, apiFile)
	_, before := do("GET", "/v1/pools", "")
	for _, body := range []string{`null`, `{"weight": 5} {"weight": 6}`, `{"weight": 5} x`, `[1]`, ``} {
		for _, route := range [][2]string{{"PUT", "/v1/services/web/backends/10.0.1.9:8080"}, {"PUT", "/v1/services/web/backends/10.0.1.1:8080"}, {"POST", "/v1/services/web/backends"}} {
			if code, got := do(route[0], route[1], body); code != http.StatusBadRequest {
				t.Errorf("%s %s %q: %d %s, want 400", route[0], route[1], body, code, got)
			}
		}
	}
	if _, after := do("GET", "/v1/pools", ""); after != before {
		t.Fatalf("refused bodies changed the file:\n%s", after)
	}
}
