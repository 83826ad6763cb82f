package xds

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// DefaultMaxNodes is how many distinct node ids may hold streams at once unless
// WithMaxNodes says otherwise.
const DefaultMaxNodes = 10_000

// Stats are the server's counters (exported as Prometheus metrics by the admin endpoint).
type Stats struct {
	// ReloadErrors counts rejected edits of the pools file: Watch counts each once, invalid
	// or untranslatable; Update only returns the error.
	Pushes, NACKs, Reloads, ReloadErrors, Rollbacks, HealthTransitions atomic.Uint64
	// Builds counts snapshot translations: one per view zone and version, shared by the
	// zone's streams.
	Builds atomic.Uint64
	// UnknownZone counts streams admitted with a zone the pools file does not name, of
	// every node group: they get the cross-zone view (XDP and Caddy nodes, whose zone has
	// no backend, spread over every zone).
	UnknownZone atomic.Uint64
	// Refused counts streams refused, by reason (limits.go).
	Refused Refusals
	// FirstRequestTimeouts counts streams ended for sending no request within
	// WithFirstRequestTimeout; UnknownTypes requests for type URLs the server does not serve
	// (dropped), and UnknownTypeEnds the streams ended for asking for maxUnknownTypes of them.
	FirstRequestTimeouts, UnknownTypes, UnknownTypeEnds atomic.Uint64
	// Panics counts services entering panic (every non-draining backend down: fail open).
	Panics atomic.Uint64
}

// stream is what the server keeps per xDS stream. Each stream is its own key in the
// snapshot cache, so what one stream ACKs or NACKs moves only that stream.
type stream struct {
	id       int64
	key      string       // the stream's key in the snapshot cache
	identity peerIdentity // who is at the other end (certificate or address)
	opened   time.Time    // when the stream began (the status page's "connected")
	node     Node         // as the node sent it; zero until the first request
	view     string       // the view the stream is served: its zone if the file names it, else ""
	keyNode  *corev3.Node // what the cache sees as the stream's node (its Id is key)
	admitted bool         // the first request was accepted
	acks     acks         // what the stream was set, ACKed and rejected (acks.go)
	names    namedAsks    // what it asks for by name (named.go)
}

// nodeEntry counts a node id's live streams and holds the identity they share.
type nodeEntry struct {
	identity peerIdentity
	streams  int
}

// testHooks are what tests run inside the server: at points they interleave on, and edits
// of what it serves. All are nil in production; tests set them through export_test.go.
type testHooks struct {
	// refreshRead runs once Refresh knows which file it will publish.
	refreshRead func()
	// updateQueued runs when an Update waits for a build in progress to finish.
	updateQueued func()
	// dumping runs while /config serialises resources.
	dumping func()
	// mutate edits every translation before validation (resources a client rejects).
	mutate func(*Resources)
	// mutateXDP edits every XDP and Caddy view after validation (views a node rejects).
	mutateXDP func(clusters, endpoints []types.Resource)
}

// Option is a server setting.
type Option func(*Server)

// WithMaxNodes caps the node ids that may hold streams at once; a stream of a new id beyond
// the cap is refused with ResourceExhausted. n <= 0 means DefaultMaxNodes.
func WithMaxNodes(n int) Option {
	return func(s *Server) {
		if n > 0 {
			s.maxNodes = n
		}
	}
}

// WithNodeIdentity makes a node id speak only for the client certificate that covers it
// (see docs/xds.md): a stream without a verified certificate, or whose node id the
// certificate does not cover, is refused with PermissionDenied. Serve with mTLS
// (`--client-ca`) when it is set.
func WithNodeIdentity() Option {
	return func(s *Server) { s.requireIdentity = true }
}

// FirstVerdictSlack is added to the health checks' first-verdict bound
// (health.Config.FirstVerdictWithin) before a control plane starting cold publishes
// without every first verdict: a probe's timer and the transition's delivery run late on
// a loaded machine, and a target left unknown after it is published unknown (routable).
// The one-process control plane and a replica starting on an empty store hold as long.
const FirstVerdictSlack = 250 * time.Millisecond

