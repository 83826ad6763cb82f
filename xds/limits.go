package xds

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The defaults of the bounds on nodes and streams (docs/xds.md, "Limits").
const (
	// DefaultMaxNodesPerIdentity is how many node ids one identity (a client certificate, or
	// without one a peer address) may hold: the nodes one host legitimately runs (an XDP
	// node per interface, a Caddy, an Envoy, a few gRPC clients), with room to spare.
	DefaultMaxNodesPerIdentity = 16
	// DefaultMaxStreams bounds the streams open at once, those still waiting for their
	// first request included: two per node at DefaultMaxNodes.
	DefaultMaxStreams = 20_000
	// DefaultMaxStreamsPerNode bounds one node id's streams: one ADS stream, or one per type
	// (four), and those of a reconnect while keepalive has not yet found the old ones gone.
	DefaultMaxStreamsPerNode = 16
	// DefaultMaxStreamsPerConn is the HTTP/2 MAX_CONCURRENT_STREAMS of a connection: a node
	// opens at most one stream per type on its connection.
	DefaultMaxStreamsPerConn = 16
	// DefaultFirstRequestTimeout is how long a new stream may wait before its first
	// request for a type the server serves: a node sends it as soon as it connects.
	DefaultFirstRequestTimeout = 10 * time.Second
)

// Bounds on the strings of a node the server keeps (a node that sends longer ones is
// refused: none of them is a real node's).
const (
	maxNodeIDLength = 1024
	// maxNodeZoneLength is the pools file's limit on a zone: a longer one names no zone.
	maxNodeZoneLength  = 128
	maxUserAgentLength = 256
)

// WithMaxNodesPerIdentity caps the node ids one identity may hold at once (the identity is
// the client certificate under WithNodeIdentity's mTLS, else the peer's IP address); a new
// id beyond it is refused with ResourceExhausted, before the fleet-wide WithMaxNodes is
// looked at, so one identity cannot take every slot. n <= 0 means the default.
func WithMaxNodesPerIdentity(n int) Option {
	return func(s *Server) {
		if n > 0 {
			s.lim.nodesPerIdentity = n
		}
	}
}

// WithMaxStreams caps the streams open at once, those waiting for their first request
// included; a stream beyond it is refused with ResourceExhausted as it opens. One
// identity may hold at most its share of nodes times WithMaxStreamsPerNode of them.
// n <= 0 means the default.
func WithMaxStreams(n int) Option {
	return func(s *Server) {
		if n > 0 {
			s.lim.streams = n
		}
	}
}

// WithMaxStreamsPerNode caps the streams of one node id; one beyond it is refused with
// ResourceExhausted. n <= 0 means the default.
func WithMaxStreamsPerNode(n int) Option {
	return func(s *Server) {
		if n > 0 {
			s.lim.streamsPerNode = n
		}
	}
}

// WithMaxStreamsPerConn sets the concurrent streams of one connection (GRPCServerOptions'
// MaxConcurrentStreams). n <= 0 means the default.
func WithMaxStreamsPerConn(n int) Option {
	return func(s *Server) {
		if n > 0 {
			s.lim.streamsPerConn = n
		}
	}
}

// WithFirstRequestTimeout ends a stream that has not sent a request for a type the server
// serves within d of opening (DeadlineExceeded). d <= 0 means the default.
func WithFirstRequestTimeout(d time.Duration) Option {
	return func(s *Server) {
		if d > 0 {
			s.lim.firstRequest = d
		}
	}
}

// GRPCServerOptions are the options the gRPC server the Server is registered on needs:
// the streams a connection may carry.
func (s *Server) GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxConcurrentStreams(uint32(s.lim.streamsPerConn))}
}

// Refusal is why a stream was refused (Stats.Refused).
type Refusal int

// The reasons a stream is refused, as stickylb_xds_refused_streams_total's reason label
// names them.
const (
	RefusedMaxStreams      Refusal = iota // --max-streams
	RefusedIdentityStreams                // the identity's share of streams
	RefusedInvalidNode                    // no node id, or a node's strings over their bounds
	RefusedIdentity                       // the certificate does not cover the node id
	RefusedIDTaken                        // the node id is held by another identity
	RefusedNodeStreams                    // --max-streams-per-node
	RefusedIdentityNodes                  // --max-nodes-per-identity
	RefusedMaxNodes                       // --max-nodes
	numRefusals
)

