package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/adsclient"
	_ "github.com/stickylb/stickylb/caddymodule"
	"github.com/stickylb/stickylb/l4bgp"
	"github.com/stickylb/stickylb/xds"
	"github.com/stickylb/stickylb/xds/api"
	"github.com/stickylb/stickylb/xds/replica"
	"github.com/stickylb/stickylb/xds/store"
)

const dashboardPath = "../../examples/grafana/stickylb.json"

// Every metric the Grafana dashboard queries is one a tier exports. The exported names come
// from the registries the code fills (not a list kept beside the dashboard): a renamed
// metric fails here, not as an empty panel in front of an operator.
func TestGrafanaDashboardMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	queried := dashboardMetrics(t, dashboardPath)
	if len(queried) < 20 {
		t.Fatalf("found only %d metrics in the dashboard's queries: %v", len(queried), queried)
	}
	checkQueried(t, "the dashboard", queried, exported)
	// Each tier's metrics are on the dashboard: one a tier adds shows up here as a reminder.
	on := map[string]bool{}
	for _, n := range queried {
		on[n] = true
	}
	for n := range exported {
		if strings.HasPrefix(n, "stickylb_") && !on[n] {
			t.Logf("exported but not on the dashboard: %s", n)
		}
	}
}

// exportedMetrics gathers the metric names of every tier from its live registry.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	describe := func(tier string, c prometheus.Collector) {
		n := 0
		ch := make(chan *prometheus.Desc)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := descName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("%s: no name in %s", tier, d)
			}
			names[m[1]] = true
			n++
		}
		if n == 0 {
			t.Fatalf("%s: its registry describes no metric", tier)
		}
	}

	// The Caddy tier: a stickylb policy provisioned in a Caddy context registers its
	// collector in the context's registry, as in a running Caddy.
	cctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if _, err := cctx.LoadModuleByID("http.reverse_proxy.selection_policies.sticky_ip", json.RawMessage(`{}`)); err != nil {
		t.Fatalf("provisioning sticky_ip: %v", err)
	}
	describe("caddy", cctx.GetMetricsRegistry())

	// The control plane: what its admin handler serves at /metrics, with a pools file of one
	// service (stickylb_panic is per service).
	f, ok := load(write(t, "pools.yaml", xdpPools), io.Discard)
	if !ok {
		t.Fatal("the pools file does not load")
	}
	srv := xds.NewServer(t.Context(), f, nil, zap.NewNop())
	rec := httptest.NewRecorder()
	srv.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	n := 0
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			names[strings.Fields(rest)[0]] = true
			n++
		}
	}
	if n == 0 {
		t.Fatalf("the xds admin handler's /metrics lists no metric:\n%s", rec.Body.String())
	}

	// The XDP forwarder's collector and what its metrics handler adds, as `stickylb xdp
	// --metrics` registers them.
	xreg := prometheus.NewRegistry()
	xreg.MustRegister(xdpCollector{})
	xdpMetricsHandler(nil, xreg, nil, nil, nil, zap.NewNop())
	describe("xdp", xreg)

	// The backend agent's and what its metrics handler adds (`stickylb backend --metrics`).
	backreg := prometheus.NewRegistry()
	backreg.MustRegister(backendCollector{})
	backendMetricsHandler(nil, backreg, zap.NewNop())
	describe("backend", backreg)

	// The BGP speaker's, which `stickylb xdp --bgp-*` adds to the node's.
	breg := prometheus.NewRegistry()
	breg.MustRegister((*l4bgp.Speaker)(nil).Collector())
	describe("bgp", breg)

	// A replica's own, which `stickylb xds --etcd` adds to its admin handler's: the store,
	// the leadership, and the change API's counter.
	rreg := prometheus.NewRegistry()
	rreg.MustRegister((*replica.Replica)(nil).Collector(), api.New(nil, store.Keys{}, nil, zap.NewNop()).Collector())
	describe("replica", rreg)

	// The xDS client's collector (Caddy's stickylb_xds source and `stickylb xdp --xds`).
	c, err := adsclient.New(adsclient.Config{Server: "127.0.0.1:1", NodeID: "dashboard-test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	areg := prometheus.NewRegistry()
	areg.MustRegister(c.Collector())
	describe("adsclient", areg)
	return names
}

// checkQueried fails for every metric of queried that no tier exports and pendingMetrics
// does not list, and for every pendingMetrics entry a tier exports now.
func checkQueried(t *testing.T, what string, queried []string, exported map[string]bool) {
	t.Helper()
	for _, name := range queried {
		why, pending := pendingMetrics[name]
		switch {
		case exported[name] && pending:
			t.Errorf("%s queries %s, which a tier exports now: drop it from pendingMetrics (%s)", what, name, why)
		case pending:
			t.Logf("%s queries %s, pending (%s)", what, name, why)
		case !exported[name]:
			t.Errorf("%s queries %s, which no tier exports", what, name)
		}
	}
}

var descName = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)

