package adsclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// testServer is go-control-plane's real ADS server on loopback, recording every request.
type testServer struct {
	cache cachev3.SnapshotCache
	g     *grpc.Server
	addr  string

	mu   sync.Mutex
	reqs []seen
	// onRequest, when set, sees every request with its stream's node instead of the record.
	onRequest func(node string, r *discoveryv3.DiscoveryRequest)
	// onNACK, when set, runs on every NACK before the server answers it and before the
	// NACK is recorded (a real control plane rolls the node back there).
	onNACK func(*discoveryv3.DiscoveryRequest)
	opens  int
}

// startServer serves cache on addr ("" for a free port).
func startServer(t testing.TB, addr string, cache cachev3.SnapshotCache, opts ...grpc.ServerOption) *testServer {
	t.Helper()
	s := &testServer{cache: cache}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	xs := serverv3.NewServer(ctx, cache, serverv3.CallbackFuncs{
		StreamOpenFunc: func(context.Context, int64, string) error {
			s.mu.Lock()
			s.opens++
			s.mu.Unlock()
			return nil
		},
	})
	s.serve(t, addr, func(g *grpc.Server) { discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, xs) }, opts...)
	return s
}

// serve runs a gRPC server with register's services on addr ("" for a free port),
// recording every request. A fixed address is retried until the kernel lets it go (a
// server just stopped there).
func (s *testServer) serve(t testing.TB, addr string, register func(*grpc.Server), opts ...grpc.ServerOption) {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var ln net.Listener
	testwait.For(t, 5*time.Second, "listening on "+addr, func() (bool, string) {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err == nil, fmt.Sprint(err)
	})
	s.addr = ln.Addr().String()
	s.g = grpc.NewServer(append(opts, grpc.StreamInterceptor(s.record))...)
	register(s.g)
	go func() { _ = s.g.Serve(ln) }()
	t.Cleanup(s.g.Stop)
}

// record keeps every request as it arrived, before go-control-plane copies the stream's
// node into the requests that came without it.
func (s *testServer) record(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, &recordingStream{ServerStream: ss, s: s})
}

// seen is one request as it arrived, with the node of its stream.
type seen struct {
	node string
	req  *discoveryv3.DiscoveryRequest
	at   time.Time
}

type recordingStream struct {
	grpc.ServerStream
	s    *testServer
	node string
}

func (r *recordingStream) RecvMsg(m any) error {
	if err := r.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if req, ok := m.(*discoveryv3.DiscoveryRequest); ok {
		if req.GetNode() != nil {
			r.node = req.GetNode().GetId()
		}
		r.s.mu.Lock()
		onRequest, onNACK := r.s.onRequest, r.s.onNACK
		r.s.mu.Unlock()
		// The rollback runs before the NACK is recorded: a test that has seen a NACK may
		// send the next version at once, and the rollback must not overwrite it.
		if req.GetErrorDetail() != nil && onNACK != nil {
			onNACK(req)
		}
		if onRequest != nil {
			onRequest(r.node, req)
			return nil
		}
		r.s.mu.Lock()
		r.s.reqs = append(r.s.reqs, seen{r.node, proto.Clone(req).(*discoveryv3.DiscoveryRequest), time.Now()})
		r.s.mu.Unlock()
	}
	return nil
}

// requests returns the requests seen so far, as they arrived.
func (s *testServer) requests() []*discoveryv3.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*discoveryv3.DiscoveryRequest, len(s.reqs))
	for i, r := range s.reqs {
		out[i] = r.req
	}
	return out
}

// from returns node's requests.
func (s *testServer) from(node string) []*discoveryv3.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*discoveryv3.DiscoveryRequest
	for _, r := range s.reqs {
		if r.node == node {
			out = append(out, r.req)
		}
	}
	return out
}

// acked reports whether node ACKed version of typeURL (a request answering a response,
// without an error).
func (s *testServer) acked(node, typeURL, version string) bool {
	for _, r := range s.from(node) {
		if r.GetTypeUrl() == typeURL && r.GetVersionInfo() == version &&
			r.GetResponseNonce() != "" && r.GetErrorDetail() == nil {
			return true
		}
	}
	return false
}

