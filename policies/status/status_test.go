package status

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestStatusJSONShowsUnknownsAsNull(t *testing.T) {
	s := Snapshot{Tier: TierCaddy, Time: time.Unix(1700000000, 0).UTC(), Services: []Service{{
		Name: "web", Policy: "sticky_cookie",
		Backends: []Backend{{ID: "a:1", Address: "a:1", Health: Health{State: Healthy}}},
	}, {Name: "empty"}}}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	svcs := m["services"].([]any)
	be := svcs[0].(map[string]any)["backends"].([]any)[0].(map[string]any)
	for _, k := range []string{"weight", "effective_weight", "slow_start", "in_flight", "sessions", "drained_since"} {
		if v, ok := be[k]; !ok || v != nil {
			t.Errorf("backend field %s = %v (present %v), want null", k, v, ok)
		}
	}
	h := be["health"].(map[string]any)
	for _, k := range []string{"since", "last_check"} {
		if v, ok := h[k]; !ok || v != nil {
			t.Errorf("health field %s = %v, want null", k, v)
		}
	}
	if got := svcs[1].(map[string]any)["backends"]; got == nil {
		t.Errorf("a service without backends encodes backends as null; the page iterates it")
	}
	if s.Services[1].Backends != nil {
		t.Errorf("MarshalJSON changed the caller's snapshot")
	}
}

func TestStatusFinishAndPanic(t *testing.T) {
	s := Service{Name: "web", Backends: []Backend{
		{ID: "a", Health: Health{State: Unhealthy}, InFlight: Ptr[int64](2)},
		{ID: "b", Health: Health{State: Healthy}, Draining: true, InFlight: Ptr[int64](3)},
	}}
	s.Finish("requests fail")
	if !s.Panic.Active || s.Panic.Note != "requests fail" {
		t.Fatalf("panic = %+v, want active: one backend down, the other draining", s.Panic)
	}
	if s.Load.InFlight == nil || *s.Load.InFlight != 5 {
		t.Fatalf("in flight = %v, want 5", s.Load.InFlight)
	}
	s.Backends[1].Draining = false
	s.Backends[1].InFlight = nil
	s.Finish("requests fail")
	if s.Panic.Active || s.Panic.Note != "" {
		t.Fatalf("panic = %+v with a healthy backend", s.Panic)
	}
	if s.Load.InFlight != nil {
		t.Fatalf("in flight = %d though one backend's count is unknown", *s.Load.InFlight)
	}
}

