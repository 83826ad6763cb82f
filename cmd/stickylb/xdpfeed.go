package main

import (
	"fmt"
	"net/netip"

	"go.uber.org/zap"

	"github.com/stickylb/stickylb/adsclient"
	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/l4xdp"
	"github.com/stickylb/stickylb/policies/status"
)

// xdpFeed applies the control plane's views to an XDP node's loader: it leaves out the
// endpoints the node refuses (fleetview's rule; the node's own VIPs and metrics address
// always), logs applies sparingly, and says in status.json how the feed stands.
type xdpFeed struct {
	l   *l4xdp.Loader
	c   *adsclient.Client
	log *zap.Logger
	// allowLoopback admits loopback endpoints (--allow-loopback); metrics is --metrics.
	allowLoopback bool
	metrics       string

	asm      *fleetview.Assembler
	refusals fleetview.Refusals
	applied  *adsclient.Sampled
}

func newXDPFeed(l *l4xdp.Loader, c *adsclient.Client, n xdsNode, metrics string, log *zap.Logger) *xdpFeed {
	f := &xdpFeed{l: l, c: c, log: log, allowLoopback: n.allowLoopback, metrics: metrics,
		applied: &adsclient.Sampled{Log: log, Every: adsclient.ApplyLogEvery}}
	f.asm = &fleetview.Assembler{Apply: f.apply, Waited: func(w fleetview.Waiting) {
		log.Warn("a service's cluster came without its endpoints: waiting for them", zap.String("service", w.Service),
			zap.Bool("serving_last_good_state", w.Kept))
	}}
	return f
}

// apply installs v without the endpoints the node refuses; the rest of the view applies.
func (f *xdpFeed) apply(v *fleetview.View) error {
	adm := fleetview.Admission{AllowLoopback: f.allowLoopback, Own: f.own(v)}
	v, refused := adm.Filter(v)
	for _, r := range f.refusals.Set(refused) {
		f.log.Warn("left out a backend the control plane named", zap.String("service", r.Service),
			zap.String("address", r.Address), zap.String("reason", r.Reason))
	}
	if err := f.l.ApplyView(v.File, verdictsOf(v)); err != nil {
		return fmt.Errorf("applying the view: %w", err)
	}
	f.applied.Info("view applied", zap.Int("services", len(v.File.Services)), zap.Int("left_out", len(refused)))
	return nil
}

// own says why an address is the node's own: a VIP of the view (the forwarder's packets
// would come back to it) or its metrics listener.
func (f *xdpFeed) own(v *fleetview.View) func(netip.AddrPort) string {
	vips := map[netip.Addr]string{}
	for _, s := range v.File.Services {
		if ap, ok := s.VIPAddrPort(); ok {
			vips[ap.Addr().Unmap()] = s.Name
		}
	}
	return func(ap netip.AddrPort) string {
		if svc, ok := vips[ap.Addr()]; ok {
			return "the address of a VIP this node serves (" + svc + ")"
		}
		if f.metrics != "" && fleetview.ListenerTakes(f.metrics, ap) {
			return "this node's metrics address"
		}
		return ""
	}
}

// status is the feed as status.json lists it.
func (f *xdpFeed) status(server, node string) status.Feed {
	return fleetview.Feed(server, node, f.c, f.asm, &f.refusals)
}
