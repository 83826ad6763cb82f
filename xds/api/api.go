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

	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds/store"
)

// maxJSONBody bounds a backend's JSON body.
const maxJSONBody = 64 << 10

// retries is how often a change without If-Match is made again after losing a
// compare-and-swap to another writer (with If-Match the loser gets 409 at once).
const retries = 5

// Server serves the API over one store.
type Server struct {
	cli     *clientv3.Client
	keys    store.Keys
	auth    *Auth
	log     *zap.Logger
	changes *prometheus.CounterVec
}

// New returns the API of the store behind cli, authenticating with auth.
func New(cli *clientv3.Client, keys store.Keys, auth *Auth, log *zap.Logger) *Server {
	return &Server{cli: cli, keys: keys, auth: auth, log: log.Named("api"),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stickylb_xds_api_changes_total",
			Help: "Changes asked of the change API, by operation and result (ok, invalid, conflict, not_found, unauthorized, error)."},
			[]string{"op", "result"})}
}

// Collector exports stickylb_xds_api_changes_total{op,result}.
func (s *Server) Collector() prometheus.Collector { return s.changes }

// Handler serves the routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/pools", s.getPools)
	mux.HandleFunc("PUT /v1/pools", s.putPools)
	mux.HandleFunc("GET /v1/services", s.listServices)
	mux.HandleFunc("GET /v1/services/{service}", s.getService)
	mux.HandleFunc("POST /v1/services/{service}/backends/{backend}/drain", s.backendDrain(true))
	mux.HandleFunc("POST /v1/services/{service}/backends/{backend}/undrain", s.backendDrain(false))
	mux.HandleFunc("PUT /v1/services/{service}/backends/{backend}", s.putBackend)
	mux.HandleFunc("DELETE /v1/services/{service}/backends/{backend}", s.deleteBackend)
	mux.HandleFunc("POST /v1/services/{service}/zones/{zone}/drain", s.zoneDrain(true))
	mux.HandleFunc("POST /v1/services/{service}/zones/{zone}/undrain", s.zoneDrain(false))
	return s.auth.wrap(mux, func(r *http.Request) {
		if r.Method != http.MethodGet {
			s.changes.WithLabelValues(opOf(r), "unauthorized").Inc()
		}
	})
}

// opOf names a change request's operation for the counter.
func opOf(r *http.Request) string {
	p := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(p) == 2 && p[1] == "pools":
		return "pools_put"
	case len(p) == 6 && p[3] == "backends":
		return "backend_" + p[5]
	case len(p) == 5 && p[3] == "backends":
		return "backend_" + strings.ToLower(r.Method)
	case len(p) == 6 && p[3] == "zones":
		return "zone_" + p[5]
	}
	return "other"
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
	writeJSON(w, http.StatusOK, map[string]any{"revision": doc.Revision, "file": string(doc.YAML),
		"stored_by": doc.Change.By, "stored_at": doc.Change.At, "op": doc.Change.Op})
}

// putPools replaces the file: the YAML file is the body, If-Match names the revision the
// change was made on ("*": whatever is stored).
func (s *Server) putPools(w http.ResponseWriter, r *http.Request) {
	const op = "pools_put"
	if r.Header.Get("If-Match") == "" {
		s.fail(w, op, http.StatusPreconditionRequired, apiError{Error: `PUT /v1/pools needs If-Match: "N", the revision the file was read at (GET /v1/pools gives it as its ETag), or "*"`})
		return
	}
	expect, err := ifMatch(r)
	if err != nil {
		s.fail(w, op, http.StatusBadRequest, apiError{Error: err.Error()})
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, store.MaxDocument+1))
	if err != nil {
		s.fail(w, op, http.StatusBadRequest, apiError{Error: "reading the body: " + err.Error()})
		return
	}
	if len(body) > store.MaxDocument {
		s.fail(w, op, http.StatusRequestEntityTooLarge, apiError{Error: fmt.Sprintf("the pools file is over %d bytes (1 MiB), the most the store takes", store.MaxDocument)})
		return
	}
	f, perr := pools.Parse("pools.yaml", body)
	if perr != nil {
		var list pools.ErrorList
		errors.As(perr, &list)
		msgs := make([]string, 0, len(list))
		for _, e := range list {
			msgs = append(msgs, e.Error())
		}
		s.fail(w, op, http.StatusBadRequest, apiError{Error: "the pools file does not validate; nothing was stored", Errors: msgs})
		return
	}
	ctx, cancel := s.ctx(r)
	defer cancel()
	who := whoOf(r)
	old, err := store.GetDocument(ctx, s.cli, s.keys)
	if err != nil {
		s.fail(w, op, http.StatusServiceUnavailable, apiError{Error: err.Error()})
		return
	}
	if expect < 0 {
		expect = 0
		if old != nil {
			expect = old.Revision
		}
	}
	rev, err := store.PutDocument(ctx, s.cli, s.keys, body, expect, store.Change{By: who, Op: op})
	if s.storeFailed(w, op, err) {
		return
	}
	s.audit(who, op, r.URL.Path, digest(old), digest(&store.Document{YAML: body, Revision: rev}), rev)
	s.changes.WithLabelValues(op, "ok").Inc()
	w.Header().Set("ETag", etag(rev))
	writeJSON(w, http.StatusOK, map[string]any{"revision": rev, "services": len(f.Services), "warnings": warnings(f)})
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

// fail answers an error and counts the change by the status's result.
func (s *Server) fail(w http.ResponseWriter, op string, code int, e apiError) {
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
	writeJSON(w, code, e)
}

// storeFailed answers a failed store write (409 with the stored revision on a lost
// compare-and-swap) and reports whether there was one.
func (s *Server) storeFailed(w http.ResponseWriter, op string, err error) bool {
	if err == nil {
		return false
	}
	var ce *store.ConflictError
	if errors.As(err, &ce) {
		s.fail(w, op, http.StatusConflict, apiError{Error: ce.Error(), Revision: ce.Revision})
		return true
	}
	s.fail(w, op, http.StatusServiceUnavailable, apiError{Error: err.Error()})
	return true
}

// audit logs one change: who, what, before, after.
func (s *Server) audit(who, op, path, before, after string, rev int64) {
	s.log.Info("audit: change applied", zap.String("who", who), zap.String("op", op), zap.String("path", path),
		zap.String("before", before), zap.String("after", after), zap.Int64("revision", rev))
}
