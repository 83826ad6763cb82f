package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/stickylb/stickylb/internal/testkit/loopback"
	"github.com/stickylb/stickylb/internal/testkit/poolstest"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// loadAdminXDSCaddy loads Caddy with its admin API on 127.0.0.1:admin and one site on port
// proxying to service api of the control plane at server; extra goes in the source's block.
func loadAdminXDSCaddy(t *testing.T, admin, port int, server, extra string) {
	t.Helper()
	src := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	persist_config off
	auto_https off
	log {
		output discard
	}
}
http://127.0.0.1:%d {
	reverse_proxy {
		dynamic stickylb_xds {
			server  %s
			service api
			node_id admit/caddy
			%s
		}
		lb_policy first
	}
}
`, admin, port, server, extra)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting the Caddyfile: %v", err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading Caddy: %v", err)
	}
}

// A control plane that names a Caddy node's own admin API as a backend does not get the
// node to proxy clients to it: loopback is refused by default, and the node's own admin
// address and listeners even with allow_loopback, which admits the other loopback
// backends (demos, tests). The rest of the view applies.
func TestXDSSourceRefusesItsOwnAdmin(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a control plane and Caddy: about 2 s")
	}
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	admin, port := loopback.FreePort(t), loopback.FreePort(t)
	adminAddr := fmt.Sprintf("127.0.0.1:%d", admin)
	b0 := startE2EBackend(t, "b0")
	cp := startE2EControlPlane(t, poolstest.API("address: "+adminAddr))
	loadAdminXDSCaddy(t, admin, port, cp.addr, "")
	t.Cleanup(func() { _ = caddy.Stop() })
	client := &http.Client{Timeout: 5 * time.Second}
	// The client names the admin API's own host (the site matches 127.0.0.1 on any port):
	// Caddy passes the Host header on, so the admin API's host check lets it in.
	get := func(path string) (int, string) {
		req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d%s", port, path), nil)
		req.Host = adminAddr
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	testwait.For(t, 5*time.Second, "the view at Caddy", func() (bool, string) {
		_, ok := backendIn(adminAddr)
		return ok, "not yet"
	})
	// Nothing to proxy to: Caddy's own 502 or 503, not an answer of the admin API.
	if code, body := get("/config/"); code != http.StatusBadGateway && code != http.StatusServiceUnavailable || strings.Contains(body, "{") {
		t.Fatalf("GET /config/ through the proxy answered %d %.200q: the admin API was reached", code, body)
	}

	// allow_loopback: the loopback backend takes the requests; the admin API and the site
	// itself (Caddy listens on ":port", every address) still none.
	siteAddr := fmt.Sprintf("127.0.0.1:%d", port)
	cp.edit(t, poolstest.API("address: "+adminAddr, "address: "+siteAddr, "address: "+b0.addr()))
	loadAdminXDSCaddy(t, admin, port, cp.addr, "allow_loopback")
	testwait.For(t, 5*time.Second, "b0 in the view", func() (bool, string) {
		_, ok := backendIn(b0.addr())
		return ok, "not yet"
	})
	for range 10 {
		if code, body := get("/config/"); code != http.StatusOK || body != "b0" {
			t.Fatalf("with allow_loopback, GET /config/ answered %d %.120q, want b0's", code, body)
		}
	}
	refused := map[string]string{}
	for _, r := range liveSub().refusals.List() {
		refused[r.Address] = r.Reason
	}
	if len(refused) != 2 || !strings.HasPrefix(refused[adminAddr], "this Caddy listens there (") ||
		!strings.HasPrefix(refused[siteAddr], "this Caddy listens there on every address") {
		t.Fatalf("refused %q, want the admin API and the site", refused)
	}
}
