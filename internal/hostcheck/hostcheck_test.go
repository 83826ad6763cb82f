package hostcheck

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestForListen(t *testing.T) {
	for _, c := range []struct {
		listen string
		extra  []string
		allow  []string
		refuse []string
	}{
		{"127.0.0.1:9100", nil,
			[]string{"127.0.0.1:9100", "127.0.0.1", "localhost:9100", "LocalHost.", "localhost", "", "[::ffff:127.0.0.1]:9100"},
			[]string{"evil.example:9100", "evil.example", "127.0.0.2:9100", "[::1]:9100", "10.0.0.1", "localhost.evil.example", "127.0.0.1.evil.example:9100", "0x7f000001"}},
		{"[::1]:9100", nil,
			[]string{"[::1]:9100", "[::1]", "localhost:9100"},
			[]string{"127.0.0.1:9100", "evil.example"}},
		{"0.0.0.0:9100", nil,
			[]string{"10.1.2.3:9100", "[fd00::1]:9100", "127.0.0.1", "localhost:9100", "[fe80::1%25eth0]:9100"},
			[]string{"lb1.example:9100", "evil.example"}},
		{":9100", []string{"lb1.example", "OPS.example."},
			[]string{"10.1.2.3", "lb1.example:9100", "ops.example", "ops.example.:9100"},
			[]string{"lb2.example", "evil.example"}},
		{"[::]:9100", nil, []string{"10.1.2.3", "[2001:db8::1]:9100"}, []string{"evil.example"}},
		{"10.0.0.5:9100", []string{"10.0.0.6", "[fd00::6]"},
			[]string{"10.0.0.5:9100", "10.0.0.6", "[fd00::6]:9100"},
			[]string{"localhost:9100", "127.0.0.1", "10.0.0.7"}},
		{"localhost:9100", nil,
			[]string{"localhost:9100", "127.0.0.1:9100", "[::1]:9100", "127.0.0.53"},
			[]string{"10.0.0.1", "evil.example"}},
		{"lb1.example:9100", nil,
			[]string{"lb1.example:9100", "LB1.EXAMPLE"},
			[]string{"10.0.0.1", "localhost", "evil.example", "lb1.example.evil.example"}},
	} {
		n, err := ForListen(c.listen, c.extra...)
		if err != nil {
			t.Fatalf("%s: %v", c.listen, err)
		}
		for _, h := range c.allow {
			if !n.Allows(h) {
				t.Errorf("listen %s %v: Host %q refused, want allowed", c.listen, c.extra, h)
			}
		}
		for _, h := range c.refuse {
			if n.Allows(h) {
				t.Errorf("listen %s %v: Host %q allowed, want refused", c.listen, c.extra, h)
			}
		}
	}
}

func TestForListenRefusesBadInput(t *testing.T) {
	for _, c := range []struct {
		listen string
		extra  []string
	}{
		{"127.0.0.1", nil}, {"127.0.0.1:80", []string{"ops.example:80"}}, {"127.0.0.1:80", []string{""}},
		{"127.0.0.1:80", []string{"a b"}}, {"127.0.0.1:80", []string{"http://ops.example"}},
	} {
		if _, err := ForListen(c.listen, c.extra...); err == nil {
			t.Errorf("ForListen(%q, %q): no error", c.listen, c.extra)
		}
	}
}

func TestLoopback(t *testing.T) {
	n := Loopback()
	for h, want := range map[string]bool{"localhost:2020": true, "127.0.0.1:2020": true, "127.1.2.3": true, "[::1]:2020": true,
		"10.0.0.1": false, "evil.example:2020": false, "localhost.evil.example": false, "[::ffff:10.0.0.1]": false} {
		if got := n.Allows(h); got != want {
			t.Errorf("Host %q: %v, want %v", h, got, want)
		}
	}
}

func TestGuard(t *testing.T) {
	n, err := ForListen("127.0.0.1:9100")
	if err != nil {
		t.Fatal(err)
	}
	var refused []string
	h := n.Guard(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) }), "add names with --admin-host",
		func(r *http.Request) { refused = append(refused, r.Host) })
	for host, want := range map[string]int{"127.0.0.1:9100": 200, "evil.example:9100": 421} {
		r := httptest.NewRequest("GET", "/status.json", nil)
		r.Host = host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want {
			t.Errorf("Host %s: %d %q, want %d", host, w.Code, w.Body.String(), want)
		}
	}
	if len(refused) != 1 || refused[0] != "evil.example:9100" {
		t.Errorf("refusals heard: %q", refused)
	}
}
