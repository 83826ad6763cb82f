package fleetview

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stickylb/stickylb/policies/pools"
)

// TestAddressRefusal: loopback, link-local and unspecified addresses are refused, in IPv4,
// IPv6 and IPv4-mapped IPv6; allowLoopback admits loopback and nothing else.
func TestAddressRefusal(t *testing.T) {
	for _, tc := range []struct {
		addr                string
		refused, withLoopOK bool
	}{
		{"127.0.0.1", true, false},
		{"127.9.9.9", true, false},
		{"::1", true, false},
		{"::ffff:127.0.0.1", true, false},
		{"169.254.169.254", true, true},
		{"::ffff:169.254.169.254", true, true},
		{"fe80::1", true, true},
		{"0.0.0.0", true, true},
		{"0.1.2.3", true, true},
		{"::", true, true},
		{"::ffff:0.0.0.0", true, true},
		{"10.0.0.1", false, false},
		{"192.168.1.1", false, false},
		{"2001:db8::1", false, false},
		{"::ffff:10.0.0.1", false, false},
	} {
		a := netip.MustParseAddr(tc.addr)
		if got := AddressRefusal(a, false) != ""; got != tc.refused {
			t.Errorf("%s: refused %v, want %v", tc.addr, got, tc.refused)
		}
		if got := AddressRefusal(a, true) != ""; got != tc.withLoopOK {
			t.Errorf("%s with loopback allowed: refused %v, want %v", tc.addr, got, tc.withLoopOK)
		}
	}
}

// TestAdmissionFilter: the node's own addresses are refused even where loopback is allowed;
// Filter leaves the view it is given as it was and returns what it left out.
func TestAdmissionFilter(t *testing.T) {
	f, err := pools.Parse("pools.yaml", []byte(`services:
  - name: api
    protocol: http
    backends:
      - {address: 127.0.0.1:2019}
      - {address: 127.0.0.1:8081}
      - {address: 169.254.169.254:80}
      - {address: 10.0.0.1:80}
  - name: rpc
    protocol: grpc
    backends:
      - {address: 10.0.0.2:80}
`))
	if err != nil {
		t.Fatal(err)
	}
	v := &View{File: f}
	adm := Admission{AllowLoopback: true, Own: func(ap netip.AddrPort) string {
		if ListenerTakes("localhost:2019", ap) {
			return "the admin API"
		}
		return ""
	}}
	got, refused := adm.Filter(v)
	var kept []string
	for _, b := range got.File.Service("api").Backends {
		kept = append(kept, b.Address)
	}
	if strings.Join(kept, " ") != "127.0.0.1:8081 10.0.0.1:80" {
		t.Fatalf("kept %v", kept)
	}
	if len(refused) != 2 || refused[0].Address != "127.0.0.1:2019" || refused[0].Reason != "the admin API" ||
		!strings.Contains(refused[1].Reason, "link-local") {
		t.Fatalf("refused %+v", refused)
	}
	if len(f.Service("api").Backends) != 4 || got.File.Service("rpc") != f.Service("rpc") {
		t.Fatal("Filter changed the view it was given, or copied a service it did not filter")
	}
	if _, refused := (Admission{}).Filter(v); len(refused) != 3 {
		t.Fatalf("without allow_loopback: %d refused, want 3", len(refused))
	}
}

// TestListenerTakes: a listener's address as a flag writes it covers the addresses it
// accepts on: its own, localhost's loopback, every address of the host for a wildcard.
func TestListenerTakes(t *testing.T) {
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		listen, ap string
		want       bool
	}{
		{"127.0.0.1:9100", "127.0.0.1:9100", true},
		{"127.0.0.1:9100", "127.0.0.1:9101", false},
		{"127.0.0.1:9100", "127.0.0.2:9100", false},
		{"localhost:9100", "127.0.0.1:9100", true},
		{"localhost:9100", "[::1]:9100", true},
		{":9100", "127.0.0.1:9100", true},
		{"0.0.0.0:9100", "[::ffff:127.0.0.1]:9100", true},
		{"[::]:9100", "[::1]:9100", true},
		{":9100", "192.0.2.77:9100", false}, // not an address of this host
		{"[::1]:9100", "[::1]:9100", true},
	} {
		if got := ListenerTakes(tc.listen, ap(tc.ap)); got != tc.want {
			t.Errorf("%s takes %s: %v, want %v", tc.listen, tc.ap, got, tc.want)
		}
	}
}

// TestRefusals: each refusal is new once while it lasts; one that left the view and came
// back is new again.
func TestRefusals(t *testing.T) {
	var rs Refusals
	a, b := Refused{"api", "127.0.0.1:1", "x"}, Refused{"api", "169.254.169.254:80", "y"}
	if fresh := rs.Set([]Refused{a, b}); len(fresh) != 2 {
		t.Fatalf("first view: %d new", len(fresh))
	}
	if fresh := rs.Set([]Refused{a, b}); len(fresh) != 0 {
		t.Fatalf("the same view again: %d new", len(fresh))
	}
	rs.Set([]Refused{a})
	if fresh := rs.Set([]Refused{a, b}); len(fresh) != 1 || fresh[0] != b {
		t.Fatalf("b came back: new %v", fresh)
	}
	if l := rs.List(); len(l) != 2 || l[0] != a {
		t.Fatalf("list %v", l)
	}
}
