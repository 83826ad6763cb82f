package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/internal/buildinfo"
	"github.com/stickylb/stickylb/l4xdp/agent"
)

const backendUsage = `usage:
  stickylb backend --iface IF --lb-source PREFIX[,PREFIX...] [--tunnel-port PORT[,PORT...]] [--metrics ADDR [--admin-host NAME,...]] [--pin-root DIR]
                                    decapsulate the tunnel's GUE on IF, pass packets of no connection here to their secondary
  stickylb backend stats --iface IF [--pin-root DIR]     the pinned agent's counters
  stickylb backend detach --iface IF [--pin-root DIR]    remove the agent and its pinned state
`

// backendSubcommands are the words that may follow `stickylb backend`.
var backendSubcommands = map[string]bool{"stats": true, "detach": true}

// backendFlags is `stickylb backend`'s command line.
type backendFlags struct {
	sub     string
	metrics httpAddr // --metrics, and the Host names it answers (--admin-host)
	cfg     agent.Config
}

// errBackendUsage is a command line parseBackendFlags refused, said on stderr.
var errBackendUsage = errors.New("stickylb backend: usage")

// parseBackendFlags reads args (what follows `stickylb backend`).
func parseBackendFlags(args []string, stderr io.Writer) (fl backendFlags, err error) {
	if len(args) > 0 && backendSubcommands[args[0]] {
		fl.sub, args = args[0], args[1:]
	}
	fs := newFlagSet("backend", backendUsage, stderr)
	fs.StringVar(&fl.cfg.Iface, "iface", "", "interface the tunnel's packets arrive on (second-chance packets leave by it)")
	var ports tunnelPorts
	var sources lbSources
	fs.Var(&ports, "tunnel-port", fmt.Sprintf("UDP port of the tunnel's GUE (the pools file's tunnel_port; repeat or separate with commas; default %d)", agent.DefaultTunnelPort))
	fs.Var(&sources, "lb-source", "the LB nodes' tunnel sources, addresses or prefixes (repeat or separate with commas): tunnel packets from elsewhere are dropped")
	fs.StringVar(&fl.metrics.addr, "metrics", "", "HTTP address for Prometheus metrics at /metrics and status.json beside them (off when empty)")
	fs.Var(&fl.metrics.hosts, "admin-host", "more Host names the --metrics address answers (comma-separated or repeated; it always answers its own address, localhost when that is loopback, and any IP address when it listens on all of them): other names are refused with 421 (DNS rebinding)")
	fs.StringVar(&fl.cfg.PinRoot, "pin-root", agent.DefaultPinRoot, "bpffs directory for pinned state (a bpffs is mounted when none holds it)")
	if err := fs.Parse(args); err != nil {
		return fl, err
	}
	fl.cfg.TunnelPorts, fl.cfg.LBSources = ports, sources
	if fl.cfg.Iface == "" || fs.NArg() != 0 {
		fmt.Fprint(stderr, backendUsage)
		return fl, errBackendUsage
	}
	if fl.sub == "" {
		if err := fl.cfg.Validate(); err != nil {
			fmt.Fprintf(stderr, "stickylb backend: %v\n", err)
			return fl, errBackendUsage
		}
		if err := checkAdminHosts("--metrics", fl.metrics.addr, fl.metrics.hosts); err != nil {
			fmt.Fprintf(stderr, "stickylb backend: %v\n", err)
			return fl, errBackendUsage
		}
	}
	return fl, nil
}

// tunnelPorts is --tunnel-port: each use adds a port or a comma-separated list.
type tunnelPorts []uint16

func (p *tunnelPorts) String() string {
	out := make([]string, len(*p))
	for i, x := range *p {
		out[i] = strconv.Itoa(int(x))
	}
	return strings.Join(out, ",")
}

func (p *tunnelPorts) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(part), 10, 16)
		if err != nil || n == 0 {
			return fmt.Errorf("%q: want a port 1..65535", part)
		}
		*p = append(*p, uint16(n))
	}
	return nil
}

// lbSources is --lb-source: addresses (as /32 or /128) and prefixes.
type lbSources []netip.Prefix

func (s *lbSources) String() string {
	out := make([]string, len(*s))
	for i, p := range *s {
		out[i] = p.String()
	}
	return strings.Join(out, ",")
}

func (s *lbSources) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		p, err := netip.ParsePrefix(part)
		if err != nil {
			a, aerr := netip.ParseAddr(part)
			if aerr != nil {
				return fmt.Errorf("%q is neither an address nor a prefix (e.g. 10.0.0.1 or 10.0.0.0/24)", part)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if p.Addr().Zone() != "" || p.Addr().Is4In6() {
			return fmt.Errorf("%q: write IPv4 as IPv4, without zones", part)
		}
		*s = append(*s, p.Masked())
	}
	return nil
}

