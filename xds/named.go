package xds

import (
	"context"
	"slices"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"go.uber.org/zap"
)

// namedAsks is what a stream of the named cache last asked for by name, per type URL (a type
// absent, or asked with no name, is asked in full). go-control-plane sizes each response by
// the snapshot's resources of the type, not by the names asked (a name-filtered response
// allocates a slice and a map for every one of them, and its server keeps each stream's last
// response): a node that asks for one service of a thousand would hold the server to about
// 70 KB a type. The stream is therefore set a snapshot of only what it asked for.
type namedAsks map[string][]string

// note records names as what the stream asks for of typeURL; it reports whether that changed.
func (n namedAsks) note(typeURL string, names []string) bool {
	if len(names) == 0 {
		if _, ok := n[typeURL]; !ok {
			return false
		}
		delete(n, typeURL)
		return true
	}
	sorted := slices.Sorted(slices.Values(names))
	if slices.Equal(n[typeURL], sorted) {
		return false
	}
	n[typeURL] = sorted
	return true
}

// of returns snap cut down to what the stream asks for: the named types' resources of those
// names (with snap's versions), the other types as snap holds them (shared). snap itself when
// the stream names nothing.
func (n namedAsks) of(snap *cachev3.Snapshot) *cachev3.Snapshot {
	if len(n) == 0 || snap == nil {
		return snap
	}
	out := &cachev3.Snapshot{Resources: snap.Resources}
	for typeURL, names := range n {
		i := cachev3.GetResponseType(typeURL)
		if i == types.UnknownType {
			continue
		}
		full := snap.Resources[i]
		items := make(map[string]types.ResourceWithTTL, len(names))
		for _, name := range names {
			if r, ok := full.Items[name]; ok {
				items[name] = r
			}
		}
		out.Resources[i] = cachev3.Resources{Version: full.Version, Items: items}
	}
	return out
}

// setLocked sets snap for the stream in its cache: for a stream of the named cache, cut down
// to what it asks for by name. The server's mu is held.
func (s *Server) setLocked(st *stream, snap *cachev3.Snapshot) error {
	c := s.cacheOf(st)
	if c == s.namedCache {
		snap = st.names.of(snap)
	}
	return c.SetSnapshot(context.Background(), st.key, snap)
}

// askNames records the names a request of stream id asks for of typeURL, before the request
// is handled (the first request is admitted with them); a stream already served that asks
// for other names is set its current snapshot again, before the cache sees the request.
func (s *Server) askNames(id int64, typeURL string, names []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[id]
	if st == nil || !st.names.note(typeURL, names) || !st.admitted || s.cacheOf(st) != s.namedCache ||
		st.acks.current == nil || s.holding.Load() {
		return
	}
	if err := s.setLocked(st, st.acks.current); err != nil {
		s.log.Error("setting a snapshot", zap.String("node", st.node.ID), zap.Error(err))
	}
}
