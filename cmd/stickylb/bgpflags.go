package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/stickylb/stickylb/l4bgp"
)

// bgpFlags are `stickylb xdp --bgp-*` and `--drain-time`: the node announces its VIPs to
// its routers when --bgp-asn and --bgp-peer are given; BGP is off otherwise.
type bgpFlags struct {
	asn, routerID, peers, passwordFile, nextHop string
	runDir                                      string // the control socket and drain state
	communities                                 bgpCommunities
	hold, restartTime, drainTime                time.Duration
	graceful                                    bool
	set                                         map[string]bool // the flags given
}

// register adds the flags to fs.
func (b *bgpFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&b.asn, "bgp-asn", "", "this node's AS number (1..4294967294): announce the VIPs over BGP to --bgp-peer")
	fs.StringVar(&b.routerID, "bgp-router-id", "", "BGP identifier, an IPv4 address (default: the interface's first IPv4 address; required on an IPv6-only node)")
	fs.StringVar(&b.peers, "bgp-peer", "", "the routers, ADDR@ASN[,ADDR@ASN...], IPv4 and/or IPv6: IPv4 VIPs go to IPv4 peers, IPv6 VIPs to IPv6 peers")
	fs.DurationVar(&b.hold, "bgp-hold", l4bgp.DefaultHold, "hold time proposed to the peers (at least 3s, whole seconds): a node gone silent is withdrawn after it")
	fs.StringVar(&b.passwordFile, "bgp-password-file", "", "file holding the TCP MD5 password of the sessions (its trailing newline is not part of it)")
	fs.StringVar(&b.nextHop, "bgp-next-hop", "", "next hop of the VIPs, ADDR[,ADDR] at most one per family (default: the interface's address of each peer's family)")
	fs.Var(&b.communities, "bgp-community", "standard community ASN:VALUE on every route (repeat the flag for more), e.g. the node's zone")
	fs.BoolVar(&b.graceful, "bgp-graceful-restart", false, "BGP graceful restart (RFC 4724): SIGTERM leaves without withdrawing, routers keep the routes while the pinned program forwards, the next start ends the restart")
	fs.DurationVar(&b.restartTime, "bgp-restart-time", l4bgp.DefaultRestartTime, "with --bgp-graceful-restart, how long routers keep the routes of a node that restarts (1s..4095s)")
	fs.StringVar(&b.runDir, "run-dir", DefaultRunDir, "with BGP, the directory of the control socket (stickylb xdp drain), its lock file and the drain state, kept across restarts; the node's user's own, writable by nobody else")
	fs.DurationVar(&b.drainTime, "drain-time", 10*time.Second, "on SIGTERM/SIGINT with BGP, how long the node keeps forwarding after withdrawing its VIPs, so routers move flows away first")
}

// enabled says whether the node announces over BGP.
func (b *bgpFlags) enabled() bool { return b.asn != "" || b.peers != "" }

// flagError is a command-line error: exit 2, naming the flag.
type flagError struct{ flag, msg string }

func (e flagError) Error() string { return "--" + e.flag + ": " + e.msg }

// check validates what needs no interface and records which flags were given; the error
// names the flag at fault.
func (b *bgpFlags) check(fs *flag.FlagSet) error {
	b.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { b.set[f.Name] = true })
	if !b.enabled() {
		for name := range b.set {
			if strings.HasPrefix(name, "bgp-") || name == "drain-time" || name == "run-dir" {
				return flagError{name, "goes with --bgp-asn and --bgp-peer"}
			}
		}
		return nil
	}
	switch {
	case b.asn == "":
		return flagError{"bgp-asn", "required with --bgp-peer"}
	case b.peers == "":
		return flagError{"bgp-peer", "required with --bgp-asn"}
	}
	if _, err := l4bgp.ParseASN(b.asn); err != nil {
		return flagError{"bgp-asn", err.Error()}
	}
	if _, err := l4bgp.ParsePeers(b.peers); err != nil {
		return flagError{"bgp-peer", err.Error()}
	}
	if err := l4bgp.CheckHold(b.hold); err != nil {
		return flagError{"bgp-hold", err.Error()}
	}
	if b.restartTime < time.Second || b.restartTime > l4bgp.MaxRestartTime || b.restartTime%time.Second != 0 {
		return flagError{"bgp-restart-time", fmt.Sprintf("%s: want whole seconds, 1s..%s", b.restartTime, l4bgp.MaxRestartTime)}
	}
	if b.set["bgp-restart-time"] && !b.graceful {
		return flagError{"bgp-restart-time", "goes with --bgp-graceful-restart"}
	}
	if b.drainTime < 0 {
		return flagError{"drain-time", fmt.Sprintf("%s: want 0 or more", b.drainTime)}
	}
	if b.routerID != "" {
		if a, err := netip.ParseAddr(b.routerID); err != nil || !a.Is4() || a.IsUnspecified() {
			return flagError{"bgp-router-id", fmt.Sprintf("%q: want an IPv4 address", b.routerID)}
		}
	}
	if _, _, err := parseNextHops(b.nextHop); err != nil {
		return flagError{"bgp-next-hop", err.Error()}
	}
	if b.passwordFile != "" {
		if _, err := readPassword(b.passwordFile); err != nil {
			return flagError{"bgp-password-file", err.Error()}
		}
	}
	return nil
}

