package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/xds/store"
)

// edit changes a parsed document and says what it changed: before and after, for the
// audit line.
type edit func(d *doc) (before, after string, err error)

// change makes an edit of the stored file: read, edit, validate by the pools file's rules,
// store with a compare-and-swap on the revision read. Without If-Match a lost swap is
// retried on the new file; with it, it is a 409.
func (s *Server) change(w http.ResponseWriter, r *http.Request, op string, e edit) {
	expect, err := ifMatch(r)
	if err != nil {
		s.fail(w, r, op, http.StatusBadRequest, apiError{Error: err.Error()})
		return
	}
	ctx, cancel := s.ctx(r)
	defer cancel()
	who := whoOf(r)
	for attempt := 0; ; attempt++ {
		old, err := store.GetDocument(ctx, s.cli, s.keys)
		if err != nil {
			s.fail(w, r, op, http.StatusServiceUnavailable, apiError{Error: err.Error()})
			return
		}
		if old == nil {
			s.fail(w, r, op, http.StatusNotFound, apiError{Error: "the store holds no pools file yet"})
			return
		}
		if expect >= 0 && old.Revision != expect {
			s.fail(w, r, op, http.StatusConflict, apiError{Error: fmt.Sprintf("the pools file is at revision %d (stored by %s), not %d as If-Match says", old.Revision, old.Change.By, expect), Revision: old.Revision})
			return
		}
		d, err := parseDoc(old.YAML)
		if err != nil {
			s.fail(w, r, op, http.StatusInternalServerError, apiError{Error: "the stored pools file: " + err.Error()})
			return
		}
		before, after, err := e(d)
		var nf errNotFound
		var ex errExists
		switch {
		case errors.As(err, &nf):
			s.fail(w, r, op, http.StatusNotFound, apiError{Error: nf.what})
			return
		case errors.As(err, &ex):
			s.fail(w, r, op, http.StatusConflict, apiError{Error: ex.what, Revision: old.Revision})
			return
		case err != nil:
			s.fail(w, r, op, http.StatusBadRequest, apiError{Error: err.Error()})
			return
		}
		data, err := d.encode()
		if err != nil {
			s.fail(w, r, op, http.StatusInternalServerError, apiError{Error: err.Error()})
			return
		}
		f, perr := pools.Parse("pools.yaml", data)
		if perr != nil {
			s.fail(w, r, op, http.StatusBadRequest, apiError{Error: "the change breaks the pools file's rules; nothing was stored",
				Errors: errorStrings(perr, pathError(data)), Revision: old.Revision})
			return
		}
		rev, err := store.PutDocument(ctx, s.cli, s.keys, data, old.Revision, store.Change{By: who, Op: op})
		var ce *store.ConflictError
		if errors.As(err, &ce) && expect < 0 && attempt < retries {
			continue
		}
		if s.storeFailed(w, r, op, err) {
			return
		}
		s.audit(who, op, r.URL.Path, before, after, rev)
		s.changes.WithLabelValues(op, "ok").Inc()
		w.Header().Set("ETag", etag(rev))
		code := http.StatusOK
		if op == opBackendAdd {
			code = http.StatusCreated
		}
		writeJSON(w, code, map[string]any{"revision": rev, "before": before, "after": after, "warnings": warnings(f)})
		return
	}
}

// flow is a node as one line of YAML, for the audit line.
func flow(n *yaml.Node) string {
	if n == nil {
		return "none"
	}
	c := *n
	c.Style = yaml.FlowStyle
	c.HeadComment, c.LineComment, c.FootComment = "", "", ""
	b, err := yaml.Marshal(&c)
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// backendEdit finds the backend named in the path and hands its list and index (-1 when
// absent) to fn.
func backendEdit(r *http.Request, fn func(list *yaml.Node, i int, id string) (string, string, error)) edit {
	svcName, id := r.PathValue("service"), r.PathValue("backend")
	return func(d *doc) (string, string, error) {
		svc, err := d.service(svcName)
		if err != nil {
			return "", "", err
		}
		list, i, err := backend(svc, id)
		if err != nil {
			return "", "", err
		}
		return fn(list, i, id)
	}
}

func notFoundBackend(r *http.Request) error {
	return errNotFound{fmt.Sprintf("no backend %q in service %q (a backend is named by its hash_key when it has one, else by its address)", r.PathValue("backend"), r.PathValue("service"))}
}

// backendDrain sets drain: true on the backend, or removes its drain.
func (s *Server) backendDrain(op string, drain bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.change(w, r, op, backendEdit(r, func(list *yaml.Node, i int, _ string) (string, string, error) {
			if i < 0 {
				return "", "", notFoundBackend(r)
			}
			b := list.Content[i]
			before := flow(b)
			if drain {
				set(b, "drain", scalar("!!bool", "true"))
			} else {
				unset(b, "drain")
			}
			return before, flow(b), nil
		}))
	}
}

