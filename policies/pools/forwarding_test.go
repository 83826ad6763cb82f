package pools

import (
	"strings"
	"testing"
)

// forwardingFile is a vip service with every way a backend gets its forwarding: inherited
// from the service, its own, and auto made NAT by a port that is not the VIP's.
const forwardingFile = `services:
  - name: mixed
    protocol: tcp
    vip: 10.9.9.9:443
    forwarding: %s
    backends:
      - {address: 10.0.0.1:443}
      - {address: 10.0.0.2:443, forwarding: dr}
      - {address: 10.0.0.3:443, forwarding: nat}
      - {address: 10.0.0.4:443, forwarding: auto}
      - {address: 10.0.0.5:8443, forwarding: nat}
      - {address: 10.0.0.6:8443, forwarding: auto}
      - {address: 10.0.0.7:8443}
`

// TestForwardingOf: a backend's own forwarding wins, else the service's, else auto; auto
// with a port other than the VIP's is NAT (direct routing cannot change the port); auto on
// the VIP's port stays auto for the loader to decide by subnet.
func TestForwardingOf(t *testing.T) {
	for _, tc := range []struct {
		service string // as written; "" omits the field
		want    [7]Forwarding
	}{
		{"", [7]Forwarding{ForwardingAuto, ForwardingDR, ForwardingNAT, ForwardingAuto, ForwardingNAT, ForwardingNAT, ForwardingNAT}},
		{"auto", [7]Forwarding{ForwardingAuto, ForwardingDR, ForwardingNAT, ForwardingAuto, ForwardingNAT, ForwardingNAT, ForwardingNAT}},
		{"nat", [7]Forwarding{ForwardingNAT, ForwardingDR, ForwardingNAT, ForwardingAuto, ForwardingNAT, ForwardingNAT, ForwardingNAT}},
	} {
		src := strings.Replace(forwardingFile, "%s", tc.service, 1)
		if tc.service == "" {
			src = strings.Replace(forwardingFile, "    forwarding: %s\n", "", 1)
		}
		f, err := Parse("f.yaml", []byte(src))
		if err != nil {
			t.Fatalf("service forwarding %q: %v", tc.service, err)
		}
		s := f.Services[0]
		if s.Forwarding == "" || tc.service != "" && s.Forwarding != Forwarding(tc.service) {
			t.Errorf("service forwarding %q decoded as %q", tc.service, s.Forwarding)
		}
		for i, b := range s.Backends {
			if got := s.ForwardingOf(b); got != tc.want[i] {
				t.Errorf("service forwarding %q, backend %s (own %q): %q, want %q", tc.service, b.Address, b.Forwarding, got, tc.want[i])
			}
		}
	}
}

// TestForwardingDefault: a vip service without forwarding gets auto, and its backends
// keep "" (inherit); a service without a vip has none.
func TestForwardingDefault(t *testing.T) {
	f, err := Parse("d.yaml", []byte(`services:
  - {name: v, protocol: udp, vip: "[2001:db8::9]:53", backends: [{address: "[2001:db8::1]:53"}]}
  - {name: l, protocol: tcp, listen: 0.0.0.0:53, backends: [{address: 10.0.0.1:53}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if v := f.Service("v"); v.Forwarding != ForwardingAuto || v.Backends[0].Forwarding != "" {
		t.Errorf("vip service: forwarding %q, backend's %q; want auto and \"\"", v.Forwarding, v.Backends[0].Forwarding)
	}
	if l := f.Service("l"); l.Forwarding != "" {
		t.Errorf("listen-only service: forwarding %q, want none", l.Forwarding)
	}
}

// TestForwardingDRPortRule: the port rule of direct routing binds only backends whose
// forwarding is dr, and reports each one at its address; a service-wide dr reaches a
// backend that does not override it.
func TestForwardingDRPortRule(t *testing.T) {
	src := strings.Replace(forwardingFile, "%s", "dr", 1)
	_, err := Parse("r.yaml", []byte(src))
	if err == nil {
		t.Fatal("forwarding: dr with backends on port 8443 accepted")
	}
	lines := strings.Split(err.Error(), "\n")
	// Only 10.0.0.7:8443 inherits dr with another port; .5 and .6 say nat and auto.
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "r.yaml:13:19: backend 10.0.0.7:8443: port 8443 differs from the vip's 443") {
		t.Fatalf("want one error at 10.0.0.7's address, got:\n%v", err)
	}
	if !strings.Contains(lines[0], "use forwarding: nat or auto") {
		t.Errorf("the error does not say what to write: %s", lines[0])
	}
}

// TestForwardingBadValueIsQuiet: a rejected forwarding value is one error, not also the
// port rule's (which would read a forwarding nobody wrote).
func TestForwardingBadValueIsQuiet(t *testing.T) {
	_, err := Parse("q.yaml", []byte(`services:
  - name: s
    protocol: tcp
    vip: 10.9.9.9:443
    forwarding: dr
    backends: [{address: 10.0.0.1:8443, forwarding: nay}]
`))
	if err == nil || strings.Count(err.Error(), "\n") != 0 || !strings.Contains(err.Error(), `forwarding "nay"`) {
		t.Fatalf("want exactly the bad value reported, got:\n%v", err)
	}
}

// TestForwardingTunnel: a tunnel service forwards every backend by tunnel, on port 6080 with
// second chance unless it says otherwise; the other modes carry no tunnel settings.
func TestForwardingTunnel(t *testing.T) {
	f, err := Parse("t.yaml", []byte(`services:
  - {name: a, protocol: tcp, vip: 10.9.9.9:80, forwarding: tunnel, backends: [{address: 10.0.0.1:80}, {address: 10.0.0.2:80}]}
  - {name: b, protocol: udp, vip: "[2001:db8::9]:53", forwarding: tunnel, tunnel_port: 7000, second_chance: false, backends: [{address: "[2001:db8::1]:53"}]}
  - {name: c, protocol: tcp, vip: 10.9.9.8:81, backends: [{address: 10.0.0.1:81}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		port   uint16
		second bool
		fwd    Forwarding
	}{{"a", DefaultTunnelPort, true, ForwardingTunnel}, {"b", 7000, false, ForwardingTunnel}, {"c", 0, false, ForwardingAuto}} {
		s := f.Service(tc.name)
		if s.TunnelPort != tc.port || s.SecondChance != tc.second {
			t.Errorf("service %s: tunnel_port %d, second_chance %v; want %d, %v", tc.name, s.TunnelPort, s.SecondChance, tc.port, tc.second)
		}
		for _, b := range s.Backends {
			if got := s.ForwardingOf(b); got != tc.fwd {
				t.Errorf("service %s, backend %s: forwarding %q, want %q", tc.name, b.Address, got, tc.fwd)
			}
		}
	}
}
