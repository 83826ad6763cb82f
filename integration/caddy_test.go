package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/stickylb/stickylb/internal/testkit/fanout"
	"github.com/stickylb/stickylb/internal/testkit/testwait"

	_ "github.com/stickylb/stickylb/caddymodule"
	"github.com/stickylb/stickylb/policies/cookie"
	"github.com/stickylb/stickylb/policies/sessions"
)

const (
	secret    = "integration-secret-0123456789abcdef"
	adminBase = "http://localhost:2999"
)

// serve loads a Caddyfile into the in-process Caddy: one site on a fresh port proxying to
// backends with the given reverse_proxy body. It returns the site's base URL.
func serve(t *testing.T, bs []*backend, proxyBody string) string {
	t.Helper()
	port := freePort(t)
	cfg := fmt.Sprintf(`{
	admin localhost:2999
	auto_https off
	skip_install_trust
	http_port %d
}
:%d {
	stickylb
	reverse_proxy %s {
%s
	}
}
`, port, port, addrs(bs), proxyBody)
	caddytest.NewTester(t).InitServer(cfg, "caddyfile")
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitPort(t, fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second)
	return base
}

// binomialBound is 4 standard deviations of a count with n trials at probability p.
func binomialBound(n int, p float64) float64 { return 4 * math.Sqrt(float64(n)*p*(1-p)) }

type mode struct {
	name   string
	policy string
	// first makes a client's first request, next its later ones; both return the body.
	first, next func(t *testing.T, c *client, base string, i int) (int, string)
	// balanced: new sessions go round robin (least connections, sequential) rather than
	// by hash.
	balanced bool
	localIP  func(i int) string
}

func TestCaddyStickinessPerMode(t *testing.T) {
	plain := func(t *testing.T, c *client, base string, i int) (int, string) { return c.get(t, base+"/") }
	modes := []mode{
		{name: "sticky_cookie", policy: "lb_policy sticky_cookie {\n secret " + secret + "\n }", first: plain, next: plain, balanced: true},
		{name: "sticky_url", policy: "lb_policy sticky_url {\n query sid\n }",
			first: func(t *testing.T, c *client, base string, i int) (int, string) {
				return c.get(t, fmt.Sprintf("%s/page?sid=client-%03d", base, i))
			}},
		{name: "sticky_url_suffix", policy: "lb_policy sticky_url {\n suffix ;jsessionid=\n }",
			first: func(t *testing.T, c *client, base string, i int) (int, string) {
				return c.get(t, fmt.Sprintf("%s/app/page;jsessionid=S%03d?x=1", base, i))
			}},
		{name: "sticky_header", policy: "lb_policy sticky_header X-Session",
			first: func(t *testing.T, c *client, base string, i int) (int, string) {
				return c.get(t, base+"/", fmt.Sprintf("X-Session: user-%03d", i))
			}},
		{name: "sticky_ip", policy: "lb_policy sticky_ip", first: plain,
			localIP: func(i int) string { return fmt.Sprintf("127.0.%d.%d", 1+i/200, 10+i%200) }},
		{name: "app_cookie_prefix", policy: "lb_policy app_cookie JSESSIONID {\n secret " + secret + "\n }", balanced: true,
			first: func(t *testing.T, c *client, base string, i int) (int, string) { return c.get(t, base+"/login") }, next: plain},
		// The clients share one address (the test's), which learn mode bounds to 60 new
		// sessions a minute by default: exactly this test's clients.
		{name: "app_cookie_learn", policy: "lb_policy app_cookie JSESSIONID {\n mode learn\n max_new_per_client 1000\n }", balanced: true,
			first: func(t *testing.T, c *client, base string, i int) (int, string) { return c.get(t, base+"/login") }, next: plain},
	}
	const clients, perClient = 60, 10
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			bs := startBackends(t, 3)
			base := serve(t, bs, "\t\t"+m.policy)
			counts := map[string]int{}
			for i := 0; i < clients; i++ {
				ip := ""
				if m.localIP != nil {
					ip = m.localIP(i)
				}
				c := newClient(t, ip)
				code, first := m.first(t, c, base, i)
				if code != 200 {
					t.Fatalf("client %d: first request %d %s", i, code, first)
				}
				counts[first]++
				next := m.next
				if next == nil {
					next = m.first
				}
				for j := 1; j < perClient; j++ {
					code, got := next(t, c, base, i)
					if code != 200 || got != first {
						t.Fatalf("client %d request %d: %d %q, pinned to %q", i, j, code, got, first)
					}
				}
			}
			t.Logf("new sessions per backend: %v", counts)
			for _, b := range bs {
				n := counts[b.name]
				if m.balanced {
					if n != clients/3 {
						t.Errorf("%s took %d new sessions, want %d (least connections, sequential clients)", b.name, n, clients/3)
					}
				} else if d := math.Abs(float64(n) - clients/3.0); d > binomialBound(clients, 1.0/3) {
					t.Errorf("%s took %d of %d keys, beyond 4 sigma of %d", b.name, n, clients, clients/3)
				}
			}
			if strings.HasPrefix(m.name, "app_cookie") {
				// The application always sees its own value, never our prefix.
				for _, b := range bs {
					b.seen.Range(func(k, _ any) bool {
						if v := k.(string); !strings.HasPrefix(v, "JSESSIONID=backend-") || strings.Contains(v, "~") {
							t.Errorf("%s saw cookie %q", b.name, v)
						}
						return true
					})
				}
			}
		})
	}
}