// WithFirstVerdicts holds every snapshot until ready is closed (or the server's context
// ends): a control plane that starts publishes its health view only once its checkers'
// first probes have decided, so it never pushes the "unknown" of a checker that has not
// probed yet, which every tier routes to, for a backend the fleet had down. Streams
// admitted meanwhile are sent nothing: a node that had a config keeps it (Envoy, gRPC and
// stickylb's nodes all keep their last resources while a stream has no answer), and a node
// starting cold waits the hold, which is a probe's first delay plus its timeout. Sending
// the config without health instead would publish exactly that "unknown".
func WithFirstVerdicts(ready <-chan struct{}) Option {
	return func(s *Server) { s.firstVerdicts = ready }
}

// WithResumeWait has wait called with the version a stream's first request says its
// node holds (its ACKed version, from an earlier stream) before the stream is answered: a
// replica of the replicated control plane that is behind the node waits there until it
// has caught up, so the node is not sent an older version than it has.
func WithResumeWait(wait func(version string)) Option {
	return func(s *Server) { s.resumeWait = wait }
}

// Readiness says whether the control plane can serve nodes now, and why not: the
// admin address's /healthz answers 503 while it cannot (a readiness probe's signal).
type Readiness func() (ready bool, why string)

// WithReadiness has /healthz answer 503 with why while ready says the server cannot serve
// (a replica that has lost its store); /livez answers while the process runs either way.
func WithReadiness(ready Readiness) Option {
	return func(s *Server) { s.readiness = ready }
}

// Server serves one pools file to every node, per node locality.
//
// Locks: buildMu orders everything that builds snapshots (reloads, refreshes, the first
// view of a zone) and is held while building; mu guards the state below and is never held
// while building, so ACKs, NACKs and new streams of known zones never wait for a build.
type Server struct {
	log *zap.Logger
	// orderedCache serves Envoy nodes: go-control-plane's ADS-mode cache, which orders responses
	// (clusters before endpoints, listeners before routes) so an update never points at a
	// resource not yet sent. It answers a named request only when the names cover the whole
	// snapshot, which Envoy's wildcard-and-all requests always do. namedCache serves every other
	// node (grpc-go asks for its one listener and cluster by name; stickylb's XDP and Caddy
	// nodes subscribe wildcard): it answers with the resources named.
	orderedCache, namedCache cachev3.SnapshotCache
	xds                      serverv3.Server
	view                     HealthView
	maxNodes                 int
	// lim bounds streams and what each identity holds (limits.go).
	lim limits
	// requireIdentity: node ids must match the client certificate (WithNodeIdentity).
	requireIdentity bool
	Stats           Stats
	// edits records the pools file's edits for the status page (set by Watch).
	edits editLog

	// verdicts: when each backend's verdict last changed, published to XDP nodes.
	verdicts verdictTimes
	hooks    testHooks
	// firstVerdicts, when set, is closed when the checkers' first verdicts are in
	// (WithFirstVerdicts); holding is set until then, and no snapshot is served.
	firstVerdicts <-chan struct{}
	holding       atomic.Bool
	// replica, when set, reports the replicated control plane on the status page.
	replica ReplicaStatus
	// resumeWait, when set, runs before a stream's first request with a version is
	// answered (WithResumeWait).
	resumeWait func(version string)
	// readiness, when set, decides /healthz (WithReadiness).
	readiness Readiness

	buildMu sync.Mutex
	// refreshQueued is set while a Refresh waits for buildMu.
	refreshQueued atomic.Bool

	mu      sync.Mutex
	file    *pools.File
	named   map[string]bool // zones the file names
	version int
	// health is the health view the current version is built from, read once per version
	// so that every zone's view of a version, and the panic gauge, agree.
	health    HealthView
	panicking map[string]bool              // services in panic in the current version
	views     map[string]*cachev3.Snapshot // view zone -> snapshot of the current version
	viewers   map[string]int               // view zone -> admitted streams served it
	zones     map[string]int               // zone as nodes sent it -> admitted streams
	streams   map[int64]*stream
	nodes     map[string]*nodeEntry
	// peak counts of the maps above since they were last rebuilt: Go maps keep their
	// buckets after deletes, so a burst of streams would pin memory without this.
	peakStreams, peakNodes, peakZones int
}

