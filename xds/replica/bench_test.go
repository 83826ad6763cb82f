package replica

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/xds/api"
)

// benchPools is 10 VIP services of 10 backends each, unchecked (no probe noise).
func benchPools() string {
	var b strings.Builder
	b.WriteString("services:\n")
	for s := range 10 {
		fmt.Fprintf(&b, "  - name: svc-%d\n    protocol: tcp\n    vip: \"10.8.%d.1:80\"\n    affinity: {mode: none}\n    balance: maglev\n    backends:\n", s, s)
		for e := range 10 {
			fmt.Fprintf(&b, "      - {address: \"10.9.%d.%d:80\"}\n", s, e+1)
		}
	}
	return b.String()
}

// BenchmarkAPIChangeTo100Subscribers: the time from a change through the API (a backend's
// weight, PUT /v1/services/svc-0/backends/ID) to the last of 100 subscribers of the
// project's ADS client, spread over three replicas, holding the new version (ACKed). The
// goal is a p99 under 1 s. Run with -benchtime=50x; it logs the load average.
func BenchmarkAPIChangeTo100Subscribers(b *testing.B) {
	rg := newRig(b, 3)
	rg.apply(benchPools())
	var addrs []string
	for _, id := range []string{"r1", "r2", "r3"} {
		addrs = append(addrs, rg.replica(id, zap.NewNop()).addr)
	}
	var nodes []*node
	for i := range 100 {
		k := i % 3
		nodes = append(nodes, rg.node(fmt.Sprintf("n%03d", i), addrs[k], addrs[(k+1)%3], addrs[(k+2)%3]))
	}
	srv := httptest.NewServer(api.New(rg.cli, rg.keys, api.NewAuth(map[string]string{"bench-token-0123456789": "bench"}, nil), zap.NewNop()).Handler())
	defer srv.Close()
	all := func(version string) bool {
		for _, n := range nodes {
			if n.c.Version(resource.EndpointType) != version {
				return false
			}
		}
		return true
	}
	rg.waitFor(30*time.Second, "every subscriber holds the first version", func() (bool, string) {
		return all(fmt.Sprint(rg.state().Revision)), ""
	})
	var took []time.Duration
	b.ResetTimer()
	for i := range b.N {
		body := fmt.Sprintf(`{"weight": %d}`, 2+i%2)
		req, _ := http.NewRequest(http.MethodPut, srv.URL+"/v1/services/svc-0/backends/10.9.0.1:80", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer bench-token-0123456789")
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			b.Fatalf("PUT: %v %v", resp, err)
		}
		rev := resp.Header.Get("ETag")
		resp.Body.Close()
		rev = strings.Trim(rev, `"`)
		for !all(rev) {
			if time.Since(start) > 30*time.Second {
				b.Fatalf("not every subscriber at %s within 30 s", rev)
			}
			time.Sleep(200 * time.Microsecond)
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	p := func(q float64) time.Duration { return took[min(len(took)-1, int(q*float64(len(took))))] }
	b.ReportMetric(float64(p(0.5).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(p(0.99).Microseconds())/1000, "p99-ms")
	load, _ := os.ReadFile("/proc/loadavg")
	b.Logf("%d API changes to 100 subscribers on 3 replicas: p50 %s, p99 %s, max %s (load %s)", len(took),
		p(0.5).Round(time.Millisecond), p(0.99).Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), strings.TrimSpace(string(load)))
}
