package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/stickylb/stickylb/internal/testkit/testwait"
)

// TestCaddyfileExampleAdaptsWithoutSecret: the JSON config Caddy keeps (the admin API's
// /config/, autosave.json) holds no secret, with STICKYLB_SECRET set or not.
func TestCaddyfileExampleAdaptsWithoutSecret(t *testing.T) {
	const real = "a-real-secret-from-the-environment-0123456789"
	t.Setenv("STICKYLB_SECRET", real)
	src, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": "Caddyfile.example"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), real) || strings.Contains(string(out), "demo-secret") {
		t.Fatalf("the adapted config holds a secret:\n%s", out)
	}
	var cfg any
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"secrets":["{env.STICKYLB_SECRET}"]`) || !strings.Contains(string(out), `"insecure_demo_secret":true`) {
		t.Fatalf("the adapted policy does not read STICKYLB_SECRET at provision:\n%s", out)
	}
}

// TestCaddyfileExample runs README's first command's Caddyfile with the built binary: a
// cookie jar keeps a client on one demo backend; clients without one reach all three.
func TestCaddyfileExample(t *testing.T) {
	for _, a := range []string{"127.0.0.1:8080", "127.0.0.1:2019", "127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"} {
		if c, err := net.DialTimeout("tcp", a, 100*time.Millisecond); err == nil {
			c.Close()
			t.Fatalf("%s is already in use; Caddyfile.example needs it", a)
		}
	}
	// README's command, with no secret set: the demo secret, and a warning in the log.
	t.Setenv("STICKYLB_SECRET", "")
	cmd := runCaddy(t, "../Caddyfile.example")
	waitPort(t, "127.0.0.1:8080", 60*time.Second)
	for _, a := range []string{"127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"} {
		waitPort(t, a, 10*time.Second)
	}
	// Caddy's first active health probe can run before the demo backends listen (they are
	// sites of the same config); the next probe (health_interval 2s) clears them. Wait until
	// new sessions reach every backend (the config's interval plus 8 s of slack).
	warm := map[string]int{}
	testwait.For(t, 10*time.Second, "new sessions reaching all three demo backends through :8080", func() (bool, string) {
		code, body := newClient(t, "").get(t, "http://localhost:8080/")
		if code == 200 {
			warm[body]++
		}
		return len(warm) == 3, fmt.Sprintf("%d %q; so far %v", code, body, warm)
	})
	seen := map[string]int{}
	for i := 0; i < 12; i++ {
		c := newClient(t, "")
		code, first := c.get(t, "http://localhost:8080/")
		if code != 200 || !strings.HasPrefix(first, "backend-") {
			t.Fatalf("%d %q", code, first)
		}
		seen[first]++
		for j := 0; j < 5; j++ {
			if code, got := c.get(t, "http://localhost:8080/"); code != 200 || got != first {
				t.Fatalf("client %d: %d %q after %q", i, code, got, first)
			}
		}
	}
	// New sessions spread by weighted least connections with a 10 s slow start: a backend
	// whose first health probe came late is still ramping up and may get none of these 12
	// (the wait above showed every backend taking new sessions).
	if len(seen) < 2 {
		t.Fatalf("new sessions reached only %v", seen)
	}
	var info struct {
		Scopes map[string]struct {
			Hits uint64 `json:"hits"`
		} `json:"scopes"`
	}
	getJSON(t, "http://localhost:2019/stickylb/sessions", &info)
	if h := info.Scopes["sticky_cookie:lb_session"].Hits; h != 60 {
		t.Fatalf("admin API counts %d hits, want 60", h)
	}
	if f, ok := cmd.Stderr.(*os.File); ok {
		log, _ := os.ReadFile(f.Name())
		if !strings.Contains(string(log), "public demo secret") {
			t.Fatalf("no warning about the demo secret in the log:\n%s", log)
		}
	}
}
