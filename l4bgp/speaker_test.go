package l4bgp

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// BIRD on loopback stands for the router (router, in bird_test.go): it accepts the
// speaker's session and holds what it announces; these tests need no root and no namespace.

var nodeHop = netip.MustParseAddr("192.0.2.10")

// newSpeaker starts a speaker peering with r (at port), logging to an observer.
func newSpeaker(t *testing.T, port int, mod func(*Config)) (*Speaker, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	cfg := Config{ASN: nodeASN, RouterID: nodeHop, Peers: []Peer{{Addr: netip.MustParseAddr("127.0.0.1"), ASN: routerASN}},
		NextHop4: nodeHop, Hold: 3 * time.Second, Port: uint16(port), Communities: []uint32{nodeASN<<16 | 7}}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close(false)
		cancel()
		if t.Failed() {
			for _, e := range logs.All() {
				t.Logf("%s %s %v", e.Level, e.Message, e.ContextMap())
			}
		}
	})
	return s, logs
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// TestAnnounceAndWithdraw: the VIPs served are announced as /32s with the node's next hop
// and communities; a VIP that leaves is withdrawn (and the caller's wait ends once GoBGP
// has it); drain, a broken forwarder and shutdown withdraw them all, each counted by
// reason; IPv6 VIPs go to no IPv4 peer.
func TestAnnounceAndWithdraw(t *testing.T) {
	r := newRouter(t, routerOpts{})
	s, logs := newSpeaker(t, r.port, nil)
	s.SetServed(addrs("10.1.0.1", "10.1.0.2", "fd00::1"))
	took := r.waitRoutes(5*time.Second, "10.1.0.1/32", "10.1.0.2/32")
	t.Logf("announced %s after the start", took.Round(time.Millisecond))
	if rt := r.routes()["10.1.0.1/32"]; rt.hop != nodeHop.String() || rt.communities != "(65001,7)" {
		t.Fatalf("route %+v: want next hop %s, community 65001:7", rt, nodeHop)
	}
	for _, a := range s.Status().Announced {
		if a.VIP == "fd00::1" && (a.Announced || a.Why != "no peer of its family") {
			t.Errorf("fd00::1 with no IPv6 peer: %+v", a)
		}
	}
	testwait.Recv(t, s.SetServed(addrs("10.1.0.1", "fd00::1")), 2*time.Second, "the withdrawal handed to GoBGP")
	r.waitRoutes(2*time.Second, "10.1.0.1/32")

	s.Drain("maintenance")
	r.waitRoutes(2 * time.Second)
	if st := s.Status(); st.Drained != "maintenance" || st.Announced[0].Reason != ReasonDrain {
		t.Fatalf("status while drained: %+v", st)
	}
	s.Undrain()
	r.waitRoutes(2*time.Second, "10.1.0.1/32")
	s.SetForwarding(fmt.Errorf("the XDP program is no longer attached to eth0"))
	r.waitRoutes(2 * time.Second)
	s.SetForwarding(nil)
	r.waitRoutes(2*time.Second, "10.1.0.1/32")
	testwait.Recv(t, s.Shutdown(), 2*time.Second, "the shutdown's withdrawals handed to GoBGP")
	r.waitRoutes(2 * time.Second)

	c := s.Collector()
	for reason, want := range map[string]float64{ReasonRemoved: 1, ReasonDrain: 1, ReasonForwarder: 1, ReasonShutdown: 1} {
		if got := metricValue(t, c, "stickylb_bgp_withdrawals_total", reason); got != want {
			t.Errorf("withdrawals{reason=%s} = %v, want %v", reason, got, want)
		}
	}
	if got := metricValue(t, c, "stickylb_bgp_peer_up", "127.0.0.1"); got != 1 {
		t.Errorf("peer_up = %v", got)
	}
	if got := metricValue(t, c, "stickylb_bgp_announced", "10.1.0.2"); got != 0 {
		t.Errorf("announced{10.1.0.2} = %v after its withdrawal", got)
	}
	for _, reason := range []string{ReasonRemoved, ReasonDrain, ReasonForwarder, ReasonShutdown} {
		if logs.FilterMessage("withdrew VIPs").FilterField(zap.String("reason", reason)).Len() == 0 {
			t.Errorf("no withdrawal logged for %s", reason)
		}
	}
}

