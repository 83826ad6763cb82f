// Package api is the replicated control plane's change API: JSON over HTTPS, served by
// every replica (`stickylb xds --etcd ... --api ADDR`), as the fleet's console would use
// it. Every change is an edit of the stored pools file, validated by the pools file's own
// rules, written with a compare-and-swap on the file's revision, logged as an audit line
// and counted; the replicas push it to every node as they read it from the store.
package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds/store"
)

// maxJSONBody bounds a backend's JSON body.
const maxJSONBody = 64 << 10

// maxBody bounds every request's body before it is authenticated: the largest pools
// file the store takes, and one byte to tell a file over it.
const maxBody = store.MaxDocument + 1

// retries is how often a change without If-Match is made again after losing a
// compare-and-swap to another writer (with If-Match the loser gets 409 at once).
const retries = 5

// Refused answers (401, 400, 409, ...) are logged at most refusedBurst a refusedTick:
// anyone who reaches the port can cause them.
const (
	refusedBurst = 10
	refusedTick  = 10 * time.Second
)

// Server serves the API over one store.
type Server struct {
	cli     *clientv3.Client
	keys    store.Keys
	auth    *Auth
	log     *zap.Logger
	refused *zap.Logger // log, sampled: refusedBurst lines a refusedTick
	changes *prometheus.CounterVec
}

// New returns the API of the store behind cli, authenticating with auth.
func New(cli *clientv3.Client, keys store.Keys, auth *Auth, log *zap.Logger) *Server {
	log = log.Named("api")
	return &Server{cli: cli, keys: keys, auth: auth, log: log,
		refused: log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			return zapcore.NewSamplerWithOptions(c, refusedTick, refusedBurst, 0)
		})),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stickylb_xds_api_changes_total",
			Help: "Changes asked of the change API, by operation (a fixed set; other: a request no route takes) and result (ok, invalid, conflict, not_found, unauthorized, error)."},
			[]string{"op", "result"})}
}

// Collector exports stickylb_xds_api_changes_total{op,result}.
func (s *Server) Collector() prometheus.Collector { return s.changes }

// The operations the counter names: one per route that changes something, and opOther
// for a change no route takes, so that no client can mint a label value.
const (
	opPoolsPut       = "pools_put"
	opBackendAdd     = "backend_add"
	opBackendPut     = "backend_put"
	opBackendDelete  = "backend_delete"
	opBackendDrain   = "backend_drain"
	opBackendUndrain = "backend_undrain"
	opZoneDrain      = "zone_drain"
	opZoneUndrain    = "zone_undrain"
	opOther          = "other"
)

// Handler serves the routes. Every request's body is bounded, and every request is
// authenticated, before a route runs.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	ops := map[string]string{} // route pattern -> the operation it counts
	route := func(pattern, op string, h http.HandlerFunc) {
		mux.HandleFunc(pattern, h)
		ops[pattern] = op
	}
	route("GET /v1/pools", "", s.getPools)
	route("PUT /v1/pools", opPoolsPut, s.putPools)
	route("GET /v1/services", "", s.listServices)
	route("GET /v1/services/{service}", "", s.getService)
	route("POST /v1/services/{service}/backends", opBackendAdd, s.addBackend)
	route("PUT /v1/services/{service}/backends/{backend}", opBackendPut, s.putBackend)
	route("DELETE /v1/services/{service}/backends/{backend}", opBackendDelete, s.deleteBackend)
	route("POST /v1/services/{service}/backends/{backend}/drain", opBackendDrain, s.backendDrain(opBackendDrain, true))
	route("POST /v1/services/{service}/backends/{backend}/undrain", opBackendUndrain, s.backendDrain(opBackendUndrain, false))
	route("POST /v1/services/{service}/zones/{zone}/drain", opZoneDrain, s.zoneDrain(opZoneDrain, true))
	route("POST /v1/services/{service}/zones/{zone}/undrain", opZoneUndrain, s.zoneDrain(opZoneUndrain, false))
	authed := s.auth.wrap(mux, func(r *http.Request, why string) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			_, pattern := mux.Handler(r)
			op := ops[pattern]
			if op == "" {
				op = opOther
			}
			s.changes.WithLabelValues(op, "unauthorized").Inc()
		}
		s.logRefused(r, http.StatusUnauthorized, why)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		authed.ServeHTTP(w, r)
	})
}

// logRefused logs a refused request, sampled: who, from where, what, and why.
func (s *Server) logRefused(r *http.Request, code int, why string) {
	path := r.URL.Path
	if len(path) > 200 {
		path = path[:200] + "..."
	}
	s.refused.Warn("api: request refused", zap.Int("status", code), zap.String("who", whoOf(r)),
		zap.String("remote", r.RemoteAddr), zap.String("method", r.Method), zap.String("path", path), zap.String("why", why))
}

// apiError is an error answer: {"error": ..., "errors": [...], "revision": N}.
type apiError struct {
	Error    string   `json:"error"`
	Errors   []string `json:"errors,omitempty"`
	Revision int64    `json:"revision,omitempty"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func etag(rev int64) string { return `"` + strconv.FormatInt(rev, 10) + `"` }

// ifMatch reads If-Match: the revision it names, -1 for none or "*".
func ifMatch(r *http.Request) (int64, error) {
	h := strings.TrimSpace(r.Header.Get("If-Match"))
	if h == "" || h == "*" {
		return -1, nil
	}
	n, err := strconv.ParseInt(strings.Trim(strings.TrimPrefix(h, "W/"), `"`), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf(`If-Match %q: want "N", a revision of the pools file`, h)
	}
	return n, nil
}

