package xds

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/stickylb/stickylb/internal/testkit/grpctest"
	"github.com/stickylb/stickylb/internal/testkit/testcert"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// TestNodesPerIdentity: under mTLS one certificate (DNS SAN host-a) may hold at most
// --max-nodes-per-identity node ids, checked before the fleet-wide --max-nodes, so another
// host's certificate still gets a stream when host-a asks for every slot.
func TestNodesPerIdentity(t *testing.T) {
	ca := testcert.NewCA(t, "test ca")
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zaptest.NewLogger(t), WithNodeIdentity(), WithMaxNodes(50))
	dial := mtlsXDS(t, s, ca)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	hostA := dial(ca.Issue(testcert.Leaf{DNS: []string{"host-a"}}))
	hostB := dial(ca.Issue(testcert.Leaf{DNS: []string{"host-b"}}))
	held := 0
	for i := 0; i < 50; i++ {
		_, _, err := adsNode(ctx, hostA, fmt.Sprintf("host-a/%d", i), "zone-a")
		switch status.Code(err) {
		case codes.OK:
			held++
		case codes.ResourceExhausted:
		default:
			t.Fatalf("host-a/%d: %v", i, err)
		}
	}
	_, _, errB := adsNode(ctx, hostB, "host-b/caddy", "zone-a")
	t.Logf("host-a holds %d of 50 slots; host-b/caddy: %v; refused: %d over the identity's cap, %d over --max-nodes",
		held, errB, s.Stats.Refused.Of(RefusedIdentityNodes), s.Stats.Refused.Of(RefusedMaxNodes))
	if held != DefaultMaxNodesPerIdentity {
		t.Errorf("host-a holds %d node ids, want %d (the per-identity default)", held, DefaultMaxNodesPerIdentity)
	}
	if errB != nil {
		t.Errorf("host-b/caddy with its own certificate: %v, want admitted", errB)
	}
	if got := s.Stats.Refused.Of(RefusedIdentityNodes); got != 50-DefaultMaxNodesPerIdentity {
		t.Errorf("%d refusals counted over the identity's cap, want %d", got, 50-DefaultMaxNodesPerIdentity)
	}
}

// TestNodesPerIdentityCheckedFirst: with both caps reached, a new id of the identity at its
// own cap is refused for that cap (the global one is not what stopped it); a new identity
// is refused for the global one; a freed id is taken again.
func TestNodesPerIdentityCheckedFirst(t *testing.T) {
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zap.NewNop(), WithMaxNodes(3), WithMaxNodesPerIdentity(2))
	s.testNodeFrom(t, "10.0.0.1", "a1", codes.OK)
	s.testNodeFrom(t, "10.0.0.1", "a2", codes.OK)
	s.testNodeFrom(t, "10.0.0.1", "a3", codes.ResourceExhausted)
	s.testNodeFrom(t, "10.0.0.2", "b1", codes.OK)
	s.testNodeFrom(t, "10.0.0.3", "c1", codes.ResourceExhausted)
	if a, g := s.Stats.Refused.Of(RefusedIdentityNodes), s.Stats.Refused.Of(RefusedMaxNodes); a != 1 || g != 1 {
		t.Fatalf("refused %d over the identity's cap and %d over the global one, want 1 and 1", a, g)
	}
	s.closeNode(t, "a1")
	s.testNodeFrom(t, "10.0.0.1", "a3", codes.OK)
}

// testNodeFrom opens a transport-less stream from addr (as testNode does) and checks the
// code its first request gets.
func (s *Server) testNodeFrom(t *testing.T, addr, id string, want codes.Code) {
	t.Helper()
	s.mu.Lock()
	sid := -int64(len(s.streams)) - 1000
	for s.streams[sid] != nil {
		sid--
	}
	s.mu.Unlock()
	if err := s.open(peerContext(addr), sid); err != nil {
		t.Fatal(err)
	}
	_, err := s.request(sid, &corev3.Node{Id: id, Locality: &corev3.Locality{Zone: "zone-a"}}, resource.ClusterType, "", "", false, "")
	if status.Code(err) != want {
		t.Fatalf("node %s from %s: %v, want %v", id, addr, err, want)
	}
	if err != nil {
		s.closed(sid)
	}
}

