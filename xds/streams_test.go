package xds

import (
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"slices"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// Views of the server's stream state for tests.

// streamsOf returns how many admitted streams node id holds.
func (s *Server) streamsOf(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.nodes[id]; e != nil {
		return e.streams
	}
	return 0
}

// nodeStreamsLocked returns node id's admitted streams, oldest first; mu is held.
func (s *Server) nodeStreamsLocked(id string) []*stream {
	var out []*stream
	for _, st := range s.streams {
		if st.admitted && st.node.ID == id {
			out = append(out, st)
		}
	}
	slices.SortFunc(out, func(a, b *stream) int { return int(a.id - b.id) })
	return out
}

// cacheKeys returns the cache keys of node id's streams, oldest first.
func (s *Server) cacheKeys(id string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, st := range s.nodeStreamsLocked(id) {
		out = append(out, st.key)
	}
	return out
}

// ackedVersion is the cluster version node id's oldest stream last acknowledged on every
// type it asked for.
func (s *Server) ackedVersion(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sts := s.nodeStreamsLocked(id); len(sts) > 0 && sts[0].acks.acked != nil {
		return sts[0].acks.acked.GetVersion(resource.ClusterType)
	}
	return ""
}

// cachedSnapshot is the snapshot the stream with cache key key is served, from whichever
// cache serves it.
func (s *Server) cachedSnapshot(key string) (cachev3.ResourceSnapshot, error) {
	if snap, err := s.orderedCache.GetSnapshot(key); err == nil {
		return snap, nil
	}
	return s.namedCache.GetSnapshot(key)
}
