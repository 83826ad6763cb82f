package fleetview

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/stickylb/stickylb/policies/pools"
)

// Assembler joins the two halves of the view as an ADS client delivers them (clusters and
// load assignments come in separate responses) and applies each view. Its Clusters and
// Endpoints methods are the handlers of the two subscriptions: a half that does not decode,
// or a view Apply refuses, is returned as the error to NACK with, and the half last
// accepted stays.
//
// A cluster whose endpoints have not come does not hold the rest back: the view applied
// holds every service whose endpoints arrived, and for a waiting one its last good state
// (the one last applied), or nothing when it never had one. Nothing was rejected, so the
// update is ACKed; Waiting lists the services that wait and since when, for the node's
// status. Until the first load assignments arrive nothing is applied (a node restarted
// with adopted state keeps it).
type Assembler struct {
	// Apply installs a view; an error rejects it (the node keeps what it had).
	Apply func(*View) error
	// Decode reads a view; nil means Decode (the XDP view), DecodeCaddy for Caddy.
	Decode func(clusters, assignments map[string]proto.Message) (*View, error)
	// Waited, when set, is called once for each service that starts waiting for its
	// endpoints (after the view that says so is applied), to log it.
	Waited func(Waiting)

	mu                  sync.Mutex
	clusters, endpoints map[string]proto.Message
	last                *View                // the view last applied
	waiting             map[string]time.Time // service -> since when it waits
}

// Clusters is the handler of the Cluster subscription.
func (a *Assembler) Clusters(_ string, res map[string]proto.Message) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if res == nil {
		res = map[string]proto.Message{} // received, and empty
	}
	if err := a.try(res, a.endpoints); err != nil {
		return err
	}
	a.clusters = res
	return nil
}

// Endpoints is the handler of the ClusterLoadAssignment subscription.
func (a *Assembler) Endpoints(_ string, res map[string]proto.Message) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if res == nil {
		res = map[string]proto.Message{}
	}
	if a.clusters != nil {
		// Without clusters, endpoints alone say nothing (decoding them would be an empty
		// view, which would remove every VIP a restarted node adopted).
		if err := a.try(a.clusters, res); err != nil {
			return err
		}
	}
	a.endpoints = res
	return nil
}

// Waiting lists the services waiting for their endpoints, by name.
func (a *Assembler) Waiting() []Waiting {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Waiting, 0, len(a.waiting))
	for _, name := range sortedNames(a.waiting) {
		kept := a.last != nil && a.last.File.Service(name) != nil
		out = append(out, Waiting{Service: name, Since: a.waiting[name], Kept: kept})
	}
	return out
}

func (a *Assembler) try(cs, es map[string]proto.Message) error {
	decode := a.Decode
	if decode == nil {
		decode = Decode
	}
	v, err := decode(cs, es)
	if err != nil && !errors.Is(err, ErrIncomplete) {
		return err
	}
	if es == nil {
		return nil // clusters checked; no endpoints yet, nothing to apply
	}
	waiting := map[string]time.Time{}
	var started []Waiting
	for i, w := range v.Waiting {
		w.Kept = a.keep(v, w.Service)
		w.Since = a.waiting[w.Service]
		if w.Since.IsZero() {
			w.Since = time.Now()
			started = append(started, w)
		}
		v.Waiting[i] = w
		waiting[w.Service] = w.Since
	}
	// A node that never applied a view may hold adopted state (pinned maps): a view with
	// nothing complete in it would only remove that.
	if a.last != nil || len(v.File.Services) > 0 || len(v.Waiting) == 0 {
		if err := a.Apply(v); err != nil {
			return err
		}
		a.last = v
	}
	a.waiting = waiting
	if a.Waited != nil {
		for _, w := range started {
			a.Waited(w)
		}
	}
	return nil
}

// keep puts the last good state of the waiting service name into v, with its verdicts;
// it reports whether there was one.
func (a *Assembler) keep(v *View, name string) bool {
	if a.last == nil {
		return false
	}
	s := a.last.File.Service(name)
	if s == nil {
		return false
	}
	i, _ := slices.BinarySearchFunc(v.File.Services, name, func(s *pools.Service, name string) int { return strings.Compare(s.Name, name) })
	v.File.Services = slices.Insert(v.File.Services, i, s)
	for k, vd := range a.last.Verdicts {
		if strings.HasPrefix(k, Key(name, "")) {
			v.Verdicts[k] = vd
		}
	}
	return true
}

func sortedNames(m map[string]time.Time) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
