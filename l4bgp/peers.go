package l4bgp

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"go.uber.org/zap"
)

// peerState is what the speaker knows of one peer's session.
type peerState struct {
	peer  Peer
	state string // idle, connect, active, opensent, openconfirm, established
	up    bool
	since time.Time // of the last change of up
	// cause is why the session is not up (the last connect error, or why it ended);
	// logged once per change.
	cause string
	// downs counts the sessions that ended.
	downs uint64
	// dialFailures counts the dials that failed.
	dialFailures uint64
	// ceased: the node ended the session because the peer sent too many routes; it dials
	// the peer again after ceasedRetry.
	ceased bool
}

// ceasedCause is why a session the node ended for too many routes is down.
var ceasedCause = fmt.Sprintf("the node ended the session: the router sent more than %d routes (a node takes none; "+
	"configure the router to send nothing): Cease, maximum number of prefixes reached; dialled again every %s",
	maxReceived, ceasedRetry)

// tooManyRoutes ends the session of the peer at addr, which sent more than maxReceived
// routes. GoBGP has sent the Cease already, but keeps the session, and stores what the
// peer still sends, until the peer closes it: the node deletes the peer at once, and adds it
// again after ceasedRetry (GoBGP alone would never dial it again).
func (s *Speaker) tooManyRoutes(addr string) {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.peers[a.Unmap()]
	if p == nil || p.ceased || !s.running || s.stopping {
		return
	}
	p.ceased = true
	s.log.Error("the router sends routes to the node: ending the session", zap.Stringer("peer", p.peer.Addr),
		zap.Int("limit", maxReceived), zap.Duration("dialled_again_in", ceasedRetry))
	go s.readd(p.peer, ceasedRetry)
}

var stateNames = map[bgp.FSMState]string{
	bgp.BGP_FSM_IDLE: "idle", bgp.BGP_FSM_CONNECT: "connect", bgp.BGP_FSM_ACTIVE: "active",
	bgp.BGP_FSM_OPENSENT: "opensent", bgp.BGP_FSM_OPENCONFIRM: "openconfirm", bgp.BGP_FSM_ESTABLISHED: "established",
}

// onPeer follows a peer's session: up, down (and why), and the refusals of its OPEN.
func (s *Speaker) onPeer(ev *apiutil.WatchEventMessage_PeerEvent, at time.Time) {
	if ev.Type != apiutil.PEER_EVENT_STATE {
		return
	}
	st := ev.Peer.State
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.peers[st.NeighborAddress.Unmap()]
	if p == nil {
		return
	}
	p.state = stateNames[st.SessionState]
	established := st.SessionState == bgp.BGP_FSM_ESTABLISHED
	switch {
	case established && !p.up:
		p.up, p.since, p.cause = true, at, ""
		s.log.Info("BGP session up", zap.Stringer("peer", p.peer.Addr), zap.Uint32("peer_asn", p.peer.ASN),
			zap.Stringer("peer_router_id", st.RouterID), zap.Int("vips", s.announcedOfLocked(p.peer.Addr.Is4())))
	case !established && p.up:
		p.up, p.since = false, at
		p.downs++
		p.cause = disconnectCause(st)
		if p.ceased {
			p.cause = ceasedCause
		}
		s.log.Warn("BGP session down", zap.Stringer("peer", p.peer.Addr), zap.String("reason", p.cause))
		if s.running && !s.stopping && !p.ceased {
			// GoBGP would idle 5 s before dialling again; a fresh peer dials at once.
			go s.readd(p.peer, 0)
		}
	case st.SessionState == bgp.BGP_FSM_IDLE && st.DisconnectReason != api.PeerState_DISCONNECT_REASON_UNSPECIFIED && !p.ceased:
		s.causeLocked(p, disconnectCause(st)) // an OPEN refused, a NOTIFICATION before the session was up
	}
}

// disconnectCause says why a session ended or was refused, from GoBGP's reason.
func disconnectCause(st apiutil.PeerState) string {
	r := strings.ToLower(strings.TrimPrefix(st.DisconnectReason.String(), "DISCONNECT_REASON_"))
	r = strings.ReplaceAll(r, "_", " ")
	if st.DisconnectMessage != "" && !strings.EqualFold(st.DisconnectMessage, r) {
		r += ": " + st.DisconnectMessage
	}
	return r
}

// causeLocked logs why peer p is not up, once per change of cause.
func (s *Speaker) causeLocked(p *peerState, cause string) {
	if cause == p.cause {
		return
	}
	p.cause = cause
	s.log.Warn("BGP peer not reachable", zap.Stringer("peer", p.peer.Addr), zap.Uint32("peer_asn", p.peer.ASN),
		zap.String("reason", cause))
}

