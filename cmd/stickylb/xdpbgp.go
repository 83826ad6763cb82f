package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/l4bgp"
	"github.com/stickylb/stickylb/l4xdp"
	"github.com/stickylb/stickylb/policies/status"
)

// xdpRouting wires the forwarder to its BGP speaker: the VIPs the loader serves are
// announced, a VIP that leaves is withdrawn before its tables go, a forwarder that can no
// longer forward is withdrawn, drain and undrain come through the control socket, and a
// stop withdraws first and forwards on for the drain time (or, restarting gracefully,
// leaves the routes to the routers). A nil *xdpRouting is BGP off: every method does
// nothing.
type xdpRouting struct {
	sp        *l4bgp.Speaker
	log       *zap.Logger
	drainTime time.Duration
	graceful  bool
	runDir    string
	ctl       *controlServer

	mu      sync.Mutex
	heard   bool         // the loader has told what it serves
	last    []netip.Addr // what it told last
	started bool
}

// newXDPRouting makes the speaker from the flags (nil when BGP is off). restarting says a
// forwarder was already running on the interface (a restart, not a cold start).
func newXDPRouting(b *bgpFlags, iface string, restarting bool, log *zap.Logger) (*xdpRouting, error) {
	if !b.enabled() {
		return nil, nil
	}
	cfg, err := b.config(iface)
	if err != nil {
		return nil, err
	}
	cfg.Restarting = restarting
	sp, err := l4bgp.New(cfg, log)
	if err != nil {
		return nil, flagError{"bgp-*", err.Error()}
	}
	return &xdpRouting{sp: sp, log: log, drainTime: b.drainTime, graceful: b.graceful, runDir: b.runDir}, nil
}

// served is the loader's ServedFunc: it hands the VIPs to the speaker and, when one
// leaves while BGP runs, waits up to a second for its withdrawal to reach GoBGP (never
// for the routers), so that its tables are deleted after it is withdrawn.
func (r *xdpRouting) served(addrs []netip.Addr) {
	if r == nil {
		return
	}
	r.mu.Lock()
	shrinks := slices.ContainsFunc(r.last, func(a netip.Addr) bool { return !slices.Contains(addrs, a) })
	r.heard, r.last = true, slices.Clone(addrs)
	done := r.sp.SetServed(addrs)
	wait := shrinks && r.started
	r.mu.Unlock()
	if !wait {
		return
	}
	select {
	case <-done:
	case <-time.After(time.Second):
		r.log.Warn("a VIP leaves: its withdrawal did not reach the BGP speaker within 1s; deleting its tables anyway")
	}
}

// start opens the control socket (a node drained when it last ran starts drained),
// announces what the loader serves (read from the pinned maps when no apply has told it
// yet: a node restarted while its control plane is down serves those), starts the speaker
// and the forwarding check.
func (r *xdpRouting) start(ctx context.Context, l *l4xdp.Loader, cfg l4xdp.Config) error {
	if r == nil {
		return nil
	}
	ctl, err := listenControl(r.runDir, cfg, r.sp, r.log)
	if err != nil {
		return err
	}
	r.ctl = ctl
	r.mu.Lock()
	if !r.heard {
		if addrs, err := l.ServedAddrs(); err == nil {
			r.last = addrs
			r.sp.SetServed(addrs)
		}
	}
	r.started = true
	r.mu.Unlock()
	if err := r.sp.Start(ctx); err != nil {
		return err
	}
	go r.watchForwarding(ctx, l)
	return nil
}

// watchForwarding withdraws every VIP while the forwarder cannot forward with tables that
// are the fleet's, checked every second (see forwardingWatch).
func (r *xdpRouting) watchForwarding(ctx context.Context, l *l4xdp.Loader) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var w forwardingWatch
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.sp.SetForwarding(w.look(l.Forwarding(), l.Stale()))
		}
	}
}

// forwardingMisses is how many looks in a row must fail to read (netlink, a map) before the
// node is withdrawn for it: at one look a second, 3 s.
const forwardingMisses = 3

// forwardingWatch turns each look at the loader into what the speaker is told. A cause it
// knows for certain (the program detached, the interface down or gone: ErrNotForwarding;
// the tables behind the config: ErrStale) withdraws at once; a read that failed withdraws
// only once forwardingMisses looks in a row failed, so that one failed netlink read does
// not take a node out of every router's ECMP group.
type forwardingWatch struct {
	misses int
	last   error // what the speaker was told last
}

// look is what to tell the speaker after one look: fwd from Forwarding, stale from Stale.
func (w *forwardingWatch) look(fwd, stale error) error {
	switch {
	case fwd == nil:
		w.misses = 0
		w.last = stale
	case errors.Is(fwd, l4xdp.ErrNotForwarding):
		w.misses = 0
		w.last = fwd
	default:
		w.misses++
		if w.misses >= forwardingMisses {
			w.last = fmt.Errorf("%w (%d looks in a row or more)", fwd, forwardingMisses)
		} else if w.last == nil || !errors.Is(w.last, l4xdp.ErrNotForwarding) {
			w.last = stale // the last certain verdict stands until a look succeeds
		}
	}
	return w.last
}

// lingering is the node's run context: it ends when sig does, except that with BGP the
// VIPs are withdrawn first and the node forwards on for the drain time (a second signal
// cuts it short), so routers move the flows before the node stops. With graceful restart
// nothing is withdrawn and it ends at once: the routers keep the routes.
func (r *xdpRouting) lingering(sig context.Context) context.Context {
	if r == nil {
		return sig
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer cancel()
		<-sig.Done()
		if r.graceful {
			r.log.Info("stopping for a graceful restart: the VIPs stay announced, the pinned program forwards")
			return
		}
		again := make(chan os.Signal, 1)
		signal.Notify(again, os.Interrupt, syscall.SIGTERM)
		defer signal.Stop(again)
		select {
		case <-r.sp.Shutdown():
		case <-time.After(2 * time.Second):
		}
		r.log.Info("stopping: VIPs withdrawn, forwarding for the drain time", zap.Duration("drain_time", r.drainTime))
		select {
		case <-time.After(r.drainTime):
		case <-again:
			r.log.Warn("a second signal: the drain time cut short")
		}
	}()
	return ctx
}

// close ends the sessions: with a NOTIFICATION (the routers drop the node at once), or,
// restarting gracefully, without one.
func (r *xdpRouting) close() {
	if r == nil {
		return
	}
	r.ctl.Close()
	if err := r.sp.Close(r.graceful); err != nil {
		r.log.Warn("stopping BGP", zap.Error(err))
	}
}

// collectors are the speaker's metrics (none with BGP off).
func (r *xdpRouting) collectors() []prometheus.Collector {
	if r == nil {
		return nil
	}
	return []prometheus.Collector{r.sp.Collector()}
}

// status is the routing part of the status page (nil with BGP off).
func (r *xdpRouting) status() *status.Routing {
	if r == nil {
		return nil
	}
	return r.sp.Status()
}