func TestCaddyBadCookiesRepinWith200(t *testing.T) {
	bs := startBackends(t, 3)
	base := serve(t, bs, "\t\tlb_policy sticky_cookie {\n secret "+secret+"\n }")
	own, _ := cookie.NewCodec([]byte(secret))
	other, _ := cookie.NewCodec([]byte("some-other-fleet-secret-0123456789"))
	now := time.Now()
	expired, _ := own.Seal(cookie.Payload{Backend: bs[0].addr, Issued: now.Add(-2 * time.Hour), Expires: now.Add(-time.Hour)}, "lb_session")
	foreign, _ := other.Seal(cookie.Payload{Backend: bs[0].addr, Issued: now, Expires: now.Add(time.Hour)}, "lb_session")
	good, _ := own.Seal(cookie.Payload{Backend: bs[0].addr, Issued: now, Expires: now.Add(time.Hour)}, "lb_session")
	tampered := good[:len(good)-4] + "AAAA"
	unknown, _ := own.Seal(cookie.Payload{Backend: "127.0.0.1:1", Issued: now, Expires: now.Add(time.Hour)}, "lb_session")
	for name, v := range map[string]string{"tampered": tampered, "foreign key": foreign, "expired": expired,
		"garbage": "not-a-cookie-at-all", "unknown upstream": unknown, "huge": strings.Repeat("A", 3000)} {
		t.Run(name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", base+"/", nil)
			req.Header.Set("Cookie", "lb_session="+v)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || byName(bs, string(body)) == nil {
				t.Fatalf("%d %q", resp.StatusCode, body)
			}
			var fresh string
			for _, c := range resp.Cookies() {
				if c.Name == "lb_session" {
					fresh = c.Value
				}
			}
			p, err := own.Open(fresh, "lb_session", time.Now())
			if err != nil || byName(bs, string(body)).addr != p.Backend {
				t.Fatalf("fresh cookie %q (%v) does not pin %s", fresh, err, body)
			}
		})
	}
	// Re-pins are counted by reason, visible in the admin API.
	var info struct {
		Scopes map[string]struct {
			Repins     map[string]uint64 `json:"repins"`
			Rejections map[string]uint64 `json:"cookie_rejections"`
		} `json:"scopes"`
	}
	getJSON(t, adminBase+"/stickylb/sessions", &info)
	sc := info.Scopes["sticky_cookie:lb_session"]
	if sc.Repins["invalid"] < 4 || sc.Repins["expired"] < 1 || sc.Repins["unknown"] < 1 || sc.Rejections["auth"] < 1 || sc.Rejections["unknown_key"] < 1 {
		t.Fatalf("re-pin counts: %+v", sc)
	}
}

func getJSON(t *testing.T, u string, v any) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", u, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v in %s", u, err, b)
	}
}

func post(t *testing.T, u string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Stickylb-Csrf", "1") // every state-changing POST of the admin API needs it
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d %s", u, resp.StatusCode, b)
	}
}

