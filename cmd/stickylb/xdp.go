package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/l4xdp"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/policies/status"
)

// xdpCmd runs `stickylb xdp`: a subcommand on the pinned forwarder, or the forwarder itself.
func xdpCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "drain" || args[0] == "undrain") {
		return xdpControl(args[0], args[1:], stdout, stderr)
	}
	fl, err := parseXDPFlags(args, stderr)
	if err != nil {
		return parseError(err)
	}
	switch fl.sub {
	case "detach":
		if err := l4xdp.Detach(fl.cfg); err != nil {
			fmt.Fprintf(stderr, "stickylb xdp detach: %v\n", err)
			return 1
		}
		return 0
	case "stats":
		return xdpStats(fl.cfg, stdout, stderr)
	case "tables":
		return xdpTables(fl.cfg, stdout, stderr)
	case "pass":
		return xdpPass(fl.cfg, stderr)
	}
	return runXDP(fl, stdout, stderr)
}

// runXDP attaches the forwarder to fl's interface and keeps it in step with the pools file or
// the control plane until SIGINT or SIGTERM, which leave the program and its pinned maps
// forwarding (a new loader adopts them).
func runXDP(fl xdpFlags, stdout, stderr io.Writer) int {
	if _, err := net.InterfaceByName(fl.cfg.Iface); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: interface %q: %v\n", fl.cfg.Iface, err)
		return 1
	}
	log, _ := newLogger()
	defer log.Sync()
	if err := ensureBPFFS(fl.cfg.PinRoot, log); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: %v\n", err)
		return 1
	}
	var f *pools.File
	if fl.node.server == "" {
		var ok bool
		if f, ok = load(fl.pools, stderr); !ok {
			return 1
		}
	}
	rt, err := newXDPRouting(&fl.bgp, fl.cfg.Iface, l4xdp.Running(fl.cfg), log)
	if err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: %v\n", err)
		return 2
	}
	defer rt.close()
	fl.cfg.Served = rt.served
	sig, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx := rt.lingering(sig) // with BGP: withdraw first, then forward for --drain-time
	if fl.node.server != "" {
		return runXDPFleet(ctx, fl.cfg, fl.node, fl.metrics, rt, log, stdout, stderr)
	}
	return runXDPPools(ctx, fl, f, rt, log, stdout, stderr)
}

// runXDPPools forwards the services of pools file f, reloading it when it changes, until ctx
// ends. The loader probes the backends itself.
func runXDPPools(ctx context.Context, fl xdpFlags, f *pools.File, rt *xdpRouting, log *zap.Logger, stdout, stderr io.Writer) int {
	edits := status.NewConfigLog(fl.pools, time.Now())
	cfg := fl.cfg
	// An edit refused for what may pass (a MAC not resolved yet) is retried by the loader:
	// the status page hears when it serves after all.
	cfg.RetryApplied = func() { edits.Applied(time.Now()) }
	l, err := l4xdp.Open(cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: %v\n", err)
		return 1
	}
	defer l.Close() // the program and its pinned maps stay, forwarding
	if err := l.Apply(ctx, f); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: %v\n", err)
		return 1
	}
	if err := rt.start(ctx, l, fl.cfg); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: %v\n", err)
		return 1
	}
	stopMetrics, err := serveXDPMetrics(fl.metrics, l, edits, rt, nil, log)
	if err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: --metrics: %v\n", err)
		return 1
	}
	defer stopMetrics()
	log.Info("forwarding", zap.String("iface", fl.cfg.Iface), zap.String("mode", string(fl.cfg.Mode)), zap.String("pools", fl.pools))
	fmt.Fprintln(stdout, "ready")
	w := pools.Watcher{Path: fl.pools, Interval: fl.poll, Current: f, Log: log, Edits: edits,
		Apply: func(f *pools.File) error { return l.Apply(ctx, f) }}
	w.Run(ctx)
	return 0
}