var refusalNames = [numRefusals]string{"max_streams", "identity_streams", "invalid_node", "identity", "id_taken",
	"node_streams", "identity_nodes", "max_nodes"}

func (r Refusal) String() string { return refusalNames[r] }

// Refusals counts refused streams by reason.
type Refusals [numRefusals]atomic.Uint64

// Of is the count of one reason.
func (r *Refusals) Of(reason Refusal) uint64 { return r[reason].Load() }

// refusalCollector exports Stats.Refused as stickylb_xds_refused_streams_total{reason}.
type refusalCollector struct {
	s    *Server
	desc *prometheus.Desc
}

func (c refusalCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c refusalCollector) Collect(ch chan<- prometheus.Metric) {
	for r := range numRefusals {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.s.Stats.Refused.Of(r)), r.String())
	}
}

// refusalError is a refused stream's status and why, for the count.
type refusalError struct {
	reason Refusal
	st     *status.Status
	holder string // the identity holding the node id (RefusedIDTaken)
}

func (e *refusalError) Error() string              { return e.st.Err().Error() }
func (e *refusalError) GRPCStatus() *status.Status { return e.st }

func refuse(reason Refusal, code codes.Code, format string, args ...any) error {
	return &refusalError{reason: reason, st: status.Newf(code, format, args...)}
}

// limits are the server's bounds on streams, and the streams each identity holds.
type limits struct {
	streams, streamsPerConn, streamsPerNode, nodesPerIdentity int
	firstRequest                                              time.Duration

	mu   sync.Mutex
	open int            // streams open, waiting ones included
	held map[string]int // identity name -> its open streams
	peak int            // held's peak size since it was last rebuilt (see shrink)
	// burst is the most streams open since the memory was last collected; collected is
	// when that was (see collectAfterBurst).
	burst     int
	collected time.Time
	// nodes: identity name -> the node ids it holds, and its peak size; guarded by
	// Server.mu, not mu (admission reads it with the server's state).
	nodes     map[string]int
	peakNodes int
}

func defaultLimits() limits {
	return limits{streams: DefaultMaxStreams, streamsPerConn: DefaultMaxStreamsPerConn, streamsPerNode: DefaultMaxStreamsPerNode,
		nodesPerIdentity: DefaultMaxNodesPerIdentity, firstRequest: DefaultFirstRequestTimeout, held: map[string]int{}, nodes: map[string]int{}}
}

// take counts a new stream of identity, or refuses it over --max-streams or the identity's
// share; release undoes it when the stream ends.
func (l *limits) take(identity string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open >= l.streams {
		return nil, refuse(RefusedMaxStreams, codes.ResourceExhausted, "stream limit reached: %d streams open (--max-streams)", l.streams)
	}
	// An identity holds at most its nodes' streams; a stream still waiting for its first
	// request counts too, or silent streams from one host would fill --max-streams.
	if share := l.nodesPerIdentity * l.streamsPerNode; l.held[identity] >= share {
		return nil, refuse(RefusedIdentityStreams, codes.ResourceExhausted,
			"%d streams open from this identity (--max-nodes-per-identity x --max-streams-per-node)", share)
	}
	l.open++
	l.burst = max(l.burst, l.open)
	l.held[identity]++
	l.peak = max(l.peak, len(l.held))
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.open--
		if l.held[identity]--; l.held[identity] == 0 {
			delete(l.held, identity)
			shrink(&l.held, &l.peak)
		}
		l.collectAfterBurst(time.Now())
	}, nil
}

// Bounds of collectAfterBurst: the streams a burst must have reached, and the time between
// two collections.
const (
	burstStreams    = 1024
	burstCollection = 30 * time.Second
)

// collectAfterBurst returns a burst's memory once it is over (the streams open fell under a
// quarter of their peak): a collection then frees what the burst's streams held, for the
// next burst to reuse and the rest for the system. Without it the runtime collects again
// only when the heap has doubled from its size at the burst's peak, so a second flood of
// silent streams took new memory (96 MB more than the first's peak for 15,000 streams)
// instead of the first's. At most once per burstCollection.
func (l *limits) collectAfterBurst(now time.Time) {
	if l.burst < burstStreams || l.open > l.burst/4 || now.Sub(l.collected) < burstCollection {
		return
	}
	l.burst, l.collected = l.open, now
	go debug.FreeOSMemory()
}