// TestSessionComesBack: when the router restarts (its session ends with a NOTIFICATION),
// the session comes back, with its routes, within 5 s of the router being back (GoBGP
// alone would idle 5 s after the drop, then dial within 2).
func TestSessionComesBack(t *testing.T) {
	r := newRouter(t, routerOpts{})
	s, logs := newSpeaker(t, r.port, nil)
	s.SetServed(addrs("10.1.0.1"))
	r.waitRoutes(5*time.Second, "10.1.0.1/32")
	r.stop()
	testwait.For(t, 2*time.Second, "the speaker sees the drop", func() (bool, string) {
		return logs.FilterMessage("BGP session down").Len() > 0, ""
	})
	r = newRouterAt(t, r.port, routerOpts{})
	back := time.Now()
	r.waitRoutes(5*time.Second, "10.1.0.1/32")
	t.Logf("session and route back %s after the router", time.Since(back).Round(time.Millisecond))
	if st := s.Status().Peers[0]; st.Downs != 1 || !st.Up {
		t.Fatalf("peer status %+v: want up, one session ended", st)
	}
}

// TestRefusedPeerLogged: a peer that refuses is logged within 10 s with the reason, once
// while the cause stays, again when it changes (the session comes up).
func TestRefusedPeerLogged(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens: connection refused
	s, logs := newSpeaker(t, port, nil)
	s.SetServed(addrs("10.1.0.1"))
	unreachable := func() *observer.ObservedLogs { return logs.FilterMessage("BGP peer not reachable") }
	took := testwait.For(t, 10*time.Second, "the refusal logged", func() (bool, string) { return unreachable().Len() > 0, "" })
	if e := unreachable().All()[0]; !strings.Contains(e.ContextMap()["reason"].(string), "connection refused") {
		t.Fatalf("logged %v", e.ContextMap())
	}
	t.Logf("refusal logged %s after the start", took.Round(time.Millisecond))
	// Two more attempts (2 s apart): the same cause, logged no second time.
	dials := func() uint64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.peers[netip.MustParseAddr("127.0.0.1")].dialFailures
	}
	first := dials()
	testwait.For(t, 3*connectRetry, "two more dials refused", func() (bool, string) {
		return dials() >= first+2, fmt.Sprintf("%d dials failed", dials())
	})
	if n := unreachable().Len(); n != 1 {
		t.Fatalf("the same refusal logged %d times", n)
	}
	if st := s.Status().Peers[0]; st.Up || !strings.Contains(st.Reason, "connection refused") {
		t.Fatalf("peer status %+v", st)
	}
}

// TestGracefulRestart, against BIRD (in its own process, so that the speaker's side runs
// under -race while GoBGP's races on a router's side stay out of it): Close(true) leaves
// without a NOTIFICATION, so BIRD keeps the routes and says the neighbour is restarting; the
// next speaker, restarting, opens with the Restarting bit and the forwarding state of IPv4
// preserved, announces the VIPs and ends the restart with End-of-RIB: BIRD finishes the
// restart with the routes it kept, none ever withdrawn.
func TestGracefulRestart(t *testing.T) {
	b := newRouter(t, routerOpts{})
	gr := func(c *Config) { c.GracefulRestart = true }
	s, _ := newSpeaker(t, b.port, gr)
	s.SetServed(addrs("10.1.0.1", "10.1.0.2"))
	b.waitRoutes(5*time.Second, "10.1.0.1/32", "10.1.0.2/32")
	if err := s.Close(true); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, "BIRD helping the node restart, its routes kept", func() (bool, string) {
		p := b.show("show", "protocols", "all", "node")
		kept, _ := b.holds("10.1.0.1/32", "10.1.0.2/32")
		return strings.Contains(p, "Neighbor graceful restart active") && kept, p
	})
	s2, _ := newSpeaker(t, b.port, func(c *Config) { gr(c); c.Restarting = true })
	s2.SetServed(addrs("10.1.0.1", "10.1.0.2"))
	testwait.For(t, 10*time.Second, "BIRD done with the restart", func() (bool, string) {
		return strings.Contains(b.logText(), "Neighbor graceful restart done"), b.show("show", "protocols", "all", "node")
	})
	p := b.show("show", "protocols", "all", "node")
	for _, want := range []string{"Restart recovery", "AF preserved: ipv4", "Established"} {
		if !strings.Contains(p, want) {
			t.Errorf("BIRD's view of the restarted node lacks %q:\n%s", want, p)
		}
	}
	if strings.Contains(p, "graceful restart active") {
		t.Errorf("BIRD still in the restart after End-of-RIB:\n%s", p)
	}
	if kept, _ := b.holds("10.1.0.1/32", "10.1.0.2/32"); !kept || !regexp.MustCompile(`Import withdraws:\s+0\s`).MatchString(p) {
		t.Fatalf("routes lost or withdrawn on the way:\n%s\n%s", p, b.show("show", "route", "protocol", "node"))
	}
}

