package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/stickylb/stickylb/l4xdp"
)

const xdpUsage = `usage:
  stickylb xdp --pools FILE --iface IF [--mode native|generic] [--metrics ADDR [--admin-host NAME,...]] [--pin-root DIR]
               [--conn-table-size N] [--conn-insert-cap N] [--zone Z]
               [--nat-source ADDR[,ADDR...]] [--nat-ports LO-HI] [--tunnel-source ADDR[,ADDR]]
               [--bgp-asn N --bgp-peer ADDR@ASN[,...] [--bgp-router-id A] [--bgp-hold D] [--bgp-next-hop A]
                [--bgp-community ASN:V]... [--bgp-password-file F] [--bgp-graceful-restart] [--drain-time D] [--run-dir DIR]]
                                                   announce the VIPs to routers over BGP (both modes)
  stickylb xdp --xds ADDR --iface IF [--node-id ID] [--zone Z] [--xds-ca F [--xds-cert F --xds-key F]] [--allow-loopback]
               [--nat-source ADDR[,ADDR...]] [--nat-ports LO-HI] [--tunnel-source ADDR[,ADDR]]
               [--mode native|generic] [--metrics ADDR] [--pin-root DIR] ...
                                                   the view from a control plane (stickylb xds)
  stickylb xdp stats --iface IF [--pin-root DIR]
  stickylb xdp tables --iface IF [--pin-root DIR]    each VIP's table: slots per backend, digest
  stickylb xdp detach --iface IF [--pin-root DIR]
  stickylb xdp pass --iface IF [--pin-root DIR]      attach an XDP_PASS program (veth peers)
  stickylb xdp drain --iface IF [--pin-root DIR] [--run-dir DIR] [--reason TEXT]
                                                   withdraw the running node's VIPs (BGP); it forwards on
  stickylb xdp undrain --iface IF [--pin-root DIR] [--run-dir DIR]
                                                   announce them again
`

// xdpFlags is `stickylb xdp`'s command line, read and checked: the subcommand, the loader's
// configuration, and where the services come from (a pools file, or a control plane).
type xdpFlags struct {
	sub     string // stats, tables, detach, pass; empty: forward
	pools   string // --pools; empty with --xds
	poll    time.Duration
	metrics httpAddr // --metrics, and the Host names it answers (--admin-host)
	node    xdsNode  // --xds and the node's flags; node.server empty with --pools
	cfg     l4xdp.Config
	bgp     bgpFlags // --bgp-* and --drain-time: announcing the VIPs (off without them)
}

// defaultPoll is how often `stickylb xdp --pools` looks for changes of the file by default.
const defaultPoll = time.Second

// xdpSubcommands are the words that may follow `stickylb xdp`.
var xdpSubcommands = map[string]bool{"stats": true, "tables": true, "detach": true, "pass": true}

// errXDPUsage is a command line parseXDPFlags refused after its flags parsed, said on stderr.
var errXDPUsage = errors.New("stickylb xdp: usage")

