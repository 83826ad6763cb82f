// Command stickylb checks, plans and serves pools files:
//
//	stickylb version [--json]
//	stickylb validate FILE
//	stickylb plan --pools OLD --next NEW [--json] [--keys N]
//	stickylb xds --pools FILE --listen ADDR [--admin ADDR] [--tls-cert F --tls-key F [--client-ca F]]
//	stickylb xdp --pools FILE --iface IF [--mode native|generic] [--metrics ADDR]
//	stickylb xdp --xds ADDR[,ADDR...] --iface IF [--node-id ID] [--zone Z] [--xds-ca F --xds-cert F --xds-key F]
//	stickylb pools apply FILE --etcd URL[,URL...] | stickylb pools get --etcd URL[,URL...]
//	stickylb xds --etcd URL[,URL...] --listen ADDR [--api ADDR ...]
//	stickylb ctl --api URL VERB ...
//	stickylb xdp ... --bgp-asn N --bgp-peer ADDR@ASN[,...]    (announce the VIPs over BGP)
//	stickylb xdp drain|undrain --iface IF [--pin-root DIR] [--run-dir DIR]
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"go.uber.org/zap"

	"github.com/stickylb/stickylb/internal/buildinfo"
	"github.com/stickylb/stickylb/policies/plan"
	"github.com/stickylb/stickylb/policies/pools"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

const usage = `usage:
  stickylb version [--json]                             the build: module version, VCS revision and time, Go version
                                                       (--version after any command prints the same)
  stickylb validate FILE                                check a pools file; every error as file:line
  stickylb plan --pools OLD --next NEW [--json] [--keys N]
                                                       share of keys each service would move
  stickylb xds --pools FILE --listen ADDR [--admin ADDR] [--tls-cert F --tls-key F [--client-ca F]]
                                                       serve the pools file to Envoy and gRPC over xDS
  stickylb xdp --pools FILE --iface IF [--mode native|generic] [--metrics ADDR]
                                                       forward the pools file's VIPs in XDP (also: xdp stats|detach|pass)
  stickylb xdp --xds ADDR[,ADDR...] --iface IF [--node-id ID] [--zone Z] [--xds-ca F [--xds-cert F --xds-key F]]
                                                       forward the VIPs and verdicts a control plane pushes
  stickylb pools apply FILE --etcd URL[,URL...] [--etcd-prefix P] [--etcd-ca F --etcd-cert F --etcd-key F] [--if-revision N | --force] [--as NAME]
                                                       validate a pools file and store it for the replicas
  stickylb pools get --etcd URL[,URL...]              print the stored pools file (its revision on stderr)
  stickylb xds --etcd URL[,URL...] --listen ADDR [--api ADDR ...]
                                                       serve as one replica of the control plane (see docs/fleet.md)
  stickylb ctl --api URL (--token-file F | --cert F --key F --ca F) VERB ...
                                                       change the fleet through a replica's API (ctl --help)
  stickylb backend --iface IF --lb-source PREFIX[,PREFIX...] [--tunnel-port PORT[,PORT...]] [--metrics ADDR]
                                                       on a backend of tunnel VIPs: decapsulate, second chance (also: backend stats|detach)
`

// run executes one command and returns the exit status: 0 success, 1 the file (or the
// change) is invalid, 2 the command line is wrong.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	if args[0] != "version" && askedVersion(args) {
		return versionCmd(nil, stdout, stderr)
	}
	switch args[0] {
	case "version":
		return versionCmd(args[1:], stdout, stderr)
	case "validate":
		return validate(args[1:], stdout, stderr)
	case "plan":
		return planCmd(args[1:], stdout, stderr)
	case "xds":
		return xdsCmd(args[1:], stderr)
	case "xdp":
		return xdpCmd(args[1:], stdout, stderr)
	case "pools":
		return poolsCmd(args[1:], stdout, stderr)
	case "ctl":
		return ctlCmd(args[1:], stdout, stderr)
	case "backend":
		return backendCmd(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "stickylb: unknown command %q\n%s", args[0], usage)
	return 2
}

