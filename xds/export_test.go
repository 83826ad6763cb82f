package xds

import (
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"google.golang.org/protobuf/proto"
)

// Validate checks m as Envoy would before it is served: PGV rules (ValidateAll) on m and on
// every message packed in an Any inside it, which PGV does not open, and the semantic checks
// Envoy makes that PGV cannot express. (The server validates through its validator; tests
// check single messages with this.)
func Validate(m proto.Message) error { return newValidator().validate(m) }

// The server's test hooks (testHooks). Set them before what they watch runs, or from inside
// a hook: the server reads them without a lock of their own.

// onRefreshRead runs f once Refresh knows which file it will publish (nil: nothing).
func (s *Server) onRefreshRead(f func()) { s.hooks.refreshRead = f }

// onUpdateQueued runs f when an Update or Refresh waits for a build in progress.
func (s *Server) onUpdateQueued(f func()) { s.hooks.updateQueued = f }

// onDumping runs f while /config serialises resources.
func (s *Server) onDumping(f func()) { s.hooks.dumping = f }

// mutateResources has f edit every Envoy and gRPC translation before validation (nil:
// none), to serve resources a client rejects.
func (s *Server) mutateResources(f func(*Resources)) { s.hooks.mutate = f }

// mutateFleetViews has f edit every XDP and Caddy view after validation (nil: none), to
// serve views a node rejects.
func (s *Server) mutateFleetViews(f func(clusters, endpoints []types.Resource)) {
	s.hooks.mutateXDP = f
}