// TestCloseWithdraws: without graceful restart, Close ends the session with a NOTIFICATION
// and the router drops the routes at once.
func TestCloseWithdraws(t *testing.T) {
	r := newRouter(t, routerOpts{})
	s, _ := newSpeaker(t, r.port, nil)
	s.SetServed(addrs("10.1.0.1"))
	r.waitRoutes(5*time.Second, "10.1.0.1/32")
	if err := s.Close(true); err != nil { // graceful asked, but not advertised: a NOTIFICATION
		t.Fatal(err)
	}
	testwait.For(t, 2*time.Second, "the routes dropped", func() (bool, string) {
		got := r.routes()
		return len(got) == 0, fmt.Sprint(got)
	})
}

// series are the values of metric name's series, by their one label's value.
func series(t *testing.T, c prometheus.Collector, name string) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue()
			if m.GetGauge() != nil {
				v = m.GetGauge().GetValue()
			}
			out[m.GetLabel()[0].GetValue()] = v
		}
	}
	return out
}

// metricValue is the value of the series of metric name whose one label is label.
func metricValue(t *testing.T, c prometheus.Collector, name, label string) float64 {
	t.Helper()
	v, ok := series(t, c, name)[label]
	if !ok {
		t.Fatalf("no series %s{%s}", name, label)
	}
	return v
}

// TestMD5: with the router's password the session comes up; with another, the router drops
// the SYNs and the node says the peer does not answer.
func TestMD5(t *testing.T) {
	r := newRouter(t, routerOpts{password: "s3cret"})
	_, logs := newSpeaker(t, r.port, func(c *Config) { c.Password = "wrong" })
	testwait.For(t, 10*time.Second, "the wrong password logged as no answer", func() (bool, string) {
		return logs.FilterMessage("BGP peer not reachable").FilterField(zap.String("reason", "connect: no answer (connect timed out)")).Len() > 0, ""
	})
	if len(r.routes()) != 0 {
		t.Fatal("routes through a session with the wrong password")
	}
	s, _ := newSpeaker(t, r.port, func(c *Config) { c.Password = "s3cret" })
	s.SetServed(addrs("10.1.0.1"))
	r.waitRoutes(5*time.Second, "10.1.0.1/32")
}

// gobgpHolds lists the VIP addresses in the speaker's own GoBGP table (what it has been
// handed, whether or not a router has it yet).
func gobgpHolds(t *testing.T, s *Speaker) []string {
	t.Helper()
	var out []string
	err := s.srv.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: bgp.RF_IPv4_UC},
		func(prefix bgp.NLRI, _ []*apiutil.Path) {
			out = append(out, strings.TrimSuffix(prefix.String(), "/32"))
		})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// TestWithdrawalWaitsForItsOwnChange: the channel SetServed (or Shutdown) returns closes
