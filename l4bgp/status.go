package l4bgp

import (
	"net/netip"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stickylb/stickylb/policies/status"
)

// Status is the speaker's part of the node's status page: its sessions and what it
// announces.
func (s *Speaker) Status() *status.Routing {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &status.Routing{Protocol: "bgp", ASN: s.cfg.ASN, RouterID: s.cfg.RouterID.String(), Drained: s.drained,
		Forwarding: s.broken, GracefulRestart: s.cfg.GracefulRestart, Peers: []status.RoutePeer{}, Announced: []status.Announcement{}}
	for _, c := range s.cfg.Communities {
		r.Communities = append(r.Communities, FormatCommunity(c))
	}
	for _, cp := range s.cfg.Peers {
		p := s.peers[cp.Addr]
		rp := status.RoutePeer{Address: cp.Addr.String(), ASN: cp.ASN, State: p.state, Up: p.up, Reason: p.cause, Downs: p.downs}
		if !p.since.IsZero() {
			rp.Since = status.Ptr(p.since)
		}
		r.Peers = append(r.Peers, rp)
	}
	for _, a := range s.sortedVIPsLocked() {
		v := s.vips[a]
		an := status.Announcement{VIP: a.String(), Announced: s.offeredLocked(a), Since: v.since, Reason: v.reason, Why: v.why}
		if v.announced && !an.Announced {
			an.Why = "in the node's BGP table; no session with a peer of its family is up"
		}
		r.Announced = append(r.Announced, an)
	}
	return r
}

func (s *Speaker) sortedVIPsLocked() []netip.Addr {
	out := make([]netip.Addr, 0, len(s.vips))
	for a := range s.vips {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

var (
	descPeerUp      = prometheus.NewDesc("stickylb_bgp_peer_up", "1 while the BGP session with the peer is established.", []string{"peer"}, nil)
	descAnnounced   = prometheus.NewDesc("stickylb_bgp_announced", "1 while the node offers the VIP address to a router: in its BGP table and a session with a peer of the address's family up; 0 otherwise (withdrawn, or no session up). A VIP that left the config is exported, 0, for 10 minutes after its withdrawal.", []string{"vip"}, nil)
	descWithdrawals = prometheus.NewDesc("stickylb_bgp_withdrawals_total", "VIP addresses withdrawn, by reason (removed, drain, shutdown, forwarder).", []string{"reason"}, nil)
)

// Collector exports the speaker's metrics.
func (s *Speaker) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Speaker }

func (collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descPeerUp
	ch <- descAnnounced
	ch <- descWithdrawals
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.peers {
		ch <- prometheus.MustNewConstMetric(descPeerUp, prometheus.GaugeValue, b2f(p.up), p.peer.Addr.String())
	}
	for a := range s.vips {
		ch <- prometheus.MustNewConstMetric(descAnnounced, prometheus.GaugeValue, b2f(s.offeredLocked(a)), a.String())
	}
	for _, r := range reasons {
		ch <- prometheus.MustNewConstMetric(descWithdrawals, prometheus.CounterValue, float64(s.withdrawals[r]), r)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