// TestCaddyKillPinnedBackendUnderLoad: clients run requests without pause while the backend many
// are pinned to dies. Retries cover the moments before the health check notices; then the
// sessions re-pin. No request may fail at any point.
func TestCaddyKillPinnedBackendUnderLoad(t *testing.T) {
	bs := startBackends(t, 3)
	// Health: interval 200ms, 1 failure: the killed backend refuses at once, so it is down
	// within ~200ms plus slack; the timeout of 1s keeps a check of a live backend, slowed by
	// the 30 clients on a loaded machine, from marking it down.
	base := serve(t, bs, "\t\tlb_policy sticky_cookie {\n secret "+secret+"\n }\n\t\tlb_retries 3\n\t\tlb_try_interval 10ms\n\t\thealth_uri /health\n\t\thealth_interval 200ms\n\t\thealth_timeout 1s\n\t\thealth_fails 1")
	const n = 30
	cs := make([]*client, n)
	pinned := make([]string, n)
	for i := range cs {
		cs[i] = newClient(t, "")
		code, body := cs[i].get(t, base+"/")
		if code != 200 {
			t.Fatalf("warm-up: %d %s", code, body)
		}
		pinned[i] = body
	}
	victim := bs[0]
	var failures, total atomic.Int64
	var mu sync.Mutex
	last := make([][]string, n) // recent answers per client
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range cs {
		wg.Go(func() {
			deadline := time.After(30 * time.Second)
			for {
				select {
				case <-stop:
					return
				case <-deadline:
					return
				default:
				}
				code, body := cs[i].get(t, base+"/")
				total.Add(1)
				if code != 200 || byName(bs, body) == nil {
					failures.Add(1)
					t.Errorf("client %d: %d %q", i, code, body)
				}
				mu.Lock()
				last[i] = append(last[i], body)
				if len(last[i]) > 5 {
					last[i] = last[i][1:]
				}
				mu.Unlock()
			}
		})
	}
	testwait.For(t, 5*time.Second, "load running", func() (bool, string) { return total.Load() > 200, fmt.Sprint(total.Load()) })
	killedAt := time.Now()
	victim.kill()
	// Every client formerly on the victim settles on one surviving backend.
	testwait.For(t, 10*time.Second, "sessions re-pinned", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		for i := range cs {
			if pinned[i] != victim.name {
				continue
			}
			if len(last[i]) < 5 {
				return false, fmt.Sprintf("client %d: %v", i, last[i])
			}
			for _, b := range last[i] {
				if b != last[i][0] || b == victim.name {
					return false, fmt.Sprintf("client %d: %v", i, last[i])
				}
			}
		}
		return true, ""
	})
	settled := time.Since(killedAt)
	close(stop)
	wg.Wait()
	onVictim := 0
	for _, p := range pinned {
		if p == victim.name {
			onVictim++
		}
	}
	t.Logf("%d requests, %d failed; %d sessions re-pinned %s after the kill", total.Load(), failures.Load(), onVictim, settled.Round(time.Millisecond))
	if failures.Load() != 0 || onVictim == 0 {
		t.Fatalf("failures %d, sessions on the victim %d", failures.Load(), onVictim)
	}
	// Clients never pinned to the victim stayed where they were.
	for i := range cs {
		if pinned[i] != victim.name && last[i][len(last[i])-1] != pinned[i] {
			t.Errorf("client %d moved from %s to %s", i, pinned[i], last[i][len(last[i])-1])
		}
	}
}

// TestCaddyAppCookiePrefixAcrossInstances: a session started through one Caddy continues on
// the same backend through another with the same secret (the built binary), upstreams
// listed in a different order.
func TestCaddyAppCookiePrefixAcrossInstances(t *testing.T) {
	bs := startBackends(t, 3)
	baseA := serve(t, bs, "\t\tlb_policy app_cookie JSESSIONID {\n secret "+secret+"\n }")
	portB := freePort(t)
	cf := filepath.Join(t.TempDir(), "Caddyfile")
	os.WriteFile(cf, []byte(fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n}\n:%d {\n\tstickylb\n\treverse_proxy %s %s %s {\n\t\tlb_policy app_cookie JSESSIONID {\n\t\t\tsecret {$SECRET}\n\t\t}\n\t}\n}\n",
		portB, bs[2].addr, bs[0].addr, bs[1].addr)), 0o644)
	runCaddy(t, cf, "SECRET="+secret)
	waitPort(t, fmt.Sprintf("127.0.0.1:%d", portB), 60*time.Second)
	baseB := fmt.Sprintf("http://127.0.0.1:%d", portB)
	for i := 0; i < 20; i++ {
		c := newClient(t, "")
		code, first := c.get(t, baseA+"/login")
		if code != 200 {
			t.Fatalf("login: %d %s", code, first)
		}
		// The jar is per host:port-less domain, so the cookie goes to B as well (same host).
		u, _ := url.Parse(baseA)
		var value string
		for _, ck := range c.Jar.Cookies(u) {
			if ck.Name == "JSESSIONID" {
				value = ck.Value
			}
		}
		if !strings.Contains(value, "~"+first+"-") {
			t.Fatalf("client sees %q, want a sealed prefix before %s-N", value, first)
		}
		for j := 0; j < 5; j++ {
			base := baseB
			if j%2 == 1 {
				base = baseA
			}
			if code, got := c.get(t, base+"/"); code != 200 || got != first {
				t.Fatalf("client %d via %s: %d %q, session on %s", i, base, code, got, first)
			}
		}
	}
	for _, b := range bs {
		b.seen.Range(func(k, _ any) bool {
			if strings.Contains(k.(string), "~") {
				t.Errorf("%s saw the prefix: %q", b.name, k)
			}
			return true
		})
	}
}