func TestStatusValidate(t *testing.T) {
	ok := Snapshot{Tier: TierXDP, Services: []Service{{Name: "a", Backends: []Backend{{ID: "x", Health: Health{State: Unknown}}}}}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]Snapshot{
		"tier":    {Tier: "nginx"},
		"service": {Tier: TierCaddy, Services: []Service{{Name: "a"}, {Name: "a"}}},
		"backend": {Tier: TierCaddy, Services: []Service{{Name: "a", Backends: []Backend{{ID: "x", Health: Health{State: Healthy}}, {ID: "x", Health: Health{State: Healthy}}}}}},
		"state":   {Tier: TierCaddy, Services: []Service{{Name: "a", Backends: []Backend{{ID: "x", Health: Health{State: "up"}}}}}},
	} {
		if err := s.Validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// The page must be self-contained: nothing it loads may come from elsewhere, and the CSP
// must carry the hash of exactly its inline script (else the browser runs nothing).
func TestStatusPageSelfContained(t *testing.T) {
	p := page
	for _, bad := range []string{"http://", "https://", "src=", "<link", "@import", "url("} {
		if bytes.Contains(p, []byte(bad)) {
			t.Errorf("page holds %q: it must not load anything from elsewhere", bad)
		}
	}
	if !bytes.Contains(p, []byte(`fetch("status.json"`)) {
		t.Errorf("page does not fetch status.json relative to itself")
	}
	w := httptest.NewRecorder()
	ServePage(w)
	csp := w.Header().Get("Content-Security-Policy")
	s := string(p)
	script := s[strings.Index(s, "<script>")+len("<script>") : strings.Index(s, "</script>")]
	sum := sha256.Sum256([]byte(script))
	if want := "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"; !strings.Contains(csp, want) {
		t.Fatalf("CSP %q lacks the script's hash %s", csp, want)
	}
	if !strings.Contains(csp, "frame-ancestors 'none'") || w.Header().Get("X-Frame-Options") != "DENY" {
		t.Fatalf("page may be framed: %v", w.Header())
	}
}

func TestStatusCheckStateChange(t *testing.T) {
	mk := func(method string, hdr ...string) *http.Request {
		r := httptest.NewRequest(method, "http://localhost:2020/drain", nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		return r
	}
	for name, c := range map[string]struct {
		r  *http.Request
		ok bool
	}{
		"page fetch":             {mk("POST", CSRFHeader, "1", "Sec-Fetch-Site", "same-origin", "Origin", "http://localhost:2020"), true},
		"tool with header":       {mk("POST", CSRFHeader, "1"), true},
		"no header":              {mk("POST", "Sec-Fetch-Site", "same-origin", "Origin", "http://localhost:2020"), false},
		"tool without header":    {mk("POST"), false},
		"header value 0":         {mk("POST", CSRFHeader, "0"), false},
		"cross-site":             {mk("POST", CSRFHeader, "1", "Sec-Fetch-Site", "cross-site", "Origin", "http://evil.example"), false},
		"same-site other origin": {mk("POST", CSRFHeader, "1", "Sec-Fetch-Site", "same-site", "Origin", "http://other.localhost:2020"), false},
		"navigation":             {mk("POST", CSRFHeader, "1", "Sec-Fetch-Site", "none"), false},
		"old browser other host": {mk("POST", CSRFHeader, "1", "Origin", "http://evil.example"), false},
		"old browser same host":  {mk("POST", CSRFHeader, "1", "Origin", "http://localhost:2020"), true},
		"GET":                    {mk("GET", CSRFHeader, "1"), false},
	} {
		err := CheckStateChange(c.r)
		if (err == nil) != c.ok {
			t.Errorf("%s: err = %v, want ok %v", name, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrCrossOrigin) {
			t.Errorf("%s: %v does not wrap ErrCrossOrigin", name, err)
		}
	}
}

func TestStatusReadDrainRequest(t *testing.T) {
	for body, want := range map[string]string{
		`{"upstream":"localhost:9001"}`:                    "localhost:9001",
		`{"upstream":""}`:                                  "",
		`{"upstream":"a b:1"}`:                             "",
		`{"upstream":"a\u0000:1"}`:                         "",
		`{"upstream":"x:1","extra":1}`:                     "",
		`upstream=localhost:9001`:                          "",
		`{"upstream":"` + strings.Repeat("a", 5000) + `"}`: "",
	} {
		r := httptest.NewRequest("POST", "/drain", strings.NewReader(body))
		got, err := ReadDrainRequest(r)
		if want == "" {
			if err == nil {
				t.Errorf("%.40q: accepted as %q", body, got.Upstream)
			}
			continue
		}
		if err != nil || got.Upstream != want {
			t.Errorf("%.40q: %q, %v", body, got.Upstream, err)
		}
	}
}

// Zones: Finish sums the backends by zone (flows only where some backend's are known);
// SetZoneFlows takes a tier's own per-zone counts, a zone gone from the file included.
func TestStatusZones(t *testing.T) {
	s := Service{Name: "web", Backends: []Backend{
		{ID: "a", Zone: "zone-b", Health: Health{State: Healthy}, Flows: Ptr[int64](4)},
		{ID: "b", Zone: "zone-a", Health: Health{State: Unhealthy}, Flows: Ptr[int64](1)},
		{ID: "c", Zone: "zone-b", Health: Health{State: Healthy}, Draining: true, Flows: Ptr[int64](2)},
		{ID: "d", Health: Health{State: Unknown}, Flows: Ptr[int64](0)},
	}}
	s.Finish("")
	got, _ := json.Marshal(s.Zones)
	want := `[{"name":"","backends":1,"healthy":0,"draining":0,"flows":0},` +
		`{"name":"zone-a","backends":1,"healthy":0,"draining":0,"flows":1},` +
		`{"name":"zone-b","backends":2,"healthy":2,"draining":1,"flows":6}]`
	if string(got) != want {
		t.Fatalf("zones %s, want %s", got, want)
	}
	s.SetZoneFlows(map[string]int64{"zone-b": 9, "zone-gone": 3, "zone-empty": 0})
	got, _ = json.Marshal(s.Zones)
	want = `[{"name":"","backends":1,"healthy":0,"draining":0,"flows":0},` +
		`{"name":"zone-a","backends":1,"healthy":0,"draining":0,"flows":1},` +
		`{"name":"zone-b","backends":2,"healthy":2,"draining":1,"flows":9},` +
		`{"name":"zone-gone","backends":0,"healthy":0,"draining":0,"flows":3}]`
	if string(got) != want {
		t.Fatalf("zones after the tier's counts %s, want %s", got, want)
	}
	// Flows unknown (the control plane): null, shown n/a. No zone anywhere (Caddy): no list.
	s = Service{Backends: []Backend{{ID: "a", Zone: "z", Health: Health{State: Healthy}}}}
	s.Finish("")
	if len(s.Zones) != 1 || s.Zones[0].Flows != nil {
		t.Fatalf("zones without flows: %+v", s.Zones)
	}
	s = Service{Backends: []Backend{{ID: "a", Health: Health{State: Healthy}}}}
	s.Finish("")
	if s.Zones != nil {
		t.Fatalf("zones of backends without any: %+v", s.Zones)
	}
}

// The page's refresh period is the model's RefreshInterval (the page cannot import it).
func TestStatusPageRefreshInterval(t *testing.T) {
	m := regexp.MustCompile(`REFRESH_MS = (\d+)`).FindSubmatch(page)
	if m == nil {
		t.Fatal("page.html has no REFRESH_MS")
	}
	if ms, _ := strconv.Atoi(string(m[1])); time.Duration(ms)*time.Millisecond != RefreshInterval {
		t.Fatalf("page refreshes every %s ms, RefreshInterval is %v", m[1], RefreshInterval)
	}
}
