package xds

import (
	"encoding/json"
	"net/http"
	"sort"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// AdminHandler serves /healthz, /metrics and /config (each node's current snapshot as JSON,
// in the manner of Envoy's config_dump).
func (s *Server) AdminHandler() http.Handler {
	reg := prometheus.NewRegistry()
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
	}
	counter := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f))
	}
	gauge("stickylb_xds_nodes", "Nodes that have subscribed.", func() float64 { return float64(len(s.Nodes())) })
	counter("stickylb_xds_pushes_total", "Responses sent to nodes.", func() float64 { return float64(s.Stats.Pushes.Load()) })
	counter("stickylb_xds_nacks_total", "Snapshots a node rejected (counted once per push).", func() float64 { return float64(s.Stats.NACKs.Load()) })
	counter("stickylb_xds_rollbacks_total", "Nodes returned to their last acknowledged snapshot.", func() float64 { return float64(s.Stats.Rollbacks.Load()) })
	counter("stickylb_xds_reloads_total", "Pools file reloads applied.", func() float64 { return float64(s.Stats.Reloads.Load()) })
	counter("stickylb_xds_reload_errors_total", "Pools file edits rejected.", func() float64 { return float64(s.Stats.ReloadErrors.Load()) })
	counter("stickylb_xds_snapshot_builds_total", "Snapshots translated and validated (one per zone and version).", func() float64 { return float64(s.Stats.Builds.Load()) })
	counter("stickylb_xds_health_transitions_total", "Backend health transitions published.", func() float64 { return float64(s.Stats.HealthTransitions.Load()) })
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/config", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(s.configDump())
	})
	return mux
}

type nodeDump struct {
	Node      string                       `json:"node"`
	Zone      string                       `json:"zone"`
	Version   string                       `json:"version"`
	Acked     string                       `json:"acked_version,omitempty"`
	Resources map[string][]json.RawMessage `json:"resources"`
}

func (s *Server) configDump() []nodeDump {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []nodeDump{}
	for id, ns := range s.nodes {
		d := nodeDump{Node: id, Zone: ns.node.Zone, Resources: map[string][]json.RawMessage{}}
		if ns.acked != nil {
			d.Acked = ns.acked.GetVersion(resource.ClusterType)
		}
		if ns.current != nil {
			d.Version = ns.current.GetVersion(resource.ClusterType)
			for _, t := range typeURLs {
				for _, r := range ns.current.GetResources(t) {
					b, err := protojson.Marshal(r.(proto.Message))
					if err == nil {
						d.Resources[t] = append(d.Resources[t], b)
					}
				}
			}
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}