// backendCmd runs `stickylb backend`: the agent, or a subcommand on the pinned one.
func backendCmd(args []string, stdout, stderr io.Writer) int {
	fl, err := parseBackendFlags(args, stderr)
	if err != nil {
		return parseError(err)
	}
	switch fl.sub {
	case "detach":
		if err := agent.Detach(fl.cfg); err != nil {
			fmt.Fprintf(stderr, "stickylb backend detach: %v\n", err)
			return 1
		}
		return 0
	case "stats":
		st, err := agent.PinnedStats(fl.cfg)
		if err != nil {
			fmt.Fprintf(stderr, "stickylb backend stats: %v\n", err)
			return 1
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(map[string]any{"paths": st})
		return 0
	}
	return runBackend(fl, stdout, stderr)
}

// runBackend attaches the agent and keeps its table of the host's addresses up to date until
// SIGINT or SIGTERM, which leave the program decapsulating (a new agent adopts it).
func runBackend(fl backendFlags, stdout, stderr io.Writer) int {
	log, _ := newLogger()
	defer log.Sync()
	if err := ensureBPFFS(fl.cfg.PinRoot, log); err != nil {
		fmt.Fprintf(stderr, "stickylb backend: %v\n", err)
		return 1
	}
	a, err := agent.Open(fl.cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "stickylb backend: %v\n", err)
		return 1
	}
	defer a.Close() // the program and its pinned counters stay
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	stopMetrics, err := serveBackendMetrics(fl.metrics, a, log)
	if err != nil {
		fmt.Fprintf(stderr, "stickylb backend: --metrics: %v\n", err)
		return 1
	}
	defer stopMetrics()
	st, _ := a.Status()
	log.Info("decapsulating", zap.String("iface", fl.cfg.Iface), zap.Uint16s("tunnel_ports", st.TunnelPorts),
		zap.Stringer("lb_sources", (*lbSources)(&fl.cfg.LBSources)), zap.Int("local_addresses", st.LocalAddrs))
	fmt.Fprintln(stdout, "ready")
	a.Run(ctx, 10*time.Second)
	return 0
}

// serveBackendMetrics serves, at m's address, the agent's counters (Prometheus, at /metrics
// and every path but status.json) and its status.json, to the Host names m answers, until
// the function it returns is called. An empty address serves nothing. Unauthenticated and
// read-only: keep it private.
func serveBackendMetrics(m httpAddr, a *agent.Agent, log *zap.Logger) (stop func(), err error) {
	if m.addr == "" {
		return func() {}, nil
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(backendCollector{a})
	_, stop, err = serveAdmin(m.addr, m.hosts, backendMetricsHandler(a, reg, log), log)
	return stop, err
}

// backendMetricsHandler serves the agent's metrics address: status.json, and the Prometheus
// metrics of reg at every other path. It adds stickylb_build_info to reg, as the other
// tiers' handlers do.
func backendMetricsHandler(a *agent.Agent, reg *prometheus.Registry, log *zap.Logger) http.Handler {
	reg.MustRegister(buildinfo.Collector())
	mux := http.NewServeMux()
	mux.Handle("/", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /status.json", func(w http.ResponseWriter, _ *http.Request) {
		st, err := a.Status()
		if err != nil {
			log.Error("status of the agent", zap.Error(err))
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(st)
	})
	return mux
}

// backendCollector exposes the agent's counters by path, and the host's addresses it knows.
type backendCollector struct{ a *agent.Agent }

var (
	descBackendAgentPackets = prometheus.NewDesc("stickylb_backend_packets_total", "Tunnel packets by path through the backend agent (decap, second_chance, no_socket, refused, malformed, not_local).", []string{"path"}, nil)
	descBackendAgentBytes   = prometheus.NewDesc("stickylb_backend_bytes_total", "Tunnel bytes by path through the backend agent.", []string{"path"}, nil)
	descBackendLocalAddrs   = prometheus.NewDesc("stickylb_backend_local_addresses", "The host's addresses the agent decapsulates for (the VIPs on lo among them).", nil, nil)
)

func (backendCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descBackendAgentPackets
	ch <- descBackendAgentBytes
	ch <- descBackendLocalAddrs
}

func (c backendCollector) Collect(ch chan<- prometheus.Metric) {
	st, err := c.a.Status()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descBackendAgentPackets, err)
		return
	}
	for p, n := range st.Paths {
		ch <- prometheus.MustNewConstMetric(descBackendAgentPackets, prometheus.CounterValue, float64(n.Packets), p)
		ch <- prometheus.MustNewConstMetric(descBackendAgentBytes, prometheus.CounterValue, float64(n.Bytes), p)
	}
	ch <- prometheus.MustNewConstMetric(descBackendLocalAddrs, prometheus.GaugeValue, float64(st.LocalAddrs))
}