// TestCaddyWeightedLeastConnInflight: 40 concurrent slow requests with weights 3:1 leave the
// in-flight counts (Caddy's own) at 30:10.
func TestCaddyWeightedLeastConnInflight(t *testing.T) {
	bs := startBackends(t, 2)
	base := serve(t, bs, "\t\tlb_policy weighted_least_conn 3 1")
	const total = 40
	var wg sync.WaitGroup
	c := newClient(t, "")
	c.Transport.(*http.Transport).MaxConnsPerHost = 0
	c.Transport.(*http.Transport).MaxIdleConnsPerHost = total
	errs := make(chan string, total)
	for i := 0; i < total; i++ {
		wg.Go(func() {
			if code, body := c.get(t, base+"/slow"); code != 200 {
				errs <- fmt.Sprintf("%d %s", code, body)
			}
		})
		// Each request must be in flight before the next is picked, or two picks read the
		// same counts; the count is what we measure, so wait on it.
		want := int64(i + 1)
		testwait.For(t, 5*time.Second, "request in flight", func() (bool, string) {
			n := bs[0].inflight.Load() + bs[1].inflight.Load()
			return n == want, fmt.Sprint(n)
		})
	}
	a, b := bs[0].inflight.Load(), bs[1].inflight.Load()
	close(bs[0].release)
	close(bs[1].release)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	t.Logf("in flight: %d : %d (weights 3 : 1)", a, b)
	if a != 30 || b != 10 {
		t.Fatalf("in flight %d:%d, want 30:10", a, b)
	}
}

// TestCaddySlowStartShares: a backend added by a reload ramps up over the slow-start window;
// request shares over time follow Envoy's formula.
func TestCaddySlowStartShares(t *testing.T) {
	bs := startBackends(t, 3)
	port := freePort(t)
	cfg := func(n int) string {
		return fmt.Sprintf("{\n\tadmin localhost:2999\n\tauto_https off\n\tskip_install_trust\n\thttp_port %d\n}\n:%d {\n\treverse_proxy %s {\n\t\tlb_policy weighted_least_conn {\n\t\t\tslow_start 3s\n\t\t\tmin_weight_percent 5\n\t\t\tclocks slow-start-test\n\t\t}\n\t}\n}\n",
			port, port, addrs(bs[:n]))
	}
	tester := caddytest.NewTester(t)
	tester.InitServer(cfg(2), "caddyfile")
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitPort(t, fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second)
	c := newClient(t, "")
	for i := 0; i < 10; i++ {
		c.get(t, base+"/")
	}
	caddytest.NewTester(t).InitServer(cfg(3), "caddyfile")
	added := time.Now()
	const buckets = 4 // seconds: three within the window, one after
	var hits, all [buckets]int
	for {
		el := time.Since(added)
		if el >= buckets*time.Second {
			break
		}
		code, body := c.get(t, base+"/")
		if code != 200 {
			t.Fatalf("%d %s", code, body)
		}
		k := int(el / time.Second)
		all[k]++
		if body == bs[2].name {
			hits[k]++
		}
	}
	var shares [buckets]float64
	for k := range shares {
		shares[k] = float64(hits[k]) / float64(all[k])
	}
	t.Logf("share of the new backend per second after it joined: %.3f %.3f %.3f %.3f (requests %v); ideal mid-second: %.3f %.3f %.3f %.3f",
		shares[0], shares[1], shares[2], shares[3], all,
		(0.5/3)/(2+0.5/3), (1.5/3)/(2+1.5/3), (2.5/3)/(2+2.5/3), 1.0/3)
	// Loose bounds: the reload itself takes part of the first second.
	if shares[0] > 0.15 || shares[3] < 0.30 || shares[3] > 0.37 || !(shares[0] < shares[1] && shares[1] < shares[2] && shares[2] < shares[3]) {
		t.Fatalf("shares do not ramp: %v", shares)
	}
}

// TestCaddyDrainKeepsSessionsTakesNoNew drains a backend through the admin API.
func TestCaddyDrainKeepsSessionsTakesNoNew(t *testing.T) {
	bs := startBackends(t, 3)
	base := serve(t, bs, "\t\tlb_policy sticky_cookie {\n secret "+secret+"\n }")
	var old []*client
	for i := 0; i < 30; i++ {
		c := newClient(t, "")
		if _, body := c.get(t, base+"/"); body == bs[0].name {
			old = append(old, c)
		}
	}
	if len(old) == 0 {
		t.Fatal("no session on backend-1 before the drain")
	}
	post(t, adminBase+"/stickylb/upstreams/"+bs[0].addr+"/drain")
	t.Cleanup(func() { post(t, adminBase+"/stickylb/upstreams/"+bs[0].addr+"/undrain") })
	for _, c := range old {
		for j := 0; j < 3; j++ {
			if _, body := c.get(t, base+"/"); body != bs[0].name {
				t.Fatalf("a session pinned to the draining backend moved to %s", body)
			}
		}
	}
	for i := 0; i < 60; i++ {
		if _, body := newClient(t, "").get(t, base+"/"); body == bs[0].name {
			t.Fatal("the draining backend got a new session")
		}
	}
	var list struct {
		Drained map[string]string `json:"drained"`
	}
	getJSON(t, adminBase+"/stickylb/upstreams", &list)
	if _, ok := list.Drained[bs[0].addr]; !ok {
		t.Fatalf("drain list: %v", list.Drained)
	}
}