// Synopses of the subcommands, printed with their flags by -h and on a wrong command line.
const (
	versionUsage  = "usage: stickylb version [--json]\n"
	validateUsage = "usage: stickylb validate [-q] FILE\n"
	planUsage     = "usage: stickylb plan --pools OLD --next NEW [--json] [--keys N]\n"
	xdsUsage      = "usage: stickylb xds (--pools FILE | --etcd URL[,URL...] [--replica-id ID] [--api ADDR ...]) --listen ADDR [--admin ADDR [--admin-host NAME,...]] [--tls-cert F --tls-key F [--client-ca F]]\n"
)

// newFlagSet is a subcommand's flag set whose -h (or a flag it does not know) prints the
// synopsis, which names the arguments the flags do not, before the flags.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, synopsis+"flags:\n")
		fs.PrintDefaults()
	}
	return fs
}

// parseError is the exit status of a failed flag parse: 0 when help was asked for.
func parseError(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

// newLogger is the long-running commands' logger: zap's production JSON, without stack
// traces. Their Error lines report what is wrong with the input or the system (a refused
// pools-file edit, a probe that cannot run), where a Go stack only hides the message.
func newLogger(opts ...zap.Option) (*zap.Logger, error) {
	cfg := zap.NewProductionConfig()
	cfg.DisableStacktrace = true
	return cfg.Build(opts...)
}

// askedVersion reports whether the command line asks for the version (--version or
// -version before any "--"), whatever the command: every command answers it the same, before
// its own flags are parsed.
func askedVersion(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "--version" || a == "-version" {
			return true
		}
	}
	return false
}

func versionCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("version", versionUsage, stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	fs.Bool("version", false, "the same as the command (every command takes it)")
	if err := fs.Parse(args); err != nil {
		return parseError(err)
	}
	if fs.NArg() != 0 {
		fmt.Fprint(stderr, versionUsage)
		return 2
	}
	in := buildinfo.Read()
	if *asJSON {
		return printJSON(stdout, stderr, in)
	}
	fmt.Fprint(stdout, in)
	return 0
}

