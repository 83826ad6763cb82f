package xds

import (
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// maxUnknownTypes is how many distinct type URLs the server does not serve a stream may
// ask for before it is ended. Not the first one: an Envoy that asks for a type we do not
// serve (runtime, secrets over ADS) would reconnect forever; a hundred is no config.
const maxUnknownTypes = 100

// maxErrorDetail bounds the part of a NACK's message the server keeps (and logs).
const maxErrorDetail = 4096

// guarded is go-control-plane's server behind the limits: every stream method of the
// services Register adds goes through guard (TestEveryStreamIsGuarded opens each); the
// unary Fetch calls go straight to it, which refuses them.
type guarded struct {
	serverv3.Server
	s *Server
}

type (
	sotwStream  = grpc.BidiStreamingServer[discoverygrpc.DiscoveryRequest, discoverygrpc.DiscoveryResponse]
	deltaStream = grpc.BidiStreamingServer[discoverygrpc.DeltaDiscoveryRequest, discoverygrpc.DeltaDiscoveryResponse]
)

func (g guarded) StreamAggregatedResources(st sotwStream) error {
	return guard(g.s, st, resource.AnyType, g.Server.StreamAggregatedResources)
}

func (g guarded) DeltaAggregatedResources(st deltaStream) error {
	return guard(g.s, st, resource.AnyType, g.Server.DeltaAggregatedResources)
}

func (g guarded) StreamClusters(st sotwStream) error {
	return guard(g.s, st, resource.ClusterType, g.Server.StreamClusters)
}

func (g guarded) DeltaClusters(st deltaStream) error {
	return guard(g.s, st, resource.ClusterType, g.Server.DeltaClusters)
}

func (g guarded) StreamEndpoints(st sotwStream) error {
	return guard(g.s, st, resource.EndpointType, g.Server.StreamEndpoints)
}

func (g guarded) DeltaEndpoints(st deltaStream) error {
	return guard(g.s, st, resource.EndpointType, g.Server.DeltaEndpoints)
}

func (g guarded) StreamListeners(st sotwStream) error {
	return guard(g.s, st, resource.ListenerType, g.Server.StreamListeners)
}

func (g guarded) DeltaListeners(st deltaStream) error {
	return guard(g.s, st, resource.ListenerType, g.Server.DeltaListeners)
}

func (g guarded) StreamRoutes(st sotwStream) error {
	return guard(g.s, st, resource.RouteType, g.Server.StreamRoutes)
}

func (g guarded) DeltaRoutes(st deltaStream) error {
	return guard(g.s, st, resource.RouteType, g.Server.DeltaRoutes)
}

// unknownSeed hashes the unknown type URLs a stream asked for: it keeps their hashes, not
// the URLs (each may be megabytes).
var unknownSeed = maphash.MakeSeed()

// guardedStream is a stream that passed the limits, as go-control-plane reads it: the
// first request is the one guard waited for, and requests for types the server does not
// serve never reach go-control-plane (they would open a watch each).
type guardedStream[Req, Resp any] struct {
	grpc.BidiStreamingServer[Req, Resp]
	s           *Server
	defaultType string // the per-type service's type; "" for ADS
	first       *Req   // handed out by the first Recv
	// unknown are the hashes of the unknown types the stream asked for.
	unknown map[uint64]bool
	// node is the node of a dropped request the stream has not yet passed on: the first
	// request of a stream carries it, whatever its type.
	node *corev3.Node
	// ended is why the guard ended the stream, when it did.
	ended atomic.Pointer[status.Status]
}

// guard serves one stream: it counts it against the limits, waits at most
// --first-request-timeout for its first request of a served type, and hands it to inner.
func guard[Req, Resp any](s *Server, st grpc.BidiStreamingServer[Req, Resp], defaultType string, inner func(grpc.BidiStreamingServer[Req, Resp]) error) error {
	ident := identityOf(st.Context())
	release, err := s.lim.take(ident.name)
	if err != nil {
		s.refused(err, ident, "")
		return err
	}
	defer release()
	g := &guardedStream[Req, Resp]{BidiStreamingServer: st, s: s, defaultType: defaultType}
	if g.first, err = g.awaitFirst(s.lim.firstRequest); err != nil {
		return err
	}
	err = inner(g)
	if e := g.ended.Load(); e != nil {
		return e.Err()
	}
	return err
}

// awaitFirst returns the stream's first request of a served type, or ends the stream when
// none came within d. The read runs on a goroutine of its own, which ends with the stream.
func (g *guardedStream[Req, Resp]) awaitFirst(d time.Duration) (*Req, error) {
	type result struct {
		req *Req
		err error
	}
	got := make(chan result, 1)
	go func() {
		r, err := g.next()
		got <- result{r, err}
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case r := <-got:
		return r.req, r.err
	case <-t.C:
		g.s.Stats.FirstRequestTimeouts.Add(1)
		g.s.log.Debug("stream ended: no request within the first-request timeout", zap.Duration("timeout", d),
			zap.String("identity", identityOf(g.Context()).name))
		return nil, status.Errorf(codes.DeadlineExceeded, "no request within %s of the stream's start (--first-request-timeout)", d)
	}
}

// Recv is go-control-plane's read of the stream.
func (g *guardedStream[Req, Resp]) Recv() (*Req, error) {
	if r := g.first; r != nil {
		g.first = nil
		return r, nil
	}
	return g.next()
}

// next reads the next request of a served type, trimmed to what the server uses. A
// request for another type is counted and dropped; the stream is ended at its
// maxUnknownTypes-th distinct one.
func (g *guardedStream[Req, Resp]) next() (*Req, error) {
	for {
		r, err := g.BidiStreamingServer.Recv()
		if err != nil {
			return nil, err
		}
		typeURL, node := requestOf(r)
		if typeURL == "" {
			typeURL = g.defaultType
		}
		if typeURL == "" || slices.Contains(typeURLs, typeURL) { // ADS without a type: go-control-plane refuses it
			if node == nil && g.node != nil {
				setNode(r, g.node)
			}
			g.node = nil
			trimRequest(r)
			return r, nil
		}
		if node != nil {
			g.node = trimNode(node)
		}
		if err := g.unknownType(typeURL); err != nil {
			return nil, err
		}
	}
}

// unknownType counts a request for a type the server does not serve, and ends the stream
// at its maxUnknownTypes-th distinct one.
func (g *guardedStream[Req, Resp]) unknownType(typeURL string) error {
	g.s.Stats.UnknownTypes.Add(1)
	if g.unknown == nil {
		g.unknown = map[uint64]bool{}
	}
	g.unknown[maphash.String(unknownSeed, typeURL)] = true
	if len(g.unknown) < maxUnknownTypes {
		return nil
	}
	g.s.Stats.UnknownTypeEnds.Add(1)
	st := status.Newf(codes.InvalidArgument, "asked for %d type URLs this server does not serve (it serves listeners, routes, clusters and endpoints)", len(g.unknown))
	g.s.log.Warn("stream ended: too many unknown type URLs", zap.Int("types", len(g.unknown)),
		zap.String("identity", identityOf(g.Context()).name))
	g.ended.Store(st)
	return st.Err()
}

// requestOf is a request's type URL and node, of either protocol.
func requestOf(r any) (string, *corev3.Node) {
	switch r := r.(type) {
	case *discoverygrpc.DiscoveryRequest:
		return r.GetTypeUrl(), r.GetNode()
	case *discoverygrpc.DeltaDiscoveryRequest:
		return r.GetTypeUrl(), r.GetNode()
	}
	panic(fmt.Sprintf("xds: a request of type %T", r))
}

func setNode(r any, n *corev3.Node) {
	switch r := r.(type) {
	case *discoverygrpc.DiscoveryRequest:
		r.Node = n
	case *discoverygrpc.DeltaDiscoveryRequest:
		r.Node = n
	}
}

// trimRequest drops what the server does not use of a request that go-control-plane keeps
// (the stream keeps the node it carried; each open watch its request): the node but for
// its id, zone and user agent, and a NACK's details and its message beyond maxErrorDetail
// bytes.
func trimRequest(r any) {
	switch r := r.(type) {
	case *discoverygrpc.DiscoveryRequest:
		r.Node = trimNode(r.Node)
		if d := r.ErrorDetail; d != nil {
			r.ErrorDetail = status.New(codes.Code(d.GetCode()), truncate(d.GetMessage(), maxErrorDetail)).Proto()
		}
	case *discoverygrpc.DeltaDiscoveryRequest:
		r.Node = trimNode(r.Node)
		if d := r.ErrorDetail; d != nil {
			r.ErrorDetail = status.New(codes.Code(d.GetCode()), truncate(d.GetMessage(), maxErrorDetail)).Proto()
		}
	}
}

// trimNode is what the server reads of a node: its id, zone and user agent name (nil for
// nil). A string over its bound is cut one byte past it: admission still sees it too long
// and refuses it, and a stream never keeps more.
func trimNode(n *corev3.Node) *corev3.Node {
	if n == nil {
		return nil
	}
	out := &corev3.Node{Id: cut(n.GetId(), maxNodeIDLength+1), UserAgentName: cut(n.GetUserAgentName(), maxUserAgentLength+1)}
	if z := n.GetLocality().GetZone(); z != "" {
		out.Locality = &corev3.Locality{Zone: cut(z, maxNodeZoneLength+1)}
	}
	return out
}

// cut is v's first n bytes, in a string of its own (a substring would keep all of v).
func cut(v string, n int) string {
	if len(v) <= n {
		return v
	}
	return strings.Clone(v[:n])
}