// TestCaddyAdminSessionsTable: a keyed policy's table in GET, flushed by DELETE.
func TestCaddyAdminSessionsTable(t *testing.T) {
	bs := startBackends(t, 3)
	base := serve(t, bs, "\t\tlb_policy sticky_header X-Session {\n table admin-test\n ttl 1m\n }")
	c := newClient(t, "")
	for i := 0; i < 10; i++ {
		c.get(t, base+"/", fmt.Sprintf("X-Session: k%d", i%5))
	}
	var info struct {
		Tables map[string]struct {
			Entries int    `json:"entries"`
			Hits    uint64 `json:"hits"`
			Policy  string `json:"policy"`
		} `json:"tables"`
	}
	getJSON(t, adminBase+"/stickylb/sessions", &info)
	tab := info.Tables["admin-test"]
	if tab.Entries != 5 || tab.Hits != 5 || tab.Policy != "sticky_header" {
		t.Fatalf("table: %+v", info.Tables)
	}
	req, _ := http.NewRequest("DELETE", adminBase+"/stickylb/sessions/admin-test", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("flush: %v %v", err, resp)
	}
	resp.Body.Close()
	getJSON(t, adminBase+"/stickylb/sessions", &info)
	if info.Tables["admin-test"].Entries != 0 {
		t.Fatalf("after flush: %+v", info.Tables["admin-test"])
	}
	req, _ = http.NewRequest("DELETE", adminBase+"/stickylb/sessions/no-such-table", nil)
	resp, _ = http.DefaultClient.Do(req)
	if resp.StatusCode != 404 {
		t.Fatalf("flush of an unknown table: %d", resp.StatusCode)
	}
	resp.Body.Close()
	// Metrics through Caddy's registry.
	resp, err = http.Get(adminBase + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `stickylb_sessions{table="admin-test"}`) || !strings.Contains(string(b), "stickylb_hits_total") {
		t.Fatalf("metrics missing stickylb series:\n%s", b)
	}
}

// TestCaddyReloadKeepsSessions: a `caddy reload` (a new config with the same table) keeps the
// session table and its mappings.
func TestCaddyReloadKeepsSessions(t *testing.T) {
	bs := startBackends(t, 3)
	policy := "\t\tlb_policy sticky_header X-Session {\n table reload-test\n ttl 10m\n }"
	base := serve(t, bs, policy)
	c := newClient(t, "")
	pins := map[string]string{}
	for i := 0; i < 30; i++ {
		k := fmt.Sprintf("X-Session: r%d", i)
		_, pins[k] = c.get(t, base+"/", k)
	}
	// Reload with the upstreams in another order and a changed ttl: a new config, the same table.
	port := strings.TrimPrefix(base, "http://127.0.0.1:")
	cfg := fmt.Sprintf("{\n\tadmin localhost:2999\n\tauto_https off\n\tskip_install_trust\n\thttp_port %s\n}\n:%s {\n\treverse_proxy %s %s %s {\n\t\tlb_policy sticky_header X-Session {\n\t\t\ttable reload-test\n\t\t\tttl 20m\n\t\t}\n\t}\n}\n",
		port, port, bs[2].addr, bs[1].addr, bs[0].addr)
	caddytest.NewTester(t).InitServer(cfg, "caddyfile")
	var info struct {
		Tables map[string]struct {
			Entries int    `json:"entries"`
			TTL     string `json:"ttl"`
		} `json:"tables"`
	}
	getJSON(t, adminBase+"/stickylb/sessions", &info)
	if tab := info.Tables["reload-test"]; tab.Entries != 30 || tab.TTL != "20m0s" {
		t.Fatalf("after reload: %+v", info.Tables)
	}
	for k, want := range pins {
		if _, got := c.get(t, base+"/", k); got != want {
			t.Fatalf("%s moved from %s to %s across the reload", k, want, got)
		}
	}
}