// NewServer returns a server for f. view may be nil (no health checking).
func NewServer(ctx context.Context, f *pools.File, view HealthView, log *zap.Logger, opts ...Option) *Server {
	s := &Server{log: log, view: view, maxNodes: DefaultMaxNodes, lim: defaultLimits(), file: f, named: namedZones(f), version: 1,
		views: map[string]*cachev3.Snapshot{}, viewers: map[string]int{}, zones: map[string]int{},
		streams: map[int64]*stream{}, nodes: map[string]*nodeEntry{}}
	for _, o := range opts {
		o(s)
	}
	if s.firstVerdicts != nil {
		s.holding.Store(true)
		go s.release(ctx)
	}
	s.orderedCache = cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	s.namedCache = cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	caches := &cachev3.MuxCache{
		// Requests reach the cache with the node the stream was admitted with (request sets
		// it on every request), so the stream's first node decides.
		Classify:      func(r *cachev3.Request) string { return cacheKind(r.GetNode()) },
		ClassifyDelta: func(r *cachev3.DeltaRequest) string { return cacheKind(r.GetNode()) },
		Caches:        map[string]cachev3.Cache{cacheOrdered: s.orderedCache, cacheNamed: s.namedCache},
	}
	s.xds = serverv3.NewServer(ctx, caches, serverv3.CallbackFuncs{
		StreamOpenFunc:      func(ctx context.Context, id int64, _ string) error { return s.open(ctx, id) },
		DeltaStreamOpenFunc: func(ctx context.Context, id int64, _ string) error { return s.open(ctx, id) },
		StreamClosedFunc:    func(id int64, _ *corev3.Node) { s.closed(id) },
		DeltaStreamClosedFunc: func(id int64, _ *corev3.Node) {
			s.closed(id)
		},
		StreamRequestFunc: func(id int64, req *discoverygrpc.DiscoveryRequest) error {
			s.askNames(id, req.GetTypeUrl(), req.GetResourceNames())
			node, err := s.request(id, req.GetNode(), req.GetTypeUrl(), req.GetResponseNonce(), req.GetErrorDetail().GetMessage(),
				req.GetErrorDetail() != nil, req.GetVersionInfo())
			if err == nil {
				req.Node = node
			}
			return err
		},
		StreamDeltaRequestFunc: func(id int64, req *discoverygrpc.DeltaDiscoveryRequest) error {
			// A delta ACK carries no version: it acknowledges what the stream was sent.
			node, err := s.request(id, req.GetNode(), req.GetTypeUrl(), req.GetResponseNonce(), req.GetErrorDetail().GetMessage(),
				req.GetErrorDetail() != nil, deltaAckVersion)
			if err == nil {
				req.Node = node
			}
			return err
		},
		StreamResponseFunc: func(context.Context, int64, *discoverygrpc.DiscoveryRequest, *discoverygrpc.DiscoveryResponse) {
			s.Stats.Pushes.Add(1)
		},
		StreamDeltaResponseFunc: func(int64, *discoverygrpc.DeltaDiscoveryRequest, *discoverygrpc.DeltaDiscoveryResponse) {
			s.Stats.Pushes.Add(1)
		},
		FetchRequestFunc: func(context.Context, *discoverygrpc.DiscoveryRequest) error {
			// Snapshots are kept per stream; a unary fetch has none.
			return status.Error(codes.Unimplemented, "stickylb xds serves streams only (ADS or per-type xDS)")
		},
	})
	return s
}

// The two caches, by what a node needs (see Server.orderedCache).
const (
	cacheOrdered = "ordered"
	cacheNamed   = "named"
)

// cacheKind is the cache a node is served from: Envoy (user agent "envoy") the ordered one,
// every other node the one that answers by name.
func cacheKind(n *corev3.Node) string {
	if n.GetUserAgentName() == "envoy" {
		return cacheOrdered
	}
	return cacheNamed
}

// cacheOf is the cache of an admitted stream.
func (s *Server) cacheOf(st *stream) cachev3.SnapshotCache {
	if cacheKind(st.keyNode) == cacheOrdered {
		return s.orderedCache
	}
	return s.namedCache
}

