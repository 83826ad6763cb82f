package api

import (
	"net/http"
	"slices"
	"time"

	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds/store"
)

// backendView is one backend as GET /v1/services/{service} shows it.
type backendView struct {
	ID       string `json:"id"`
	Address  string `json:"address"`
	Weight   uint32 `json:"weight"`
	Zone     string `json:"zone,omitempty"`
	HashKey  string `json:"hash_key,omitempty"`
	Drain    bool   `json:"drain"`
	Draining bool   `json:"draining"` // drain: true, or its zone drained
	Health   struct {
		State  string     `json:"state"`
		Since  *time.Time `json:"since,omitempty"`
		From   string     `json:"from,omitempty"`
		Reason string     `json:"reason,omitempty"`
	} `json:"health"`
}

// serviceView is one service with its backends, drains, weights and verdicts.
type serviceView struct {
	Name         string        `json:"name"`
	Protocol     string        `json:"protocol"`
	Listen       string        `json:"listen,omitempty"`
	VIP          string        `json:"vip,omitempty"`
	Balance      string        `json:"balance"`
	Affinity     string        `json:"affinity"`
	CrossZone    bool          `json:"cross_zone"`
	DrainedZones []string      `json:"drained_zones,omitempty"`
	HealthCheck  bool          `json:"health_checked"`
	Backends     []backendView `json:"backends"`
}

// state reads the store: the parsed file and the verdicts, at one revision.
func (s *Server) state(w http.ResponseWriter, r *http.Request) (*pools.File, *store.State, bool) {
	ctx, cancel := s.ctx(r)
	defer cancel()
	st, _, err := store.Load(ctx, s.cli, s.keys)
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: err.Error()})
		return nil, nil, false
	}
	if st.Doc == nil {
		writeJSON(w, http.StatusNotFound, apiError{Error: "the store holds no pools file yet"})
		return nil, nil, false
	}
	f, err := pools.Parse("pools.yaml", st.Doc.YAML)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, apiError{Error: "the stored pools file does not parse: " + err.Error()})
		return nil, nil, false
	}
	return f, st, true
}

func viewOf(svc *pools.Service, st *store.State) serviceView {
	out := serviceView{Name: svc.Name, Protocol: svc.Protocol, Listen: svc.Listen, VIP: svc.VIP, Balance: svc.Balance,
		Affinity: svc.Affinity.Mode, CrossZone: svc.CrossZone, DrainedZones: slices.Clone(svc.DrainedZones),
		HealthCheck: svc.HealthCheck != nil, Backends: []backendView{}}
	for _, b := range svc.Backends {
		bv := backendView{ID: b.Identity(), Address: b.Address, Weight: b.Weight, Zone: b.Zone, HashKey: b.HashKey,
			Drain: b.Drain, Draining: b.Drain || svc.ZoneDrained(b.Zone)}
		bv.Health.State = "unknown"
		if v, ok := st.Verdict(svc.Name, b.Identity()); ok {
			bv.Health.State, bv.Health.Reason = v.State.String(), v.Reason
			bv.Health.From = v.From.String()
			since := v.Since
			bv.Health.Since = &since
		}
		out.Backends = append(out.Backends, bv)
	}
	return out
}

func (s *Server) listServices(w http.ResponseWriter, r *http.Request) {
	f, st, ok := s.state(w, r)
	if !ok {
		return
	}
	out := make([]serviceView, 0, len(f.Services))
	for _, svc := range f.Services {
		out = append(out, viewOf(svc, st))
	}
	w.Header().Set("ETag", etag(st.Doc.Revision))
	writeJSON(w, http.StatusOK, map[string]any{"revision": st.Doc.Revision, "state_revision": st.Revision, "services": out})
}

func (s *Server) getService(w http.ResponseWriter, r *http.Request) {
	f, st, ok := s.state(w, r)
	if !ok {
		return
	}
	svc := f.Service(r.PathValue("service"))
	if svc == nil {
		writeJSON(w, http.StatusNotFound, apiError{Error: "no service " + r.PathValue("service") + " in the pools file"})
		return
	}
	w.Header().Set("ETag", etag(st.Doc.Revision))
	writeJSON(w, http.StatusOK, map[string]any{"revision": st.Doc.Revision, "state_revision": st.Revision, "service": viewOf(svc, st)})
}