// TestCaddyAppCookieLearnSurvivesFlood: app_cookie learn mode keeps the sessions its backends
// issued while clients send ten times the table's size of values no backend issued. Such
// values are balanced by their hash, never stored, so they cannot evict a real session.
func TestCaddyAppCookieLearnSurvivesFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("floods a real Caddy")
	}
	const sessions, flood = 1000, 10 * 1000
	bs := startBackends(t, 3)
	// The 1,000 logins come from one address (the test's), over learn mode's default bound
	// of new sessions per client and minute.
	base := serve(t, bs, fmt.Sprintf("\t\tlb_policy app_cookie JSESSIONID {\n mode learn\n max_sessions %d\n max_new_per_client %d\n table flood-test\n }", sessions, sessions))
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	do := func(path, cookie string) (string, []*http.Cookie) {
		req, _ := http.NewRequest("GET", base+path, nil)
		if cookie != "" {
			req.Header.Set("Cookie", "JSESSIONID="+cookie)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Error(err)
			return "", nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", path, resp.StatusCode, b)
		}
		return string(b), resp.Cookies()
	}
	parallel := func(n int, fn func(i int)) {
		var wg sync.WaitGroup
		var next atomic.Int64
		for range 8 {
			wg.Go(func() {
				for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
					fn(i)
				}
			})
		}
		wg.Wait()
	}
	// 1,000 logins: each backend issues a value, which the table learns.
	values := make([]string, sessions)
	owners := make([]string, sessions)
	parallel(sessions, func(i int) {
		body, cs := do("/login", "")
		for _, c := range cs {
			if c.Name == "JSESSIONID" {
				values[i], owners[i] = c.Value, body
			}
		}
	})
	type tableInfo struct {
		Entries int    `json:"entries"`
		Hits    uint64 `json:"hits"`
		Evicted uint64 `json:"evicted"`
	}
	var info struct {
		Tables map[string]tableInfo `json:"tables"`
	}
	getJSON(t, adminBase+"/stickylb/sessions", &info)
	if got := info.Tables["flood-test"].Entries; got != sessions {
		t.Fatalf("%d sessions learned, want %d", got, sessions)
	}
	// The flood: values no backend issued.
	parallel(flood, func(i int) { do("/", fmt.Sprintf("forged-%06d", i)) })
	getJSON(t, adminBase+"/stickylb/sessions", &info)
	before := info.Tables["flood-test"]
	// Every learned session still reaches the backend that issued it, by its table entry.
	var onOwner atomic.Int64
	parallel(sessions, func(i int) {
		if body, _ := do("/", values[i]); body == owners[i] {
			onOwner.Add(1)
		}
	})
	getJSON(t, adminBase+"/stickylb/sessions", &info)
	after := info.Tables["flood-test"]
	survived := after.Hits - before.Hits
	t.Logf("after a flood of %d forged values: %d of %d learned sessions hit the table (%d evictions), %d reached their backend",
		flood, survived, sessions, after.Evicted, onOwner.Load())
	if survived != sessions || onOwner.Load() != sessions {
		t.Fatalf("%d of %d sessions survived the flood (%d on their backend)", survived, sessions, onOwner.Load())
	}
}

// TestCaddyAppCookieLearnKeepsSessionsSeenTwice: an application sets a fresh session cookie
// on every request that carries none, so in learn mode cookie-less requests do insert
// sessions. With max_sessions 5000, 1,000 clients, each from its own address, log in and
// come back once; then 50,000 cookie-less requests, each from an address of its own, and a
// client that comes back once with each of 5,000 fresh values (a flood of sessions seen
// twice, from one address): none of the 1,000 moves. The first flood meets the table's
// protected segment (sessions seen twice are evicted only by sessions seen twice), the
// second max_new_per_client (its default, 60 a minute). Client addresses come from
// X-Forwarded-For, which the site trusts from loopback.
func TestCaddyAppCookieLearnKeepsSessionsSeenTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("floods a real Caddy")
	}
	const victims, flood, replayed = 1000, 50_000, 5000
	bs := startBackends(t, 3)
	port := freePort(t)
	cfg := fmt.Sprintf(`{
	admin localhost:2999
	auto_https off
	skip_install_trust
	http_port %d
	servers {
		trusted_proxies static 127.0.0.0/8
		client_ip_headers X-Forwarded-For
	}
}
:%d {
	stickylb
	reverse_proxy %s {
		lb_policy app_cookie JSESSIONID {
			mode learn
			max_sessions 5000
			table seen-twice
		}
	}
}
`, port, port, addrs(bs))
	caddytest.NewTester(t).InitServer(cfg, "caddyfile")
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitPort(t, fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second)
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	// do sends GET /app from client address from, with the session cookie when given, and
	// returns the backend that answered and the session value it set, if any.
	do := func(from netip.Addr, cookie string) (string, string) {
		req, _ := http.NewRequest("GET", base+"/app", nil)
		req.Header.Set("X-Forwarded-For", from.String())
		if cookie != "" {
			req.Header.Set("Cookie", "JSESSIONID="+cookie)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Error(err)
			return "", ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Errorf("%d %s", resp.StatusCode, b)
		}
		set := ""
		for _, c := range resp.Cookies() {
			if c.Name == "JSESSIONID" {
				set = c.Value
			}
		}
		return string(b), set
	}
	parallel := func(n int, fn func(i int)) { fanout.Each(n, 8, func(i int) error { fn(i); return nil }) }
	addr := func(net byte, i int) netip.Addr { return netip.AddrFrom4([4]byte{10, net, byte(i >> 8), byte(i)}) }
	type tableInfo struct {
		Entries, Protected int
		Hits, Evicted      uint64
	}
	table := func() tableInfo {
		var info struct {
			Tables map[string]tableInfo `json:"tables"`
		}
		getJSON(t, adminBase+"/stickylb/sessions", &info)
		return info.Tables["seen-twice"]
	}
	// The 1,000 clients: a first request (the application sets the session) and one more.
	values, owners := make([]string, victims), make([]string, victims)
	parallel(victims, func(i int) {
		owners[i], values[i] = do(addr(1, i), "")
		if body, _ := do(addr(1, i), values[i]); body != owners[i] {
			t.Errorf("client %d: its second request went to %s, its session is on %s", i, body, owners[i])
		}
	})
	if tab := table(); tab.Entries != victims || tab.Protected != victims {
		t.Fatalf("after the logins: %+v, want %d sessions, all protected", tab, victims)
	}
	// moved counts the clients whose next request does not reach their session's backend,
	// and those whose session the table lost (hash routing may land them home by luck).
	moved := func(what string) {
		t.Helper()
		before := table().Hits
		var away atomic.Int64
		parallel(victims, func(i int) {
			if body, _ := do(addr(1, i), values[i]); body != owners[i] {
				away.Add(1)
			}
		})
		tab := table()
		lost := victims - int(tab.Hits-before)
		t.Logf("after %s: %d of %d clients moved, %d lost their table entry (table: %+v)", what, away.Load(), victims, lost, tab)
		if away.Load() != 0 || lost != 0 {
			t.Errorf("after %s: %d of %d clients moved to another backend, %d sessions lost from the table", what, away.Load(), victims, lost)
		}
	}
	// 50,000 cookie-less requests, each from its own address: each a new session, seen once.
	start := time.Now()
	parallel(flood, func(i int) { do(addr(2+byte(i>>16), i), "") })
	t.Logf("%d cookie-less requests in %v", flood, time.Since(start).Round(time.Millisecond))
	moved(fmt.Sprintf("%d cookie-less requests", flood))
	// One client comes back once with each of 5,000 fresh values: sessions seen twice.
	attacker := netip.MustParseAddr("192.0.2.66")
	replays := time.Now()
	parallel(replayed, func(int) {
		if _, v := do(attacker, ""); v != "" {
			do(attacker, v)
		}
	})
	moved(fmt.Sprintf("%d fresh values each sent back once from one address", replayed))
	var info struct {
		Scopes map[string]struct {
			NewCapped uint64 `json:"new_sessions_capped"`
		} `json:"scopes"`
	}
	getJSON(t, adminBase+"/stickylb/sessions", &info)
	// The replays met as many one-minute windows as they took minutes, plus one: each window
	// learned the default bound at most.
	windows := int(time.Since(replays)/time.Minute) + 2
	t.Logf("%d new sessions capped (max_new_per_client)", info.Scopes["seen-twice"].NewCapped)
	if c, want := info.Scopes["seen-twice"].NewCapped, uint64(replayed-windows*sessions.DefaultNewPerClient); c < want {
		t.Errorf("%d new sessions capped (max_new_per_client), want at least %d", c, want)
	}
}

