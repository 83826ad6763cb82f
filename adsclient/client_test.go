package adsclient

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
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
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// wait is the bound of every convergence in these tests: loopback round trips take
// milliseconds, so 5 s is slack for a loaded race-detector run, not a figure.
const wait = 5 * time.Second

var (
	cds = resource.ClusterType
	eds = resource.EndpointType
)

// TestSubscribeACKAndNACK: named CDS and EDS subscriptions get exactly their names and ACK
// them; the node is sent as Envoy sends it; an update the handler refuses is NACKed with its
// reason and the last ACKed version, the node keeps what it applied, the same content sent
// again is NACKed without reaching the handler (once per send, no loop), and the next good
// version applies.
func TestSubscribeACKAndNACK(t *testing.T) {
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	const node = "host-1/xdp/eth0"
	good := snapshot(t, "1", 8080, clusterv3.Cluster_ROUND_ROBIN)
	if err := cache.SetSnapshot(context.Background(), node, good); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, "", cache)
	srv.onNACK = func(*discoveryv3.DiscoveryRequest) { // roll the node back, as stickylb xds does
		if err := cache.SetSnapshot(context.Background(), node, good); err != nil {
			t.Error(err)
		}
	}
	rec := newRecorder()
	c := newClient(t, Config{Server: srv.addr, NodeID: node, Zone: "zone-a", UserAgentName: "stickylb-xdp",
		UserAgentVersion: "v9"}, rec, nil)

	testwait.For(t, wait, "ACK of version 1", func() (bool, string) {
		return srv.acked(node, cds, "1") && srv.acked(node, eds, "1"), fmt.Sprint(srv.requests())
	})
	for _, typeURL := range []string{cds, eds} {
		if got := rec.get(typeURL); len(got) != 1 || got[0].version != "1" || !slices.Equal(got[0].names, []string{"a", "b"}) {
			t.Fatalf("%s handler calls = %+v, want one of version 1 with a and b", typeURL, got)
		}
	}
	// The node: on the first request of each type only, with id, user agent and zone.
	firsts := map[string]int{}
	for _, r := range srv.requests() {
		if r.GetNode() == nil {
			continue
		}
		firsts[r.GetTypeUrl()]++
		n := r.GetNode()
		if n.GetId() != node || n.GetUserAgentName() != "stickylb-xdp" || n.GetUserAgentVersion() != "v9" ||
			n.GetLocality().GetZone() != "zone-a" {
			t.Errorf("node sent = %v", n)
		}
		if !slices.Equal(r.GetResourceNames(), []string{"a", "b"}) || r.GetVersionInfo() != "" {
			t.Errorf("first %s request = %v", r.GetTypeUrl(), r)
		}
	}
	if firsts[cds] != 1 || firsts[eds] != 1 {
		t.Errorf("requests carrying the node per type = %v, want one each", firsts)
	}

	// A version the node cannot apply.
	if err := cache.SetSnapshot(context.Background(), node, snapshot(t, "2", 8080, clusterv3.Cluster_MAGLEV)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, wait, "NACK of version 2", func() (bool, string) {
		return len(srv.nacks(node, cds)) == 1, fmt.Sprint(srv.nacks(node, cds))
	})
	n := srv.nacks(node, cds)[0]
	if n.GetErrorDetail().GetMessage() != errMaglev || n.GetVersionInfo() != "1" {
		t.Errorf("NACK = %v, want the reason %q and version 1", n, errMaglev)
	}
	if v := c.Version(cds); v != "1" {
		t.Errorf("CDS version after the NACK = %q, want 1", v)
	}
	// The server sends the rejected content again: NACKed again, the handler not called.
	if err := cache.SetSnapshot(context.Background(), node, snapshot(t, "2", 8080, clusterv3.Cluster_MAGLEV)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, wait, "second NACK", func() (bool, string) {
		return len(srv.nacks(node, cds)) == 2, fmt.Sprint(srv.nacks(node, cds))
	})
	if got := srv.nacks(node, cds)[1].GetErrorDetail().GetMessage(); got != errMaglev {
		t.Errorf("second NACK reason = %q", got)
	}
	calls := rec.get(cds)
	if len(calls) != 2 || calls[0].err != nil || calls[1].version != "2" || calls[1].err == nil {
		t.Fatalf("CDS handler calls = %+v, want version 1 applied and version 2 refused once", calls)
	}

	// The next good version applies.
	if err := cache.SetSnapshot(context.Background(), node, snapshot(t, "3", 9090, clusterv3.Cluster_ROUND_ROBIN)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, wait, "ACK of version 3", func() (bool, string) {
		return srv.acked(node, cds, "3") && srv.acked(node, eds, "3"), fmt.Sprint(rec.get(cds))
	})
	if got := rec.port("a"); got != 9090 {
		t.Errorf("applied port = %d, want 9090", got)
	}
	if got := len(srv.nacks(node, cds)); got != 2 {
		t.Errorf("NACKs = %d, want 2 (one per send of the rejected version)", got)
	}
	if c.LastUpdate().IsZero() || !c.Connected() {
		t.Errorf("connected %v, last update %v", c.Connected(), c.LastUpdate())
	}

	// The collector says the same.
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c.Collector()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" || l.GetName() == "type" {
					key += "," + l.GetValue()
				}
			}
			got[key] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	for k, want := range map[string]float64{
		"stickylb_xds_connected":                     1,
		"stickylb_xds_updates_total,rejected," + cds: 2,
		"stickylb_xds_updates_total,applied," + cds:  2,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], want, got)
		}
	}
}