// closeNode closes every stream of node id, as the server's callbacks would.
func (s *Server) closeNode(t *testing.T, id string) {
	t.Helper()
	s.mu.Lock()
	sts := s.nodeStreamsLocked(id)
	s.mu.Unlock()
	for _, st := range sts {
		s.closed(st.id)
	}
}

// silentFlood opens n streams over conns connections that never send a request and
// reports, per stream, when and how the server ended it.
type silentFlood struct {
	start time.Time
	mu    sync.Mutex
	ended map[codes.Code][]time.Duration
	open  int
}

func floodSilently(ctx context.Context, t *testing.T, dial func() *grpc.ClientConn, n, conns int) *silentFlood {
	t.Helper()
	f := &silentFlood{start: time.Now(), ended: map[codes.Code][]time.Duration{}, open: n}
	ccs := make([]*grpc.ClientConn, conns)
	for i := range ccs {
		ccs[i] = dial()
	}
	for i := 0; i < n; i++ {
		st, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(ccs[i%conns]).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		go func() {
			_, err := st.Recv()
			f.mu.Lock()
			defer f.mu.Unlock()
			f.open--
			c := status.Code(err)
			f.ended[c] = append(f.ended[c], time.Since(f.start))
		}()
	}
	return f
}

// held is how many of the flood's streams the server still holds.
func (f *silentFlood) held() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.open
}

// count is how many of the flood's streams ended with code.
func (f *silentFlood) count(code codes.Code) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.ended[code])
}

func (f *silentFlood) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%d held", f.open)
	for c, ts := range f.ended {
		last := time.Duration(0)
		for _, d := range ts {
			last = max(last, d)
		}
		fmt.Fprintf(&b, "; %d ended %v (last %s)", len(ts), c, last.Round(time.Millisecond))
	}
	return b.String()
}

// TestSilentStreamsEnd: streams that never send a request are refused at once beyond
// --max-streams and ended at the first-request deadline otherwise; none is held after it.
func TestSilentStreamsEnd(t *testing.T) {
	const deadline, total, maxStreams = 2 * time.Second, 600, 400
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zap.NewNop(), WithFirstRequestTimeout(deadline),
		WithMaxStreams(maxStreams), WithMaxNodesPerIdentity(100))
	dial := tcpXDS(t, s)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	f := floodSilently(ctx, t, dial, total, 40)
	opened := time.Since(f.start)
	// Slack: 600 streams to open and end on a loaded 2-core machine.
	const slack = 5 * time.Second
	testwait.For(t, deadline+slack, "every silent stream refused or ended", func() (bool, string) {
		return f.held() == 0, fmt.Sprintf("%s; the server counts %d streams", f, s.Streams())
	})
	t.Logf("%d silent streams opened in %s, --max-streams %d, first-request deadline %s: after %s: %s; %d refused over --max-streams, %d ended at the deadline",
		total, opened.Round(time.Millisecond), maxStreams, deadline, time.Since(f.start).Round(time.Millisecond), f,
		s.Stats.Refused.Of(RefusedMaxStreams), s.Stats.FirstRequestTimeouts.Load())
	refused, timedOut := f.count(codes.ResourceExhausted), f.count(codes.DeadlineExceeded)
	f.mu.Lock()
	early := 0
	for _, d := range f.ended[codes.DeadlineExceeded] {
		if d < deadline {
			early++
		}
	}
	f.mu.Unlock()
	if refused+timedOut != total || early != 0 {
		t.Fatalf("%d refused, %d ended at the deadline (%d of them before it), %d otherwise", refused, timedOut, early, total-refused-timedOut)
	}
	if got := s.Stats.Refused.Of(RefusedMaxStreams); got != uint64(refused) {
		t.Fatalf("%d refusals counted over --max-streams, %d seen", got, refused)
	}
	// Opened well within the deadline, every stream was open at once: --max-streams decided
	// exactly (TestMaxStreams checks that on its own, whatever the load).
	if opened < deadline/2 && refused != total-maxStreams {
		t.Fatalf("%d refused, want %d", refused, total-maxStreams)
	}
	testwait.For(t, 5*time.Second, "the server's stream count back to 0", func() (bool, string) {
		return s.Streams() == 0, fmt.Sprint(s.Streams())
	})
}