// only once the change it made is in GoBGP's table, not when a reconcile that began before
// that change ends: the forwarder would delete a VIP's tables while the VIP is still
// announced. The test holds the reconciler inside one change while it makes the next.
func TestWithdrawalWaitsForItsOwnChange(t *testing.T) {
	r := newRouter(t, routerOpts{})
	s, _ := newSpeaker(t, r.port, nil)
	s.SetServed(addrs("10.1.0.1"))
	r.waitRoutes(5*time.Second, "10.1.0.1/32")
	for _, c := range []struct {
		what   string
		change func() <-chan struct{}
		holds  []string
	}{
		{"a VIP that leaves", func() <-chan struct{} { return s.SetServed(addrs("10.1.0.1")) }, []string{"10.1.0.1"}},
		{"the shutdown", s.Shutdown, nil},
	} {
		entered := make(chan struct{}, 2)
		release := make(chan struct{})
		s.mu.Lock()
		s.planned = func() { entered <- struct{}{}; <-release }
		s.mu.Unlock()
		s.SetServed(addrs("10.1.0.1", "10.1.0.2")) // the reconciler takes this change up...
		testwait.Recv(t, entered, 2*time.Second, "the reconciler inside the first change")
		done := c.change() // ...and this one is made meanwhile
		release <- struct{}{}
		testwait.Recv(t, entered, 2*time.Second, "the reconciler inside the second change")
		select {
		case <-done:
			t.Fatalf("%s: the wait ended before the reconcile of its change, GoBGP holding %v", c.what, gobgpHolds(t, s))
		default:
		}
		close(release)
		testwait.Recv(t, done, 2*time.Second, c.what+" handed to GoBGP")
		if got := gobgpHolds(t, s); !slices.Equal(got, c.holds) {
			t.Fatalf("%s: the wait ended with GoBGP holding %v, want %v", c.what, got, c.holds)
		}
		s.mu.Lock()
		s.planned = nil
		s.mu.Unlock()
	}
}

// received counts the routes the speaker's GoBGP holds from the router (its Adj-RIB-In,
// before the import policy).
func received(t *testing.T, s *Speaker) int {
	t.Helper()
	n := 0
	err := s.srv.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_ADJ_IN, Name: "127.0.0.1", Family: bgp.RF_IPv4_UC},
		func(_ bgp.NLRI, paths []*apiutil.Path) { n += len(paths) })
	if err != nil && !strings.Contains(err.Error(), "doesn't exist") { // deleted: nothing held
		t.Fatal(err)
	}
	return n
}

// TestReceivedRoutesBounded: a router that sends routes (it should send none) cannot make a
// node hold them: past maxReceived the node ends the session with a Cease (maximum number
// of prefixes reached), logs it with the reason and shows it on the status page, and what
// GoBGP held goes with the session. An UPDATE is read whole before the count is checked
// (BIRD's are 4096 bytes: at most about 810 /32s), and those already read when the limit is
// crossed are handled before the session ends: the bound is three UPDATEs' worth, where
// without a limit the node held all 20,000.
func TestReceivedRoutesBounded(t *testing.T) {
	const sent = 20000
	r := newRouter(t, routerOpts{originate: sent})
	s, logs := newSpeaker(t, r.port, nil)
	s.SetServed(addrs("10.1.0.1"))
	most := 0
	took := testwait.For(t, 10*time.Second, "the session ended for the routes the router sent", func() (bool, string) {
		n := received(t, s)
		most = max(most, n)
		st := s.Status().Peers[0]
		return strings.Contains(st.Reason, "maximum number of prefixes"), fmt.Sprintf("holding %d of the %d routes the router sent; peer %+v", n, sent, st)
	})
	t.Logf("the session ended %s after the start; at most %d received routes held at a look", took.Round(time.Millisecond), most)
	if most > 3*810 {
		t.Fatalf("held %d received routes: more than three UPDATEs' worth", most)
	}
	if n := received(t, s); n != 0 {
		t.Fatalf("still holding %d received routes after the session ended", n)
	}
	if logs.FilterMessage("BGP session down").FilterFieldKey("reason").Len() == 0 {
		t.Fatal("no session end logged")
	}
	e := logs.FilterMessage("BGP session down").All()[0]
	if reason := e.ContextMap()["reason"].(string); !strings.Contains(reason, "maximum number of prefixes") {
		t.Fatalf("session end logged with reason %q", reason)
	}
}

