package fleetview

import (
	"time"

	"github.com/stickylb/stickylb/policies/status"
)

// Conn is what a node knows of its stream to the control plane (an adsclient.Client).
type Conn interface {
	Connected() bool
	LastUpdate() time.Time
}

// Feed is how a node fed by server as node stands with it, for its status.json: whether
// conn is up and when it last took an update, the services a waits for (their endpoints
// have not come) and the backends rs records as left out. conn, a and rs may be nil.
func Feed(server, node string, conn Conn, a *Assembler, rs *Refusals) status.Feed {
	f := status.Feed{Server: server, Node: node}
	if conn != nil {
		f.Connected = conn.Connected()
		if t := conn.LastUpdate(); !t.IsZero() {
			f.LastUpdate = &t
		}
	}
	if a != nil {
		for _, w := range a.Waiting() {
			f.Waiting = append(f.Waiting, status.FeedWaiting{Service: w.Service, Since: w.Since, Kept: w.Kept})
		}
	}
	if rs != nil {
		for _, r := range rs.List() {
			f.Refused = append(f.Refused, status.FeedRefused{Service: r.Service, Address: r.Address, Reason: r.Reason})
		}
	}
	return f
}
