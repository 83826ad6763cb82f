package xds

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"
)

// TestConfigDumpOutsideTheLock: /config serialises a copy of the streams' snapshots; the
// lock that ACKs, NACKs and new streams take is free while it does.
func TestConfigDumpOutsideTheLock(t *testing.T) {
	s := NewServer(t.Context(), bigPools(t, 2, 3, 8080), nil, zaptest.NewLogger(t))
	s.testNode(t, "dumped", "zone-a")
	calls, held := 0, 0
	s.onDumping(func() {
		calls++
		if !s.mu.TryLock() {
			held++
			return
		}
		s.mu.Unlock()
	})
	h := httptest.NewServer(s.AdminHandler())
	defer h.Close()
	resp, err := http.Get(h.URL + "/config")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"node":"dumped"`) || !strings.Contains(string(body), "svc-1") {
		t.Fatalf("config: %.300s", body)
	}
	if calls == 0 || held > 0 {
		t.Fatalf("%d of %d resources were serialised with the server's lock held", held, calls)
	}
}