// config is the speaker's configuration on interface iface, whose addresses give the
// router id and next hops not set by flags.
func (b *bgpFlags) config(iface string) (l4bgp.Config, error) {
	asn, _ := l4bgp.ParseASN(b.asn)
	peers, _ := l4bgp.ParsePeers(b.peers)
	c := l4bgp.Config{ASN: asn, Peers: peers, Hold: b.hold, Communities: b.communities, GracefulRestart: b.graceful,
		RestartTime: b.restartTime}
	c.NextHop4, c.NextHop6, _ = parseNextHops(b.nextHop)
	if b.passwordFile != "" {
		c.Password, _ = readPassword(b.passwordFile)
	}
	own4, own6, err := ifaceAddrs(iface)
	if err != nil {
		return c, flagError{"iface", err.Error()}
	}
	if !c.NextHop4.IsValid() {
		c.NextHop4 = own4
	}
	if !c.NextHop6.IsValid() {
		c.NextHop6 = own6
	}
	c.RouterID = own4
	if b.routerID != "" {
		c.RouterID = netip.MustParseAddr(b.routerID)
	}
	if !c.RouterID.IsValid() {
		return c, flagError{"bgp-router-id", fmt.Sprintf("required: %s has no IPv4 address to take it from", iface)}
	}
	for _, p := range peers {
		if p.Addr.Is4() && !c.NextHop4.IsValid() || p.Addr.Is6() && !c.NextHop6.IsValid() {
			return c, flagError{"bgp-next-hop", fmt.Sprintf("peer %s: %s has no address of its family; give one", p.Addr, iface)}
		}
	}
	return c, nil
}

// ifaceAddrs are the first IPv4 and the first global IPv6 address of iface.
func ifaceAddrs(iface string) (v4, v6 netip.Addr, err error) {
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return v4, v6, err
	}
	as, err := ifc.Addrs()
	if err != nil {
		return v4, v6, fmt.Errorf("addresses of %s: %w", iface, err)
	}
	for _, a := range as {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, _ := netip.AddrFromSlice(n.IP)
		ip = ip.Unmap()
		switch {
		case ip.Is4() && !v4.IsValid():
			v4 = ip
		case ip.Is6() && ip.IsGlobalUnicast() && !v6.IsValid():
			v6 = ip
		}
	}
	return v4, v6, nil
}

// parseNextHops reads ADDR[,ADDR], at most one of each family.
func parseNextHops(s string) (v4, v6 netip.Addr, err error) {
	if s == "" {
		return v4, v6, nil
	}
	for _, part := range strings.Split(s, ",") {
		a, err := netip.ParseAddr(strings.TrimSpace(part))
		if err != nil || a.IsUnspecified() || a.IsMulticast() || a.Zone() != "" {
			return v4, v6, fmt.Errorf("%q is not a unicast IP address", part)
		}
		a = a.Unmap()
		dst := &v6
		if a.Is4() {
			dst = &v4
		}
		if dst.IsValid() {
			return v4, v6, fmt.Errorf("%q: one next hop per family", s)
		}
		*dst = a
	}
	return v4, v6, nil
}

// readPassword reads the TCP MD5 password: the file less one trailing newline, 1 to 80
// bytes (the kernel's limit).
func readPassword(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	pw := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	switch {
	case pw == "":
		return "", errors.New("empty password")
	case len(pw) > 80:
		return "", fmt.Errorf("password of %d bytes: TCP MD5 takes at most 80", len(pw))
	}
	return pw, nil
}

// bgpCommunities is --bgp-community, repeatable.
type bgpCommunities []uint32

// String lists the communities as the flag takes them.
func (c *bgpCommunities) String() string {
	out := make([]string, len(*c))
	for i, v := range *c {
		out[i] = l4bgp.FormatCommunity(v)
	}
	return strings.Join(out, ",")
}

// Set adds one community (or several, comma-separated).
func (c *bgpCommunities) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		n, err := l4bgp.ParseCommunity(part)
		if err != nil {
			return err
		}
		*c = append(*c, n)
	}
	return nil
}