// TestCaddyAppCookieTablesPerSite: two sites with `app_cookie JSESSIONID` (learn mode) and no
// table name keep separate tables: a client whose cookie reaches both sites (cookies are
// per host, not per port) keeps its session on site A after visiting site B, each table
// keeps its own ttl, and both survive a reload that changes ttl and upstream order.
func TestCaddyAppCookieTablesPerSite(t *testing.T) {
	as := []*backend{startBackend(t, "a-1"), startBackend(t, "a-2"), startBackend(t, "a-3")}
	bs := []*backend{startBackend(t, "b-1"), startBackend(t, "b-2"), startBackend(t, "b-3")}
	portA, portB := freePort(t), freePort(t)
	cfg := func(ttlA, ttlB string, a, b []*backend) string {
		site := func(port int, ups []*backend, ttl string) string {
			return fmt.Sprintf(":%d {\n\tstickylb\n\treverse_proxy %s {\n\t\tlb_policy app_cookie JSESSIONID {\n\t\t\tmode learn\n\t\t\tttl %s\n\t\t}\n\t}\n}\n", port, addrs(ups), ttl)
		}
		return fmt.Sprintf("{\n\tadmin localhost:2999\n\tauto_https off\n\tskip_install_trust\n\thttp_port %d\n}\n", portA) +
			site(portA, a, ttlA) + site(portB, b, ttlB)
	}
	caddytest.NewTester(t).InitServer(cfg("10m", "20m", as, bs), "caddyfile")
	baseA, baseB := fmt.Sprintf("http://127.0.0.1:%d", portA), fmt.Sprintf("http://127.0.0.1:%d", portB)
	waitPort(t, fmt.Sprintf("127.0.0.1:%d", portB), 10*time.Second)
	type tableInfo struct {
		Policy string `json:"policy"`
		TTL    string `json:"ttl"`
	}
	tables := func() map[string]int {
		var info struct {
			Tables map[string]tableInfo `json:"tables"`
		}
		getJSON(t, adminBase+"/stickylb/sessions", &info)
		ttls := map[string]int{}
		for _, tab := range info.Tables {
			if tab.Policy == "app_cookie" {
				ttls[tab.TTL]++
			}
		}
		return ttls
	}
	if got := tables(); got["10m0s"] != 1 || got["20m0s"] != 1 {
		t.Fatalf("app_cookie tables by ttl: %v, want one of 10m and one of 20m", got)
	}
	const clients = 30
	cs := make([]*client, clients)
	pinned := make([]string, clients)
	for i := range cs {
		cs[i] = newClient(t, "")
		var code int
		if code, pinned[i] = cs[i].get(t, baseA+"/login"); code != 200 {
			t.Fatalf("login: %d %s", code, pinned[i])
		}
		// The same JSESSIONID goes to site B, whose backends never issued it.
		if code, body := cs[i].get(t, baseB+"/"); code != 200 || byName(bs, body) == nil {
			t.Fatalf("site B: %d %q", code, body)
		}
	}
	kept := func(when string) {
		t.Helper()
		moved := 0
		for i, c := range cs {
			if _, body := c.get(t, baseA+"/"); body != pinned[i] {
				moved++
			}
		}
		if moved > 0 {
			t.Fatalf("%s: %d of %d sessions of site A moved", when, moved, clients)
		}
	}
	kept("after visiting site B")
	caddytest.NewTester(t).InitServer(cfg("15m", "25m", []*backend{as[2], as[0], as[1]}, bs), "caddyfile")
	if got := tables(); got["15m0s"] != 1 || got["25m0s"] != 1 || len(got) != 2 {
		t.Fatalf("after the reload, app_cookie tables by ttl: %v", got)
	}
	kept("after a reload")
}