// printJSON writes v as indented JSON and returns the exit status: 1 when it cannot.
func printJSON(stdout, stderr io.Writer, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// load reads a pools file, printing its errors (every one, file:line first) and warnings.
func load(path string, stderr io.Writer) (*pools.File, bool) {
	f, err := pools.Load(path)
	return reported(f, err, stderr)
}

// parseFile parses the pools file data read from path, printing its errors and warnings
// as load does.
func parseFile(path string, data []byte, stderr io.Writer) (*pools.File, bool) {
	f, err := pools.Parse(path, data)
	return reported(f, err, stderr)
}

// reported prints a parsed pools file's errors, or its warnings, and says whether it is
// usable.
func reported(f *pools.File, err error, stderr io.Writer) (*pools.File, bool) {
	if err != nil {
		printErrors(err, stderr)
		return nil, false
	}
	for _, w := range f.Warnings {
		fmt.Fprintf(stderr, "%s:%d:%d: warning: %s\n", w.File, w.Line, w.Col, w.Msg)
	}
	return f, true
}

// printErrors prints every error of a pools file's ErrorList on a line of its own.
func printErrors(err error, stderr io.Writer) {
	var list pools.ErrorList
	if !errors.As(err, &list) {
		fmt.Fprintln(stderr, err)
		return
	}
	for _, e := range list {
		fmt.Fprintln(stderr, e)
	}
}

func validate(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("validate", validateUsage, stderr)
	quiet := fs.Bool("q", false, "print nothing when the file is valid")
	if err := fs.Parse(args); err != nil {
		return parseError(err)
	}
	if fs.NArg() != 1 {
		fmt.Fprint(stderr, validateUsage)
		return 2
	}
	f, ok := load(fs.Arg(0), stderr)
	if !ok {
		return 1
	}
	warnRefused(stderr, f)
	if !*quiet {
		backends := 0
		for _, s := range f.Services {
			backends += len(s.Backends)
		}
		fmt.Fprintf(stdout, "%s: ok (%d services, %d backends)\n", fs.Arg(0), len(f.Services), backends)
		printNAT(stdout, f)
	}
	return 0
}

// printNAT says which vip services have backends the file already puts behind NAT
// (forwarding nat, or auto on another port than the VIP's), since `stickylb xdp` then needs
// --nat-source of their family; auto backends on the VIP's port are decided by the loader,
// which knows the interface's subnets.
func printNAT(w io.Writer, f *pools.File) {
	for _, s := range f.Services {
		n, families := 0, map[string]bool{}
		for _, b := range s.Backends {
			if s.VIP != "" && s.ForwardingOf(b) == pools.ForwardingNAT {
				n++
				families[map[bool]string{true: "IPv4", false: "IPv6"}[b.AddrPort().Addr().Is4()]] = true
			}
		}
		if n == 0 {
			continue
		}
		fmt.Fprintf(w, "  %s: %d of %d backends forwarded by NAT (stickylb xdp needs --nat-source: %s)\n",
			s.Name, n, len(s.Backends), strings.Join(slices.Sorted(maps.Keys(families)), " and "))
	}
}

func planCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("plan", planUsage, stderr)
	oldPath := fs.String("pools", "", "the pools file in service now")
	nextPath := fs.String("next", "", "the pools file to roll out")
	asJSON := fs.Bool("json", false, "print JSON")
	keys := fs.Int("keys", plan.DefaultKeys, fmt.Sprintf("keys to measure (at least %d)", plan.MinKeys))
	if err := fs.Parse(args); err != nil {
		return parseError(err)
	}
	if *oldPath == "" || *nextPath == "" || fs.NArg() != 0 {
		fmt.Fprint(stderr, planUsage)
		return 2
	}
	oldF, ok1 := load(*oldPath, stderr)
	nextF, ok2 := load(*nextPath, stderr)
	if !ok1 || !ok2 {
		return 1
	}
	rs, err := plan.Compare(oldF, nextF, *keys)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if *asJSON {
		out := struct {
			Services []plan.Result `json:"services"`
		}{rs}
		if out.Services == nil {
			out.Services = []plan.Result{}
		}
		return printJSON(stdout, stderr, out)
	}
	printPlan(stdout, rs)
	return 0
}

// printPlan writes the disruption table: per service the share its algorithm moves, then
// the classic comparison (mod-N, the ring with the file's settings and its points, Maglev,
// the ideal), the second-chance table of tunnel services, and gRPC clients' ring where their
// 4096-point cap makes it another ring.
func printPlan(w io.Writer, rs []plan.Result) {
	grpcCapped := slices.ContainsFunc(rs, func(r plan.Result) bool { return r.GRPCRing != nil })
	pct := func(p *float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf("%.2f%%", 100**p)
	}
	points := func(p *[2]int) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf("%d->%d", p[0], p[1])
	}
	tunnels := slices.ContainsFunc(rs, func(r plan.Result) bool { return r.Rendezvous != nil })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "SERVICE\tALGORITHM\tCHANGE\tMOVED\tMOD-N\tRING\tRING POINTS\tMAGLEV\tIDEAL"
	if tunnels {
		head += "\tRENDEZVOUS"
	}
	if grpcCapped {
		head += "\tGRPC RING\tGRPC POINTS"
	}
	fmt.Fprintln(tw, head+"\tNOTE")
	for _, r := range rs {
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", r.Name, r.Algorithm, r.Change,
			pct(&r.Moved), pct(&r.ModN), pct(r.Ring), points(r.RingPoints), pct(r.Maglev), pct(&r.Ideal))
		if tunnels {
			line += "\t" + pct(r.Rendezvous)
		}
		if grpcCapped {
			line += "\t" + pct(r.GRPCRing) + "\t" + points(r.GRPCRingPoints)
		}
		fmt.Fprintln(tw, line+"\t"+r.Note)
	}
	tw.Flush()
}
