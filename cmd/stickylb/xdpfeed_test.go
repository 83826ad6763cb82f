package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/internal/testkit/adstest"
	"github.com/stickylb/stickylb/internal/testkit/netnstest"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/policies/status"
)

// fedRig is `stickylb xdp --xds` run in a namespace of the test's own (veth d0, 10.200.0.1/24),
// fed by a control plane (adstest) listening on that namespace's loopback.
type fedRig struct {
	kit     *netnstest.Kit
	bin     string
	cp      *adstest.Server
	pinRoot string
}

func newFedRig(t *testing.T, prefix string) *fedRig {
	t.Helper()
	netnstest.NeedRoot(t)
	r := &fedRig{kit: netnstest.New(t, prefix), bin: buildBinary(t)}
	r.kit.AddNS("lb")
	r.kit.Veth("lb", "d0", "lb", "d1")
	r.kit.In("lb", "ip", "addr", "add", "10.200.0.1/24", "dev", "d0")
	r.pinRoot = r.kit.BPFFS()
	var ln net.Listener
	r.kit.MustDo("lb", func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	})
	r.cp = adstest.Serve(t, ln)
	return r
}

// serve has the control plane serve src's XDP view, each endpoint's address replaced by
// addrs[i] when given (a control plane may name any address), and returns the version.
func (r *fedRig) serve(t *testing.T, src string, addrs ...string) string {
	t.Helper()
	f, err := pools.Parse("pools.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	cs, ls := fleetview.Encode(f, nil)
	for i, a := range addrs {
		e := ls[0].Endpoints[0].LbEndpoints[i]
		ap := netipAddrPort(t, a)
		e.Metadata.FilterMetadata[fleetview.MetadataKey].Fields["address"] = structpb.NewStringValue(a)
		sa := e.GetEndpoint().GetAddress().GetSocketAddress()
		sa.Address, sa.PortSpecifier = ap.Addr().String(), &corev3.SocketAddress_PortValue{PortValue: uint32(ap.Port())}
	}
	return r.cp.Set(t, cs, ls)
}

// run starts the node with args after the common ones; stop stops it (the test's end does
// too).
func (r *fedRig) run(t *testing.T, args ...string) (stop func()) {
	t.Helper()
	return startXDPProc(t, r.kit, "lb", r.bin, append([]string{"xdp", "--xds", r.cp.Addr, "--iface", "d0", "--mode", "generic",
		"--pin-root", r.pinRoot}, args...)...).stop
}

// acked waits for the node's ACK of version v of the clusters and the endpoints: the node
// applies a view once it has both, and ACKs the second only after applying it (an ACK of
// the endpoints alone came 0.4 s before the tables held them).
func (r *fedRig) acked(t *testing.T, v string) {
	t.Helper()
	testwait.For(t, 20*time.Second, "the node's ACK of the view", func() (bool, string) {
		c, e := r.cp.Acked(resource.ClusterType), r.cp.Acked(resource.EndpointType)
		return c == v && e == v, fmt.Sprintf("acked clusters %q, endpoints %q, NACKs %q", c, e, r.cp.NACKs())
	})
}

// tableHolds waits until svc's table holds want, sorted: the node has ACKed the view by
// then, and applies it within its pacing (a second) plus 2 s of slack.
func (r *fedRig) tableHolds(t *testing.T, svc string, want ...string) {
	t.Helper()
	testwait.For(t, 3*time.Second, "the table of "+svc+" holding "+strings.Join(want, ", "), func() (bool, string) {
		got := r.tables(t)[svc]
		return slices.Equal(got, want), fmt.Sprintf("it holds %q", got)
	})
}

// status reads status.json from the node's metrics address (in its namespace).
func (r *fedRig) status(t *testing.T, metrics string) *status.Snapshot {
	t.Helper()
	var conn net.Conn
	r.kit.MustDo("lb", func() (err error) {
		conn, err = net.DialTimeout("tcp", metrics, 5*time.Second)
		return err
	})
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /%s HTTP/1.0\r\nHost: %s\r\n\r\n", status.JSONPath, metrics)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var snap status.Snapshot
	if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status.json: %d %v", resp.StatusCode, err)
	}
	return &snap
}

// tables is `stickylb xdp tables`: each VIP's backends in its table.
func (r *fedRig) tables(t *testing.T) map[string][]string {
	t.Helper()
	out := r.kit.Run(r.bin, "xdp", "tables", "--iface", "d0", "--pin-root", r.pinRoot)
	var ts map[string]vipTableSummary
	if err := json.Unmarshal([]byte(out), &ts); err != nil {
		t.Fatalf("stickylb xdp tables: %v\n%s", err, out)
	}
	got := map[string][]string{}
	for svc, s := range ts {
		got[svc] = slices.Sorted(maps.Keys(s.Slots))
	}
	return got
}