// deltaAckVersion marks a delta request that ACKs whatever the stream was last sent.
const deltaAckVersion = "\x00delta"

// Register adds ADS and the per-type services to g, every stream behind the limits
// (guard.go, limits.go). Serve g with GRPCServerOptions.
func (s *Server) Register(g *grpc.Server) {
	gs := guarded{Server: s.xds, s: s}
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(g, gs)
	clusterservice.RegisterClusterDiscoveryServiceServer(g, gs)
	endpointservice.RegisterEndpointDiscoveryServiceServer(g, gs)
	listenerservice.RegisterListenerDiscoveryServiceServer(g, gs)
	routeservice.RegisterRouteDiscoveryServiceServer(g, gs)
}

var typeURLs = []string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType}

// namedZones are the zones f's backends are in: the only zones the server builds views for.
func namedZones(f *pools.File) map[string]bool {
	out := map[string]bool{}
	for _, s := range f.Services {
		for _, b := range s.Backends {
			if b.Zone != "" {
				out[b.Zone] = true
			}
		}
	}
	return out
}

func (s *Server) open(ctx context.Context, id int64) error {
	ident := identityOf(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.streams[id] = &stream{id: id, key: "stream/" + strconv.FormatInt(id, 10), identity: ident, opened: time.Now(),
		acks: newAcks(), names: namedAsks{}}
	s.peakStreams = max(s.peakStreams, len(s.streams))
	return nil
}

// closed frees everything the stream held: its cache entry, its node's entry when it was
// the node's last stream, and the view of its zone when nobody else is served it.
func (s *Server) closed(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[id]
	if st == nil {
		return
	}
	delete(s.streams, id)
	if st.admitted {
		s.cacheOf(st).ClearSnapshot(st.key)
		if e := s.nodes[st.node.ID]; e != nil {
			if e.streams--; e.streams == 0 {
				delete(s.nodes, st.node.ID)
				s.lim.dropNodeLocked(e.identity.name)
			}
		}
		if s.zones[st.node.Zone]--; s.zones[st.node.Zone] == 0 {
			delete(s.zones, st.node.Zone)
		}
		if s.viewers[st.view]--; s.viewers[st.view] == 0 {
			delete(s.viewers, st.view)
			delete(s.views, st.view)
		}
	}
	shrink(&s.streams, &s.peakStreams)
	shrink(&s.nodes, &s.peakNodes)
	shrink(&s.zones, &s.peakZones)
}

// shrink copies m into a fresh map once it holds under a quarter of its peak: the buckets a
// burst of streams grew are released instead of pinned for the process's life.
func shrink[K comparable, V any](m *map[K]V, peak *int) {
	if *peak < 256 || len(*m) >= *peak/4 {
		return
	}
	fresh := make(map[K]V, len(*m)) // maps.Clone would keep the grown table
	for k, v := range *m {
		fresh[k] = v
	}
	*m, *peak = fresh, len(fresh)
}

// request handles every request of a stream: the first admits it (or refuses it with a
// status that ends the stream), the others ACK or NACK what the stream was sent. It returns
// the node the cache must see, whose id is the stream's cache key.
func (s *Server) request(id int64, n *corev3.Node, typeURL, nonce, detail string, nacked bool, version string) (*corev3.Node, error) {
	if s.resumeWait != nil && version != "" && version != deltaAckVersion && !s.admitted(id) {
		s.resumeWait(version) // a stream's requests come one by one: this holds the stream alone
	}
	s.mu.Lock()
	st := s.streams[id]
	if st == nil {
		s.mu.Unlock()
		return nil, status.Error(codes.Internal, "unknown stream")
	}
	if !st.admitted {
		needsView, err := s.admitLocked(st, n)
		s.mu.Unlock()
		if err != nil {
			s.refused(err, st.identity, n.GetId())
			return nil, err
		}
		if needsView {
			s.lockBuild()
			s.fillViews()
			s.buildMu.Unlock()
		}
		s.mu.Lock()
	} else if n != nil && n.GetId() != "" && n.GetId() != st.node.ID {
		s.mu.Unlock()
		return nil, status.Errorf(codes.InvalidArgument, "stream opened as node %q cannot speak for node %q", st.node.ID, n.GetId())
	}
	defer s.mu.Unlock()
	st.acks.asked(typeURL)
	switch {
	case nacked:
		s.nackLocked(st, typeURL, nonce, detail)
	case version == deltaAckVersion:
		if nonce != "" {
			st.acks.ackSent(typeURL)
		}
	case version != "":
		st.acks.ack(typeURL, version)
	}
	return st.keyNode, nil
}

// admitted reports whether stream id's first request was accepted.
func (s *Server) admitted(id int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[id]
	return st != nil && st.admitted
}

// admitLocked checks a stream's first request and registers its node; it reports whether
// the stream's view has yet to be built.
func (s *Server) admitLocked(st *stream, n *corev3.Node) (needsView bool, err error) {
	if err := s.checkAdmissionLocked(st, n); err != nil {
		return false, err
	}
	e := s.nodes[n.GetId()]
	st.admitted = true
	st.node = Node{ID: n.GetId(), Zone: n.GetLocality().GetZone(), Group: groupOf(n)}
	st.keyNode = trimNode(n)
	st.keyNode.Id = st.key
	if e == nil {
		e = &nodeEntry{identity: st.identity}
		s.nodes[st.node.ID] = e
		s.peakNodes = max(s.peakNodes, len(s.nodes))
		s.lim.addNodeLocked(st.identity.name)
	}
	e.streams++
	s.zones[st.node.Zone]++
	s.peakZones = max(s.peakZones, len(s.zones))
	st.view = viewKey(s.named, st.node)
	if st.node.Zone != "" && !s.named[st.node.Zone] {
		// Every group: an XDP or Caddy node shares its group's view and, finding no backend
		// in its zone, spreads over every zone, as an Envoy node served the cross-zone view.
		s.Stats.UnknownZone.Add(1)
	}
	s.viewers[st.view]++
	if snap := s.views[st.view]; snap != nil {
		s.serveLocked(st, snap)
		return false, nil
	}
	return true, nil
}

// release ends the hold of WithFirstVerdicts: the current file is published with the
// health view read now, to every stream admitted meanwhile.
func (s *Server) release(ctx context.Context) {
	select {
	case <-s.firstVerdicts:
	case <-ctx.Done():
		return
	}
	s.lockBuild()
	defer s.buildMu.Unlock()
	s.mu.Lock()
	// Views built during the hold (to validate reloads) read the health of unprobed
	// targets: a stream admitted from here on must not be served one.
	s.views = map[string]*cachev3.Snapshot{}
	s.holding.Store(false)
	f, next := s.file, s.version+1
	s.mu.Unlock()
	if err := s.publish(f, next); err != nil {
		s.log.Error("publishing the first health view", zap.Error(err))
		return
	}
	s.log.Info("first health verdicts in: serving", zap.Int("streams", s.Streams()))
}

// serveLocked sets snap for the stream, unless the stream rejected that version or the
// server holds its first view (WithFirstVerdicts).
func (s *Server) serveLocked(st *stream, snap *cachev3.Snapshot) {
	if s.holding.Load() || !st.acks.set(snap) {
		return
	}
	if err := s.setLocked(st, snap); err != nil {
		s.log.Error("setting a snapshot", zap.String("node", st.node.ID), zap.Error(err))
	}
}

// fillViews builds the views streams are waiting for, outside mu; buildMu is held.
func (s *Server) fillViews() {
	s.mu.Lock()
	if s.health == nil && s.view != nil { // version 1: nothing has read the view yet
		s.health = s.freeze(s.file)
		s.setPanickingLocked(s.file, s.health)
	}
	f, v, view := s.file, s.version, s.health
	var missing []string
	for z := range s.viewers {
		if s.views[z] == nil {
			missing = append(missing, z)
		}
	}
	s.mu.Unlock()
	built := map[string]*cachev3.Snapshot{}
	for _, z := range missing {
		snap, err := s.build(f, viewNode(z), strconv.Itoa(v), view)
		if err != nil {
			s.log.Error("building a zone's view", zap.String("zone", z), zap.Error(err))
			continue
		}
		built[z] = snap
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for z, snap := range built {
		if s.viewers[z] == 0 { // every stream of the zone left meanwhile
			continue
		}
		s.views[z] = snap
	}
	for _, st := range s.streams {
		if snap := built[st.view]; snap != nil && st.admitted && st.acks.current != snap {
			s.serveLocked(st, snap)
		}
	}
}

// build translates and validates the file for a view zone. Only the zone shapes the
// result, so one snapshot serves every stream of the zone (the cache only reads it).
func (s *Server) build(f *pools.File, n Node, version string, view HealthView) (*cachev3.Snapshot, error) {
	if n.Group != GroupEnvoy {
		return s.buildFleet(f, n.Group, version, view)
	}
	s.Stats.Builds.Add(1)
	r, err := Translate(f, n, view)
	if err != nil {
		return nil, err
	}
	if s.hooks.mutate != nil {
		s.hooks.mutate(r)
	}
	if err := r.ValidateAll(); err != nil {
		return nil, fmt.Errorf("validating resources: %w", err)
	}
	conv := func(ms []proto.Message) []types.Resource {
		out := make([]types.Resource, len(ms))
		for i, m := range ms {
			out[i] = m
		}
		return out
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{
		resource.ListenerType: conv(r.Listeners),
		resource.RouteType:    conv(r.Routes),
		resource.ClusterType:  conv(r.Clusters),
		resource.EndpointType: conv(r.Endpoints),
	})
	if err != nil {
		return nil, err
	}
	// snap.Consistent() is not used: it does not see the RDS reference of an api_listener
	// (gRPC's listeners) and would reject every gRPC snapshot.
	return snap, nil
}

// nackLocked logs and counts a rejection and returns the stream, and only it, to the last
// snapshot it acknowledged.
func (s *Server) nackLocked(st *stream, typeURL, nonce, detail string) {
	rejected, fresh, rollback := st.acks.nack(typeURL)
	if !fresh {
		return // nothing set yet, or this push was already counted and rolled back
	}
	s.Stats.NACKs.Add(1)
	s.log.Warn("node rejected a snapshot", zap.String("node", st.node.ID), zap.Int64("stream", st.id), zap.String("type", typeURL),
		zap.String("version", rejected), zap.String("nonce", nonce), zap.String("error", detail))
	if rollback != nil {
		s.Stats.Rollbacks.Add(1)
		if err := s.setLocked(st, rollback); err != nil {
			s.log.Error("rolling back", zap.String("node", st.node.ID), zap.Error(err))
		}
	}
}

// Update replaces the pools file (a reload) and pushes a new version to every stream. A
// file that does not translate keeps the last good one serving and is returned as an
// error, not counted: the caller counts the rejected edit (Watch does, once).
func (s *Server) Update(f *pools.File) error {
	s.lockBuild()
	defer s.buildMu.Unlock()
	return s.publish(f, s.nextVersion())
}

// UpdateAt is Update at a version the caller names: the replicated control plane's store
// revision, so that every replica serves the same version for the same stored state.
// prepare, when set, runs first under the lock that orders builds, so what it changes
// (the source of the health view, RecordTransition) is what every build of this version
// reads, and no build of an earlier one.
func (s *Server) UpdateAt(f *pools.File, version int, prepare func()) error {
	s.lockBuild()
	defer s.buildMu.Unlock()
	if prepare != nil {
		prepare()
	}
	return s.publish(f, version)
}

// nextVersion is the version after the current one.
func (s *Server) nextVersion() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version + 1
}

// lockBuild takes buildMu, telling the test hook when it has to wait for it.
func (s *Server) lockBuild() {
	if s.buildMu.TryLock() {
		return
	}
	if s.hooks.updateQueued != nil {
		s.hooks.updateQueued()
	}
	s.buildMu.Lock()
}

// publish builds f for every view in use and serves it; buildMu is held, mu is taken only
// to read what to build and to install the result.
func (s *Server) publish(f *pools.File, next int) error {
	named := namedZones(f)
	s.mu.Lock()
	need := map[string]bool{}
	for _, st := range s.streams {
		if st.admitted {
			need[viewKey(named, st.node)] = true
		}
	}
	s.mu.Unlock()
	view := s.freeze(f)
	// Build every view before changing anything: an edit that does not translate keeps
	// the last good config serving.
	built := map[string]*cachev3.Snapshot{}
	for z := range need {
		snap, err := s.build(f, viewNode(z), strconv.Itoa(next), view)
		if err != nil {
			// Not counted here: whoever offered the file counts the rejected edit once
			// (Watch through pools.Watcher); a refresh's failure is no edit.
			return fmt.Errorf("pools file not applied: %w", err)
		}
		built[z] = snap
	}
	s.mu.Lock()
	s.file, s.named, s.version, s.health = f, named, next, view
	s.setPanickingLocked(f, view)
	s.views = map[string]*cachev3.Snapshot{}
	s.viewers = map[string]int{}
	for _, st := range s.streams {
		if !st.admitted {
			continue
		}
		st.view = viewKey(named, st.node)
		s.viewers[st.view]++
		if snap := built[st.view]; snap != nil {
			s.views[st.view] = snap
			s.serveLocked(st, snap)
		}
	}
	s.Stats.Reloads.Add(1)
	s.mu.Unlock()
	// Streams of a zone first seen while this version was being built.
	s.fillViews()
	return nil
}

// freeze reads the health view of every backend of f once.
func (s *Server) freeze(f *pools.File) HealthView {
	if s.view == nil {
		return nil
	}
	states := map[string]map[string]health.State{}
	for _, svc := range f.Services {
		m := make(map[string]health.State, len(svc.Backends))
		for _, b := range svc.Backends {
			m[b.Identity()] = s.view(svc.Name, b)
		}
		states[svc.Name] = m
	}
	return func(service string, b *pools.Backend) health.State { return states[service][b.Identity()] }
}

// setPanickingLocked records which services of f are in panic under view and logs each
// change: entering panic is a fleet-wide event an operator must see.
func (s *Server) setPanickingLocked(f *pools.File, view HealthView) {
	next := map[string]bool{}
	for _, svc := range f.Services {
		if !InPanic(svc, view) {
			continue
		}
		next[svc.Name] = true
		if !s.panicking[svc.Name] {
			s.Stats.Panics.Add(1)
			s.log.Warn("every non-draining backend of the service is down: failing open, publishing them all as UNKNOWN",
				zap.String("service", svc.Name), zap.Int("backends", len(svc.Backends)))
		}
	}
	for name := range s.panicking {
		if !next[name] {
			s.log.Info("service out of panic: health published again", zap.String("service", name))
		}
	}
	s.panicking = next
}

// Panicking reports, for every service of the current file, whether it is in panic.
func (s *Server) Panicking() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]bool, len(s.file.Services))
	for _, svc := range s.file.Services {
		out[svc.Name] = s.panicking[svc.Name]
	}
	return out
}