// TestCloseEndsEveryGoroutine: Close stops everything GoBGP and the speaker started (GoBGP's
// BFD loop, which StopBgp leaves running, among them): a node that stops its speaker, or a
// test that makes many, keeps no goroutine of it.
func TestCloseEndsEveryGoroutine(t *testing.T) {
	for _, graceful := range []bool{false, true} {
		r := newRouter(t, routerOpts{}) // a fresh one: GoBGP waits 5 s after a NOTIFICATION
		before := runtime.NumGoroutine()
		s, _ := newSpeaker(t, r.port, func(c *Config) { c.GracefulRestart = graceful })
		s.SetServed(addrs("10.1.0.1"))
		r.waitRoutes(5*time.Second, "10.1.0.1/32")
		if err := s.Close(graceful); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 5*time.Second, "the speaker's goroutines ended", func() (bool, string) {
			n := runtime.NumGoroutine()
			return n <= before, fmt.Sprintf("%d goroutines, %d before the speaker started", n, before)
		})
	}
}

// hasSeries says whether the collector exports metric name with label value label.
func hasSeries(t *testing.T, c prometheus.Collector, name, label string) bool {
	t.Helper()
	_, ok := series(t, c, name)[label]
	return ok
}

// TestAnnouncedMeansOffered: stickylb_bgp_announced is 1 only while the VIP is in the
// speaker's table and a session with a peer of its family is up (offered to a router), not
// while every session is down.
func TestAnnouncedMeansOffered(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens: no session
	s, _ := newSpeaker(t, port, nil)
	s.SetServed(addrs("10.1.0.1"))
	testwait.For(t, 5*time.Second, "10.1.0.1 in the speaker's table", func() (bool, string) {
		got := gobgpHolds(t, s)
		return slices.Equal(got, []string{"10.1.0.1"}), fmt.Sprint(got)
	})
	if got := metricValue(t, s.Collector(), "stickylb_bgp_announced", "10.1.0.1"); got != 0 {
		t.Fatalf("announced{10.1.0.1} = %v with no session up", got)
	}
	if a := s.Status().Announced[0]; a.Announced || !strings.Contains(a.Why, "no session") {
		t.Fatalf("status with no session up: %+v", a)
	}
}

// TestWithdrawnVIPsForgotten: a VIP that left the config keeps its announced 0 for a while
// (an alert on it sees the withdrawal), then its series and its row go: VIP churn under a
// control plane grows neither.
func TestWithdrawnVIPsForgotten(t *testing.T) {
	r := newRouter(t, routerOpts{})
	s, _ := newSpeaker(t, r.port, nil)
	s.mu.Lock()
	s.forgetAfter = time.Second
	s.mu.Unlock()
	s.SetServed(addrs("10.1.0.1", "10.1.0.2"))
	r.waitRoutes(5*time.Second, "10.1.0.1/32", "10.1.0.2/32")
	testwait.Recv(t, s.SetServed(addrs("10.1.0.1")), 2*time.Second, "10.1.0.2's withdrawal handed to GoBGP")
	left := time.Now()
	if got := metricValue(t, s.Collector(), "stickylb_bgp_announced", "10.1.0.2"); got != 0 {
		t.Fatalf("announced{10.1.0.2} = %v after its withdrawal", got)
	}
	testwait.For(t, 5*time.Second, "10.1.0.2 forgotten", func() (bool, string) {
		return !hasSeries(t, s.Collector(), "stickylb_bgp_announced", "10.1.0.2") && len(s.Status().Announced) == 1,
			fmt.Sprintf("%+v", s.Status().Announced)
	})
	if d := time.Since(left); d < time.Second {
		t.Fatalf("forgotten %s after its withdrawal, before the grace period", d)
	}
	if !hasSeries(t, s.Collector(), "stickylb_bgp_announced", "10.1.0.1") {
		t.Fatal("the VIP still served was forgotten too")
	}
}