// dashboardMetrics returns the metric names the PromQL expressions of a dashboard's panels
// (rows' nested panels included) select, sorted and without repeats.
func dashboardMetrics(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string                  `json:"title"`
		Targets []struct{ Expr string } `json:"targets"`
		Panels  []json.RawMessage       `json:"panels"`
	}
	var dash struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	seen := map[string]bool{}
	var walk func([]json.RawMessage)
	walk = func(ps []json.RawMessage) {
		for _, r := range ps {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatalf("%s: a panel: %v", path, err)
			}
			for _, tg := range p.Targets {
				ms := promQLMetrics(tg.Expr)
				if len(ms) == 0 {
					t.Errorf("panel %q: no metric in %q", p.Title, tg.Expr)
				}
				for _, m := range ms {
					seen[m] = true
				}
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

var (
	// What is not a metric name: strings, label matchers, range and subquery selectors,
	// Grafana's variables, and the label lists of by, without, on, ignoring, group_*.
	promQLNoise = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\{[^}]*\}|\[[^\]]*\]|\$\{[^}]*\}|\$\w+|` +
		`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promQLIdent = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	promQLWords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true,
		"without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
)

// promQLMetrics returns the metric names a PromQL expression selects: the identifiers left
// once the noise is gone that are neither keywords nor functions (a function is followed by
// its parenthesis) nor numbers (1e3's e).
func promQLMetrics(expr string) []string {
	var out []string
	clean := promQLNoise.ReplaceAllString(expr, " ")
	for _, m := range promQLIdent.FindAllStringSubmatchIndex(clean, -1) {
		word := clean[m[0]:m[1]]
		if m[2] >= 0 || promQLWords[strings.ToLower(word)] {
			continue
		}
		if m[0] > 0 && (clean[m[0]-1] >= '0' && clean[m[0]-1] <= '9' || clean[m[0]-1] == '.') {
			continue // the exponent or unit of a number
		}
		out = append(out, word)
	}
	return out
}

// The extraction the dashboard test rests on: it finds every selected metric, and takes no
// function, keyword, label, variable or number for one.
func TestPromQLMetrics(t *testing.T) {
	for expr, want := range map[string]string{
		`sum by (table, event) (rate(stickylb_table_events_total[$__rate_interval]))`:                                  "stickylb_table_events_total",
		`8 * sum(rate(a_total{result="hit", x=~"by(y)"}[5m])) / on(service) group_left(zone) b_total offset 1h`:        "a_total b_total",
		`histogram_quantile(0.99, sum without (le) (rate(c_bucket[${interval}]))) > 1e3 and bool d unless max(e:rule)`: "c_bucket d e:rule",
		`count(up == 1)`: "up",
	} {
		if got := strings.Join(promQLMetrics(expr), " "); got != want {
			t.Errorf("%s: got %q, want %q", expr, got, want)
		}
	}
}