// TestMaxStreams: beyond --max-streams a stream is refused as it opens, silent or not; a
// closed stream's place is free again.
func TestMaxStreams(t *testing.T) {
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zap.NewNop(), WithMaxStreams(5))
	dial := tcpXDS(t, s)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	silent := floodSilently(ctx, t, dial, 4, 1)
	testwait.For(t, 5*time.Second, "4 silent streams open", func() (bool, string) { return s.Streams() == 4, fmt.Sprint(s.Streams()) })
	cc := dial()
	_, closeNode, err := adsNode(ctx, cc, "n", "zone-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := adsNode(ctx, cc, "m", "zone-a"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a sixth stream with --max-streams 5: %v, want ResourceExhausted", err)
	}
	closeNode()
	testwait.For(t, 5*time.Second, "the closed stream's place free", func() (bool, string) { return s.Streams() == 4, fmt.Sprint(s.Streams()) })
	if _, _, err := adsNode(ctx, cc, "m", "zone-a"); err != nil {
		t.Fatalf("once a stream closed: %v", err)
	}
	if got, held := s.Stats.Refused.Of(RefusedMaxStreams), silent.held(); got != 1 || held != 4 {
		t.Fatalf("%d refusals counted over --max-streams (want 1); %d silent streams held (want 4)", got, held)
	}
}

// bigNode is a node whose metadata carries size bytes: all of it is the client's to send,
// none of it the server's to keep.
func bigNode(id string, size int) *corev3.Node {
	md, _ := structpb.NewStruct(map[string]any{"padding": strings.Repeat("x", size)})
	return &corev3.Node{Id: id, Locality: &corev3.Locality{Zone: "zone-a"}, Metadata: md, UserAgentName: "envoy"}
}

// TestNodeMessageBounded: 60 streams under one node id, each whose first request carries a
// 3.5 MB node: the server admits --max-streams-per-node of them and keeps only what it uses
// of each node (id, zone, user agent), so its heap grows by far less than one node's size.
func TestNodeMessageBounded(t *testing.T) {
	const streams, size = 60, 3_500_000
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	prewarmGoroutines(4 * streams)
	base := settledHeap()
	s := NewServer(ctx, bigPools(t, 1, 3, 8080), nil, zap.NewNop())
	cc := tcpXDS(t, s)()
	admitted := 0
	var cancels []context.CancelFunc
	for i := 0; i < streams; i++ {
		sctx, scancel := context.WithCancel(ctx)
		cancels = append(cancels, scancel)
		st, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(sctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&discoverygrpc.DiscoveryRequest{Node: bigNode("fat", size), TypeUrl: resource.ClusterType}); err != nil {
			t.Fatal(err)
		}
		_, err = st.Recv()
		switch status.Code(err) {
		case codes.OK:
			admitted++
		case codes.ResourceExhausted:
		default:
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	held := settledHeap() - base
	t.Logf("%d streams under one id with a %.1f MB node: %d admitted, heap %.1f MB above the start",
		streams, float64(size)/1e6, admitted, float64(held)/1e6)
	for _, c := range cancels {
		c()
	}
	if admitted != DefaultMaxStreamsPerNode {
		t.Errorf("%d streams admitted under one node id, want %d", admitted, DefaultMaxStreamsPerNode)
	}
	if held > size {
		t.Errorf("the server holds %.1f MB more after the streams, more than one node's %.1f MB", float64(held)/1e6, float64(size)/1e6)
	}
}

// peerContext is a stream context whose peer is addr (port 1).
func peerContext(addr string) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(addr), Port: 1}})
}