// TestNACKLoopIsPaced: a server that answers a NACK by sending the rejected version again
// (go-control-plane's cache with no rollback) gets each NACK after the first later than the
// one before (Backoff without jitter: 20, 40, 80 ms), the handler sees the rejected version
// once, and the next good version still applies.
func TestNACKLoopIsPaced(t *testing.T) {
	const node = "n"
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	if err := cache.SetSnapshot(context.Background(), node, snapshot(t, "1", 8080, clusterv3.Cluster_ROUND_ROBIN)); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, "", cache)
	rec := newRecorder()
	const initial = 20 * time.Millisecond
	c := newClient(t, Config{Server: srv.addr, NodeID: node, Backoff: Backoff{Initial: initial, Max: time.Second}}, rec, nil)
	testwait.For(t, wait, "ACK of version 1", func() (bool, string) { return srv.acked(node, cds, "1"), "" })
	if err := cache.SetSnapshot(context.Background(), node, snapshot(t, "2", 8080, clusterv3.Cluster_MAGLEV)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, wait, "four NACKs", func() (bool, string) {
		return len(srv.nackTimes(node, cds)) >= 4, fmt.Sprint(len(srv.nackTimes(node, cds)))
	})
	at := srv.nackTimes(node, cds)
	for i := 1; i < 4; i++ {
		// A NACK is held for its delay after the re-send arrived, so the gap between two
		// arrivals is at least that delay.
		if gap, min := at[i].Sub(at[i-1]), initial<<(i-1); gap < min {
			t.Errorf("gap before NACK %d = %v, want at least %v", i+1, gap, min)
		}
	}
	var refused int
	for _, cl := range rec.get(cds) {
		if cl.err != nil {
			refused++
		}
	}
	if refused != 1 {
		t.Errorf("handler refused %d times, want once", refused)
	}
	if err := cache.SetSnapshot(context.Background(), node, snapshot(t, "3", 9090, clusterv3.Cluster_ROUND_ROBIN)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, wait, "ACK of version 3", func() (bool, string) { return srv.acked(node, cds, "3"), "" })
	if v := c.Version(cds); v != "3" {
		t.Errorf("version = %q", v)
	}
}

