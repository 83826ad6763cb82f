package adsclient

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// collector exports a client's state; every series carries the server and node labels, so
// a process with several clients registers one collector each.
type collector struct {
	c                                  *Client
	connected, lastUpdate, age, reconn *prometheus.Desc
	updates, server                    *prometheus.Desc
}

// Collector returns a Prometheus collector of the client's state, for the adapter to
// register: stickylb_xds_connected (0/1), stickylb_xds_last_update_timestamp_seconds and
// stickylb_xds_last_update_age_seconds (absent before the first update),
// stickylb_xds_stream_ends_total, and stickylb_xds_updates_total{type,result} with result
// applied, unchanged (equal to what was applied: ACKed, the handler not called) or rejected
// (NACKed).
func (c *Client) Collector() prometheus.Collector {
	labels := prometheus.Labels{"server": c.cfg.Server, "node": c.cfg.NodeID}
	return &collector{
		c: c,
		connected: prometheus.NewDesc("stickylb_xds_connected",
			"1 while the ADS stream to the control plane is up.", nil, labels),
		lastUpdate: prometheus.NewDesc("stickylb_xds_last_update_timestamp_seconds",
			"When an update from the control plane was last accepted.", nil, labels),
		age: prometheus.NewDesc("stickylb_xds_last_update_age_seconds",
			"Seconds since an update from the control plane was last accepted.", nil, labels),
		reconn: prometheus.NewDesc("stickylb_xds_stream_ends_total",
			"ADS streams (or connection attempts) that ended; each is followed by a reconnect.", nil, labels),
		updates: prometheus.NewDesc("stickylb_xds_updates_total",
			"Responses from the control plane, by type URL and result.", []string{"type", "result"}, labels),
		server: prometheus.NewDesc("stickylb_xds_current_server",
			"1 for the control-plane address (of the list) the current or last stream went to.", []string{"address"}, labels),
	}
}

// Describe implements prometheus.Collector.
func (m *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.connected, m.lastUpdate, m.age, m.reconn, m.updates, m.server} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *collector) Collect(ch chan<- prometheus.Metric) {
	c := m.c
	c.mu.Lock()
	connected, last, ends, server := c.connected, c.lastUpdate, c.streamEnds, c.server
	counts := make(map[updateKey]uint64, len(c.counts))
	for k, v := range c.counts {
		counts[k] = v
	}
	c.mu.Unlock()
	up := 0.0
	if connected {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(m.connected, prometheus.GaugeValue, up)
	if !last.IsZero() {
		ch <- prometheus.MustNewConstMetric(m.lastUpdate, prometheus.GaugeValue, float64(last.UnixNano())/1e9)
		ch <- prometheus.MustNewConstMetric(m.age, prometheus.GaugeValue, time.Since(last).Seconds())
	}
	ch <- prometheus.MustNewConstMetric(m.reconn, prometheus.CounterValue, float64(ends))
	if server != "" {
		ch <- prometheus.MustNewConstMetric(m.server, prometheus.GaugeValue, 1, server)
	}
	for k, v := range counts {
		ch <- prometheus.MustNewConstMetric(m.updates, prometheus.CounterValue, float64(v), k.typeURL, k.result)
	}
}
