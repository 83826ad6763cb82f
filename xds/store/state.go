package store

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stickylb/stickylb/policies/health"
)

// Document is the stored pools file.
type Document struct {
	// YAML is the file as stored.
	YAML []byte
	// Revision is the pools key's last write: what a compare-and-swap names.
	Revision int64
	// Change says who stored it, when and how.
	Change Change
}

// Change records who made a write to the state, when and by what operation.
type Change struct {
	// By is USER@HOST from the command line, the token's or certificate's name from the
	// API, or the replica id for verdicts.
	By string    `json:"by"`
	At time.Time `json:"at"`
	// Op names the operation: apply, put, drain, weight, verdicts...
	Op string `json:"op"`
}

// VerdictKey names one backend of one service.
type VerdictKey struct{ Service, ID string }

// Verdict is a backend's health as the leading replica decided it.
type Verdict struct {
	State health.State
	// Since is when the deciding probe completed (published as health_since, so every node
	// ramps slow start from the same instant).
	Since time.Time
	// From is the state left at Since.
	From health.State
	// Reason is the deciding probe's result.
	Reason string
	// By is the replica that wrote it.
	By string
	// Target is what was probed (ProbeTarget: the check and the address): a verdict
	// stands for the backend only while the file probes it so. Empty in verdicts stored
	// before targets were (taken as the backend's current one).
	Target string
}

// verdictJSON is a verdict as stored.
type verdictJSON struct {
	State  string    `json:"state"`
	Since  time.Time `json:"since"`
	From   string    `json:"from,omitempty"`
	Reason string    `json:"reason,omitempty"`
	By     string    `json:"by,omitempty"`
	Target string    `json:"target,omitempty"`
}

func (v Verdict) marshal() string {
	b, _ := json.Marshal(verdictJSON{State: v.State.String(), Since: v.Since.UTC(), From: v.From.String(), Reason: v.Reason, By: v.By, Target: v.Target})
	return string(b)
}

// Stands reports whether v is the verdict of a backend probed as target (what
// ProbeTarget says of it now): a backend keyed by hash_key whose address or check
// changed is another probe target, and its old verdict says nothing of it.
func (v Verdict) Stands(target string) bool { return v.Target == "" || v.Target == target }

// ProbeTarget names what a health check of c probes at address (a health target's
// Address): the protocol, the address with the check's port, and what makes a probe pass.
// The thresholds and timing are not in it: a verdict stands across their changes.
func ProbeTarget(c health.Config, address string) string {
	c = c.WithDefaults()
	t := string(c.Protocol) + " " + address
	if c.Port != 0 {
		t += fmt.Sprintf(" port %d", c.Port)
	}
	if c.Protocol == health.HTTP {
		t += fmt.Sprintf(" %s host %q expect %v %v", c.Path, c.Host, c.ExpectStatus, c.ExpectRanges)
	}
	return t
}

func parseState(s string) (health.State, error) {
	for _, st := range []health.State{health.Unknown, health.Healthy, health.Unhealthy} {
		if s == st.String() {
			return st, nil
		}
	}
	return health.Unknown, fmt.Errorf("state %q: want healthy, unhealthy or unknown", s)
}

func parseVerdict(b []byte) (Verdict, error) {
	var j verdictJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return Verdict{}, err
	}
	st, err := parseState(j.State)
	if err != nil {
		return Verdict{}, err
	}
	from := health.Unknown
	if j.From != "" {
		if from, err = parseState(j.From); err != nil {
			return Verdict{}, err
		}
	}
	return Verdict{State: st, Since: j.Since, From: from, Reason: j.Reason, By: j.By, Target: j.Target}, nil
}

