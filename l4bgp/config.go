package l4bgp

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Defaults and bounds of the speaker's settings.
const (
	// DefaultHold is the hold time the speaker proposes: a silent peer (a pulled link, a
	// dead machine) is dropped, and its routes withdrawn by the router, within it.
	DefaultHold = 9 * time.Second
	// MinHold is the shortest hold time BGP allows (RFC 4271: 0 or at least 3 s).
	MinHold = 3 * time.Second
	// DefaultRestartTime is how long a router keeps the routes of a node that restarts
	// gracefully (advertised in the graceful-restart capability).
	DefaultRestartTime = 120 * time.Second
	// MaxRestartTime is the largest restart time the capability can carry (12 bits).
	MaxRestartTime = 4095 * time.Second
	// connectRetry is how often a peer that is not up is dialled again: with GoBGP's
	// jitter (0.75 to 1 of it) and its dial timeout (as long), a session comes up within
	// 4 s of the peer accepting.
	connectRetry = 2 * time.Second
	// maxReceived is how many routes a peer may send (per family) before the node ends the
	// session with a Cease (maximum number of prefixes reached). A node needs none: the
	// import policy drops them, but GoBGP keeps what a peer sends in its Adj-RIB-In before
	// the policy runs, so without a limit a router exporting its table would have the node
	// hold all of it. 16 leaves room for the few routes a router commonly sends by
	// default (a default route, its connected subnets) without ending the session.
	maxReceived = 16
	// ceasedRetry is how long the node waits before dialling a peer again whose session it
	// ended for sending too many routes (the peer would send them again at once).
	ceasedRetry = 30 * time.Second
	// forgetWithdrawn is how long a VIP that left the config is still shown, withdrawn (and
	// exported as stickylb_bgp_announced 0), after its withdrawal.
	forgetWithdrawn = 10 * time.Minute
	// maxASN: 4294967295 is reserved (RFC 7300), 0 too.
	maxASN = 4294967294
)

// Peer is one BGP neighbour: a router the node announces its VIPs to.
type Peer struct {
	Addr netip.Addr
	ASN  uint32
}

// Config is a speaker's settings (the `stickylb xdp --bgp-*` flags).
type Config struct {
	// ASN is the node's own AS number.
	ASN uint32
	// RouterID is the BGP identifier, an IPv4 address.
	RouterID netip.Addr
	// Peers are the routers; IPv4 VIPs go to the IPv4 ones, IPv6 VIPs to the IPv6 ones.
	Peers []Peer
	// Hold is the hold time proposed to every peer, at least MinHold (the negotiated one is
	// the smaller of the two sides').
	Hold time.Duration
	// Password enables TCP MD5 (RFC 2385) on every session when not empty.
	Password string
	// NextHop4 and NextHop6 are the next hops of the IPv4 and the IPv6 VIPs: the address
	// of the interface the forwarder runs on, where the VIPs' packets must arrive.
	NextHop4, NextHop6 netip.Addr
	// Communities tag every route (ASN<<16 | value), e.g. the node's zone.
	Communities []uint32
	// GracefulRestart advertises RFC 4724 graceful restart (no N-bit, no long-lived):
	// Close(true) then leaves without a NOTIFICATION, and routers keep the node's routes
	// for RestartTime.
	GracefulRestart bool
	// RestartTime is the restart time advertised (default DefaultRestartTime).
	RestartTime time.Duration
	// Restarting says the forwarder kept forwarding while this process was restarted: with
	// GracefulRestart, the first sessions set the Restarting bit and the forwarding-state
	// bits, and End-of-RIB follows the VIPs.
	Restarting bool
	// Port is the peers' BGP port (default 179; tests on loopback use others).
	Port uint16
}

// Validate checks what the flags cannot: the ASN, the router id, a next hop for each
// peer family, the hold and restart times. Each error names the setting at fault.
func (c Config) Validate() error {
	var errs []error
	if c.ASN == 0 || c.ASN > maxASN {
		errs = append(errs, fmt.Errorf("asn %d: want 1..%d", c.ASN, maxASN))
	}
	if !c.RouterID.Is4() || c.RouterID.IsUnspecified() {
		errs = append(errs, fmt.Errorf("router id %v: want an IPv4 address", c.RouterID))
	}
	if len(c.Peers) == 0 {
		errs = append(errs, errors.New("peers: none"))
	}
	for _, p := range c.Peers {
		if p.Addr.Is4() && !c.NextHop4.IsValid() {
			errs = append(errs, fmt.Errorf("next hop: peer %s is IPv4 and no IPv4 next hop is known", p.Addr))
		}
		if p.Addr.Is6() && !c.NextHop6.IsValid() {
			errs = append(errs, fmt.Errorf("next hop: peer %s is IPv6 and no IPv6 next hop is known", p.Addr))
		}
	}
	if err := CheckHold(c.Hold); err != nil {
		errs = append(errs, err)
	}
	if c.GracefulRestart && (c.RestartTime < time.Second || c.RestartTime > MaxRestartTime) {
		errs = append(errs, fmt.Errorf("restart time %s: want 1s..%s", c.RestartTime, MaxRestartTime))
	}
	return errors.Join(errs...)
}