// putBackend changes the fields given of a backend the service has and keeps the others
// (null removes a field); a backend it does not have is a 404, never added (POST to the
// service's backends adds). The body is a JSON object of the pools file's backend fields.
func (s *Server) putBackend(w http.ResponseWriter, r *http.Request) {
	const op = opBackendPut
	fields, err := backendFields(w, r)
	if err != nil {
		s.fail(w, r, op, http.StatusBadRequest, apiError{Error: err.Error()})
		return
	}
	s.change(w, r, op, backendEdit(r, func(list *yaml.Node, i int, id string) (string, string, error) {
		if i < 0 {
			return "", "", notFoundBackend(r)
		}
		b := list.Content[i]
		before := flow(b)
		if err := setFields(b, fields); err != nil {
			return "", "", err
		}
		if got := identity(b); got != id {
			return "", "", fmt.Errorf("the backend's identity would be %q, not %q as the path names it: a backend is named by its hash_key when it has one, else by its address (remove it and add it under its new name)", got, id)
		}
		return before, flow(b), nil
	}))
}

// addBackend adds a backend to the service: the body is a JSON object of its fields, with
// an address. A backend of the same identity there already is a 409.
func (s *Server) addBackend(w http.ResponseWriter, r *http.Request) {
	const op = opBackendAdd
	fields, err := backendFields(w, r)
	if err == nil {
		if a, ok := fields["address"].(string); !ok || a == "" {
			err = errors.New(`the backend needs an "address" (a string, host:port)`)
		}
	}
	if err != nil {
		s.fail(w, r, op, http.StatusBadRequest, apiError{Error: err.Error()})
		return
	}
	svcName := r.PathValue("service")
	s.change(w, r, op, func(d *doc) (string, string, error) {
		svc, err := d.service(svcName)
		if err != nil {
			return "", "", err
		}
		b := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		if err := setFields(b, fields); err != nil {
			return "", "", err
		}
		id := identity(b)
		list, i, err := backend(svc, id)
		if err != nil {
			return "", "", err
		}
		if i >= 0 {
			return "", "", errExists{fmt.Sprintf("service %q has a backend %q already: change it with PUT /v1/services/%s/backends/%s (stickylb ctl weight, drain ...)", svcName, id, svcName, id)}
		}
		if len(list.Content) > 0 {
			b.Style = list.Content[len(list.Content)-1].Style // as the file writes its backends
		}
		list.Content = append(list.Content, b)
		return "none", flow(b), nil
	})
}

// backendFields reads a request's body: one JSON object of backend fields, nothing after.
func backendFields(w http.ResponseWriter, r *http.Request) (map[string]any, error) {
	const want = "the body: want one JSON object of backend fields (address, weight, zone, hash_key, server_id, mac, drain, forwarding)"
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSONBody))
	dec.UseNumber()
	var fields map[string]any
	if err := dec.Decode(&fields); err != nil {
		return nil, fmt.Errorf("%s: %w", want, err)
	}
	if fields == nil {
		return nil, errors.New(want + ", not null")
	}
	if err := dec.Decode(&struct{}{}); err != io.EOF {
		return nil, errors.New(want + ": there is more after the object")
	}
	return fields, nil
}

// setFields sets each field of fields on the backend mapping b (null removes it), the
// address first when b has none yet, as the pools file's examples write it.
func setFields(b *yaml.Node, fields map[string]any) error {
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	sort.SliceStable(names, func(a, c int) bool { return names[a] == "address" && names[c] != "address" })
	for _, k := range names {
		v := fields[k]
		if n, ok := v.(json.Number); ok {
			v = jsonNumber(n)
		}
		node, err := fieldNode(k, v)
		if err != nil {
			return err
		}
		if node == nil {
			unset(b, k)
		} else {
			set(b, k, node)
		}
	}
	return nil
}

// jsonNumber is n as the fieldNode's float64, or as its text when it is not a number a
// float holds exactly (the pools file's rules then judge it).
func jsonNumber(n json.Number) any {
	if f, err := n.Float64(); err == nil {
		return f
	}
	return n.String()
}

// deleteBackend removes the backend.
func (s *Server) deleteBackend(w http.ResponseWriter, r *http.Request) {
	s.change(w, r, opBackendDelete, backendEdit(r, func(list *yaml.Node, i int, _ string) (string, string, error) {
		if i < 0 {
			return "", "", notFoundBackend(r)
		}
		before := flow(list.Content[i])
		list.Content = append(list.Content[:i], list.Content[i+1:]...)
		return before, "none", nil
	}))
}

// zoneDrain adds the zone to the service's drained_zones, or removes it.
func (s *Server) zoneDrain(op string, drain bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		svcName, zone := r.PathValue("service"), r.PathValue("zone")
		s.change(w, r, op, func(d *doc) (string, string, error) {
			svc, err := d.service(svcName)
			if err != nil {
				return "", "", err
			}
			before := flow(value(svc, "drained_zones"))
			if err := zoneList(svc, zone, drain); err != nil {
				return "", "", err
			}
			return "drained_zones " + before, "drained_zones " + flow(value(svc, "drained_zones")), nil
		})
	}
}