// Refresh rebuilds every stream's snapshot from the current file (a health transition).
// It publishes the file current when it starts, under the same order as Update, so a
// reload that runs meanwhile is applied after it and never undone by it.
//
// Refreshes coalesce: while one waits for the build in progress, others return at once, as
// the waiting one will read the health view after them (a burst of transitions costs two
// rebuilds, not one each).
func (s *Server) Refresh() error {
	if s.holding.Load() {
		return nil // the release reads the health view after every transition of the hold
	}
	if !s.refreshQueued.CompareAndSwap(false, true) {
		return nil
	}
	s.lockBuild()
	defer s.buildMu.Unlock()
	s.refreshQueued.Store(false) // from here, a transition needs a refresh of its own
	f := s.currentFile()
	if s.hooks.refreshRead != nil {
		s.hooks.refreshRead()
	}
	return s.publish(f, s.nextVersion())
}

func (s *Server) currentFile() *pools.File {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.file
}

// Nodes returns the IDs of the nodes that hold at least one stream, sorted.
func (s *Server) Nodes() []string {
	s.mu.Lock()
	out := slices.Collect(maps.Keys(s.nodes))
	s.mu.Unlock()
	slices.Sort(out)
	return out
}

// Streams returns how many streams are open, those still waiting for their first request
// included.
func (s *Server) Streams() int { return s.lim.openStreams() }