// connectFailed records a failed dial of peer addr (GoBGP logs it, at debug level only).
func (s *Speaker) connectFailed(addr, errText string) {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return
	}
	// "dial tcp 10.0.0.1:179: connect: connection refused" -> "connection refused"
	cause := errText
	if i := strings.LastIndex(cause, ": "); i >= 0 && strings.HasPrefix(cause, "dial ") {
		cause = cause[i+2:]
	}
	if cause == "i/o timeout" {
		cause = "no answer (connect timed out)"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.peers[a.Unmap()]; p != nil && !p.up && !p.ceased {
		p.dialFailures++
		s.causeLocked(p, "connect: "+cause)
	}
}

// readd configures peer p afresh after its session dropped, adding it again after wait,
// so that it is dialled within the connect retry instead of after GoBGP's idle hold.
func (s *Speaker) readd(p Peer, wait time.Duration) {
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	err := s.srv.DeletePeer(ctx, &api.DeletePeerRequest{Address: p.Addr.String()})
	cancel()
	if err != nil {
		s.log.Debug("re-adding a BGP peer: delete", zap.Stringer("peer", p.Addr), zap.Error(err))
	}
	select {
	case <-time.After(wait):
	case <-s.ctx.Done():
		return
	}
	s.mu.Lock()
	stop := !s.running || s.stopping
	if ps := s.peers[p.Addr]; ps != nil {
		ps.ceased = false
	}
	s.mu.Unlock()
	if stop {
		return
	}
	ctx, cancel = context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	if err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: s.peerConf(p, false)}); err != nil {
		s.log.Error("re-adding a BGP peer after its session dropped", zap.Stringer("peer", p.Addr), zap.Error(err))
	}
}

func (s *Speaker) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// upLocked counts the sessions up.
func (s *Speaker) upLocked() int {
	n := 0
	for _, p := range s.peers {
		if p.up {
			n++
		}
	}
	return n
}

// announcedOfLocked counts the VIPs announced of one family.
func (s *Speaker) announcedOfLocked(v4 bool) int {
	n := 0
	for a, v := range s.vips {
		if v.announced && a.Is4() == v4 {
			n++
		}
	}
	return n
}

// slogBridge takes GoBGP's log: its failed dials (debug level there) become the peers'
// causes, its warnings and errors go to the node's log, the rest to its debug level.
type slogBridge struct {
	s     *Speaker
	attrs []slog.Attr
}

// Enabled takes every level: the dial failures come at debug level.
func (h *slogBridge) Enabled(context.Context, slog.Level) bool { return true }

// Handle routes one record of GoBGP's.
func (h *slogBridge) Handle(_ context.Context, r slog.Record) error {
	var key, errText, reason string
	fields := make([]zap.Field, 0, len(h.attrs)+r.NumAttrs())
	take := func(a slog.Attr) bool {
		switch a.Key {
		case "Key":
			key = a.Value.String()
		case "Error":
			errText = a.Value.String()
		case "reason":
			reason = a.Value.String()
		}
		fields = append(fields, zap.String(a.Key, a.Value.String()))
		return true
	}
	for _, a := range h.attrs {
		take(a)
	}
	r.Attrs(take)
	switch {
	case r.Message == "failed to connect" && key != "":
		h.s.connectFailed(key, errText)
		return nil
	case r.Message == "prefix limit reached" && key != "":
		h.s.tooManyRoutes(key) // GoBGP holds the session's lock: the peer is deleted from a goroutine
	case r.Message == "outgoing connection IO error" && key != "":
		// Accepted, then closed before the OPEN: a router that refuses the session for now
		// (BIRD's error wait after a failed session, a peer not configured).
		h.s.connectFailed(key, "the peer closed the connection before its OPEN ("+reason+")")
		return nil
	}
	if r.Message == "failed to stop BGP server" && h.s.isClosing() {
		return nil // Close's second stop, for the BFD loop (see Close)
	}
	switch {
	case r.Level >= slog.LevelError:
		h.s.log.Warn("gobgp: "+r.Message, fields...)
	case r.Level >= slog.LevelWarn:
		h.s.log.Info("gobgp: "+r.Message, fields...)
	default:
		if ce := h.s.log.Check(zap.DebugLevel, "gobgp: "+r.Message); ce != nil {
			ce.Write(fields...)
		}
	}
	return nil
}

// WithAttrs keeps attrs (GoBGP names each peer's logger by its address, "Key").
func (h *slogBridge) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &slogBridge{s: h.s, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

// WithGroup is ignored: GoBGP uses no groups.
func (h *slogBridge) WithGroup(string) slog.Handler { return h }