// TestUnknownTypes: requests for type URLs the server does not serve open no watch and keep
// no state, and are counted; the stream keeps being served (an Envoy may ask for a type we
// do not serve) until it has asked for maxUnknownTypes distinct ones, when it is ended.
func TestUnknownTypes(t *testing.T) {
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zaptest.NewLogger(t))
	cc := tcpXDS(t, s)()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	st, closeStream, err := adsNode(ctx, cc, "curious", "zone-a")
	if err != nil {
		t.Fatal(err)
	}
	defer closeStream()
	const few = 50
	for i := 0; i < few; i++ {
		if err := st.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: fmt.Sprintf("type.googleapis.com/made.up.T%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	// A served type after them: its answer comes once the server has read them all.
	if err := st.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: resource.ListenerType}); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("after %d unknown types the stream ended: %v", few, err)
		}
		if resp.GetTypeUrl() == resource.ListenerType {
			break
		}
	}
	info := s.namedCache.GetStatusInfo(s.cacheKeys("curious")[0])
	watches := info.GetNumWatches()
	t.Logf("after %d requests for unknown types and one for listeners: %d watches, %d unknown-type requests counted", few, watches, s.Stats.UnknownTypes.Load())
	if watches != 0 {
		t.Errorf("%d watches open, want 0 (the clusters and listeners were answered; the rest are not served)", watches)
	}
	if got := s.Stats.UnknownTypes.Load(); got != few {
		t.Errorf("%d unknown-type requests counted, want %d", got, few)
	}
	// The same types again are not new: the stream stays.
	for i := 0; i < few; i++ {
		if err := st.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: fmt.Sprintf("type.googleapis.com/made.up.T%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := few; i < few+maxUnknownTypes; i++ {
		if err := st.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: fmt.Sprintf("type.googleapis.com/made.up.T%d", i)}); err != nil {
			break // the server ended the stream
		}
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case err := <-ended:
		t.Logf("after %d distinct unknown types: %v; %d streams ended for it", few+maxUnknownTypes, err, s.Stats.UnknownTypeEnds.Load())
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("the stream ended with %v, want InvalidArgument", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the stream still open 5 s after asking for %d distinct unknown types (%d watches)",
			few+maxUnknownTypes, s.namedCache.GetStatusInfo(s.cacheKeys("curious")[0]).GetNumWatches())
	}
	if got := s.Stats.UnknownTypeEnds.Load(); got != 1 {
		t.Fatalf("%d streams counted as ended for unknown types, want 1", got)
	}
}

// TestIDTakenLogged: without TLS a host that reaches the server first holds a node id, and
// the node's own stream is refused (the rule stays: see docs/xds.md); the refusal is
// logged with both identities and counted.
func TestIDTakenLogged(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zap.New(core))
	s.testNodeFrom(t, "127.0.0.2", "victim", codes.OK)
	s.testNodeFrom(t, "127.0.0.1", "victim", codes.AlreadyExists)
	var found []string
	for _, e := range logs.All() {
		f := e.ContextMap()
		found = append(found, fmt.Sprintf("%s %v", e.Message, f))
		if f["node"] == "victim" && f["identity"] == "addr:127.0.0.1" && f["holder"] == "addr:127.0.0.2" {
			found = nil
			break
		}
	}
	if found != nil {
		t.Errorf("no log line names the refused identity and the holder's: %q", found)
	}
	if got := s.Stats.Refused.Of(RefusedIDTaken); got != 1 {
		t.Errorf("%d refusals counted as an id taken, want 1", got)
	}
}