// openStreams is how many streams are open, those waiting for their first request included.
func (l *limits) openStreams() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// checkNode refuses a node whose strings are over their bounds (or that has no id).
func checkNode(n *corev3.Node) error {
	switch {
	case n.GetId() == "":
		return refuse(RefusedInvalidNode, codes.InvalidArgument, "the first request of a stream must carry a node id")
	case len(n.GetId()) > maxNodeIDLength:
		return refuse(RefusedInvalidNode, codes.InvalidArgument, "node id of %d bytes: at most %d", len(n.GetId()), maxNodeIDLength)
	case len(n.GetLocality().GetZone()) > maxNodeZoneLength:
		return refuse(RefusedInvalidNode, codes.InvalidArgument, "zone of %d bytes: at most %d (the pools file's limit)", len(n.GetLocality().GetZone()), maxNodeZoneLength)
	case len(n.GetUserAgentName()) > maxUserAgentLength:
		return refuse(RefusedInvalidNode, codes.InvalidArgument, "user agent name of %d bytes: at most %d", len(n.GetUserAgentName()), maxUserAgentLength)
	}
	return nil
}

// checkAdmissionLocked refuses a stream's first request unless its node may be served:
// its strings within bounds, covered by the certificate (WithNodeIdentity), its id not held
// by another identity, and within the caps on the id's streams, the identity's nodes and
// the nodes of the fleet, in that order.
func (s *Server) checkAdmissionLocked(st *stream, n *corev3.Node) error {
	if err := checkNode(n); err != nil {
		return err
	}
	if s.requireIdentity && !st.identity.covers(n.GetId()) {
		return refuse(RefusedIdentity, codes.PermissionDenied, "node id %q is not covered by %s: it needs a URI SAN spiffe://TRUST_DOMAIN/%s or a DNS SAN naming its host part",
			n.GetId(), st.identity.describe(), n.GetId())
	}
	e := s.nodes[n.GetId()]
	switch {
	case e != nil && e.identity.name != st.identity.name:
		// Without this, anyone could attach to a live node's id; the node's own streams stay
		// its own either way (ACKs and NACKs are per stream). Without TLS the identity is
		// an address, and whoever comes first holds the id: docs/xds.md says so.
		err := refuse(RefusedIDTaken, codes.AlreadyExists, "node id %q has a live stream from another identity", n.GetId())
		err.(*refusalError).holder = e.identity.name
		return err
	case e != nil && e.streams >= s.lim.streamsPerNode:
		return refuse(RefusedNodeStreams, codes.ResourceExhausted, "node id %q holds %d streams (--max-streams-per-node)", n.GetId(), e.streams)
	case e == nil && s.lim.nodes[st.identity.name] >= s.lim.nodesPerIdentity:
		return refuse(RefusedIdentityNodes, codes.ResourceExhausted, "%s holds %d node ids (--max-nodes-per-identity)",
			st.identity.name, s.lim.nodesPerIdentity)
	case e == nil && len(s.nodes) >= s.maxNodes:
		return refuse(RefusedMaxNodes, codes.ResourceExhausted, "node limit reached: %d nodes hold streams (--max-nodes)", s.maxNodes)
	}
	return nil
}

// addNodeLocked and dropNodeLocked count the node ids an identity holds; Server.mu is held.
func (l *limits) addNodeLocked(identity string) {
	l.nodes[identity]++
	l.peakNodes = max(l.peakNodes, len(l.nodes))
}

func (l *limits) dropNodeLocked(identity string) {
	if l.nodes[identity]--; l.nodes[identity] == 0 {
		delete(l.nodes, identity)
		shrink(&l.nodes, &l.peakNodes)
	}
}

// refused counts and logs a refused stream (one line per refusal; the production logger
// samples a flood of them).
func (s *Server) refused(err error, ident peerIdentity, node string) {
	reason, holder := RefusedInvalidNode, ""
	if r, ok := err.(*refusalError); ok {
		reason, holder = r.reason, r.holder
	}
	s.Stats.Refused[reason].Add(1)
	fields := []zap.Field{zap.Stringer("reason", reason), zap.String("node", truncate(node, 128)),
		zap.String("identity", ident.name), zap.Error(err)}
	if holder != "" {
		fields = append(fields, zap.String("holder", holder))
	}
	s.log.Warn("stream refused", fields...)
}

// truncate keeps a client's string to n bytes in a log line.
func truncate(v string, n int) string {
	if len(v) <= n {
		return v
	}
	return v[:n] + "..."
}
