package xds

import (
	"encoding/json"
	"net/http"
	"sort"

	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/stickylb/stickylb/internal/buildinfo"
	"github.com/stickylb/stickylb/policies/status"
)

// AdminHandler serves the fleet's status page at / (its JSON at /status.json), /healthz
// (503 while the server cannot serve nodes, see WithReadiness), /livez (while the process
// runs), /metrics and /config (each stream's current snapshot as
// JSON, in the manner of Envoy's config_dump). It authenticates nobody and /config shows the
// whole fleet's configuration: serve it on a private address only (`--admin` is off unless
// set). extra collectors are served on /metrics beside the server's own.
func (s *Server) AdminHandler(extra ...prometheus.Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(buildinfo.Collector())
	reg.MustRegister(extra...)
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
	}
	counter := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f))
	}
	gauge("stickylb_xds_nodes", "Node ids that hold at least one stream.", func() float64 { return float64(len(s.Nodes())) })
	gauge("stickylb_xds_streams", "Open xDS streams.", func() float64 { return float64(s.Streams()) })
	counter("stickylb_xds_unknown_zone_streams_total", "Streams of a zone the pools file does not name (served the cross-zone view).", func() float64 { return float64(s.Stats.UnknownZone.Load()) })
	reg.MustRegister(refusalCollector{s: s, desc: prometheus.NewDesc("stickylb_xds_refused_streams_total",
		"Streams refused, by reason: max_streams, identity_streams, invalid_node, identity, id_taken, node_streams, identity_nodes, max_nodes.",
		[]string{"reason"}, nil)})
	counter("stickylb_xds_first_request_timeouts_total", "Streams ended for sending no request within --first-request-timeout.", func() float64 { return float64(s.Stats.FirstRequestTimeouts.Load()) })
	counter("stickylb_xds_unknown_type_requests_total", "Requests for type URLs the server does not serve (dropped: no watch, no state).", func() float64 { return float64(s.Stats.UnknownTypes.Load()) })
	counter("stickylb_xds_unknown_type_streams_ended_total", "Streams ended for asking for 100 distinct type URLs the server does not serve.", func() float64 { return float64(s.Stats.UnknownTypeEnds.Load()) })
	counter("stickylb_xds_pushes_total", "Responses sent to nodes.", func() float64 { return float64(s.Stats.Pushes.Load()) })
	counter("stickylb_xds_nacks_total", "Snapshots a node rejected (counted once per push).", func() float64 { return float64(s.Stats.NACKs.Load()) })
	counter("stickylb_xds_rollbacks_total", "Nodes returned to their last acknowledged snapshot.", func() float64 { return float64(s.Stats.Rollbacks.Load()) })
	counter("stickylb_xds_reloads_total", "Pools file reloads applied.", func() float64 { return float64(s.Stats.Reloads.Load()) })
	counter("stickylb_xds_reload_errors_total", "Pools file edits rejected.", func() float64 { return float64(s.Stats.ReloadErrors.Load()) })
	counter("stickylb_xds_snapshot_builds_total", "Snapshots translated and validated (one per zone and version).", func() float64 { return float64(s.Stats.Builds.Load()) })
	counter("stickylb_panics_total", "Services that entered panic (fail open).", func() float64 { return float64(s.Stats.Panics.Load()) })
	counter("stickylb_xds_health_transitions_total", "Backend health transitions published.", func() float64 { return float64(s.Stats.HealthTransitions.Load()) })
	reg.MustRegister(panicCollector{s: s, desc: prometheus.NewDesc("stickylb_panic",
		"1 while every non-draining backend of the service is down and the control plane fails open (publishes them all as UNKNOWN).",
		[]string{"service"}, nil)})
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if s.readiness != nil {
			if ready, why := s.readiness(); !ready {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write([]byte("not ready: " + why + "\n"))
				return
			}
		}
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	// The fleet's status page at the root and its JSON beside it (read-only).
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) { status.ServePage(w) })
	mux.HandleFunc("GET /"+status.JSONPath, func(w http.ResponseWriter, _ *http.Request) { status.ServeJSON(w, s.Status()) })
	mux.HandleFunc("/config", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(s.configDump())
	})
	return mux
}

// panicCollector exports stickylb_panic{service} for every service of the current file.
type panicCollector struct {
	s    *Server
	desc *prometheus.Desc
}

func (c panicCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c panicCollector) Collect(ch chan<- prometheus.Metric) {
	for name, p := range c.s.Panicking() {
		v := 0.0
		if p {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, name)
	}
}

type nodeDump struct {
	Node      string                       `json:"node"`
	Stream    int64                        `json:"stream"`
	Zone      string                       `json:"zone"`
	Version   string                       `json:"version"`
	Acked     string                       `json:"acked_version,omitempty"`
	Resources map[string][]json.RawMessage `json:"resources"`
}

// configDump copies what each stream is served under the lock (snapshots are immutable
// once built, so a copy of the pointers is a copy of the state) and serialises outside it.
func (s *Server) configDump() []nodeDump {
	type served struct {
		d       nodeDump
		current *cachev3.Snapshot
	}
	s.mu.Lock()
	var copies []served
	for _, st := range s.streams {
		if !st.admitted {
			continue
		}
		c := served{d: nodeDump{Node: st.node.ID, Stream: st.id, Zone: st.node.Zone}, current: st.acks.current}
		if st.acks.acked != nil {
			c.d.Acked = st.acks.acked.GetVersion(resource.ClusterType)
		}
		copies = append(copies, c)
	}
	s.mu.Unlock()
	out := make([]nodeDump, 0, len(copies))
	for _, c := range copies {
		d := c.d
		d.Resources = map[string][]json.RawMessage{}
		if c.current != nil {
			d.Version = c.current.GetVersion(resource.ClusterType)
			for _, t := range typeURLs {
				for _, r := range c.current.GetResources(t) {
					if s.hooks.dumping != nil {
						s.hooks.dumping()
					}
					b, err := protojson.Marshal(r.(proto.Message))
					if err == nil {
						d.Resources[t] = append(d.Resources[t], b)
					}
				}
			}
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Node != out[j].Node {
			return out[i].Node < out[j].Node
		}
		return out[i].Stream < out[j].Stream
	})
	return out
}
