package caddymodule

import (
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/stickylb/stickylb/adsclient"
	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/policies/status"
)

// A control plane may send a new version every few milliseconds. A Caddy node applies each
// (the policies must route on the current view) but writes its view file at most once per
// xdsSaveEvery, the latest view, and logs its applies at most once per
// adsclient.ApplyLogEvery, so a flood costs no disk and no log to speak of.

// xdsSaveEvery is how often a subscription writes its view file, at most.
const xdsSaveEvery = time.Second

// xdsPacing is what a subscription paces: its view-file writes and its "applied" lines.
type xdsPacing struct {
	saves   adsclient.Paced[*xdsView]
	applied adsclient.Sampled
}

// paced returns s's pacing, set up on first use (a subscription built by a test has none
// until then).
func (s *xdsSub) paced() *xdsPacing {
	s.pacedOnce.Do(func() {
		s.pacing.saves = adsclient.Paced[*xdsView]{Every: xdsSaveEvery, Fn: func(v *xdsView, _ int) { s.write(v) }}
		s.pacing.applied = adsclient.Sampled{Log: s.log, Every: adsclient.ApplyLogEvery}
	})
	return &s.pacing
}

// waited logs a service whose cluster came without its endpoints (once, when it starts
// waiting).
func (s *xdsSub) waited(w fleetview.Waiting) {
	s.log.Warn("a service's cluster came without its endpoints: waiting for them", zap.String("service", w.Service),
		zap.Bool("serving_last_good_state", w.Kept))
}

// xdsFeeds is how each live subscription stands with its control plane, by server and
// node, for status.json: connected, last update, the services waiting for their endpoints
// and the backends its sources leave out.
func xdsFeeds() []status.Feed {
	var out []status.Feed
	subPool.Range(func(_, v any) bool {
		if s, ok := v.(*xdsSub); ok {
			out = append(out, s.feed())
		}
		return true
	})
	slices.SortFunc(out, func(a, b status.Feed) int { return strings.Compare(a.Server+"\x00"+a.Node, b.Server+"\x00"+b.Node) })
	return out
}

// feed is the subscription's status.Feed.
func (s *xdsSub) feed() status.Feed {
	var conn fleetview.Conn
	if s.client != nil {
		conn = s.client
	}
	return fleetview.Feed(s.server, s.node, conn, s.asm, &s.refusals)
}