// TestReconnectResumesFromAckedVersion: the control plane dies and a new one takes its
// port: the client reconnects, restates its subscriptions from the versions it ACKed (an
// identical re-send is ACKed without reaching the handler), and converges on new content.
func TestReconnectResumesFromAckedVersion(t *testing.T) {
	const node = "caddy-1"
	serve := func(addr string, snap *cachev3.Snapshot) *testServer {
		cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
		if err := cache.SetSnapshot(context.Background(), node, snap); err != nil {
			t.Fatal(err)
		}
		return startServer(t, addr, cache)
	}
	srv := serve("", snapshot(t, "1", 8080, clusterv3.Cluster_ROUND_ROBIN))
	rec := newRecorder()
	c := newClient(t, Config{Server: srv.addr, NodeID: node}, rec, nil)
	testwait.For(t, wait, "ACK of version 1", func() (bool, string) {
		return srv.acked(node, cds, "1") && srv.acked(node, eds, "1"), fmt.Sprint(srv.requests())
	})

	for i, step := range []struct {
		version string
		port    uint32
		calls   int // handler calls per type once converged
	}{
		{"1", 8080, 1}, // same state: the handler is not called again
		{"2", 9090, 2},
	} {
		srv.g.Stop()
		testwait.For(t, wait, "disconnected", func() (bool, string) { return !c.Connected(), "connected" })
		srv = serve(srv.addr, snapshot(t, step.version, step.port, clusterv3.Cluster_ROUND_ROBIN))
		testwait.For(t, wait, fmt.Sprintf("step %d: ACK of version %s", i, step.version), func() (bool, string) {
			return srv.acked(node, cds, step.version) && srv.acked(node, eds, step.version), fmt.Sprint(srv.requests())
		})
		for _, r := range srv.requests() {
			if r.GetNode() != nil && r.GetVersionInfo() != "1" { // the first request of each type
				t.Errorf("step %d: first %s request on the new stream has version %q, want the ACKed 1",
					i, r.GetTypeUrl(), r.GetVersionInfo())
			}
		}
		for _, typeURL := range []string{cds, eds} {
			if got := rec.get(typeURL); len(got) != step.calls {
				t.Errorf("step %d: %s handler calls = %+v, want %d", i, typeURL, got, step.calls)
			}
		}
		if got := rec.port("a"); got != step.port {
			t.Errorf("step %d: port = %d, want %d", i, got, step.port)
		}
		if !c.Connected() {
			t.Errorf("step %d: not connected after converging", i)
		}
	}
}

// TestNamesWildcardAndUnsubscribe: a wildcard subscription gets every resource; names
// added to a named subscription arrive at the same version; an unsubscribed type no longer
// reaches its handler.
func TestNamesWildcardAndUnsubscribe(t *testing.T) {
	const node = "n"
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	if err := cache.SetSnapshot(context.Background(), node, snapshot(t, "1", 8080, clusterv3.Cluster_ROUND_ROBIN)); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, "", cache)
	c, err := New(Config{Server: srv.addr, NodeID: node}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	if err := c.Subscribe(cds, rec.handler(cds)); err != nil { // wildcard
		t.Fatal(err)
	}
	if err := c.Subscribe(eds, rec.handler(eds), "a"); err != nil {
		t.Fatal(err)
	}
	if err := c.Subscribe(eds, rec.handler(eds), "b"); err == nil {
		t.Error("a second subscription to one type was accepted")
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lastNames := func(typeURL string) []string {
		calls := rec.get(typeURL)
		if len(calls) == 0 {
			return nil
		}
		return calls[len(calls)-1].names
	}
	testwait.For(t, wait, "wildcard CDS and EDS a", func() (bool, string) {
		return slices.Equal(lastNames(cds), []string{"a", "b", "c"}) && slices.Equal(lastNames(eds), []string{"a"}),
			fmt.Sprint(lastNames(cds), lastNames(eds))
	})
	if err := c.SetNames(cds, "a"); err == nil {
		t.Error("a wildcard subscription took names")
	}
	if err := c.SetNames(eds, "a", "c"); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, wait, "EDS a and c", func() (bool, string) {
		return slices.Equal(lastNames(eds), []string{"a", "c"}), fmt.Sprint(rec.get(eds))
	})
	c.Unsubscribe(eds)
	testwait.For(t, wait, "the server told of the unsubscription", func() (bool, string) {
		rs := srv.requests()
		last := rs[len(rs)-1]
		return last.GetTypeUrl() == eds && len(last.GetResourceNames()) == 0, fmt.Sprint(last)
	})
	before := len(rec.get(eds))
	if err := cache.SetSnapshot(context.Background(), node, snapshot(t, "2", 9090, clusterv3.Cluster_ROUND_ROBIN)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, wait, "ACK of CDS 2", func() (bool, string) { return srv.acked(node, cds, "2"), "" })
	if got := len(rec.get(eds)); got != before {
		t.Errorf("EDS handler called %d times after Unsubscribe", got-before)
	}
}

