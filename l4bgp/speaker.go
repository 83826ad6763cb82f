package l4bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
	"go.uber.org/zap"
)

// Reasons a VIP is withdrawn (the label of stickylb_bgp_withdrawals_total).
const (
	// ReasonRemoved: the forwarder no longer serves the VIP (it left the config).
	ReasonRemoved = "removed"
	// ReasonDrain: the node is drained (`stickylb xdp drain`).
	ReasonDrain = "drain"
	// ReasonShutdown: the node is stopping (SIGTERM, SIGINT).
	ReasonShutdown = "shutdown"
	// ReasonForwarder: the node can no longer forward (program detached, interface down,
	// maps unreadable), or forwards with tables behind the config the rest of the fleet
	// holds (an edit it failed to install, retried meanwhile).
	ReasonForwarder = "forwarder"
)

var reasons = []string{ReasonRemoved, ReasonDrain, ReasonShutdown, ReasonForwarder}

// Speaker announces a node's VIPs to its peers. Its methods never block on BGP: they set
// what should be announced and return; a goroutine of its own talks to GoBGP.
type Speaker struct {
	cfg Config
	log *zap.Logger
	srv *server.BgpServer
	// ctx ends with Close (or the context Start was given): the speaker's goroutines and
	// GoBGP's watch end with it.
	ctx    context.Context
	cancel context.CancelFunc

	kick chan struct{}

	mu sync.Mutex
	// served: the forwarder's VIP addresses; drained, broken: why the node is drained, or
	// cannot forward ("" when not); stopping: Shutdown was called.
	served   map[netip.Addr]bool
	drained  string
	broken   string
	stopping bool
	closing  bool // Close was called
	// vips: every VIP address seen, announced (in GoBGP's table) or not and why.
	vips map[netip.Addr]*vipState
	// forgetAfter: how long a VIP that left the config stays in vips, withdrawn, after its
	// withdrawal (its announced 0 stays exported for alerts to see).
	forgetAfter time.Duration
	peers       map[netip.Addr]*peerState
	withdrawals map[string]uint64
	// want counts the changes asked for, done the last one the reconciler carried out;
	// waiters holds, by change, the channel closed once done reaches it.
	want, done uint64
	waiters    map[uint64]chan struct{}
	running    bool
	// planned, when set (by a test), is called by reconcile once it has planned a change
	// and let go of mu, before it hands the change to GoBGP.
	planned func()
}

type vipState struct {
	announced bool
	since     time.Time
	reason    string // why not announced
	why       string // the reason's detail
}

// New checks cfg and makes a speaker; Start runs it.
func New(cfg Config, log *zap.Logger) (*Speaker, error) {
	if cfg.Hold == 0 {
		cfg.Hold = DefaultHold
	}
	if cfg.GracefulRestart && cfg.RestartTime == 0 {
		cfg.RestartTime = DefaultRestartTime
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Speaker{cfg: cfg, log: log.Named("bgp"), kick: make(chan struct{}, 1), served: map[netip.Addr]bool{},
		vips: map[netip.Addr]*vipState{}, peers: map[netip.Addr]*peerState{}, withdrawals: map[string]uint64{},
		waiters: map[uint64]chan struct{}{}, forgetAfter: forgetWithdrawn}
	for _, p := range cfg.Peers {
		s.peers[p.Addr] = &peerState{peer: p, state: "idle"}
	}
	return s, nil
}

// Start runs GoBGP (announcing only: it listens on no port and keeps no route it
// receives), puts the VIPs set so far in its table, then configures the peers, so that the
// first UPDATE a router gets already holds them (and End-of-RIB, after a graceful restart,
// follows them). It returns once the peers are configured; sessions come up on their own.
func (s *Speaker) Start(ctx context.Context) error {
	ctx, s.cancel = context.WithCancel(ctx)
	s.ctx = ctx
	s.srv = server.NewBgpServer(server.LoggerOption(slog.New(&slogBridge{s: s}), nil))
	go s.srv.Serve()
	if err := s.srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn: s.cfg.ASN, RouterId: s.cfg.RouterID.String(), ListenPort: -1,
	}}); err != nil {
		s.srv.Stop()
		return fmt.Errorf("starting BGP: %w", err)
	}
	if err := s.rejectReceived(ctx); err != nil {
		s.srv.Stop()
		return err
	}
	if err := s.srv.WatchEvent(ctx, server.WatchEventMessageCallbacks{OnPeerUpdate: s.onPeer}, server.WatchPeer()); err != nil {
		s.srv.Stop()
		return fmt.Errorf("watching BGP peers: %w", err)
	}
	s.mu.Lock()
	s.running = true
	s.mu.Unlock()
	s.reconcile()
	for _, p := range s.cfg.Peers {
		if err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: s.peerConf(p, s.cfg.GracefulRestart && s.cfg.Restarting)}); err != nil {
			s.srv.Stop()
			return fmt.Errorf("adding BGP peer %s: %w", p.Addr, err)
		}
	}
	s.log.Info("BGP speaker started", zap.Uint32("asn", s.cfg.ASN), zap.Stringer("router_id", s.cfg.RouterID),
		zap.Int("peers", len(s.cfg.Peers)), zap.Bool("graceful_restart", s.cfg.GracefulRestart),
		zap.Bool("restarting", s.cfg.GracefulRestart && s.cfg.Restarting))
	go s.loop(ctx)
	return nil
}

