package replica

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/status"
)

// Status is the replica as its status page shows it.
func (r *Replica) Status() *status.Replica {
	out := &status.Replica{ID: r.cfg.ID, Leader: r.leading.Load(), Revision: r.served.Load().Revision, Store: "connected"}
	if ms := r.members.Load(); ms != nil {
		for i, m := range *ms {
			if i == 0 {
				out.LeaderID = m.ID
			}
			out.Replicas = append(out.Replicas, m.ID)
		}
	}
	open, reason := r.gate.State()
	switch {
	case !r.connected.Load():
		out.Store = "lost"
	case r.empty():
		out.Store = "empty"
	}
	if !open {
		out.Note = "refusing xDS streams: " + reason
	}
	r.mu.Lock()
	if r.badRev != 0 {
		served := "nothing"
		if r.fileRev != 0 {
			served = fmt.Sprintf("the file of revision %d", r.fileRev)
		}
		out.Problem = fmt.Sprintf("the stored pools file (revision %d) does not parse here: %s; serving %s", r.badRev, r.badErr, served)
	}
	r.mu.Unlock()
	return out
}

// probes is the status page's last check of a backend: the leader's own checker, or on
// another replica the stored verdict's (its deciding probe, at its since-time).
func (r *Replica) probes(service, id string) (health.TargetStatus, bool) {
	if m := r.mon.Load(); m != nil {
		return m.Lookup(service, id)
	}
	v, ok := r.served.Load().Verdict(service, id)
	if !ok {
		return health.TargetStatus{}, false
	}
	return health.TargetStatus{ID: id, State: v.State, Since: v.Since, Reason: v.Reason, LastProbe: v.Since, LastResult: v.Reason}, true
}

// ready is the admin address's /healthz (a readiness probe): the replica has the store,
// having read the state since it last lost it. An empty store, or a stored file that does
// not parse here, leaves it ready: every replica is alike then, and taking them all out of
// a Service would only hold a first install's rollout until the file is applied.
func (r *Replica) ready() (bool, string) {
	if r.connected.Load() {
		return true, ""
	}
	if open, why := r.gate.State(); !open {
		return false, why
	}
	return false, "lost the store"
}

func (r *Replica) empty() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.latest == nil || r.latest.Doc == nil
}

// Collector exports stickylb_xds_store_connected (0/1), stickylb_xds_leader (1 on the
// leading replica) and stickylb_xds_store_revision (the revision served, which is the
// version nodes are sent).
func (r *Replica) Collector() prometheus.Collector {
	return replicaCollector{r: r,
		connected: prometheus.NewDesc("stickylb_xds_store_connected", "1 while this replica has the store (etcd) and serves from it.", nil, nil),
		leader:    prometheus.NewDesc("stickylb_xds_leader", "1 while this replica leads: it probes the backends and writes the verdicts.", nil, nil),
		revision:  prometheus.NewDesc("stickylb_xds_store_revision", "The store revision this replica serves (the version of its snapshots).", nil, nil),
		serving:   prometheus.NewDesc("stickylb_xds_serving", "1 while this replica admits xDS streams.", nil, nil),
	}
}

type replicaCollector struct {
	r                                    *Replica
	connected, leader, revision, serving *prometheus.Desc
}

func (c replicaCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.connected
	ch <- c.leader
	ch <- c.revision
	ch <- c.serving
}

func (c replicaCollector) Collect(ch chan<- prometheus.Metric) {
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	open, _ := c.r.gate.State()
	ch <- prometheus.MustNewConstMetric(c.connected, prometheus.GaugeValue, b(c.r.connected.Load()))
	ch <- prometheus.MustNewConstMetric(c.leader, prometheus.GaugeValue, b(c.r.leading.Load()))
	ch <- prometheus.MustNewConstMetric(c.revision, prometheus.GaugeValue, float64(c.r.served.Load().Revision))
	ch <- prometheus.MustNewConstMetric(c.serving, prometheus.GaugeValue, b(open))
}