// parseXDPFlags reads args (what follows `stickylb xdp`). Its error is flag.ErrHelp for -h,
// or a usage error already said on stderr, the usage when the line is malformed (parseError
// gives the exit status of either); everything it checks is checked before anything is
// attached.
func parseXDPFlags(args []string, stderr io.Writer) (fl xdpFlags, err error) {
	if len(args) > 0 && xdpSubcommands[args[0]] {
		fl.sub, args = args[0], args[1:]
	}
	fs := newFlagSet("xdp", xdpUsage, stderr)
	fs.StringVar(&fl.pools, "pools", "", "pools file (reloaded when it changes)")
	fs.StringVar(&fl.cfg.Iface, "iface", "", "interface to attach to")
	mode := fs.String("mode", "native", "native or generic")
	fs.StringVar(&fl.metrics.addr, "metrics", "", "HTTP address for Prometheus metrics at /metrics and the status page at / (off when empty)")
	fs.Var(&fl.metrics.hosts, "admin-host", "more Host names the --metrics address answers (comma-separated or repeated; it always answers its own address, localhost when that is loopback, and any IP address when it listens on all of them): other names are refused with 421 (DNS rebinding)")
	fs.StringVar(&fl.cfg.PinRoot, "pin-root", l4xdp.DefaultPinRoot, "bpffs directory for pinned state (a bpffs is mounted when none holds it)")
	fs.DurationVar(&fl.poll, "poll", defaultPoll, "how often to look for pools-file changes")
	tableSize := fs.Uint("conn-table-size", l4xdp.DefaultConnTableSize, "connection-table entries (shared by every CPU)")
	insertCap := fs.Int("conn-insert-cap", l4xdp.DefaultInsertCap, "new connection-table entries each CPU may make per second (flood guard; 0: no cap)")
	xn := &fl.node
	fs.StringVar(&xn.server, "xds", "", "control plane (host:port) to take the view from, instead of --pools; several replicas comma-separated, tried in order")
	fs.StringVar(&xn.nodeID, "node-id", "", "node id sent to the control plane (default HOST/xdp/IFACE)")
	fs.StringVar(&xn.zone, "zone", "", "this node's zone: with cross_zone false, new flows go to its zone's backends first; with --xds, sent to the control plane as the node's locality")
	fs.StringVar(&xn.ca, "xds-ca", "", "CA bundle (PEM) that signs the control plane's certificate: TLS")
	fs.StringVar(&xn.cert, "xds-cert", "", "client certificate (PEM) for mTLS")
	fs.StringVar(&xn.key, "xds-key", "", "client key (PEM) for mTLS")
	fs.BoolVar(&xn.allowLoopback, "allow-loopback", false, "with --xds, forward to backends on loopback addresses (demos, tests); left out otherwise, as link-local and unspecified ones always are")
	var nat natFlags
	nat.register(fs)
	var tunnelSrc natSources // the same rules as --nat-source's
	fs.Var(&tunnelSrc, "tunnel-source", "outer source address of tunnel packets, at most one IPv4 and one IPv6 (default: the interface's first global address of each family); the backends' stickylb backend --lb-source must allow it")
	fl.bgp.register(fs)
	if err := fs.Parse(args); err != nil {
		return fl, err
	}
	if err := fl.bgp.check(fs); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: %v\n", err)
		return fl, errXDPUsage
	}
	if fl.sub == "" && fl.pools != "" && xn.server != "" {
		fmt.Fprint(stderr, "stickylb xdp: --pools and --xds exclude each other: a node takes its services and health from a file (and probes itself) or from a control plane\n")
		return fl, errXDPUsage
	}
	if xn.server == "" && (xn.nodeID != "" || xn.ca != "" || xn.cert != "" || xn.key != "" || xn.allowLoopback) {
		fmt.Fprint(stderr, "stickylb xdp: --node-id, --allow-loopback and --xds-* go with --xds\n")
		return fl, errXDPUsage
	}
	if err := checkAdminHosts("--metrics", fl.metrics.addr, fl.metrics.hosts); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: %v\n", err)
		return fl, errXDPUsage
	}
	if fl.cfg.Iface == "" || fs.NArg() != 0 || fl.sub == "" && fl.pools == "" && xn.server == "" || *mode != "native" && *mode != "generic" ||
		*tableSize == 0 || *tableSize > 1<<31 || *insertCap < 0 {
		fmt.Fprint(stderr, xdpUsage)
		return fl, errXDPUsage
	}
	// The loader's own rules (as many sources as the program holds) are command-line errors
	// too, said before anything is attached.
	if err := nat.config().Validate(); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: --nat-source, --nat-ports: %v\n", err)
		return fl, errXDPUsage
	}
	if err := (l4xdp.Tunnel{Sources: tunnelSrc}).Validate(); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: --tunnel-source: %v\n", err)
		return fl, errXDPUsage
	}
	fl.cfg.Tunnel = l4xdp.Tunnel{Sources: tunnelSrc}
	capOpt := *insertCap
	if capOpt == 0 {
		capOpt = -1 // the flag's 0 is "no cap"; Options' is "the default"
	}
	fl.cfg.Mode, fl.cfg.Zone, fl.cfg.NAT = l4xdp.Mode(*mode), xn.zone, nat.config()
	fl.cfg.Tables = l4xdp.Options{ConnTableSize: uint32(*tableSize), InsertCap: capOpt}
	if xn.server != "" && xn.nodeID == "" {
		xn.nodeID = defaultNodeID(fl.cfg.Iface)
	}
	return fl, nil
}
