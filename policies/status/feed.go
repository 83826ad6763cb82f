package status

import (
	"fmt"
	"time"
)

// Feed is how a node fed by a control plane stands with it: an XDP node with --xds, each
// stickylb_xds subscription of a Caddy node.
type Feed struct {
	// Server is the control plane's address; Node the id this node subscribes with.
	Server string `json:"server"`
	Node   string `json:"node_id"`
	// Connected: a stream to the control plane is up.
	Connected bool `json:"connected"`
	// LastUpdate is when an update was last accepted, nil before the first.
	LastUpdate *time.Time `json:"last_update,omitempty"`
	// Waiting are the services whose cluster came without its endpoints: the node serves
	// their last good state (Kept), or nothing of a service that never had one. The
	// control plane sees these updates ACKed: nothing was rejected.
	Waiting []FeedWaiting `json:"waiting,omitempty"`
	// Refused are the backends of the view the node leaves out (loopback, link-local, its
	// own addresses), and why.
	Refused []FeedRefused `json:"refused,omitempty"`
}

// FeedWaiting is a service waiting for its endpoints since Since.
type FeedWaiting struct {
	Service string    `json:"service"`
	Since   time.Time `json:"since"`
	Kept    bool      `json:"kept"`
}

// FeedRefused is a backend a node leaves out of its view.
type FeedRefused struct {
	Service string `json:"service"`
	Address string `json:"address"`
	Reason  string `json:"reason"`
}

// AddFeed lists f in the snapshot, and says on the page what waits and what is refused.
func (s *Snapshot) AddFeed(f Feed) {
	s.Feeds = append(s.Feeds, f)
	for _, w := range f.Waiting {
		serving := "serving its last good state"
		if !w.Kept {
			serving = "not served: it never had endpoints here"
		}
		s.Notes = append(s.Notes, fmt.Sprintf("Service %s: its cluster came from %s without its endpoints; waiting since %s, %s.",
			w.Service, f.Server, w.Since.UTC().Format(time.RFC3339), serving))
	}
	for _, r := range f.Refused {
		s.Notes = append(s.Notes, fmt.Sprintf("Service %s: backend %s from %s left out: %s.", r.Service, r.Address, f.Server, r.Reason))
	}
}
