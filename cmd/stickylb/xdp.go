package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
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

const xdpUsage = `usage:
  stickylb xdp --pools FILE --iface IF [--mode native|generic] [--metrics ADDR] [--pin-root DIR]
               [--conn-table-size N] [--conn-insert-cap N] [--zone Z]
               [--nat-source ADDR[,ADDR...]] [--nat-ports LO-HI]
  stickylb xdp --xds ADDR --iface IF [--node-id ID] [--zone Z] [--xds-ca F [--xds-cert F --xds-key F]] [--allow-loopback]
               [--nat-source ADDR[,ADDR...]] [--nat-ports LO-HI]
               [--mode native|generic] [--metrics ADDR] [--pin-root DIR] ...
                                                   the view from a control plane (stickylb xds)
  stickylb xdp stats --iface IF [--pin-root DIR]
  stickylb xdp tables --iface IF [--pin-root DIR]    each VIP's table: slots per backend, digest
  stickylb xdp detach --iface IF [--pin-root DIR]
  stickylb xdp pass --iface IF [--pin-root DIR]      attach an XDP_PASS program (veth peers)
`

func xdpCmd(args []string, stdout, stderr io.Writer) int {
	sub := ""
	if len(args) > 0 && (args[0] == "stats" || args[0] == "tables" || args[0] == "detach" || args[0] == "pass") {
		sub, args = args[0], args[1:]
	}
	fs := newFlagSet("xdp", xdpUsage, stderr)
	poolsPath := fs.String("pools", "", "pools file (reloaded when it changes)")
	iface := fs.String("iface", "", "interface to attach to")
	mode := fs.String("mode", "native", "native or generic")
	metrics := fs.String("metrics", "", "HTTP address for Prometheus metrics at /metrics and the status page at / (off when empty)")
	pinRoot := fs.String("pin-root", l4xdp.DefaultPinRoot, "bpffs directory for pinned state (a bpffs is mounted when none holds it)")
	poll := fs.Duration("poll", time.Second, "how often to look for pools-file changes")
	tableSize := fs.Uint("conn-table-size", l4xdp.DefaultConnTableSize, "connection-table entries (shared by every CPU)")
	insertCap := fs.Int("conn-insert-cap", l4xdp.DefaultInsertCap, "new connection-table entries each CPU may make per second (flood guard; 0: no cap)")
	var xn xdsNode
	fs.StringVar(&xn.server, "xds", "", "control plane (host:port) to take the view from, instead of --pools")
	fs.StringVar(&xn.nodeID, "node-id", "", "node id sent to the control plane (default HOST/xdp/IFACE)")
	fs.StringVar(&xn.zone, "zone", "", "this node's zone: with cross_zone false, new flows go to its zone's backends first; with --xds, sent to the control plane as the node's locality")
	fs.StringVar(&xn.ca, "xds-ca", "", "CA bundle (PEM) that signs the control plane's certificate: TLS")
	fs.StringVar(&xn.cert, "xds-cert", "", "client certificate (PEM) for mTLS")
	fs.StringVar(&xn.key, "xds-key", "", "client key (PEM) for mTLS")
	fs.BoolVar(&xn.allowLoopback, "allow-loopback", false, "with --xds, forward to backends on loopback addresses (demos, tests); left out otherwise, as link-local and unspecified ones always are")
	var nat natFlags
	nat.register(fs)
	if err := fs.Parse(args); err != nil {
		return parseError(err)
	}
	if sub == "" && *poolsPath != "" && xn.server != "" {
		fmt.Fprint(stderr, "stickylb xdp: --pools and --xds exclude each other: a node takes its services and health from a file (and probes itself) or from a control plane\n")
		return 2
	}
	if xn.server == "" && (xn.nodeID != "" || xn.ca != "" || xn.cert != "" || xn.key != "" || xn.allowLoopback) {
		fmt.Fprint(stderr, "stickylb xdp: --node-id, --allow-loopback and --xds-* go with --xds\n")
		return 2
	}
	if *iface == "" || fs.NArg() != 0 || sub == "" && *poolsPath == "" && xn.server == "" || *mode != "native" && *mode != "generic" ||
		*tableSize == 0 || *tableSize > 1<<31 || *insertCap < 0 {
		fmt.Fprint(stderr, xdpUsage)
		return 2
	}
	// The loader's own rules (as many sources as the program holds) are command-line errors
	// too, said before anything is attached.
	if err := nat.config().Validate(); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: --nat-source, --nat-ports: %v\n", err)
		return 2
	}
	capOpt := *insertCap
	if capOpt == 0 {
		capOpt = -1 // the flag's 0 is "no cap"; Options' is "the default"
	}
	cfg := l4xdp.Config{Iface: *iface, Mode: l4xdp.Mode(*mode), PinRoot: *pinRoot, Zone: xn.zone,
		Tables: l4xdp.Options{ConnTableSize: uint32(*tableSize), InsertCap: capOpt}, NAT: nat.config()}
	switch sub {
	case "detach":
		if err := l4xdp.Detach(cfg); err != nil {
			fmt.Fprintf(stderr, "stickylb xdp detach: %v\n", err)
			return 1
		}
		return 0
	case "stats":
		return xdpStats(cfg, stdout, stderr)
	case "tables":
		return xdpTables(cfg, stdout, stderr)
	case "pass":
		return xdpPass(cfg, stderr)
	}
	if _, err := net.InterfaceByName(*iface); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: interface %q: %v\n", *iface, err)
		return 1
	}
	log, _ := newLogger()
	defer log.Sync()
	if err := ensureBPFFS(cfg.PinRoot, log); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: %v\n", err)
		return 1
	}
	if xn.server != "" {
		if xn.nodeID == "" {
			xn.nodeID = defaultNodeID(*iface)
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return runXDPFleet(ctx, cfg, xn, *metrics, log, stdout, stderr)
	}
	f, ok := load(*poolsPath, stderr)
	if !ok {
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	l, err := l4xdp.Open(cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: %v\n", err)
		return 1
	}
	// SIGTERM leaves the program and its pinned maps forwarding; a new loader adopts them.
	defer l.Close()
	if err := l.Apply(ctx, f); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: %v\n", err)
		return 1
	}
	edits := status.NewConfigLog(*poolsPath, time.Now())
	if *metrics != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(xdpCollector{l.Tables()})
		hs := &http.Server{Addr: *metrics, Handler: xdpMetricsHandler(l, reg, edits, nil, log), ReadHeaderTimeout: 5 * time.Second}
		go hs.ListenAndServe()
		defer hs.Close()
	}
	log.Info("forwarding", zap.String("iface", *iface), zap.String("mode", *mode), zap.String("pools", *poolsPath))
	fmt.Fprintln(stdout, "ready")
	w := pools.Watcher{Path: *poolsPath, Interval: *poll, Current: f, Log: log, Edits: edits,
		Apply: func(nf *pools.File) error { return l.Apply(ctx, nf) }}
	w.Run(ctx)
	return 0
}

// xdpCollector exposes the forwarder's counters: by path, by VIP, by backend, and the
// connection table's hits and misses.
type xdpCollector struct{ fw *l4xdp.Tables }

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
)

func (xdpCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPathPackets, descPathBytes, descVIPPackets, descVIPBytes, descBackendPackets, descBackendBytes, descConnTable, descInsertsRefused, descActiveBackend, descActiveZone} {
		ch <- d
	}
}

func (c xdpCollector) Collect(ch chan<- prometheus.Metric) {
	st, err := c.fw.Stats()
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
