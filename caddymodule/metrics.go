package caddymodule

import (
	"errors"
	"math"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/internal/buildinfo"
)

// collector exports stickylb's state as Prometheus metrics at scrape time, reading the
// counters the request path keeps anyway: no metric work happens per request.
type collector struct{}

var (
	descSessions = prometheus.NewDesc("stickylb_sessions",
		"Live mappings held by a session table.", []string{"table"}, nil)
	descCapacity = prometheus.NewDesc("stickylb_sessions_capacity",
		"Maximum mappings a session table holds (max_sessions).", []string{"table"}, nil)
	descProtected = prometheus.NewDesc("stickylb_sessions_protected",
		"Mappings of a session table in its protected segment (seen again since they were stored).", []string{"table"}, nil)
	descTableEvents = prometheus.NewDesc("stickylb_table_events_total",
		"Session table events: hit, miss, insert, expired, evicted, invalidated.", []string{"table", "event"}, nil)
	descHits = prometheus.NewDesc("stickylb_hits_total",
		"Requests sent to the upstream their session was pinned to.", []string{"scope"}, nil)
	descMisses = prometheus.NewDesc("stickylb_misses_total",
		"Requests that started a new session (no cookie, key or mapping).", []string{"scope"}, nil)
	descRepins = prometheus.NewDesc("stickylb_repins_total",
		"Sessions moved to a new upstream, by reason.", []string{"scope", "reason"}, nil)
	descRejections = prometheus.NewDesc("stickylb_cookie_rejections_total",
		"Cookies or prefixes that did not open, by reason.", []string{"scope", "reason"}, nil)
	descNewCapped = prometheus.NewDesc("stickylb_new_sessions_capped_total",
		"New sessions not learned because their client started max_new_per_client in the minute (app_cookie learn).", []string{"scope"}, nil)
	descSlowStart = prometheus.NewDesc("stickylb_slow_start_weight_ratio",
		"Share of its configured weight an upstream gets under slow start (1 = fully ramped).", []string{"upstream"}, nil)
	descDrained = prometheus.NewDesc("stickylb_upstream_drained",
		"1 for upstreams drained through the admin API.", []string{"upstream"}, nil)
)

// Describe implements prometheus.Collector.
func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSessions, descCapacity, descProtected, descTableEvents, descHits, descMisses,
		descRepins, descRejections, descNewCapped, descSlowStart, descDrained} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (collector) Collect(ch chan<- prometheus.Metric) {
	eachTable(func(name string, t *sharedTable) {
		st := t.Stats()
		ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(st.Entries), name)
		ch <- prometheus.MustNewConstMetric(descCapacity, prometheus.GaugeValue, float64(st.Capacity), name)
		ch <- prometheus.MustNewConstMetric(descProtected, prometheus.GaugeValue, float64(st.Protected), name)
		for ev, v := range map[string]uint64{"hit": st.Hits, "miss": st.Misses, "insert": st.Inserts,
			"expired": st.Expired, "evicted": st.Evicted, "invalidated": st.Invalidated} {
			ch <- prometheus.MustNewConstMetric(descTableEvents, prometheus.CounterValue, float64(v), name, ev)
		}
	})
	eachScope(func(name string, s *scopeStats) {
		ch <- prometheus.MustNewConstMetric(descHits, prometheus.CounterValue, float64(s.hits.Load()), name)
		ch <- prometheus.MustNewConstMetric(descMisses, prometheus.CounterValue, float64(s.misses.Load()), name)
		ch <- prometheus.MustNewConstMetric(descNewCapped, prometheus.CounterValue, float64(s.capped.Load()), name)
		for reason, v := range s.repins.snapshot(repinReasons) {
			ch <- prometheus.MustNewConstMetric(descRepins, prometheus.CounterValue, float64(v), name, reason)
		}
		for reason, v := range s.rejections.snapshot(rejectReasons) {
			ch <- prometheus.MustNewConstMetric(descRejections, prometheus.CounterValue, float64(v), name, reason)
		}
	})
	factors := map[string]float64{}
	clockPool.Range(func(_, v any) bool {
		if cs, ok := v.(*clockStore); ok {
			for id, f := range cs.factors() {
				if old, seen := factors[id]; !seen || f < old {
					factors[id] = f
				}
			}
		}
		return true
	})
	for id, f := range factors {
		ch <- prometheus.MustNewConstMetric(descSlowStart, prometheus.GaugeValue, f, id)
	}
	for id := range drains.list() {
		ch <- prometheus.MustNewConstMetric(descDrained, prometheus.GaugeValue, 1, id)
	}
}

// theCollector is registered in every config's metrics registry (Caddy gives each config
// context its own); registering it twice in one registry is expected and ignored.
var theCollector collector

// buildCollector is stickylb_build_info: the stickylb module this Caddy was built with.
var buildCollector = buildinfo.Collector()

func registerMetrics(ctx caddy.Context) {
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return
	}
	for _, c := range []prometheus.Collector{theCollector, buildCollector} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				ctx.Logger().Error("registering stickylb metrics", zap.Error(err))
			}
		}
	}
}

func floatBits(f float64) uint64     { return math.Float64bits(f) }
func floatFromBits(b uint64) float64 { return math.Float64frombits(b) }