// rejectReceived keeps GoBGP's table to the node's own routes: whatever a router sends is
// dropped on import (routers should send nothing to LB nodes; this bounds what they can).
func (s *Speaker) rejectReceived(ctx context.Context) error {
	const name = "stickylb-originate-only"
	err := s.srv.AddPolicy(ctx, &api.AddPolicyRequest{Policy: &api.Policy{Name: name, Statements: []*api.Statement{{
		Name:       name + "-local",
		Conditions: &api.Conditions{RouteType: api.Conditions_ROUTE_TYPE_LOCAL},
		Actions:    &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_ACCEPT},
	}}}})
	if err == nil {
		err = s.srv.AddPolicyAssignment(ctx, &api.AddPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
			Name: "global", Direction: api.PolicyDirection_POLICY_DIRECTION_IMPORT,
			Policies: []*api.Policy{{Name: name}}, DefaultAction: api.RouteAction_ROUTE_ACTION_REJECT,
		}})
	}
	if err != nil {
		return fmt.Errorf("setting the BGP import policy: %w", err)
	}
	return nil
}

// peerConf is GoBGP's configuration of peer p: the family of its address only, the hold
// time, a connect retry short enough to come up within 5 s, MD5, graceful restart.
func (s *Speaker) peerConf(p Peer, restarting bool) *api.Peer {
	fam := &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
	if p.Addr.Is6() {
		fam.Afi = api.Family_AFI_IP6
	}
	af := &api.AfiSafi{Config: &api.AfiSafiConfig{Family: fam, Enabled: true},
		PrefixLimits: &api.PrefixLimit{Family: fam, MaxPrefixes: maxReceived}}
	hold := uint64(s.cfg.Hold / time.Second)
	conf := &api.Peer{
		Conf: &api.PeerConf{NeighborAddress: p.Addr.String(), PeerAsn: p.ASN, AuthPassword: s.cfg.Password},
		Timers: &api.Timers{Config: &api.TimersConfig{
			ConnectRetry: uint64(connectRetry / time.Second), HoldTime: hold, KeepaliveInterval: max(1, hold/3),
			IdleHoldTimeAfterReset: 1,
		}},
		Transport: &api.Transport{RemotePort: uint32(s.cfg.Port)},
		AfiSafis:  []*api.AfiSafi{af},
	}
	if s.cfg.GracefulRestart {
		// No NotificationEnabled (the N-bit) and no long-lived restart: a node that dies
		// silently must leave the routers' tables at the hold time, not the restart time.
		conf.GracefulRestart = &api.GracefulRestart{Enabled: true, RestartTime: uint32(s.cfg.RestartTime / time.Second),
			DeferralTime: 1, LocalRestarting: restarting}
		af.MpGracefulRestart = &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}
	}
	return conf
}

// SetServed sets the VIP addresses the forwarder serves. The returned channel is closed
// once GoBGP has been told (those announced, the others withdrawn); nobody has to wait
// for it but a caller about to delete a VIP's tables.
func (s *Speaker) SetServed(addrs []netip.Addr) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	served := map[netip.Addr]bool{}
	for _, a := range addrs {
		served[a.Unmap()] = true
	}
	s.served = served
	return s.changedLocked()
}

// Drain withdraws every VIP and keeps them withdrawn until Undrain; the forwarder goes on
// forwarding what still arrives. why is logged and shown. It reports whether the node was
// drained already.
func (s *Speaker) Drain(why string) (already bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	already = s.drained != ""
	if why == "" {
		why = "drained"
	}
	s.drained = why
	s.log.Warn("node drained: withdrawing every VIP", zap.String("why", why), zap.Bool("already", already))
	s.changedLocked()
	return already
}

// Undrain announces the VIPs again after Drain. It reports whether the node was drained.
func (s *Speaker) Undrain() (was bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	was = s.drained != ""
	s.drained = ""
	s.log.Info("node undrained: announcing the VIPs again", zap.Bool("was_drained", was))
	s.changedLocked()
	return was
}

