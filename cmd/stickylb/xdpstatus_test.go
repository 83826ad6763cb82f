package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/stickylb/stickylb/internal/testkit/xdptest"
	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/policies/status"
)

// TestXDPMetricsAddressServesStatus: the metrics address of a real loader (on a veth of a
// namespace of the test's own) serves the status page at its root, status.json beside it
// with the file's VIP and backends and the last edit refused, and the metrics still at
// /metrics.
func TestXDPMetricsAddressServesStatus(t *testing.T) {
	l := xdptest.Loader(t, "slst")
	f, err := pools.Parse("pools.yaml", []byte(strings.Replace(xdpPools, "10.200.0.77:80}", `10.200.0.77:80, mac: "02:00:00:00:00:77", zone: z1}`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Apply(t.Context(), f); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(xdpCollector{l.Tables()})
	edits := status.NewConfigLog("pools.yaml", time.Now())
	edits.Refused(time.Now(), []string{"pools.yaml:4:10: vip \"nonsense\": want ip:port"})
	h := httptest.NewServer(xdpMetricsHandler(l, reg, edits, nil, nil, zaptest.NewLogger(t)))
	defer h.Close()
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Get(h.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, body := get("/"); resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(body, "status.json") {
		t.Fatalf("page: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	resp, body := get("/" + status.JSONPath)
	var snap status.Snapshot
	if err := json.Unmarshal([]byte(body), &snap); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status.json: %d %v: %.300s", resp.StatusCode, err, body)
	}
	if snap.Tier != status.TierXDP || len(snap.Services) != 1 || snap.Services[0].VIP != "10.200.100.1:80" ||
		len(snap.Services[0].Backends) != 1 || snap.Services[0].Backends[0].Zone != "z1" || snap.Services[0].Backends[0].Flows == nil ||
		snap.Config == nil || snap.Config.Path != "pools.yaml" || snap.Config.Refused == nil || len(snap.Config.Refused.Errors) != 1 {
		t.Fatalf("status.json: %.500s", body)
	}
	if _, body := get("/metrics"); !strings.Contains(body, "stickylb_xdp_packets_total") {
		t.Fatalf("metrics: %.300s", body)
	}
}
