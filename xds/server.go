package xds

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

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
	"google.golang.org/protobuf/proto"

	"github.com/stickylb/stickylb/policies/pools"
)

// Stats are the server's counters (exported as Prometheus metrics by the admin endpoint).
type Stats struct {
	Pushes, NACKs, Reloads, ReloadErrors, Rollbacks, HealthTransitions atomic.Uint64
	// Builds counts snapshot translations: one per zone and version, shared by the zone's nodes.
	Builds atomic.Uint64
}

// nodeState is what the server keeps per subscribing node.
type nodeState struct {
	node    Node
	current *cachev3.Snapshot // last snapshot set for the node
	acked   *cachev3.Snapshot // last snapshot the node acknowledged on every type
	ackedBy map[string]string // type URL -> version the node last ACKed
	// rejected is the version the node NACKed: the server does not build it for this node
	// again (the cache alone would re-send it forever: a NACK carries the old version).
	rejected string
	// subscribed are the type URLs the node asked for (see ackTypes).
	subscribed map[string]bool
}

// Server serves one pools file to every node, per node locality.
type Server struct {
	log   *zap.Logger
	cache cachev3.SnapshotCache
	xds   serverv3.Server
	view  HealthView
	Stats Stats

	// mutate, when set, edits every translation before validation (tests use it to serve
	// resources a client rejects).
	mutate func(*Resources)
	// mutateXDP, when set, edits every XDP view after validation (tests serve views a
	// node rejects).
	mutateXDP func(clusters, endpoints []types.Resource)
	verdicts  verdictTimes

	mu      sync.Mutex
	file    *pools.File
	version int
	nodes   map[string]*nodeState
}

// NewServer returns a server for f. view may be nil (no health checking).
func NewServer(ctx context.Context, f *pools.File, view HealthView, log *zap.Logger) *Server {
	s := &Server{log: log, view: view, file: f, version: 1, nodes: map[string]*nodeState{}}
	s.cache = cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	s.xds = serverv3.NewServer(ctx, s.cache, serverv3.CallbackFuncs{
		StreamRequestFunc: s.onRequest,
		StreamDeltaRequestFunc: func(_ int64, req *discoverygrpc.DeltaDiscoveryRequest) error {
			s.ensureNode(req.GetNode())
			if d := req.GetErrorDetail(); d != nil {
				s.nack(req.GetNode().GetId(), req.GetTypeUrl(), "", d.GetMessage())
			}
			return nil
		},
		StreamResponseFunc: func(context.Context, int64, *discoverygrpc.DiscoveryRequest, *discoverygrpc.DiscoveryResponse) {
			s.Stats.Pushes.Add(1)
		},
		StreamDeltaResponseFunc: func(int64, *discoverygrpc.DeltaDiscoveryRequest, *discoverygrpc.DeltaDiscoveryResponse) {
			s.Stats.Pushes.Add(1)
		},
	})
	return s
}

// Register adds ADS and the per-type services to g.
func (s *Server) Register(g *grpc.Server) {
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(g, s.xds)
	clusterservice.RegisterClusterDiscoveryServiceServer(g, s.xds)
	endpointservice.RegisterEndpointDiscoveryServiceServer(g, s.xds)
	listenerservice.RegisterListenerDiscoveryServiceServer(g, s.xds)
	routeservice.RegisterRouteDiscoveryServiceServer(g, s.xds)
}

var typeURLs = []string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType}

func (s *Server) onRequest(_ int64, req *discoverygrpc.DiscoveryRequest) error {
	id := req.GetNode().GetId()
	s.ensureNode(req.GetNode())
	s.noteSubscribed(id, req.GetTypeUrl())
	if d := req.GetErrorDetail(); d != nil {
		s.nack(id, req.GetTypeUrl(), req.GetResponseNonce(), d.GetMessage())
		return nil
	}
	if v := req.GetVersionInfo(); v != "" {
		s.ack(id, req.GetTypeUrl(), v)
	}
	return nil
}

