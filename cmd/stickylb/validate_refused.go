package main

import (
	"fmt"
	"io"

	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/policies/pools"
)

// warnRefused warns of each backend that nodes fed by the control plane would leave out
// (fleetview.AddressRefusal: loopback, link-local, unspecified), in the services they are
// sent: the vip services (XDP nodes) and the http and grpc ones (Caddy nodes). Envoy and
// gRPC clients dial what they are given, so a tcp service with a listen only is not named.
// A warning, not an error: demos on one host admit loopback (allow_loopback,
// --allow-loopback).
func warnRefused(w io.Writer, f *pools.File) {
	for _, s := range f.Services {
		if s.VIP == "" && s.Protocol != pools.ProtocolHTTP && s.Protocol != pools.ProtocolGRPC {
			continue
		}
		for _, b := range s.Backends {
			if why := fleetview.AddressRefusal(b.AddrPort().Addr(), false); why != "" {
				fmt.Fprintf(w, "%s:%d: warning: service %s: backend %s: nodes fed by the control plane leave it out: %s\n",
					f.Filename, b.Line, s.Name, b.Address, why)
			}
		}
	}
}
