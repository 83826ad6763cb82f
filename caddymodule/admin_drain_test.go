package caddymodule

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/stickylb/stickylb/policies/status"
)

// adminPost posts to the admin API's upstreams route as a tool does (with the CSRF header)
// and returns the status and the body or error message.
func adminPost(t *testing.T, path string) (int, string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "http://localhost:2019"+path, nil)
	r.Header.Set(status.CSRFHeader, "1")
	w := httptest.NewRecorder()
	if err := handleUpstreams(w, r); err != nil {
		var ae caddy.APIError
		if errors.As(err, &ae) {
			return ae.HTTPStatus, ae.Err.Error()
		}
		return 500, err.Error()
	}
	return w.Code, w.Body.String()
}

// The admin API's drain answers 400 with the reason for what cannot be an upstream's dial
// address (as the status page's drain does), and drains nothing. An address no static
// upstream of the config has is drained (a dynamic upstream, or one about to be added, gets
// no new sessions from its first request), and the answer says it is not in the config.
func TestAdminDrainAddress(t *testing.T) {
	for _, bad := range []string{"localhost", "a:b:c", "{http.request.host}:80", "10.0.0.1:0", "10.0.0.1:80-90", ":80"} {
		for _, action := range []string{"drain", "undrain"} {
			code, msg := adminPost(t, "/stickylb/upstreams/"+bad+"/"+action)
			if code != http.StatusBadRequest || !strings.Contains(msg, bad) || drains.drained(bad) {
				t.Fatalf("POST %s %s: %d %q, drained %v; want 400 naming the address, nothing drained", action, bad, code, msg, drains.drained(bad))
			}
		}
	}
	const ahead = "10.9.8.6:80" // no config is running: no static upstream has it
	t.Cleanup(func() { drains.undrain(ahead) })
	code, body := adminPost(t, "/stickylb/upstreams/"+ahead+"/drain")
	var out struct {
		Upstream string `json:"upstream"`
		Drained  bool   `json:"drained"`
		Changed  bool   `json:"changed"`
		InConfig bool   `json:"in_config"`
	}
	if err := json.Unmarshal([]byte(body), &out); code != 200 || err != nil || !out.Drained || !out.Changed || out.InConfig || !drains.drained(ahead) {
		t.Fatalf("POST drain %s ahead of its arrival: %d %s (%v); want 200, drained, in_config false", ahead, code, body, err)
	}
	if code, body := adminPost(t, "/stickylb/upstreams/"+ahead+"/undrain"); code != 200 || drains.drained(ahead) {
		t.Fatalf("POST undrain %s: %d %s", ahead, code, body)
	}
}
