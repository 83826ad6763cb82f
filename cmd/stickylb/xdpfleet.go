package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/adsclient"
	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/l4xdp"
	"github.com/stickylb/stickylb/policies/status"
)

// xdsNode is how `stickylb xdp --xds` reaches its control plane.
type xdsNode struct {
	server, nodeID, zone string // server: one address, or the replicas' comma-separated
	ca, cert, key        string
	// allowLoopback admits endpoints on loopback addresses (demos, tests).
	allowLoopback bool
}

// defaultNodeID is HOST/xdp/IFACE: unique per interface of a host, stable across restarts.
func defaultNodeID(iface string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	return host + "/xdp/" + iface
}

// runXDPFleet forwards with the views the control plane pushes, until ctx ends. The loader
// starts on what a previous loader pinned (so a node restarted while the control plane is
// down keeps forwarding its last view), and probes nothing: the view's verdicts decide. A
// view the forwarder cannot hold is NACKed with the reason and the last view stays.
func runXDPFleet(ctx context.Context, cfg l4xdp.Config, n xdsNode, metrics httpAddr, rt *xdpRouting, log *zap.Logger, stdout, stderr io.Writer) int {
	c, err := adsclient.New(adsclient.Config{
		Servers: strings.Split(n.server, ","), NodeID: n.nodeID, Zone: n.zone, UserAgentName: fleetview.UserAgentXDP,
		TLS: adsclient.TLS{CAFile: n.ca, CertFile: n.cert, KeyFile: n.key},
	}, log)
	if err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: %v\n", err)
		return 2
	}
	l, err := l4xdp.Open(cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: %v\n", err)
		return 1
	}
	// SIGTERM leaves the program and its pinned maps forwarding; a new loader adopts them.
	defer l.Close()
	if n.ca == "" && n.cert == "" && n.key == "" {
		log.Warn("the stream to the control plane has no TLS: whoever can reach it, or the path to it, can feed this node backends; set --xds-ca (and --xds-cert, --xds-key)")
	}
	feed := newXDPFeed(l, c, n, metrics.addr, log)
	defer feed.applied.Stop()
	a := feed.asm
	// Wildcard subscriptions, filtered here: the snapshot cache answers a named one only
	// when it names every resource of the type.
	if err := c.Subscribe(resource.ClusterType, a.Clusters); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: %v\n", err)
		return 1
	}
	if err := c.Subscribe(resource.EndpointType, a.Endpoints); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: %v\n", err)
		return 1
	}
	fs := func() *status.Feed { fd := feed.status(n.server, n.nodeID); return &fd }
	stopMetrics, err := serveXDPMetrics(metrics, l, nil, rt, fs, log, c.Collector())
	if err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: --metrics: %v\n", err)
		return 1
	}
	defer stopMetrics()
	// The VIPs the pinned program serves are announced before the first view arrives.
	if err := rt.start(ctx, l, cfg); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: %v\n", err)
		return 1
	}
	if err := c.Start(ctx); err != nil {
		fmt.Fprintf(stderr, "stickylb xdp: %v\n", err)
		return 1
	}
	defer c.Close()
	log.Info("forwarding", zap.String("iface", cfg.Iface), zap.String("mode", string(cfg.Mode)),
		zap.String("xds", n.server), zap.String("node", n.nodeID), zap.String("zone", n.zone))
	fmt.Fprintln(stdout, "ready")
	<-ctx.Done()
	return 0
}

// verdictsOf hands the view's verdicts to the loader.
func verdictsOf(v *fleetview.View) l4xdp.Verdicts {
	return func(service, id string) l4xdp.Verdict {
		vd := v.Verdict(service, id)
		return l4xdp.Verdict{State: vd.State, Since: vd.Since, From: vd.From}
	}
}

// vipTableSummary is one VIP's table as `stickylb xdp tables` prints it: the slots each
// backend holds, and a digest of the whole table by backend names, which is equal on two
// nodes that hold the same table (whatever slot numbers each gave its backends).
type vipTableSummary struct {
	Slots  map[string]int `json:"slots"`
	Down   []string       `json:"down,omitempty"`
	Panic  bool           `json:"panic,omitempty"`
	Digest string         `json:"digest"`
}

// xdpTables prints the pinned forwarder's tables, summarised, as JSON.
func xdpTables(cfg l4xdp.Config, stdout, stderr io.Writer) int {
	ts, err := l4xdp.PinnedTables(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "stickylb xdp tables: %v\n", err)
		return 1
	}
	out := map[string]vipTableSummary{}
	for svc, t := range ts {
		s := vipTableSummary{Slots: map[string]int{}, Down: t.Down, Panic: t.Panic}
		h := sha256.New()
		for _, name := range t.Table {
			s.Slots[name]++
			io.WriteString(h, name)
			h.Write([]byte{0})
		}
		s.Digest = hex.EncodeToString(h.Sum(nil)[:16])
		out[svc] = s
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	enc.Encode(out)
	return 0
}