// CheckHold says whether d can be this speaker's hold time: at least MinHold, whole
// seconds, at most 65535 s. BGP also allows 0 (no keepalives), which this speaker refuses:
// GoBGP's API cannot propose it, and without keepalives a node whose link is pulled stays
// routed until the router's own timer, if any, runs out.
func CheckHold(d time.Duration) error {
	switch {
	case d == 0:
		return errors.New("hold time 0 (no keepalives) is not supported: a silent node would stay routed; use at least 3s")
	case d < MinHold:
		return fmt.Errorf("hold time %s: BGP allows 0 or at least 3s", d)
	case d%time.Second != 0:
		return fmt.Errorf("hold time %s: BGP counts it in whole seconds", d)
	case d > 65535*time.Second:
		return fmt.Errorf("hold time %s: at most 65535s", d)
	}
	return nil
}

// ParseASN reads an AS number: 1..4294967294, plain (asplain) or as HIGH.LOW (asdot).
func ParseASN(s string) (uint32, error) {
	s = strings.TrimSpace(s)
	var n uint64
	var err error
	if hi, lo, ok := strings.Cut(s, "."); ok {
		h, err1 := strconv.ParseUint(hi, 10, 16)
		l, err2 := strconv.ParseUint(lo, 10, 16)
		if err1 != nil || err2 != nil {
			return 0, fmt.Errorf("%q is not an AS number (e.g. 65001 or 1.10)", s)
		}
		n = h<<16 | l
	} else if n, err = strconv.ParseUint(s, 10, 32); err != nil {
		return 0, fmt.Errorf("%q is not an AS number (e.g. 65001)", s)
	}
	if n == 0 || n > maxASN {
		return 0, fmt.Errorf("AS %d: want 1..%d", n, maxASN)
	}
	return uint32(n), nil
}

// ParsePeers reads ADDR@ASN[,ADDR@ASN...]: IPv4 or IPv6 addresses (IPv6 may be bracketed),
// each listed once.
func ParsePeers(s string) ([]Peer, error) {
	var out []Peer
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		at := strings.LastIndex(part, "@")
		if at < 0 {
			return nil, fmt.Errorf("%q: want ADDR@ASN (e.g. 10.0.0.1@65000)", part)
		}
		addrS := strings.Trim(part[:at], "[]")
		addr, err := netip.ParseAddr(addrS)
		if err != nil || addr.Zone() != "" || addr.IsUnspecified() || addr.IsMulticast() {
			return nil, fmt.Errorf("%q: %q is not a unicast IP address", part, addrS)
		}
		n, err := ParseASN(part[at+1:])
		if err != nil {
			return nil, fmt.Errorf("%q: %w", part, err)
		}
		addr = addr.Unmap()
		for _, p := range out {
			if p.Addr == addr {
				return nil, fmt.Errorf("%q: peer %s listed twice", part, addr)
			}
		}
		out = append(out, Peer{Addr: addr, ASN: n})
	}
	return out, nil
}

// ParseCommunity reads a standard community, ASN:VALUE with both parts in 0..65535.
func ParseCommunity(s string) (uint32, error) {
	hi, lo, ok := strings.Cut(strings.TrimSpace(s), ":")
	h, err1 := strconv.ParseUint(hi, 10, 16)
	l, err2 := strconv.ParseUint(lo, 10, 16)
	if !ok || err1 != nil || err2 != nil {
		return 0, fmt.Errorf("%q: want ASN:VALUE, both 0..65535 (e.g. 65001:100)", s)
	}
	return uint32(h)<<16 | uint32(l), nil
}

// FormatCommunity writes c as ASN:VALUE.
func FormatCommunity(c uint32) string { return fmt.Sprintf("%d:%d", c>>16, c&0xffff) }