// ensureNode creates the node's state and first snapshot on its first request.
func (s *Server) ensureNode(n *corev3.Node) {
	if n == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.nodes[n.GetId()]; ok {
		return
	}
	ns := &nodeState{node: Node{ID: n.GetId(), Zone: n.GetLocality().GetZone(), Group: groupOf(n)}, ackedBy: map[string]string{}}
	s.nodes[n.GetId()] = ns
	if err := s.pushLocked(ns); err != nil {
		s.log.Error("building the first snapshot", zap.String("node", ns.node.ID), zap.Error(err))
	}
}

// build translates and validates the file for a node. Only the node's zone shapes the
// result, so callers share one snapshot among a zone's nodes (the cache only reads it).
func (s *Server) build(f *pools.File, n Node, version string) (*cachev3.Snapshot, error) {
	if n.Group != GroupEnvoy {
		return s.buildFleet(f, n.Group, version)
	}
	s.Stats.Builds.Add(1)
	r, err := Translate(f, n, s.view)
	if err != nil {
		return nil, err
	}
	if s.mutate != nil {
		s.mutate(r)
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

func (s *Server) pushLocked(ns *nodeState) error {
	v := strconv.Itoa(s.version)
	if ns.rejected == v {
		return nil
	}
	var snap *cachev3.Snapshot
	for _, o := range s.nodes { // a zone peer's snapshot of this version serves this node too
		if o != ns && o.node.shareKey() == ns.node.shareKey() && o.current != nil && o.current.GetVersion(resource.ClusterType) == v {
			snap = o.current
			break
		}
	}
	if snap == nil {
		var err error
		if snap, err = s.build(s.file, ns.node, v); err != nil {
			return err
		}
	}
	ns.current = snap
	return s.cache.SetSnapshot(context.Background(), ns.node.ID, snap)
}

func (s *Server) ack(id, typeURL, version string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ns := s.nodes[id]
	if ns == nil {
		return
	}
	ns.ackedBy[typeURL] = version
	if ns.current == nil || version != ns.current.GetVersion(typeURL) {
		return
	}
	for _, t := range ns.ackTypes() {
		if ns.ackedBy[t] != ns.current.GetVersion(t) {
			return
		}
	}
	ns.acked = ns.current
}

// nack logs and counts a rejection and returns the node to its last acknowledged snapshot.
func (s *Server) nack(id, typeURL, nonce, detail string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ns := s.nodes[id]
	if ns == nil || ns.current == nil {
		return
	}
	rejected := ns.current.GetVersion(typeURL)
	if ns.rejected == rejected {
		return // this push was already counted and rolled back
	}
	ns.rejected = rejected
	s.Stats.NACKs.Add(1)
	s.log.Warn("node rejected a snapshot", zap.String("node", id), zap.String("type", typeURL),
		zap.String("version", rejected), zap.String("nonce", nonce), zap.String("error", detail))
	if ns.acked != nil {
		ns.current = ns.acked
		s.Stats.Rollbacks.Add(1)
		if err := s.cache.SetSnapshot(context.Background(), id, ns.acked); err != nil {
			s.log.Error("rolling back", zap.String("node", id), zap.Error(err))
		}
	}
}

// Update replaces the pools file (a reload) and pushes a new version to every node.
func (s *Server) Update(f *pools.File) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Build for every node before changing anything: an edit that does not translate keeps
	// the last good config serving.
	next := s.version + 1
	snaps := map[string]*cachev3.Snapshot{}
	byZone := map[string]*cachev3.Snapshot{}
	for id, ns := range s.nodes {
		snap, ok := byZone[ns.node.shareKey()]
		if !ok {
			var err error
			if snap, err = s.build(f, ns.node, strconv.Itoa(next)); err != nil {
				return fmt.Errorf("pools file not applied: %w", err)
			}
			byZone[ns.node.shareKey()] = snap
		}
		snaps[id] = snap
	}
	s.file, s.version = f, next
	s.Stats.Reloads.Add(1)
	var errs []error
	for id, snap := range snaps {
		ns := s.nodes[id]
		ns.current = snap
		if err := s.cache.SetSnapshot(context.Background(), id, snap); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Refresh rebuilds every node's snapshot from the current file (a health transition).
func (s *Server) Refresh() error {
	return s.Update(s.currentFile())
}

func (s *Server) currentFile() *pools.File {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.file
}

// Nodes returns the IDs of the nodes seen so far.
func (s *Server) Nodes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.nodes))
	for id := range s.nodes {
		out = append(out, id)
	}
	return out
}