// TestEveryStreamIsGuarded: every stream method Register serves (ADS and the four per-type
// services, state-of-the-world and delta) goes through the limits: a silent stream on any
// of them is ended at the first-request deadline.
func TestEveryStreamIsGuarded(t *testing.T) {
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zap.NewNop(), WithFirstRequestTimeout(300*time.Millisecond))
	cc := tcpXDS(t, s)()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	methods := 0
	for _, desc := range []grpc.ServiceDesc{discoverygrpc.AggregatedDiscoveryService_ServiceDesc, clusterservice.ClusterDiscoveryService_ServiceDesc,
		endpointservice.EndpointDiscoveryService_ServiceDesc, listenerservice.ListenerDiscoveryService_ServiceDesc, routeservice.RouteDiscoveryService_ServiceDesc} {
		for _, sd := range desc.Streams {
			methods++
			method := "/" + desc.ServiceName + "/" + sd.StreamName
			st, err := cc.NewStream(ctx, &grpc.StreamDesc{StreamName: sd.StreamName, ServerStreams: true, ClientStreams: true}, method)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err = st.RecvMsg(new(discoverygrpc.DiscoveryResponse))
			if status.Code(err) != codes.DeadlineExceeded {
				t.Errorf("%s: a silent stream ended with %v after %s, want DeadlineExceeded", method, err, time.Since(start).Round(time.Millisecond))
			}
		}
	}
	if methods != 10 {
		t.Fatalf("%d stream methods registered, want 10", methods)
	}
	if got := s.Stats.FirstRequestTimeouts.Load(); got != 10 {
		t.Fatalf("%d first-request timeouts counted, want 10", got)
	}
}

// TestStreamsPerConnection: a connection carries at most --max-streams-per-conn streams at
// once (HTTP/2 MAX_CONCURRENT_STREAMS): the next waits until one closes.
func TestStreamsPerConnection(t *testing.T) {
	const perConn = 4
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zap.NewNop(), WithMaxStreamsPerConn(perConn))
	addr := grpctest.Serve(t, s.Register, s.GRPCServerOptions()...)
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var closers []context.CancelFunc
	for i := 0; i < perConn; i++ {
		_, c, err := adsNode(ctx, cc, fmt.Sprintf("n%d", i), "zone-a")
		if err != nil {
			t.Fatal(err)
		}
		closers = append(closers, c)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := adsNode(ctx, cc, "late", "zone-a")
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("stream %d on one connection was served at once (%v); the server counts %d streams", perConn+1, err, s.Streams())
	case <-time.After(500 * time.Millisecond):
	}
	if n := s.Streams(); n != perConn {
		t.Fatalf("the server counts %d streams, want %d", n, perConn)
	}
	closers[0]()
	if err := testwait.Recv(t, done, 10*time.Second, "the waiting stream served once one closed"); err != nil {
		t.Fatal(err)
	}
}

// fromAddr dials addr from the loopback address ip: each is its own identity without TLS.
func fromAddr(t *testing.T, addr, ip string) *grpc.ClientConn {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// TestStreamsPerIdentity: one identity holds at most --max-nodes-per-identity x
// --max-streams-per-node streams, those waiting for their first request included, so
// silent streams from one host do not fill --max-streams for the others.
func TestStreamsPerIdentity(t *testing.T) {
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zap.NewNop(), WithMaxNodesPerIdentity(2), WithMaxStreamsPerNode(3))
	addr := grpctest.Serve(t, s.Register)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	f := floodSilently(ctx, t, func() *grpc.ClientConn { return fromAddr(t, addr, "127.0.0.1") }, 10, 2)
	testwait.For(t, 5*time.Second, "4 of 10 silent streams refused", func() (bool, string) {
		return f.count(codes.ResourceExhausted) == 4, f.String()
	})
	if _, _, err := adsNode(ctx, fromAddr(t, addr, "127.0.0.2"), "other-host", "zone-a"); err != nil {
		t.Fatalf("another identity: %v", err)
	}
	if got := s.Stats.Refused.Of(RefusedIdentityStreams); got != 4 {
		t.Fatalf("%d refusals counted for the identity's streams, want 4", got)
	}
}

// TestNodeOnAnUnknownTypeRequest: the first request of a stream carries its node whatever
// its type; when that type is one the server does not serve, the node still admits the
// stream on its next request (an Envoy may ask for runtime first).
func TestNodeOnAnUnknownTypeRequest(t *testing.T) {
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zap.NewNop())
	cc := tcpXDS(t, s)()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	st, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "runtime-first", Locality: &corev3.Locality{Zone: "zone-a"}}
	if err := st.Send(&discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.RuntimeType}); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil || resp.GetTypeUrl() != resource.ClusterType {
		t.Fatalf("clusters after a runtime request: %v %v", resp.GetTypeUrl(), err)
	}
	if s.streamsOf("runtime-first") != 1 {
		t.Fatalf("the node is not admitted: %v", s.Nodes())
	}
}