// nacks returns node's NACKs of typeURL.
func (s *testServer) nacks(node, typeURL string) []*discoveryv3.DiscoveryRequest {
	var out []*discoveryv3.DiscoveryRequest
	for _, r := range s.from(node) {
		if r.GetTypeUrl() == typeURL && r.GetErrorDetail() != nil {
			out = append(out, r)
		}
	}
	return out
}

// nackTimes returns when node's NACKs of typeURL arrived.
func (s *testServer) nackTimes(node, typeURL string) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []time.Time
	for _, r := range s.reqs {
		if r.node == node && r.req.GetTypeUrl() == typeURL && r.req.GetErrorDetail() != nil {
			out = append(out, r.at)
		}
	}
	return out
}

// snapshot is a CDS+EDS snapshot of clusters a, b and c; port shapes the endpoints and the
// clusters' connect timeouts (so versions can differ in content) and lb sets cluster a's policy (a client may reject it).
func snapshot(t testing.TB, version string, port uint32, lb clusterv3.Cluster_LbPolicy) *cachev3.Snapshot {
	t.Helper()
	var clusters, clas []types.Resource
	for i, name := range []string{"a", "b", "c"} {
		c := &clusterv3.Cluster{
			Name:                 name,
			ConnectTimeout:       durationpb.New(time.Duration(port) * time.Millisecond),
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		}
		if name == "a" {
			c.LbPolicy = lb
		}
		clusters = append(clusters, c)
		clas = append(clas, &endpointv3.ClusterLoadAssignment{
			ClusterName: name,
			Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
						Address: fmt.Sprintf("10.0.0.%d", i+1), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}},
				}},
			}}}},
		})
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{
		resource.ClusterType: clusters, resource.EndpointType: clas,
	})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// recorder is a node's handlers: it applies clusters and endpoints, refuses a cluster with
// the MAGLEV policy, and records every call.
type recorder struct {
	mu      sync.Mutex
	calls   map[string][]call // type URL -> calls
	applied map[string]map[string]proto.Message
}

type call struct {
	version string
	names   []string
	err     error
}

func newRecorder() *recorder {
	return &recorder{calls: map[string][]call{}, applied: map[string]map[string]proto.Message{}}
}

const errMaglev = "cluster a: lb_policy MAGLEV is not supported by this node"

func (r *recorder) handler(typeURL string) Handler {
	return func(version string, res map[string]proto.Message) error {
		var err error
		for _, m := range res {
			if c, ok := m.(*clusterv3.Cluster); ok && c.GetLbPolicy() == clusterv3.Cluster_MAGLEV {
				err = errors.New(errMaglev)
			}
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.calls[typeURL] = append(r.calls[typeURL], call{version: version, names: sortedKeys(res), err: err})
		if err == nil {
			r.applied[typeURL] = res
		}
		return err
	}
}

func (r *recorder) get(typeURL string) []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]call(nil), r.calls[typeURL]...)
}

// port returns the port of the applied endpoints of cluster name (0 if none).
func (r *recorder) port(name string) uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	cla, _ := r.applied[resource.EndpointType][name].(*endpointv3.ClusterLoadAssignment)
	for _, l := range cla.GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			return e.GetEndpoint().GetAddress().GetSocketAddress().GetPortValue()
		}
	}
	return 0
}

// newClient returns a started client of addr subscribed to CDS and EDS for a and b.
func newClient(t testing.TB, cfg Config, rec *recorder, tune func(*Client)) *Client {
	t.Helper()
	if cfg.NodeID == "" {
		cfg.NodeID = "node-1"
	}
	if cfg.Backoff == (Backoff{}) {
		cfg.Backoff = Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}
	}
	c, err := New(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if tune != nil {
		tune(c)
	}
	for _, typeURL := range []string{resource.ClusterType, resource.EndpointType} {
		if err := c.Subscribe(typeURL, rec.handler(typeURL), "a", "b"); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
