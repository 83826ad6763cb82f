package status

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// page is the status page: one self-contained HTML file (no external assets).
//
//go:embed page.html
var page []byte

// pageCSP allows the page its own inline style and script (by hash) and requests to its own
// origin only, and forbids framing, so its drain buttons cannot be clickjacked.
var pageCSP = func() string {
	start := bytes.Index(page, []byte("<script>"))
	end := bytes.Index(page, []byte("</script>"))
	if start < 0 || end < start {
		panic("status: page.html has no <script> element")
	}
	sum := sha256.Sum256(page[start+len("<script>") : end])
	return "default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-" +
		base64.StdEncoding.EncodeToString(sum[:]) + "'; connect-src 'self'; img-src data:; " +
		"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}()

// ServePage writes the page with headers that keep it to its own origin.
func ServePage(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", pageCSP)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	_, _ = w.Write(page)
}

// ServeJSON writes snap as JSON.
func ServeJSON(w http.ResponseWriter, snap *Snapshot) error {
	b, err := json.Marshal(snap)
	if err != nil {
		return fmt.Errorf("status: encoding snapshot: %w", err)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	_, err = w.Write(append(b, '\n'))
	return err
}

// ErrCrossOrigin is returned by CheckStateChange for a request that does not prove it comes
// from the page's own origin.
var ErrCrossOrigin = errors.New("state-changing request refused: not same-origin or missing " + CSRFHeader + " header")

// crossOrigin is net/http's check of Sec-Fetch-Site and Origin against Host. It holds no
// mutable state of ours: no trusted origins or bypass patterns are ever added.
var crossOrigin = http.NewCrossOriginProtection()

// CheckStateChange refuses a state-changing request that a browser sent from another
// origin, or that lacks the custom header CSRFHeader: 1. A browser sends that header
// cross-origin only after a CORS preflight that the status endpoints never grant, and a
// cross-origin request without it is refused anyway (Sec-Fetch-Site or Origin). Tools such
// as curl send neither Sec-Fetch-Site nor Origin and pass with the header.
func CheckStateChange(r *http.Request) error {
	if r.Method != http.MethodPost {
		return fmt.Errorf("%w: method %s", ErrCrossOrigin, r.Method)
	}
	if r.Header.Get(CSRFHeader) != "1" {
		return fmt.Errorf("%w: %s: 1 is missing", ErrCrossOrigin, CSRFHeader)
	}
	if err := crossOrigin.Check(r); err != nil {
		return fmt.Errorf("%w: %v", ErrCrossOrigin, err)
	}
	// CrossOriginProtection lets Sec-Fetch-Site: none through (a navigation the user typed);
	// the page's POSTs are always fetches, so nothing but same-origin has a reason to be here.
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" {
		return fmt.Errorf("%w: Sec-Fetch-Site %s", ErrCrossOrigin, s)
	}
	return nil
}

// maxDrainBody bounds a drain request body.
const maxDrainBody = 4096

// ReadDrainRequest reads and checks the JSON body of a drain or undrain POST. The upstream
// must be non-empty, printable and without spaces; the tier checks the address's form.
func ReadDrainRequest(r *http.Request) (DrainRequest, error) {
	var req DrainRequest
	body, err := io.ReadAll(io.LimitReader(r.Body, maxDrainBody+1))
	if err != nil {
		return req, fmt.Errorf("reading body: %w", err)
	}
	if len(body) > maxDrainBody {
		return req, fmt.Errorf("body larger than %d bytes", maxDrainBody)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf(`body must be {"upstream": "HOST:PORT"}: %w`, err)
	}
	if req.Upstream == "" {
		return req, errors.New(`body must be {"upstream": "HOST:PORT"}: upstream is empty`)
	}
	if strings.IndexFunc(req.Upstream, func(c rune) bool { return c <= ' ' || c == 0x7f }) >= 0 {
		return req, fmt.Errorf("upstream %q holds spaces or control characters", req.Upstream)
	}
	return req, nil
}
