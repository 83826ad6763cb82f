package integration

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/proto"

	"github.com/stickylb/stickylb/adsclient"
	"github.com/stickylb/stickylb/fleetview"
	"github.com/stickylb/stickylb/internal/testkit/grpctest"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/policies/status"
	"github.com/stickylb/stickylb/xds"
)

// statusNode connects one node to the control plane as stickylb's own ADS client does,
// accepting every response (so it ACKs each version).
func statusNode(t *testing.T, addr, id, zone, userAgent string) {
	t.Helper()
	c, err := adsclient.New(adsclient.Config{Server: addr, NodeID: id, Zone: zone, UserAgentName: userAgent,
		Backoff: adsclient.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	accept := func(string, map[string]proto.Message) error { return nil }
	for _, typ := range []string{resource.ClusterType, resource.EndpointType} {
		if err := c.Subscribe(typ, accept); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); c.Close() })
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestXDSStatusPageBrowser: the control plane's admin address, opened by its plain URL in
// a real browser, lists the connected nodes by zone with the versions each ACKed (as the
// server's status.json says), a node that connects later within one refresh, the services'
// backends with the checker's verdicts, and no drain button (it says how to drain instead).
func TestXDSStatusPageBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test")
	}
	ctx := newBrowser(t)
	f := poolstest.Parse(t, poolstest.Fleet)
	view := func(_ string, b *pools.Backend) health.State {
		if b.Address == "10.0.7.1:80" {
			return health.Unhealthy
		}
		return health.Healthy
	}
	sctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s := xds.NewServer(sctx, f, view, zaptest.NewLogger(t))
	s.RecordTransition("api", health.Transition{ID: "10.0.7.1:80", To: health.Unhealthy, From: health.Healthy,
		At: time.Now().Add(-time.Minute), Reason: "http: status 503"})
	if err := s.Refresh(); err != nil {
		t.Fatal(err)
	}
	addr := grpctest.Serve(t, s.Register)
	admin := httptest.NewServer(s.AdminHandler())
	t.Cleanup(admin.Close)

	statusNode(t, addr, "edge-b1", "zone-b", "envoy")
	statusNode(t, addr, "edge-a1", "zone-a", "envoy")
	statusNode(t, addr, "h1/xdp/eth0", "zone-a", fleetview.UserAgentXDP)
	var snap status.Snapshot
	testwait.For(t, 5*time.Second, "three nodes ACK", func() (bool, string) {
		snap = fetchSnapshot(t, admin.URL+"/status.json")
		acked := 0
		for _, n := range snap.Nodes {
			if n.Versions["cluster"] != "" && n.Versions["endpoint"] != "" {
				acked++
			}
		}
		return acked == 3, fmt.Sprintf("%+v", snap.Nodes)
	})

	run(t, ctx, 30*time.Second, chromedp.Navigate(admin.URL+"/"))
	pageWait(t, ctx, 10*time.Second, "three nodes and four backends",
		`document.querySelectorAll(".row[data-node]").length === 3 && document.querySelectorAll(".row[data-id]").length === 4`)
	// Zones in order, each with its nodes; each row with the versions its node ACKed.
	got := run(t, ctx, 5*time.Second, chromedp.Evaluate[string](`Array.from(document.querySelectorAll("#nodes .sum b, #nodes .row[data-node]")).map(e => e.dataset.node ? e.dataset.node + "=" + e.innerText.replace(/\s+/g, " ") : "[" + e.innerText + "]").join(" ")`))
	for _, n := range snap.Nodes {
		if !strings.Contains(got, n.ID+"=") || !strings.Contains(got, "cluster "+n.Versions["cluster"]) {
			t.Fatalf("page's nodes %q lack %s with its ACKed cluster version %s", got, n.ID, n.Versions["cluster"])
		}
	}
	order := []string{"[zone-a]", "edge-a1=", "h1/xdp/eth0=", "[zone-b]", "edge-b1="}
	last := -1
	for _, w := range order {
		i := strings.Index(got, w)
		if i <= last {
			t.Fatalf("page's nodes %q: want %v in that order", got, order)
		}
		last = i
	}
	if !strings.Contains(got, "h1/xdp/eth0=h1/xdp/eth0 xdp") || !strings.Contains(got, "edge-a1=edge-a1 envoy") {
		t.Fatalf("page's nodes %q: kinds missing", got)
	}
	main := run(t, ctx, 5*time.Second, chromedp.Evaluate[string](`document.querySelectorAll("button[data-act]").length + " | " + document.getElementById("main").innerText`))
	if !strings.HasPrefix(main, "0 | ") || !strings.Contains(main, "pools file") || !strings.Contains(main, "http: status 503") {
		t.Fatalf("page: %.600q: want no buttons, the drain hint and the failure's reason", main)
	}

	// A node that connects while the page is open shows within one refresh (and slack).
	statusNode(t, addr, "grpc-c1", "zone-c", "gRPC Go")
	pageWait(t, ctx, status.RefreshInterval+3*time.Second, "the new node under its zone",
		`document.querySelectorAll(".row[data-node]").length === 4 && document.querySelector('.row[data-node="grpc-c1"]') !== null`)

	if out := os.Getenv("STICKYLB_XDS_STATUS_SCREENSHOT"); out != "" {
		png := run(t, ctx, 30*time.Second, chromedp.Screenshot(chromedp.CSS("body")))
		if err := os.WriteFile(out, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s (%d bytes)", out, len(png))
	}
}