// TestNodeStringsBounded: a node id, zone or user agent over its bound is refused, and
// counted; what the server keeps of a request is its node's id, zone and user agent, and
// at most maxErrorDetail bytes of a NACK's message.
func TestNodeStringsBounded(t *testing.T) {
	s := NewServer(t.Context(), bigPools(t, 1, 3, 8080), nil, zap.NewNop())
	for _, n := range []*corev3.Node{
		{Id: strings.Repeat("i", 1<<20)},
		{Id: "z", Locality: &corev3.Locality{Zone: strings.Repeat("z", maxNodeZoneLength+1)}},
		{Id: "u", UserAgentName: strings.Repeat("u", 1<<20)},
	} {
		// As the guard hands it on: cut to its bounds plus one byte.
		n = trimNode(n)
		if size := proto.Size(n); size > maxNodeIDLength+maxUserAgentLength+16 {
			t.Errorf("a trimmed node is %d bytes", size)
		}
		s.mu.Lock()
		st := &stream{id: 1, key: "stream/1"}
		err := s.checkAdmissionLocked(st, n)
		s.mu.Unlock()
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("node %.40v: %v, want InvalidArgument", n, err)
		}
		s.refused(err, peerIdentity{name: "addr:127.0.0.1"}, n.GetId())
	}
	if got := s.Stats.Refused.Of(RefusedInvalidNode); got != 3 {
		t.Errorf("%d refusals counted as invalid nodes, want 3", got)
	}
	req := &discoverygrpc.DiscoveryRequest{Node: bigNode("fat", 1<<20), TypeUrl: resource.ClusterType,
		ErrorDetail: status.New(codes.InvalidArgument, strings.Repeat("e", 1<<20)).Proto()}
	req.Node.Extensions = []*corev3.Extension{{Name: "envoy.filters.http.router"}}
	trimRequest(req)
	if size := proto.Size(req); size > maxErrorDetail+200 {
		t.Fatalf("a trimmed request is %d bytes: %.200v", size, req)
	}
	if req.GetNode().GetId() != "fat" || req.GetNode().GetLocality().GetZone() != "zone-a" || req.GetNode().GetUserAgentName() != "envoy" ||
		req.GetErrorDetail().GetCode() != int32(codes.InvalidArgument) {
		t.Fatalf("trimmed away what the server uses: %.300v", req)
	}
}

// TestCollectAfterBurst: the memory of a burst of streams is collected once it is over
// (under a quarter of its peak still open), once per burst, and at most every
// burstCollection; a small burst is left to the runtime.
func TestCollectAfterBurst(t *testing.T) {
	l := defaultLimits()
	l.nodesPerIdentity = 1 << 20
	open := func(n int) []func() {
		var rel []func()
		for i := 0; i < n; i++ {
			r, err := l.take("addr:127.0.0.1")
			if err != nil {
				t.Fatal(err)
			}
			rel = append(rel, r)
		}
		return rel
	}
	release := func(rel []func()) {
		for _, r := range rel {
			r()
		}
	}
	release(open(burstStreams - 1))
	if !l.collected.IsZero() {
		t.Fatalf("a burst of %d streams collected", burstStreams-1)
	}
	rel := open(burstStreams)
	release(rel[:burstStreams/2])
	if !l.collected.IsZero() {
		t.Fatal("collected with half the burst still open")
	}
	release(rel[burstStreams/2 : burstStreams*3/4+1])
	first := l.collected
	if first.IsZero() {
		t.Fatal("not collected with a quarter of the burst open")
	}
	release(rel[burstStreams*3/4+1:])
	release(open(burstStreams))
	if l.collected != first {
		t.Fatalf("collected again %s after the last collection", l.collected.Sub(first))
	}
	l.collected = l.collected.Add(-burstCollection)
	release(open(burstStreams))
	if l.collected == first.Add(-burstCollection) {
		t.Fatal("a burst after burstCollection not collected")
	}
}