// SetForwarding says whether the forwarder can forward: err, when not nil, says why not,
// and every VIP is withdrawn until it is nil again.
func (s *Speaker) SetForwarding(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	why := ""
	if err != nil {
		why = err.Error()
	}
	if why == s.broken {
		return
	}
	if why != "" {
		s.log.Error("the forwarder cannot forward: withdrawing every VIP", zap.String("why", why))
	} else {
		s.log.Info("the forwarder forwards again: announcing the VIPs")
	}
	s.broken = why
	s.changedLocked()
}

// Shutdown withdraws every VIP for good (the node stops). The channel is closed once
// GoBGP has been told; the caller then waits its drain time and calls Close.
func (s *Speaker) Shutdown() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopping = true
	return s.changedLocked()
}

// Close ends every session and stops GoBGP and every goroutine of the speaker. With
// graceful (and graceful restart advertised) it leaves without a NOTIFICATION and without
// withdrawing: routers keep the routes for the restart time while the pinned program
// forwards. Otherwise each session ends with a Cease NOTIFICATION, on which routers drop
// what the node announced.
func (s *Speaker) Close(graceful bool) error {
	s.mu.Lock()
	again := s.closing
	s.running = false
	s.closing = true
	s.mu.Unlock()
	if s.srv == nil || again {
		return nil
	}
	defer s.cancel() // the reconciler, the peers being added again, GoBGP's watch
	graceful = graceful && s.cfg.GracefulRestart
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.StopBgp(ctx, &api.StopBgpRequest{AllowGracefulRestart: graceful})
	// StopBgp leaves GoBGP's BFD loop running: Stop ends it (its own StopBgp, on a server
	// stopped already, only logs that it is, which the log bridge drops while closing).
	s.srv.Stop()
	s.log.Info("BGP speaker stopped", zap.Bool("graceful_restart", graceful))
	if err != nil {
		return fmt.Errorf("stopping BGP: %w", err)
	}
	return nil
}

// changedLocked records a change of what should be announced and wakes the reconciler. The
// channel it returns is closed once a reconcile that began after this change (and so
// carried it out) has handed GoBGP everything: not by one already under way.
func (s *Speaker) changedLocked() <-chan struct{} {
	s.want++
	ch := make(chan struct{})
	s.waiters[s.want] = ch
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return ch
}

// doneLocked records that every change up to gen is in GoBGP's table and wakes their
// waiters.
func (s *Speaker) doneLocked(gen uint64) {
	s.done = gen
	for g, ch := range s.waiters {
		if g <= gen {
			close(ch)
			delete(s.waiters, g)
		}
	}
}

// loop brings GoBGP's table to what should be announced after each change, and retries
// what failed every second, until ctx ends.
func (s *Speaker) loop(ctx context.Context) {
	retry := time.NewTicker(time.Second)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-retry.C:
			s.mu.Lock()
			s.forgetLocked(time.Now())
			behind := s.done < s.want
			s.mu.Unlock()
			if !behind {
				continue
			}
		}
		s.reconcile()
	}
}

// forgetLocked drops the VIPs that left the config and were withdrawn more than
// forgetAfter ago: a control plane's VIP churn grows neither the status page nor the
// metrics.
func (s *Speaker) forgetLocked(now time.Time) {
	for a, v := range s.vips {
		if !v.announced && !s.served[a] && v.reason == ReasonRemoved && now.Sub(v.since) > s.forgetAfter {
			delete(s.vips, a)
		}
	}
}

// offeredLocked says whether VIP a is offered to a router: in GoBGP's table, and a session
// with a peer of its family up.
func (s *Speaker) offeredLocked(a netip.Addr) bool {
	if v := s.vips[a]; v == nil || !v.announced {
		return false
	}
	for _, p := range s.peers {
		if p.up && p.peer.Addr.Is4() == a.Is4() {
			return true
		}
	}
	return false
}

// verdict is what should become of one VIP address: announced, or not, for reason (a
// withdrawal's label, empty when nothing withdrew it) and why.
type verdict struct {
	announce    bool
	reason, why string
}

// wantLocked says what should become of every VIP address known.
func (s *Speaker) wantLocked() map[netip.Addr]verdict {
	out := map[netip.Addr]verdict{}
	for a := range s.vips {
		out[a] = verdict{reason: ReasonRemoved, why: "the forwarder no longer serves it"}
	}
	for a := range s.served {
		switch {
		case s.stopping:
			out[a] = verdict{reason: ReasonShutdown, why: "the node is stopping"}
		case s.drained != "":
			out[a] = verdict{reason: ReasonDrain, why: s.drained}
		case s.broken != "":
			out[a] = verdict{reason: ReasonForwarder, why: s.broken}
		case !s.hasPeerOfLocked(a):
			out[a] = verdict{why: "no peer of its family"}
		default:
			out[a] = verdict{announce: true}
		}
	}
	return out
}

