package caddymodule

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/stickylb/stickylb/policies/status"
)

// The admin API's drain and undrain change state: like the status page's, they need the
// custom header and a same-origin (or non-browser) request, so a page on another origin
// cannot drain through a browser that can reach the admin address.
func TestAdminDrainNeedsCSRFHeader(t *testing.T) {
	const addr = "10.9.8.7:80"
	t.Cleanup(func() { drains.undrain(addr) })
	do := func(hdr map[string]string) int {
		r := httptest.NewRequest(http.MethodPost, "http://localhost:2019/stickylb/upstreams/"+addr+"/drain", nil)
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		if err := handleUpstreams(w, r); err != nil {
			var ae caddy.APIError
			if errors.As(err, &ae) {
				return ae.HTTPStatus
			}
			return 500
		}
		return 200
	}
	if code := do(nil); code != http.StatusForbidden || drains.drained(addr) {
		t.Fatalf("POST drain without %s: %d, drained %v; want 403 and nothing drained", status.CSRFHeader, code, drains.drained(addr))
	}
	if code := do(map[string]string{status.CSRFHeader: "1", "Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"}); code != http.StatusForbidden || drains.drained(addr) {
		t.Fatalf("cross-site POST drain with the header: %d; want 403", code)
	}
	if code := do(map[string]string{status.CSRFHeader: "1"}); code != 200 || !drains.drained(addr) {
		t.Fatalf("POST drain with %s: 1 from a tool: %d, drained %v; want 200 and drained", status.CSRFHeader, code, drains.drained(addr))
	}
}