func (s *Server) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 10*time.Second)
}

func (s *Server) getPools(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := s.ctx(r)
	defer cancel()
	doc, err := store.GetDocument(ctx, s.cli, s.keys)
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: err.Error()})
		return
	}
	if doc == nil {
		writeJSON(w, http.StatusNotFound, apiError{Error: "the store holds no pools file yet: PUT /v1/pools, or `stickylb pools apply`"})
		return
	}
	w.Header().Set("ETag", etag(doc.Revision))
	// caller is the name this request authenticated as: a client compares it with
	// stored_by before it replaces a file someone else stored last (ctl pools-put).
	writeJSON(w, http.StatusOK, map[string]any{"revision": doc.Revision, "file": string(doc.YAML),
		"stored_by": doc.Change.By, "stored_at": doc.Change.At, "op": doc.Change.Op, "caller": whoOf(r)})
}

// putPools replaces the file: the YAML file is the body, If-Match names the revision the
// change was made on ("*": whatever is stored).
func (s *Server) putPools(w http.ResponseWriter, r *http.Request) {
	const op = opPoolsPut
	if r.Header.Get("If-Match") == "" {
		s.fail(w, r, op, http.StatusPreconditionRequired, apiError{Error: `PUT /v1/pools needs If-Match: "N", the revision the file was read at (GET /v1/pools gives it as its ETag), or "*"`})
		return
	}
	expect, err := ifMatch(r)
	if err != nil {
		s.fail(w, r, op, http.StatusBadRequest, apiError{Error: err.Error()})
		return
	}
	body, err := io.ReadAll(r.Body)
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) || len(body) > store.MaxDocument {
		s.fail(w, r, op, http.StatusRequestEntityTooLarge, apiError{Error: fmt.Sprintf("the pools file is over %d bytes (1 MiB), the most the store takes", store.MaxDocument)})
		return
	}
	if err != nil {
		s.fail(w, r, op, http.StatusBadRequest, apiError{Error: "reading the body: " + err.Error()})
		return
	}
	f, perr := pools.Parse("pools.yaml", body)
	if perr != nil {
		s.fail(w, r, op, http.StatusBadRequest, apiError{Error: "the pools file does not validate; nothing was stored",
			Errors: errorStrings(perr, func(e *pools.Error) string { return e.Error() })})
		return
	}
	ctx, cancel := s.ctx(r)
	defer cancel()
	who := whoOf(r)
	old, rev, err := store.ReplaceDocument(ctx, s.cli, s.keys, body, expect, store.Change{By: who, Op: op}, nil)
	if s.storeFailed(w, r, op, err) {
		return
	}
	s.audit(who, op, r.URL.Path, digest(old), digest(&store.Document{YAML: body, Revision: rev}), rev)
	s.changes.WithLabelValues(op, "ok").Inc()
	w.Header().Set("ETag", etag(rev))
	writeJSON(w, http.StatusOK, map[string]any{"revision": rev, "services": len(f.Services), "warnings": warnings(f)})
}

// errorStrings are the errors of a pools file that does not validate, each as show
// renders it (file:line, or a path in the file).
func errorStrings(perr error, show func(*pools.Error) string) []string {
	var list pools.ErrorList
	if !errors.As(perr, &list) {
		return []string{perr.Error()}
	}
	out := make([]string, 0, len(list))
	for _, e := range list {
		out = append(out, show(e))
	}
	return out
}

func digest(d *store.Document) string {
	if d == nil {
		return "none"
	}
	h := sha256.Sum256(d.YAML)
	return fmt.Sprintf("revision %d, %d bytes, sha256 %s", d.Revision, len(d.YAML), hex.EncodeToString(h[:8]))
}

func warnings(f *pools.File) []string {
	out := []string{}
	for _, w := range f.Warnings {
		out = append(out, w.Error())
	}
	return out
}

// fail answers an error, counts the change by the status's result, and logs the refusal
// (sampled).
func (s *Server) fail(w http.ResponseWriter, r *http.Request, op string, code int, e apiError) {
	result := "error"
	switch code {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusPreconditionRequired:
		result = "invalid"
	case http.StatusConflict, http.StatusPreconditionFailed:
		result = "conflict"
	case http.StatusNotFound:
		result = "not_found"
	}
	s.changes.WithLabelValues(op, result).Inc()
	why := e.Error
	if len(e.Errors) > 0 {
		why += ": " + strings.Join(e.Errors, "; ")
	}
	s.logRefused(r, code, why)
	writeJSON(w, code, e)
}

// storeFailed answers a failed store write (409 with the stored revision on a lost
// compare-and-swap) and reports whether there was one.
func (s *Server) storeFailed(w http.ResponseWriter, r *http.Request, op string, err error) bool {
	if err == nil {
		return false
	}
	var ce *store.ConflictError
	if errors.As(err, &ce) {
		s.fail(w, r, op, http.StatusConflict, apiError{Error: ce.Error(), Revision: ce.Revision})
		return true
	}
	s.fail(w, r, op, http.StatusServiceUnavailable, apiError{Error: err.Error()})
	return true
}

// audit logs one change: who, what, before, after.
func (s *Server) audit(who, op, path, before, after string, rev int64) {
	s.log.Info("audit: change applied", zap.String("who", who), zap.String("op", op), zap.String("path", path),
		zap.String("before", before), zap.String("after", after), zap.Int64("revision", rev))
}