// serveXDPMetrics serves, at m, the forwarder's counters and more (Prometheus, at
// /metrics) and l's status page (at /; with the pools file's refused edits when edits is
// not nil, what the node announces with BGP, and how it stands with its control plane when
// feed is not nil), to requests for m's Host names only, until the function it returns is
// called. An empty address serves nothing.
func serveXDPMetrics(m httpAddr, l *l4xdp.Loader, edits *status.ConfigLog, rt *xdpRouting, feed func() *status.Feed, log *zap.Logger, more ...prometheus.Collector) (stop func(), err error) {
	if m.addr == "" {
		return func() {}, nil
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(append(append([]prometheus.Collector{xdpCollector{l.Tables()}}, rt.collectors()...), more...)...)
	_, stop, err = serveAdmin(m.addr, m.hosts, xdpMetricsHandler(l, reg, edits, rt.status, feed, log), log)
	return stop, err
}

// xdpCollector exposes the forwarder's counters: by path, by VIP, by backend, and the
// connection table's hits and misses.
type xdpCollector struct{ tables *l4xdp.Tables }

var (
	descPathPackets    = prometheus.NewDesc("stickylb_xdp_packets_total", "Packets by path through the XDP program.", []string{"path"}, nil)
	descPathBytes      = prometheus.NewDesc("stickylb_xdp_bytes_total", "Bytes by path through the XDP program.", []string{"path"}, nil)
	descVIPPackets     = prometheus.NewDesc("stickylb_xdp_vip_packets_total", "Packets forwarded for a VIP.", []string{"service"}, nil)
	descVIPBytes       = prometheus.NewDesc("stickylb_xdp_vip_bytes_total", "Bytes forwarded for a VIP.", []string{"service"}, nil)
	descBackendPackets = prometheus.NewDesc("stickylb_xdp_backend_packets_total", "Packets forwarded to a backend.", []string{"service", "backend"}, nil)
	descBackendBytes   = prometheus.NewDesc("stickylb_xdp_backend_bytes_total", "Bytes forwarded to a backend.", []string{"service", "backend"}, nil)
	descConnTable      = prometheus.NewDesc("stickylb_xdp_conn_table_lookups_total", "Connection-table lookups of packets to a VIP.", []string{"result"}, nil)
	descActiveBackend  = prometheus.NewDesc("stickylb_xdp_backend_active_connections", "Active connections of a backend, counted from the client side.", []string{"service", "backend"}, nil)
	descActiveZone     = prometheus.NewDesc("stickylb_xdp_zone_active_connections", "Active connections to a zone's backends.", []string{"service", "zone"}, nil)
	descInsertsRefused = prometheus.NewDesc("stickylb_xdp_conn_inserts_refused_total", "New flows forwarded but not remembered: a CPU's connection-table insert cap for the second was spent (flood guard).", nil, nil)
	descNATReclaimed   = prometheus.NewDesc("stickylb_xdp_nat_holds_reclaimed_total", "NAT source ports taken back from flows whose client had not completed the handshake, for new flows that found no free port (SYN flood guard).", nil, nil)
)

func (xdpCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPathPackets, descPathBytes, descVIPPackets, descVIPBytes, descBackendPackets, descBackendBytes, descConnTable, descInsertsRefused, descNATReclaimed, descActiveBackend, descActiveZone} {
		ch <- d
	}
}

func (c xdpCollector) Collect(ch chan<- prometheus.Metric) {
	st, err := c.tables.Stats()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descPathPackets, err)
		return
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for p, n := range st.Paths {
		counter(descPathPackets, n.Packets, p)
		counter(descPathBytes, n.Bytes, p)
	}
	for s, n := range st.VIPs {
		counter(descVIPPackets, n.Packets, s)
		counter(descVIPBytes, n.Bytes, s)
	}
	for k, n := range st.Backends {
		service, backend, _ := strings.Cut(k, "/")
		counter(descBackendPackets, n.Packets, service, backend)
		counter(descBackendBytes, n.Bytes, service, backend)
	}
	for k, n := range st.ActiveBackends {
		service, backend, _ := strings.Cut(k, "/")
		ch <- prometheus.MustNewConstMetric(descActiveBackend, prometheus.GaugeValue, float64(n), service, backend)
	}
	for k, n := range st.ActiveZones {
		service, zone, _ := strings.Cut(k, "/")
		ch <- prometheus.MustNewConstMetric(descActiveZone, prometheus.GaugeValue, float64(n), service, zone)
	}
	counter(descConnTable, st.Paths["conn_hit"].Packets, "hit")
	counter(descConnTable, st.Paths["conn_miss"].Packets, "miss")
	counter(descInsertsRefused, st.Paths["insert_refused"].Packets)
	counter(descNATReclaimed, st.Paths["nat_reclaim"].Packets)
}

// xdpStats prints the pinned forwarder's counters as JSON: it needs no running loader.
func xdpStats(cfg l4xdp.Config, stdout, stderr io.Writer) int {
	st, err := l4xdp.PinnedStats(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "stickylb xdp stats: %v\n", err)
		return 1
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	enc.Encode(st)
	return 0
}

func xdpPass(cfg l4xdp.Config, stderr io.Writer) int {
	ifc, err := net.InterfaceByName(cfg.Iface)
	if err != nil {
		fmt.Fprintf(stderr, "stickylb xdp pass: %v\n", err)
		return 1
	}
	prog, err := l4xdp.LoadPass()
	if err != nil {
		fmt.Fprintf(stderr, "stickylb xdp pass: %v\n", err)
		return 1
	}
	defer prog.Close()
	lnk, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifc.Index})
	if err != nil {
		fmt.Fprintf(stderr, "stickylb xdp pass: %v\n", err)
		return 1
	}
	dir := filepath.Join(cfg.PinRoot, "pass-"+cfg.Iface)
	os.MkdirAll(dir, 0o700)
	if err := lnk.Pin(filepath.Join(dir, "link")); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp pass: %v\n", err)
		return 1
	}
	return 0
}