// State is everything replicas serve, as of one revision. A State is never changed once
// made: Apply returns a new one.
//
// Its Revision is the revision of the last write under the state prefix that the replica
// has read: writes elsewhere in etcd (the election's keys, other applications) do not move
// it, so replicas that have read the same state serve it under the same version, and a
// node moving between them gets the version it has. A replica following by watch takes
// it from the last event (a delete's included); one reading the state whole takes the
// newest key's revision, which is the same because every write stickylb makes under the
// prefix also puts the revision key. A delete made by another client (etcdctl) leaves no
// key behind: the state is Unmarked then, and the leading replica puts the revision key
// (MarkRevision), so every replica settles on that write's revision.
type State struct {
	// Revision is the revision of the last write under the state prefix the state
	// reflects: the version every replica serves it under. 0 for an empty store.
	Revision int64
	// Unmarked: the last write was a delete only (another client's): a replica reading the
	// state whole now would take an older revision, until the revision key is put.
	Unmarked bool
	// Doc is the pools file; nil when none was applied yet.
	Doc *Document
	// Verdicts are the stored verdicts by backend.
	Verdicts map[VerdictKey]Verdict
	// Bad counts keys under the state prefix that did not parse (skipped, logged by the
	// caller once).
	Bad []string
}

// Verdict is the stored verdict of a backend (false when none).
func (s *State) Verdict(service, id string) (Verdict, bool) {
	v, ok := s.Verdicts[VerdictKey{service, id}]
	return v, ok
}

// Load reads the whole state with one linearizable read. It also returns the read's
// revision, from which a watch continues.
func Load(ctx context.Context, cli *clientv3.Client, k Keys) (*State, int64, error) {
	r, err := cli.Get(ctx, k.State(), clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("reading the state: %w", err)
	}
	st := &State{Verdicts: map[VerdictKey]Verdict{}}
	for _, kv := range r.Kvs {
		st.put(k, kv)
		// The revision key moves with every write of ours; a put of another client's
		// moves its own key.
		st.Revision = max(st.Revision, kv.ModRevision)
	}
	return st, r.Header.Revision, nil
}

// put applies one stored key to st (which the caller owns).
func (st *State) put(k Keys, kv *mvccpb.KeyValue) {
	key := string(kv.Key)
	switch {
	case key == k.Pools():
		doc := Document{YAML: kv.Value, Revision: kv.ModRevision}
		if st.Doc != nil {
			doc.Change = st.Doc.Change
		}
		st.Doc = &doc
	case key == k.PoolsBy():
		var c Change
		if json.Unmarshal(kv.Value, &c) != nil {
			st.Bad = append(st.Bad, key)
			return
		}
		if st.Doc == nil {
			st.Doc = &Document{}
		}
		st.Doc.Change = c
	case strings.HasPrefix(key, k.Verdicts()):
		vk, ok := verdictKeyOf(k, key)
		v, err := parseVerdict(kv.Value)
		if !ok || err != nil {
			st.Bad = append(st.Bad, key)
			return
		}
		st.Verdicts[vk] = v
	}
}

func verdictKeyOf(k Keys, key string) (VerdictKey, bool) {
	svc, id, ok := strings.Cut(strings.TrimPrefix(key, k.Verdicts()), "/")
	return VerdictKey{svc, id}, ok && svc != "" && id != ""
}

// Apply returns the state after events (one watch response's, in order): a new State,
// st itself unchanged. Its revision is the last event's (a delete's is the revision that
// deleted).
func (st *State) Apply(k Keys, events []*clientv3.Event) *State {
	next := &State{Revision: st.Revision, Unmarked: st.Unmarked, Verdicts: maps.Clone(st.Verdicts)}
	if st.Doc != nil {
		d := *st.Doc
		next.Doc = &d
	}
	for _, ev := range events {
		if ev.Kv.ModRevision > next.Revision {
			next.Revision, next.Unmarked = ev.Kv.ModRevision, true
		}
		if ev.Type == clientv3.EventTypePut {
			if ev.Kv.ModRevision == next.Revision {
				next.Unmarked = false // a key of this revision stays to show it
			}
			next.put(k, ev.Kv)
			continue
		}
		key := string(ev.Kv.Key)
		switch {
		case key == k.Pools():
			next.Doc = nil
		case strings.HasPrefix(key, k.Verdicts()):
			if vk, ok := verdictKeyOf(k, key); ok {
				delete(next.Verdicts, vk)
			}
		}
	}
	return next
}

