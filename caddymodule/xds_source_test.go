package caddymodule

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/stickylb/stickylb/adsclient"
	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
)

// sourceWith returns a source serving service "api" of v for a node of zone, with no
// subscription behind it (no client, no file): what GetUpstreams reads is memory only.
func sourceWith(v *xdsView, zone string) *XDSUpstreams {
	sub := &xdsSub{}
	sub.view.Store(v)
	return &XDSUpstreams{Service: "api", Zone: zone, sub: sub}
}

func dials(t *testing.T, x *XDSUpstreams) []string {
	t.Helper()
	ups, err := x.GetUpstreams(nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, u := range ups {
		out = append(out, u.Dial)
	}
	return out
}

// TestXDSSourceFreshNoIO: every call returns new *Upstream values (Caddy writes into them)
// naming the same backends, from memory: the source has no client and no file behind it,
// and a call allocates exactly the slice and the values.
func TestXDSSourceFreshNoIO(t *testing.T) {
	v := &xdsView{Services: map[string]*xdsService{"api": {CrossZone: true, Backends: []xdsBackend{
		{ID: "a", Dial: "10.0.0.1:80", Weight: 1, Health: "healthy"},
		{ID: "b", Dial: "10.0.0.2:80", Weight: 1, Health: "healthy"},
		{ID: "c", Dial: "10.0.0.3:80", Weight: 1, Health: "unknown"},
	}}}}
	x := sourceWith(v, "")
	first, err := x.GetUpstreams(nil)
	if err != nil {
		t.Fatal(err)
	}
	first[0].MaxRequests = 7 // as Caddy's provisioning writes
	second, _ := x.GetUpstreams(nil)
	if len(first) != 3 || len(second) != 3 {
		t.Fatalf("got %d and %d upstreams, want 3", len(first), len(second))
	}
	for i := range first {
		if first[i] == second[i] || first[i].Dial != second[i].Dial {
			t.Fatalf("upstream %d: the same value twice or different backends (%p %s, %p %s)", i, first[i], first[i].Dial, second[i], second[i].Dial)
		}
	}
	if second[0].MaxRequests != 0 {
		t.Fatal("a write into one call's upstream shows in the next call's")
	}
	if a := testing.AllocsPerRun(100, func() { _, _ = x.GetUpstreams(nil) }); a != 2 {
		t.Fatalf("GetUpstreams allocates %v times per call, want 2 (the slice and the values)", a)
	}
	if _, err := (&XDSUpstreams{Service: "api", sub: &xdsSub{}}).GetUpstreams(nil); err == nil {
		t.Fatal("no view yet: want an error")
	}
	if _, err := sourceWith(v, "").withService("nope").GetUpstreams(nil); err == nil {
		t.Fatal("a service not in the view: want an error")
	}
}

func (x *XDSUpstreams) withService(s string) *XDSUpstreams { x.Service = s; return x }

// TestXDSSourcePick: healthy and draining backends; the node's zone only when cross_zone is
// false and the zone has a healthy backend; fail open to every non-draining backend.
func TestXDSSourcePick(t *testing.T) {
	// Backend "a" dials 10.0.0.1:80, "b" 10.0.0.2:80, and so on.
	b := func(name, zone, h string, drain bool) xdsBackend {
		return xdsBackend{ID: name, Dial: fmt.Sprintf("10.0.0.%d:80", name[0]-'a'+1), Weight: 1, Zone: zone, Health: h, Drain: drain}
	}
	for _, tc := range []struct {
		name  string
		cross bool
		zone  string
		bs    []xdsBackend
		want  string
	}{
		{"unhealthy left out, draining kept", true, "", []xdsBackend{b("a", "", "healthy", false), b("b", "", "unhealthy", false), b("c", "", "healthy", true), b("d", "", "unknown", false)}, "a c d"},
		{"own zone only", false, "z1", []xdsBackend{b("a", "z1", "healthy", false), b("b", "z2", "healthy", false), b("c", "z1", "healthy", true)}, "a c"},
		{"cross_zone true: every zone", true, "z1", []xdsBackend{b("a", "z1", "healthy", false), b("b", "z2", "healthy", false)}, "a b"},
		{"own zone has only draining or down: every zone", false, "z1", []xdsBackend{b("a", "z1", "unhealthy", false), b("c", "z1", "healthy", true), b("b", "z2", "healthy", false)}, "c b"},
		{"none healthy: fail open", true, "", []xdsBackend{b("a", "", "unhealthy", false), b("b", "", "unhealthy", false), b("c", "", "unhealthy", true)}, "a b"},
	} {
		v := &xdsView{Services: map[string]*xdsService{"api": {CrossZone: tc.cross, Backends: tc.bs}}}
		var names []string
		for _, d := range dials(t, sourceWith(v, tc.zone)) {
			names = append(names, string(rune('a'+d[len("10.0.0.")]-'1')))
		}
		if got := strings.Join(names, " "); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestXDSSourceApplyAndNACK: a view from the control plane's encoding is applied (weights
// and drains reach the policies' table by identity); one the node cannot take is refused
// with the reason and the last view stays.
func TestXDSSourceApplyAndNACK(t *testing.T) {
	f := poolstest.Parse(t, poolstest.CaddyFleet)
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	sub := &xdsSub{log: zaptest.NewLogger(t), path: t.TempDir() + "/view.json", key: t.Name(), server: "s", node: "n"}
	t.Cleanup(func() { xdsTable.set(sub.key, nil) })
	a := &fleetview.Assembler{Decode: fleetview.DecodeCaddy, Apply: sub.apply}
	cs, ls := fleetview.EncodeCaddy(f, nil)
	if len(cs) != 2 || cs[0].GetName() != "api" || cs[1].GetName() != "rpc" {
		t.Fatalf("the Caddy view holds %d clusters, want api and rpc (not the VIP web)", len(cs))
	}
	byName := func(ms ...proto.Message) map[string]proto.Message {
		out := map[string]proto.Message{}
		for _, m := range ms {
			out[nameOfResource(m)] = m
		}
		return out
	}
	if err := a.Clusters("1", byName(cs[0])); err != nil {
		t.Fatal(err)
	}
	if err := a.Endpoints("1", byName(ls[0])); err != nil {
		t.Fatal(err)
	}
	v := sub.view.Load()
	if v == nil || len(v.Services["api"].Backends) != 2 || v.Services["api"].CrossZone {
		t.Fatalf("applied view %+v", v)
	}
	if w, ok := xdsTable.weight("10.0.7.1:80"); !ok || w != 3 {
		t.Fatalf("weight of 10.0.7.1:80 in the source table: %v %v, want 3", w, ok)
	}
	p := &WeightedLeastConn{}
	if w := p.weight(5, &reverseproxy.Upstream{Dial: "10.0.7.1:80"}); w != 3 {
		t.Fatalf("weighted_least_conn weighs 10.0.7.1:80 %v, want the control plane's 3", w)
	}
	if !drains.drained("10.0.7.2:80") || drains.drained("10.0.7.1:80") {
		t.Fatal("the control plane's drain did not reach the drain set by identity")
	}
	if _, listed := drains.list()["10.0.7.2:80"]; listed {
		t.Fatal("a control-plane drain is listed as the operator's")
	}
	// A cluster a Caddy node cannot route (an L4 protocol) is refused; the view stays.
	bad := proto.Clone(cs[0]).(*clusterv3.Cluster)
	bad.Metadata.FilterMetadata[fleetview.MetadataKey].Fields["protocol"] = structpb.NewStringValue("udp")
	err := a.Clusters("2", byName(bad))
	if err == nil || !strings.Contains(err.Error(), "protocol") {
		t.Fatalf("a udp cluster: err %v, want a protocol error", err)
	}
	if sub.view.Load() != v {
		t.Fatal("a refused view replaced the applied one")
	}
}

// TestXDSSourceCaddyfile: the Caddyfile block fills every field.
func TestXDSSourceCaddyfile(t *testing.T) {
	d := caddyfile.NewTestDispenser(`stickylb_xds {
		server  xds.internal:18000
		service api
		node_id host-1/caddy
		zone    z1
		ca      /etc/ca.pem
		cert    /etc/c.pem
		key     /etc/k.pem
		allow_loopback
		max_message_size 4MiB
	}`)
	var x XDSUpstreams
	if err := x.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	got := []string{x.servers(), x.Service, x.NodeID, x.Zone, x.CA, x.Cert, x.Key}
	want := []string{"xds.internal:18000", "api", "host-1/caddy", "z1", "/etc/ca.pem", "/etc/c.pem", "/etc/k.pem"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("got %q, want %q", got, want)
	}
	if !x.AllowLoopback || x.MaxMessageSize != 4<<20 {
		t.Fatalf("allow_loopback %v, max_message_size %d", x.AllowLoopback, x.MaxMessageSize)
	}
	if err := x.Validate(); err != nil {
		t.Fatal(err)
	}
	for size, want := range map[string]int{"1000": 1000, "20MB": 20e6, "512kib": 512 << 10, "1GiB": 1 << 30} {
		if n, err := parseByteSize(size); err != nil || n != want {
			t.Errorf("size %s: %d %v, want %d", size, n, err, want)
		}
	}
	for _, src := range []string{"stickylb_xds {\n bogus 1\n}", "stickylb_xds {\n server\n}", "stickylb_xds extra",
		"stickylb_xds {\n allow_loopback yes\n}", "stickylb_xds {\n max_message_size\n}", "stickylb_xds {\n max_message_size 0\n}",
		"stickylb_xds {\n max_message_size 16 MiB\n}", "stickylb_xds {\n max_message_size 3GiB\n}", "stickylb_xds {\n max_message_size 5pb\n}"} {
		var y XDSUpstreams
		if err := y.UnmarshalCaddyfile(caddyfile.NewTestDispenser(src)); err == nil {
			t.Errorf("%q: no error", src)
		}
	}
	var several XDSUpstreams
	if err := several.UnmarshalCaddyfile(caddyfile.NewTestDispenser("stickylb_xds {\n server a:1 b:2 c:3\n service api\n}")); err != nil ||
		several.servers() != "a:1,b:2,c:3" {
		t.Fatalf("three servers: %q %v", several.servers(), err)
	}
	if err := (&XDSUpstreams{Server: "x:1"}).Validate(); err == nil {
		t.Error("no service: no error")
	}
}

// nameOfResource is the name an ADS client files a resource under.
func nameOfResource(m proto.Message) string {
	switch r := m.(type) {
	case *clusterv3.Cluster:
		return r.GetName()
	case *endpointv3.ClusterLoadAssignment:
		return r.GetClusterName()
	}
	return ""
}

// TestXDSSourceWeights: weighted_least_conn, over the fresh pools a source returns, splits
// new sessions by the control plane's weights (3:1 exactly at light load, its smooth round
// robin), and a draining upstream gets none.
func TestXDSSourceWeights(t *testing.T) {
	v := &xdsView{Services: map[string]*xdsService{"api": {CrossZone: true, Backends: []xdsBackend{
		{ID: "a", Dial: "10.0.0.1:80", Weight: 3, Health: "healthy"},
		{ID: "b", Dial: "10.0.0.2:80", Weight: 1, Health: "healthy"},
		{ID: "c", Dial: "10.0.0.3:80", Weight: 5, Health: "healthy", Drain: true},
	}}}}
	key := t.Name()
	xdsTable.set(key, v)
	t.Cleanup(func() { xdsTable.set(key, nil) })
	x := sourceWith(v, "")
	p := &WeightedLeastConn{}
	provision(t, p)
	hosts := map[string]*reverseproxy.Host{}
	got := map[string]int{}
	for range 400 {
		ups, err := x.GetUpstreams(nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range ups { // as Caddy's provisioning does: one Host per address
			if hosts[u.Dial] == nil {
				hosts[u.Dial] = new(reverseproxy.Host)
			}
			u.Host = hosts[u.Dial]
		}
		u := p.Select(ups, request("/"), httptest.NewRecorder())
		if u == nil {
			t.Fatal("no pick")
		}
		got[u.Dial]++
	}
	if got["10.0.0.1:80"] != 300 || got["10.0.0.2:80"] != 100 || got["10.0.0.3:80"] != 0 {
		t.Fatalf("picks %v, want 300 and 100 by the control plane's weights 3:1, none on the draining one", got)
	}
}

// TestXDSSourceSharedSubscription: sources naming one server and node share one
// subscription, which a reload's new config takes over from the old one (provisioned
// before the old one is cleaned up) and which stops when no config uses it; each
// subscription's collector is registered once per config registry.
func TestXDSSourceSharedSubscription(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	const server = "127.0.0.1:1" // nothing answers: the clients retry in the background
	ctx1, cancel1 := caddy.NewContext(caddy.Context{Context: context.Background()})
	a := &XDSUpstreams{Server: server, Service: "api", NodeID: "n1"}
	b := &XDSUpstreams{Server: server, Service: "web", NodeID: "n1"}
	c := &XDSUpstreams{Server: server, Service: "api", NodeID: "n2"}
	for _, x := range []*XDSUpstreams{a, b, c} {
		if err := x.Provision(ctx1); err != nil {
			t.Fatal(err)
		}
	}
	if a.sub != b.sub || a.sub == c.sub {
		t.Fatal("want one subscription per server and node")
	}
	mfs, err := ctx1.GetMetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := 0
	for _, mf := range mfs {
		if mf.GetName() == "stickylb_xds_connected" {
			series = len(mf.GetMetric())
		}
	}
	if series != 2 {
		t.Fatalf("stickylb_xds_connected has %d series, want one per subscription (2)", series)
	}
	// A reload: the new config's source is provisioned, then the old config cleaned up.
	ctx2, cancel2 := caddy.NewContext(caddy.Context{Context: context.Background()})
	a2 := &XDSUpstreams{Server: server, Service: "api", NodeID: "n1"}
	if err := a2.Provision(ctx2); err != nil {
		t.Fatal(err)
	}
	for _, x := range []*XDSUpstreams{a, b, c} {
		x.Cleanup()
	}
	cancel1()
	if a2.sub != a.sub {
		t.Fatal("a reload started a new subscription")
	}
	count := func() int {
		n := 0
		subPool.Range(func(_, _ any) bool { n++; return true })
		return n
	}
	if n := count(); n != 1 {
		t.Fatalf("%d subscriptions after the old config went, want 1", n)
	}
	a2.Cleanup()
	cancel2()
	if n := count(); n != 0 {
		t.Fatalf("%d subscriptions after every config went, want 0", n)
	}
}

// TestXDSSourceSavedView: a saved view is loaded back as it was; a file that is not a view
// of this server and node, or not JSON, is ignored (the source waits for the control plane).
func TestXDSSourceSavedView(t *testing.T) {
	dir := t.TempDir()
	cfg := adsclient.Config{Server: "cp:18000", NodeID: "n1"}
	v := &xdsView{Services: map[string]*xdsService{"api": {Backends: []xdsBackend{
		{ID: "k1", Dial: "10.0.0.1:80", Weight: 2, Zone: "z1", Health: "healthy", Since: time.Unix(1700000000, 0).UTC()},
		{ID: "10.0.0.2:80", Dial: "10.0.0.2:80", Weight: 1, Drain: true, Health: "unknown"},
	}}}}
	path := filepath.Join(dir, "sub", viewFileName(cfg.Server, cfg.NodeID))
	w := &xdsSub{log: zaptest.NewLogger(t), path: path, server: cfg.Server, node: cfg.NodeID, key: t.Name()}
	w.save(v)
	r := &xdsSub{log: zaptest.NewLogger(t), path: path, key: t.Name()}
	t.Cleanup(func() { xdsTable.set(t.Name(), nil) })
	r.load(cfg)
	got := r.view.Load()
	if got == nil || !reflect.DeepEqual(got, v) {
		t.Fatalf("loaded %+v, want %+v", got, v)
	}
	for name, content := range map[string]string{
		"garbage":      "{not json",
		"another node": `{"server":"cp:18000","node_id":"n2","view":{"services":{}}}`,
		"no view":      `{"server":"cp:18000","node_id":"n1"}`,
	} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		r := &xdsSub{log: zaptest.NewLogger(t), path: path, key: t.Name()}
		r.load(cfg)
		if r.view.Load() != nil {
			t.Errorf("%s: loaded a view", name)
		}
	}
}

// BenchmarkXDSSourceGetUpstreams: the per-request cost of the source for a 10-backend
// service (the slice and the values, nothing else).
func BenchmarkXDSSourceGetUpstreams(b *testing.B) {
	svc := &xdsService{CrossZone: true}
	for i := range 10 {
		svc.Backends = append(svc.Backends, xdsBackend{ID: fmt.Sprint(i), Dial: fmt.Sprintf("10.0.0.%d:80", i+1), Weight: 1, Health: "healthy"})
	}
	x := sourceWith(&xdsView{Services: map[string]*xdsService{"api": svc}}, "")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := x.GetUpstreams(nil); err != nil {
			b.Fatal(err)
		}
	}
}