// TestCaddyStickyCookieResponsesArePrivate: through a real Caddy, the response that sets the LB
// cookie says Cache-Control: private; the hits that follow carry the upstream's own.
func TestCaddyStickyCookieResponsesArePrivate(t *testing.T) {
	bs := startBackends(t, 2)
	base := serve(t, bs, "\t\tlb_policy sticky_cookie {\n secret "+secret+"\n }\n\t\theader_down Cache-Control \"public, max-age=60, s-maxage=600\"")
	c := newClient(t, "")
	for i, want := range []string{"private, max-age=60", "public, max-age=60, s-maxage=600"} {
		req, _ := http.NewRequest("GET", base+"/", nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := strings.Join(resp.Header.Values("Cache-Control"), ", "); got != want {
			t.Fatalf("request %d (Set-Cookie %q): Cache-Control %q, want %q", i, resp.Header.Get("Set-Cookie"), got, want)
		}
	}
}

// TestCaddyAppCookiePrefixResponsesArePrivate: through a real Caddy, a response whose
// Set-Cookie app_cookie prefixed (a cookie of the LB's) says Cache-Control: private without
// the upstream's public and s-maxage; a response that sets no cookie keeps the upstream's.
func TestCaddyAppCookiePrefixResponsesArePrivate(t *testing.T) {
	bs := startBackends(t, 2)
	base := serve(t, bs, "\t\tlb_policy app_cookie JSESSIONID {\n secret "+secret+"\n }\n\t\theader_down Cache-Control \"public, max-age=60, s-maxage=600\"")
	c := newClient(t, "")
	for i, step := range []struct{ path, want string }{
		{"/login", "private, max-age=60"},
		{"/", "public, max-age=60, s-maxage=600"},
		{"/login", "private, max-age=60"},
	} {
		resp, err := c.Get(base + step.path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		sc := resp.Header.Get("Set-Cookie")
		if step.path == "/login" && !strings.Contains(sc, "~backend-") {
			t.Fatalf("request %d: Set-Cookie %q, want the upstream's cookie behind a sealed prefix", i, sc)
		}
		if got := strings.Join(resp.Header.Values("Cache-Control"), ", "); got != step.want {
			t.Fatalf("request %d %s (Set-Cookie %q): Cache-Control %q, want %q", i, step.path, sc, got, step.want)
		}
	}
}

// TestCaddyStickyCookieWithoutHandlerIsPrivate: without the stickylb handler in the route a
// selection policy writes its headers before Caddy adds the upstream's, and sees nothing
// after: the response that sets the cookie says private first, the upstream's public and
// s-maxage after it (a shared cache must not store a response marked private, whatever
// else it says: RFC 9111, section 3). xcaddy.md states this.
func TestCaddyStickyCookieWithoutHandlerIsPrivate(t *testing.T) {
	bs := startBackends(t, 2)
	port := freePort(t)
	cfg := fmt.Sprintf(`{
	admin localhost:2999
	auto_https off
	skip_install_trust
	http_port %d
}
:%d {
	reverse_proxy %s {
		lb_policy sticky_cookie {
			secret %s
		}
		header_down Cache-Control "public, max-age=60, s-maxage=600"
	}
}
`, port, port, addrs(bs), secret)
	caddytest.NewTester(t).InitServer(cfg, "caddyfile")
	waitPort(t, fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second)
	resp, err := newClient(t, "").Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Header.Get("Set-Cookie") == "" {
		t.Fatal("no cookie set")
	}
	if got := resp.Header.Values("Cache-Control"); len(got) != 2 || got[0] != "private" || got[1] != "public, max-age=60, s-maxage=600" {
		t.Fatalf("Cache-Control %q, want private first, then the upstream's", got)
	}
}