// ConflictError is a compare-and-swap that lost: the document changed since it was read.
type ConflictError struct {
	// Revision and By are the stored document's (0 and "" when there is none).
	Revision int64
	By       string
	At       time.Time
	// Expected is the revision the writer had read.
	Expected int64
}

func (e *ConflictError) Error() string {
	if e.Revision == 0 {
		return fmt.Sprintf("conflict: the pools file was expected at revision %d, but the store holds none", e.Expected)
	}
	return fmt.Sprintf("conflict: the pools file is at revision %d, stored by %s at %s, not at revision %d as read; read it again and retry",
		e.Revision, e.By, e.At.UTC().Format(time.RFC3339), e.Expected)
}

// GetDocument reads the stored pools file (nil when there is none).
func GetDocument(ctx context.Context, cli *clientv3.Client, k Keys) (*Document, error) {
	r, err := cli.Txn(ctx).Then(clientv3.OpGet(k.Pools()), clientv3.OpGet(k.PoolsBy())).Commit()
	if err != nil {
		return nil, fmt.Errorf("reading the pools file: %w", err)
	}
	return documentOf(k, r.Responses)
}

func documentOf(k Keys, rs []*etcdserverpb.ResponseOp) (*Document, error) {
	st := &State{Verdicts: map[VerdictKey]Verdict{}}
	for _, r := range rs {
		for _, kv := range r.GetResponseRange().GetKvs() {
			st.put(k, kv)
		}
	}
	if st.Doc == nil || st.Doc.Revision == 0 {
		return nil, nil
	}
	return st.Doc, nil
}

// PutDocument stores yaml as the pools file if the stored one is still at revision expect
// (0: none stored), and returns the new revision; a lost race is a *ConflictError. The
// caller has validated yaml.
func PutDocument(ctx context.Context, cli *clientv3.Client, k Keys, yaml []byte, expect int64, c Change) (int64, error) {
	if len(yaml) > MaxDocument {
		return 0, fmt.Errorf("the pools file is %d bytes; the store takes at most %d (1 MiB)", len(yaml), MaxDocument)
	}
	if c.At.IsZero() {
		c.At = time.Now()
	}
	c.At = c.At.UTC()
	meta, _ := json.Marshal(c)
	r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k.Pools()), "=", expect)).
		Then(clientv3.OpPut(k.Pools(), string(yaml)), clientv3.OpPut(k.PoolsBy(), string(meta)), clientv3.OpPut(k.Revision(), string(meta))).
		Else(clientv3.OpGet(k.Pools(), clientv3.WithKeysOnly()), clientv3.OpGet(k.PoolsBy())).Commit()
	if err != nil {
		return 0, fmt.Errorf("storing the pools file: %w", err)
	}
	if !r.Succeeded {
		ce := &ConflictError{Expected: expect}
		if doc, _ := documentOf(k, r.Responses); doc != nil {
			ce.Revision, ce.By, ce.At = doc.Revision, doc.Change.By, doc.Change.At
		}
		return 0, ce
	}
	return r.Header.Revision, nil
}

// ReplaceDocument reads the stored pools file, hands it to accept when set (which may
// refuse the change), and stores yaml in its place with PutDocument: on revision expect,
// or on the revision just read when expect < 0. It returns the document read (nil when
// none) and the new revision. The caller has validated yaml.
func ReplaceDocument(ctx context.Context, cli *clientv3.Client, k Keys, yaml []byte, expect int64, c Change, accept func(old *Document) error) (*Document, int64, error) {
	old, err := GetDocument(ctx, cli, k)
	if err != nil {
		return nil, 0, err
	}
	if accept != nil {
		if err := accept(old); err != nil {
			return old, 0, err
		}
	}
	if expect < 0 {
		expect = 0
		if old != nil {
			expect = old.Revision
		}
	}
	rev, err := PutDocument(ctx, cli, k, yaml, expect, c)
	return old, rev, err
}