// edgeFile is service edge on VIP 10.200.100.1:80 with n backends 10.200.0.11.. on port 80
// (forwarded by DR: MACs given, no neighbour needed), whose addresses serve replaces.
func edgeFile(n int) string {
	var b strings.Builder
	b.WriteString("services:\n  - name: edge\n    protocol: tcp\n    vip: 10.200.100.1:80\n    affinity: {mode: none}\n    balance: maglev\n    backends:\n")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "      - {address: 10.200.0.%d:80, mac: \"02:00:00:00:00:%02x\"}\n", 10+i, i)
	}
	return b.String()
}

// An XDP node fed by the control plane leaves out endpoints on link-local, loopback and
// unspecified addresses, its own VIPs and its metrics address, and forwards to the rest
// (the view is not NACKed); --allow-loopback admits loopback endpoints, not its own ones.
func TestXDPFedRefusesHostileEndpoints(t *testing.T) {
	r := newFedRig(t, "slrf")
	const metrics = "127.0.0.1:9912"
	v := r.serve(t, edgeFile(6), "169.254.169.254:80", "[fe80::1]:80", "127.0.0.1:80", "10.200.100.1:80", "0.0.0.0:80", "10.200.0.16:80")
	stop := r.run(t, "--metrics", metrics)
	r.acked(t, v)
	r.tableHolds(t, "edge", "edge/10.200.0.16:80")
	stop()

	// --allow-loopback: a loopback backend is forwarded to; the metrics address, the VIP and
	// link-local ones still are not. status.json lists each refusal with its reason.
	v = r.serve(t, edgeFile(4), "127.0.0.1:80", "127.0.0.1:9912", "[::ffff:169.254.169.254]:80", "10.200.0.16:80")
	r.run(t, "--metrics", metrics, "--allow-loopback")
	r.acked(t, v)
	r.tableHolds(t, "edge", "edge/10.200.0.16:80", "edge/127.0.0.1:80")
	snap := r.status(t, metrics)
	if len(snap.Feeds) != 1 {
		t.Fatalf("status.json: feeds %+v, want the control plane's", snap.Feeds)
	}
	refused := map[string]string{}
	for _, rf := range snap.Feeds[0].Refused {
		refused[rf.Address] = rf.Reason
	}
	if len(refused) != 2 || refused["127.0.0.1:9912"] != "this node's metrics address" || !strings.Contains(refused["[::ffff:169.254.169.254]:80"], "link-local") {
		t.Fatalf("status.json lists as refused %q", refused)
	}
}

func netipAddrPort(t *testing.T, s string) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

// An XDP node whose control plane stops sending one VIP's endpoints applies the other
// VIP's update (ACKed), keeps forwarding the waiting VIP by its last good table, and lists
// it in status.json as waiting, and since when.
func TestXDPFedWaitsForEndpoints(t *testing.T) {
	r := newFedRig(t, "slwt")
	const metrics = "127.0.0.1:9913"
	second := "  - name: edge2\n    protocol: tcp\n    vip: 10.200.100.2:80\n    affinity: {mode: none}\n    balance: maglev\n    backends:\n" +
		"      - {address: 10.200.0.21:80, mac: \"02:00:00:00:00:21\"}\n"
	f1, err := pools.Parse("pools.yaml", []byte(edgeFile(1)+second))
	if err != nil {
		t.Fatal(err)
	}
	cs, ls := fleetview.Encode(f1, nil)
	v := r.cp.Set(t, cs, ls)
	r.run(t, "--metrics", metrics)
	r.acked(t, v)
	// Version 2: edge gains a backend; edge2's endpoints are missing.
	f2, err := pools.Parse("pools.yaml", []byte(edgeFile(2)+second))
	if err != nil {
		t.Fatal(err)
	}
	cs2, ls2 := fleetview.Encode(f2, nil)
	sent := time.Now()
	r.acked(t, r.cp.Set(t, cs2, ls2[:1]))
	got := r.tables(t)
	if !slices.Equal(got["edge"], []string{"edge/10.200.0.11:80", "edge/10.200.0.12:80"}) {
		t.Fatalf("edge's table holds %q after version 2, want its two backends: one VIP without endpoints held the view back", got["edge"])
	}
	if !slices.Equal(got["edge2"], []string{"edge2/10.200.0.21:80"}) {
		t.Fatalf("edge2, waiting for its endpoints, has the table %q, want its last good one", got["edge2"])
	}
	snap := r.status(t, metrics)
	if len(snap.Feeds) != 1 || len(snap.Feeds[0].Waiting) != 1 {
		t.Fatalf("status.json feeds %+v", snap.Feeds)
	}
	if w := snap.Feeds[0].Waiting[0]; w.Service != "edge2" || !w.Kept || w.Since.Before(sent.Add(-time.Second)) {
		t.Fatalf("status.json: waiting %+v, want edge2 since the version sent at %s, its last state kept", w, sent)
	}
}