func (s *Speaker) hasPeerOfLocked(a netip.Addr) bool {
	return slices.ContainsFunc(s.cfg.Peers, func(p Peer) bool { return p.Addr.Is4() == a.Is4() })
}

// reconcile adds to GoBGP the paths that should be announced and are not, and withdraws
// those announced that should not be; one call at a time (from Start, then from loop).
func (s *Speaker) reconcile() {
	s.mu.Lock()
	if !s.running {
		s.mu.Unlock()
		return
	}
	gen := s.want
	want := s.wantLocked()
	var add, del []netip.Addr
	for a, w := range want {
		v := s.vips[a]
		switch {
		case w.announce && (v == nil || !v.announced):
			add = append(add, a)
		case !w.announce && v != nil && v.announced:
			del = append(del, a)
		}
	}
	planned := s.planned
	s.mu.Unlock()
	if planned != nil {
		planned()
	}
	slices.SortFunc(add, netip.Addr.Compare)
	slices.SortFunc(del, netip.Addr.Compare)
	addErr := s.apply(add, false)
	delErr := s.apply(del, true)

	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	byReason := map[string][]string{}
	for a, w := range want {
		v := s.vips[a]
		if v == nil {
			v = &vipState{since: now}
			s.vips[a] = v
		}
		switch {
		case slices.Contains(add, a) && addErr == nil:
			v.announced, v.since, v.reason, v.why = true, now, "", ""
		case slices.Contains(del, a) && delErr == nil:
			v.announced, v.since = false, now
			s.withdrawals[w.reason]++
			byReason[w.reason+"\x00"+w.why] = append(byReason[w.reason+"\x00"+w.why], a.String())
			fallthrough
		case !v.announced:
			v.reason, v.why = w.reason, w.why
		}
	}
	for k, vips := range byReason {
		reason, why, _ := strings.Cut(k, "\x00")
		s.log.Warn("withdrew VIPs", zap.Strings("vips", vips), zap.String("reason", reason), zap.String("why", why),
			zap.Int("peers_up", s.upLocked()))
	}
	if len(add) > 0 && addErr == nil {
		s.log.Info("announcing VIPs", zap.Stringers("vips", add), zap.Int("peers_up", s.upLocked()))
	}
	if err := errors.Join(addErr, delErr); err != nil {
		s.log.Error("updating the BGP table (retried every second)", zap.Error(err))
		return
	}
	s.doneLocked(gen)
}

// apply adds (or withdraws) the host routes of addrs in GoBGP's table; GoBGP sends them
// to the peers of their family.
func (s *Speaker) apply(addrs []netip.Addr, withdraw bool) error {
	if len(addrs) == 0 {
		return nil
	}
	paths := make([]*apiutil.Path, 0, len(addrs))
	for _, a := range addrs {
		p, err := s.path(a, withdraw)
		if err != nil {
			return err
		}
		paths = append(paths, p)
	}
	if withdraw {
		if err := s.srv.DeletePath(apiutil.DeletePathRequest{Paths: paths}); err != nil {
			return fmt.Errorf("withdrawing %v: %w", addrs, err)
		}
		return nil
	}
	if _, err := s.srv.AddPath(apiutil.AddPathRequest{Paths: paths}); err != nil {
		return fmt.Errorf("announcing %v: %w", addrs, err)
	}
	return nil
}

// path is the route of VIP address a: a /32 or /128, origin IGP, the node's next hop of
// its family, its communities.
func (s *Speaker) path(a netip.Addr, withdraw bool) (*apiutil.Path, error) {
	fam, nh := bgp.RF_IPv4_UC, s.cfg.NextHop4
	if a.Is6() {
		fam, nh = bgp.RF_IPv6_UC, s.cfg.NextHop6
	}
	nlri, err := bgp.NewIPAddrPrefix(netip.PrefixFrom(a, a.BitLen()))
	if err != nil {
		return nil, fmt.Errorf("route of %s: %w", a, err)
	}
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)}
	if fam == bgp.RF_IPv4_UC {
		hop, err := bgp.NewPathAttributeNextHop(nh)
		if err != nil {
			return nil, fmt.Errorf("next hop %s of %s: %w", nh, a, err)
		}
		attrs = append(attrs, hop)
	} else {
		reach, err := bgp.NewPathAttributeMpReachNLRI(fam, []bgp.PathNLRI{{NLRI: nlri}}, nh)
		if err != nil {
			return nil, fmt.Errorf("next hop %s of %s: %w", nh, a, err)
		}
		attrs = append(attrs, reach)
	}
	if len(s.cfg.Communities) > 0 {
		attrs = append(attrs, bgp.NewPathAttributeCommunities(s.cfg.Communities))
	}
	return &apiutil.Path{Family: fam, Nlri: nlri, Attrs: attrs, Age: time.Now().Unix(), Withdrawal: withdraw}, nil
}