// TestDecode: resources are keyed by their name (or their wrapper's); a response that
// repeats a name, holds another type, or does not decode is an error (which NACKs it
// without reaching the handler).
func TestDecode(t *testing.T) {
	resp := &discoveryv3.DiscoveryResponse{TypeUrl: cds, VersionInfo: "1"}
	a, err := anypb.New(&clusterv3.Cluster{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	w, err := anypb.New(&discoveryv3.Resource{Name: "wrapped", Resource: a})
	if err != nil {
		t.Fatal(err)
	}
	resp.Resources = []*anypb.Any{a, w}
	got, err := decode(resp, nil)
	if err != nil || len(got) != 2 || got["a"] == nil || got["wrapped"] == nil {
		t.Fatalf("decode = %v, %v; want a and wrapped", got, err)
	}
	if got, err := decode(resp, map[string]bool{"wrapped": true}); err != nil || len(got) != 1 {
		t.Errorf("decode of one name = %v, %v", got, err)
	}
	resp.Resources = nil
	resp.Resources = append(resp.Resources, a, a)
	if _, err := decode(resp, nil); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate: err = %v", err)
	}
	resp.TypeUrl = eds
	resp.Resources = resp.Resources[:1]
	if _, err := decode(resp, nil); err == nil || !strings.Contains(err.Error(), "in a") {
		t.Errorf("wrong type: err = %v", err)
	}
	resp.TypeUrl = cds
	resp.Resources[0].Value = []byte{0xff}
	if _, err := decode(resp, nil); err == nil {
		t.Error("garbage decoded")
	}
}

// TestCloseWaitsForGoroutines: once Close returns, none of the client's goroutines (the
// stream loop, the receiver) is left, whether it was streaming or waiting to reconnect;
// cancelling the context given to Start ends them too.
func TestCloseWaitsForGoroutines(t *testing.T) {
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	if err := cache.SetSnapshot(context.Background(), "n", snapshot(t, "1", 1, clusterv3.Cluster_ROUND_ROBIN)); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, "", cache)
	// ours counts the client's goroutines, and those of them parked (not running or
	// runnable: waiting on a channel, a timer, the network).
	ours := func() (n, parked int) {
		buf := make([]byte, 1<<20)
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if !strings.Contains(g, "adsclient.(*Client)") {
				continue
			}
			n++
			if head, _, _ := strings.Cut(g, "\n"); !strings.Contains(head, "[running]") && !strings.Contains(head, "[runnable]") {
				parked++
			}
		}
		return n, parked
	}
	// Close has waited for every goroutine to run its deferred WaitGroup Done, but the
	// runtime lists a goroutine until it has returned from it: one may still be exiting,
	// running, never parked.
	goneAfterClose := func(what string) {
		t.Helper()
		if n, parked := ours(); parked != 0 {
			t.Errorf("%s: %d client goroutines after Close, %d of them parked (not exiting)", what, n, parked)
		}
		testwait.For(t, time.Second, what+": the client's goroutines exit", func() (bool, string) {
			n, _ := ours()
			return n == 0, fmt.Sprintf("%d left", n)
		})
	}
	for _, up := range []bool{true, false} {
		c := newClient(t, Config{Server: srv.addr, NodeID: "n"}, newRecorder(), nil)
		if up {
			testwait.For(t, wait, "ACK", func() (bool, string) { return srv.acked("n", cds, "1"), "" })
		} else {
			srv.g.Stop()
			testwait.For(t, wait, "disconnected", func() (bool, string) { return !c.Connected(), "" })
		}
		if n, _ := ours(); n == 0 {
			t.Fatal("no client goroutine found before Close: the check sees nothing")
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		goneAfterClose(fmt.Sprintf("up=%v", up))
		if err := c.Close(); err != nil { // twice is fine
			t.Fatal(err)
		}
	}

	// Cancelling Start's context stops the client as Close does.
	c, err := New(Config{Server: srv.addr, NodeID: "n"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err == nil {
		t.Error("started twice")
	}
	cancel()
	testwait.For(t, wait, "goroutines gone after cancel", func() (bool, string) {
		n, _ := ours()
		return n == 0, fmt.Sprint(n)
	})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCloseWaitsForTheHandler: Close returns only once the handler running on the
// client's goroutine has returned: it waits for its goroutines, not only cancels them.
func TestCloseWaitsForTheHandler(t *testing.T) {
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	if err := cache.SetSnapshot(context.Background(), "n", snapshot(t, "1", 1, clusterv3.Cluster_ROUND_ROBIN)); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, "", cache)
	c, err := New(Config{Server: srv.addr, NodeID: "n"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	if err := c.Subscribe(cds, func(string, map[string]proto.Message) error {
		once.Do(func() { close(entered) })
		<-release
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	testwait.Recv(t, entered, wait, "the handler called")
	closed := make(chan struct{})
	go func() { _ = c.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while the handler ran")
	case <-time.After(100 * time.Millisecond): // Close without the wait returns in microseconds
	}
	close(release)
	testwait.Recv(t, closed, wait, "Close once the handler returned")
}

// TestLargeResponse: one EDS response above gRPC's default 4 MiB limit (90,000 endpoints
// with host names) is received and applied. Skipped under -short: 4 s with -race.
func TestLargeResponse(t *testing.T) {
	if testing.Short() {
		t.Skip("a 4 MiB response: slow under -race")
	}
	const endpoints = 90000
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: "a", Endpoints: []*endpointv3.LocalityLbEndpoints{{}}}
	for i := range endpoints {
		cla.Endpoints[0].LbEndpoints = append(cla.Endpoints[0].LbEndpoints, &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Hostname: fmt.Sprintf("backend-%d.pool.example", i),
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address: fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 8080}}}},
			}},
		})
	}
	if size := proto.Size(cla); size <= 4<<20 {
		t.Fatalf("response of %d bytes does not exceed 4 MiB", size)
	}
	snap, err := cachev3.NewSnapshot("1", map[resource.Type][]types.Resource{resource.EndpointType: {cla}})
	if err != nil {
		t.Fatal(err)
	}
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	if err := cache.SetSnapshot(context.Background(), "n", snap); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, "", cache)
	c, err := New(Config{Server: srv.addr, NodeID: "n"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan int, 1)
	if err := c.Subscribe(eds, func(_ string, res map[string]proto.Message) error {
		got <- len(res["a"].(*endpointv3.ClusterLoadAssignment).GetEndpoints()[0].GetLbEndpoints())
		return nil
	}, "a"); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case n := <-got:
		if n != endpoints {
			t.Errorf("applied %d endpoints, want %d", n, endpoints)
		}
	case <-time.After(wait):
		c.mu.Lock()
		defer c.mu.Unlock()
		t.Fatalf("nothing applied within %s; last error %v", wait, c.lastErr)
	}
}
