package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// hostGet sends GET path to addr with the Host header host and returns the status code.
func hostGet(t *testing.T, addr, host, path string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestXDSAdminRefusesForeignHosts: the admin address answers only the Host names it is
// bound to (its address, localhost for a loopback bind, and --admin-host names); a page a
// browser loaded from another name (DNS rebinding: evil.example resolving to 127.0.0.1)
// is refused on every path, with 421.
func TestXDSAdminRefusesForeignHosts(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, admin, done := runXDS(ctx, t, xdsOptions{pools: "../../pools.example.yaml", listen: "127.0.0.1:0", admin: "127.0.0.1:0",
		adminHosts: []string{"ops.example"}, poll: time.Second}, zaptest.NewLogger(t))
	_, port, _ := net.SplitHostPort(admin)
	paths := []string{"/", "/status.json", "/config", "/metrics", "/healthz", "/livez"}
	foreign := []string{"evil.example:" + port, "evil.example", "127.0.0.1.evil.example:" + port, "localhost.evil.example:" + port, "[::1]:" + port, "10.0.0.1:" + port}
	own := []string{admin, "localhost:" + port, "LOCALHOST:" + port, "ops.example:" + port, "ops.example"}
	refused, total := 0, 0
	for _, p := range paths {
		for _, h := range foreign {
			total++
			if code := hostGet(t, admin, h, p); code == http.StatusMisdirectedRequest {
				refused++
			} else {
				t.Errorf("GET %s with Host %s: %d, want 421", p, h, code)
			}
		}
		for _, h := range own {
			if code := hostGet(t, admin, h, p); code != http.StatusOK {
				t.Errorf("GET %s with Host %s: %d, want 200", p, h, code)
			}
		}
	}
	t.Logf("refused %d of %d requests with a foreign Host", refused, total)
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestXDSAdminWildcardBind: bound to every address, the admin answers any IP literal and
// localhost, and names only when --admin-host lists them.
func TestXDSAdminWildcardBind(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, admin, done := runXDS(ctx, t, xdsOptions{pools: "../../pools.example.yaml", listen: "127.0.0.1:0", admin: "0.0.0.0:0",
		poll: time.Second}, zaptest.NewLogger(t))
	_, port, _ := net.SplitHostPort(admin)
	dial := "127.0.0.1:" + port
	for h, want := range map[string]int{
		"10.1.2.3:" + port: 200, "[fd00::1]:" + port: 200, "127.0.0.1": 200, "localhost:" + port: 200,
		"lb1.example:" + port: 421, "evil.example": 421,
	} {
		if code := hostGet(t, dial, h, "/status.json"); code != want {
			t.Errorf("Host %s: %d, want %d", h, code, want)
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d", code)
	}
}

var _ = fmt.Sprint
