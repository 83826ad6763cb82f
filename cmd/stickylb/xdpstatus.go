package main

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/internal/buildinfo"
	"github.com/stickylb/stickylb/l4xdp"
	"github.com/stickylb/stickylb/policies/status"
)

// xdpMetricsHandler serves the forwarder's metrics address: the status page at its root,
// status.json beside it, and the Prometheus metrics at every other path (as before the page,
// so scrapers of any path keep working). Unauthenticated and read-only: keep it private.
// edits, the record of the pools file's edits, is nil on a node fed by a control plane;
// routing, what the node announces, nil without BGP; feed, how a node fed by a control
// plane stands with it, nil on the others. It adds stickylb_build_info to reg.
func xdpMetricsHandler(l *l4xdp.Loader, reg *prometheus.Registry, edits *status.ConfigLog, routing func() *status.Routing, feed func() *status.Feed, log *zap.Logger) http.Handler {
	reg.MustRegister(buildinfo.Collector())
	mux := http.NewServeMux()
	mux.Handle("/", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) { status.ServePage(w) })
	mux.HandleFunc("GET /"+status.JSONPath, func(w http.ResponseWriter, _ *http.Request) {
		snap, err := l.Status()
		if err != nil {
			log.Error("status of the forwarder", zap.Error(err))
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		snap.Config = edits.File()
		if routing != nil {
			snap.Routing = routing()
		}
		if feed != nil {
			snap.AddFeed(*feed())
		}
		if err := status.ServeJSON(w, snap); err != nil {
			log.Debug("writing status.json", zap.Error(err))
		}
	})
	return mux
}
