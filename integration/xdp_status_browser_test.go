package integration

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/cilium/ebpf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stickylb/stickylb/internal/testkit/testwait"

	"github.com/stickylb/stickylb/internal/testkit/netnstest"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/internal/testkit/xdptest"
	"github.com/stickylb/stickylb/policies/status"
)

// synTo runs one client SYN to vip:80 through the forwarder's program (BPF_PROG_TEST_RUN).
func synTo(t *testing.T, p *ebpf.Program, client net.IP, sport uint16) uint32 {
	t.Helper()
	e := &layers.Ethernet{DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 0xaa}, SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 0xcc}, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: client, DstIP: net.IPv4(10, 0, 0, 100)}
	tc := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: 80, SYN: true, Window: 65535}
	tc.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, e, ip, tc); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, len(buf.Bytes())+256)
	opts := &ebpf.RunOptions{Data: buf.Bytes(), DataOut: out}
	ret, err := p.Run(opts)
	if err != nil {
		t.Fatal(err)
	}
	return ret
}

// TestXDPStatusPageBrowser: a forwarder's page (a loader on a veth in a namespace of the
// test's own, checking its backends with real TCP probes) in a real browser shows, per
// backend, the flows the program counted, the verdicts with their reason, the draining
// backend, and the VIP's table generation.
func TestXDPStatusPageBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test")
	}
	netnstest.NeedRoot(t)
	ctx := newBrowser(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	l := xdptest.Loader(t, "slxp")
	f := poolstest.Parse(t, fmt.Sprintf(`services:
  - name: web
    protocol: tcp
    vip: 10.0.0.100:80
    balance: maglev
    hash: {table_size: 251}
    health_check: {protocol: tcp, port: %d, interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}
    backends:
      - {address: 127.0.0.1:80, mac: "02:00:00:00:00:01", zone: zone-a, weight: 2}
      - {address: 127.0.0.2:80, mac: "02:00:00:00:00:02", zone: zone-b}
      - {address: 127.0.0.3:80, mac: "02:00:00:00:00:03", zone: zone-b, drain: true}
`, ln.Addr().(*net.TCPAddr).Port))
	if err := l.Apply(t.Context(), f); err != nil {
		t.Fatal(err)
	}
	// The same routes as `stickylb xdp --metrics` (cmd/stickylb's handler, not importable).
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/"+status.JSONPath {
			snap, err := l.Status()
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			_ = status.ServeJSON(w, snap)
			return
		}
		status.ServePage(w)
	}))
	t.Cleanup(srv.Close)
	// Verdicts: the first probe within interval/10, its result within the timeout; 2 s slack.
	// The checker's state shows before the loader's callback has rebuilt the table without
	// the refused backend (generation 2), so the wait is on both: the SYNs below must meet
	// that table.
	testwait.For(t, 100*time.Millisecond+500*time.Millisecond+2*time.Second, "verdicts on the three backends, applied", func() (bool, string) {
		s := fetchSnapshot(t, srv.URL+"/status.json")
		bs := s.Services[0].Backends
		g := s.Services[0].Generation
		return bs[0].Health.State == status.Healthy && bs[1].Health.State == status.Unhealthy && bs[2].Health.State == status.Unhealthy &&
			g != nil && *g >= 2, fmt.Sprintf("generation %v, %+v", g, bs)
	})
	const flows = 17
	for i := 0; i < flows; i++ {
		if ret := synTo(t, l.Tables().Program(), net.IPv4(192, 0, 2, byte(10+i)), uint16(40000+i)); ret != 3 {
			t.Fatalf("SYN %d: XDP action %d, want XDP_TX", i, ret)
		}
	}
	snap := fetchSnapshot(t, srv.URL+"/status.json")
	gen := *snap.Services[0].Generation

	run(t, ctx, 30*time.Second, chromedp.Navigate(srv.URL+"/"))
	pageWait(t, ctx, 10*time.Second, "three backends", rowsShown(3))
	rows := pageRows(ctx)
	for _, want := range []string{
		"127.0.0.1:80 zone-a 2 2.00 healthy", fmt.Sprintf("n/a %d | 127.0.0.2", flows),
		"127.0.0.2:80 zone-b 1 0.00 unhealthy", "tcp: connection refused", "127.0.0.3:80 zone-b 1 0.00 unhealthydraining",
	} {
		if !strings.Contains(rows, want) {
			t.Fatalf("page rows %q lack %q", rows, want)
		}
	}
	main := run(t, ctx, 5*time.Second, chromedp.Evaluate[string](`document.getElementById("main").innerText + " | " + document.getElementById("nodes").innerText`))
	if !strings.Contains(main, fmt.Sprintf("table generation %d", gen)) || !strings.Contains(main, fmt.Sprintf("flows %d", flows)) || !strings.Contains(main, "forward") {
		t.Fatalf("page: %.800q: want the table generation %d, %d flows and the path counters", main, gen, flows)
	}
	// Flows per zone, from the program's per-zone counts, on the service's zone line.
	zones := run(t, ctx, 5*time.Second, chromedp.Evaluate[string](`document.querySelector("section.svc .zones").innerText`))
	for _, want := range []string{fmt.Sprintf("zone-a 1 backend, 1 healthy, flows %d", flows), "zone-b 2 backends, 0 healthy, 1 draining, flows 0"} {
		if !strings.Contains(zones, want) {
			t.Fatalf("zones line %q lacks %q", zones, want)
		}
	}
	// The loader probes, so every row's last check is a time ("N s ago"), not n/a.
	checks := run(t, ctx, 5*time.Second, chromedp.Evaluate[string](`Array.from(document.querySelectorAll(".row[data-id]")).map(r => r.children[6].innerText).join("|")`))
	for _, c := range strings.Split(checks, "|") {
		if !strings.HasSuffix(c, " s ago") {
			t.Fatalf("last check cells %q: want a time on every row", checks)
		}
	}
	if out := os.Getenv("STICKYLB_XDP_STATUS_SCREENSHOT"); out != "" {
		png := run(t, ctx, 30*time.Second, chromedp.Screenshot(chromedp.CSS("body")))
		if err := os.WriteFile(out, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s (%d bytes)", out, len(png))
	}
}
