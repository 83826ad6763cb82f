package xds

import (
	"slices"

	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// maxPending bounds the snapshots a stream remembers while it has not ACKed them: a node
// ACKs within a few pushes, and one that lags further only loses its rollback target until
// it ACKs a whole version again.
const maxPending = 4

// acks is one stream's ACK/NACK bookkeeping: the snapshots set for it, what it acknowledged,
// and what a NACK rolls it back to. It holds no lock and touches no cache: the server, under
// its mu, logs, counts and sets what acks decides.
type acks struct {
	types   map[string]bool   // the type URLs the stream asked for
	current *cachev3.Snapshot // last snapshot set for the stream
	acked   *cachev3.Snapshot // last snapshot the stream acknowledged on every type it asked for
	// pending are the snapshots set since acked, oldest first (at most maxPending): a node
	// may ACK the last types of one version after the next was set, and that version must
	// still become the one a NACK rolls back to.
	pending []*cachev3.Snapshot
	ackedBy map[string]string // type URL -> version last ACKed
	// rejected is the version the stream NACKed: it is not set again for this stream (the
	// cache alone would re-send it forever: a NACK carries the old version), and the NACKs of
	// one push are counted, and rolled back, once.
	rejected string
}

func newAcks() acks { return acks{types: map[string]bool{}, ackedBy: map[string]string{}} }

// asked records that the stream asked for typeURL: an ACK of a whole version needs every
// type asked for.
func (a *acks) asked(typeURL string) { a.types[typeURL] = true }

// set records snap as set for the stream; false, and nothing recorded, when the stream
// rejected that version.
func (a *acks) set(snap *cachev3.Snapshot) bool {
	if a.rejected == snap.GetVersion(resource.ClusterType) {
		return false
	}
	a.current = snap
	if a.pending = append(a.pending, snap); len(a.pending) > maxPending {
		a.pending = slices.Delete(a.pending, 0, len(a.pending)-maxPending)
	}
	return true
}

// ack records an ACK of typeURL at version; the newest snapshot set for the stream that the
// node has now ACKed on every type it asked for becomes the one a NACK rolls back to.
func (a *acks) ack(typeURL, version string) {
	a.ackedBy[typeURL] = version
	for i := len(a.pending) - 1; i >= 0; i-- {
		snap := a.pending[i]
		if version != snap.GetVersion(typeURL) || !a.ackedAll(snap) {
			continue
		}
		a.acked = snap
		a.pending = slices.Delete(a.pending, 0, i+1)
		return
	}
}

// ackSent records an ACK of typeURL at the version last set (a delta ACK carries no
// version: it acknowledges what the stream was sent).
func (a *acks) ackSent(typeURL string) {
	if a.current != nil {
		a.ack(typeURL, a.current.GetVersion(typeURL))
	}
}

// ackedAll reports whether the stream's last ACK of every type it asked for is snap's.
func (a *acks) ackedAll(snap *cachev3.Snapshot) bool {
	for t := range a.types {
		if a.ackedBy[t] != snap.GetVersion(t) {
			return false
		}
	}
	return true
}

// nack records a NACK of typeURL. fresh is false when there is nothing to reject (nothing
// set yet) or this push's rejection was already recorded; else version is the version
// rejected and rollback the snapshot to set again, now current (nil when the stream never
// ACKed a whole version: it keeps what it has).
//
// A stream rolled back stands on a snapshot it ACKed on every type, so a NACK that comes
// then is another type's NACK of the push already rejected (a node NACKs each type it was
// sent), not a rejection of what it ACKed.
func (a *acks) nack(typeURL string) (version string, fresh bool, rollback *cachev3.Snapshot) {
	if a.current == nil {
		return "", false, nil
	}
	version = a.current.GetVersion(typeURL)
	if a.rejected == version || a.rejected != "" && a.current == a.acked {
		return version, false, nil
	}
	a.rejected = version
	if a.acked != nil {
		a.current, a.pending = a.acked, nil
	}
	return version, true, a.acked
}
