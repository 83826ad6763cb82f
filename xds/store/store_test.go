package store

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/stickylb/stickylb/internal/testkit/etcdtest"
	"github.com/stickylb/stickylb/policies/health"
)

func startStore(t *testing.T) (*etcdtest.Cluster, Keys) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs etcd: skipped under -short")
	}
	return etcdtest.Start(t, 1, "127.0.0.1"), KeysOf("/test")
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Two writers that read the same revision: one stores, the other gets a conflict naming
// the stored revision and who stored it; nothing of the loser is stored.
func TestPutDocumentCompareAndSwap(t *testing.T) {
	c, k := startStore(t)
	cli := c.Client(t)
	ctx := ctxFor(t)
	if doc, err := GetDocument(ctx, cli, k); err != nil || doc != nil {
		t.Fatalf("empty store: %v %v", doc, err)
	}
	rev, err := PutDocument(ctx, cli, k, []byte("services: []\n"), 0, Change{By: "alice@h1", Op: "apply"})
	if err != nil {
		t.Fatal(err)
	}
	rev2, err := PutDocument(ctx, cli, k, []byte("services: [] # bob\n"), rev, Change{By: "bob@h2", Op: "apply"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = PutDocument(ctx, cli, k, []byte("services: [] # carol\n"), rev, Change{By: "carol@h3", Op: "apply"})
	var ce *ConflictError
	if !errors.As(err, &ce) || ce.Revision != rev2 || ce.By != "bob@h2" || ce.Expected != rev {
		t.Fatalf("conflict: %v (%+v)", err, ce)
	}
	doc, err := GetDocument(ctx, cli, k)
	if err != nil || string(doc.YAML) != "services: [] # bob\n" || doc.Revision != rev2 || doc.Change.By != "bob@h2" {
		t.Fatalf("stored: %+v %v", doc, err)
	}
	if _, err := PutDocument(ctx, cli, k, make([]byte, MaxDocument+1), rev2, Change{}); err == nil {
		t.Fatal("a document over 1 MiB was stored")
	}
}

// A stale leader, whose lease expired (revoked here) while another replica took over,
// tries to write a verdict: the fence refuses it and the new leader's verdict stays.
func TestStaleLeaderCannotWrite(t *testing.T) {
	c, k := startStore(t)
	cli := c.Client(t)
	ctx := ctxFor(t)
	campaign := func(id string) (*concurrency.Session, Fence) {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		e := concurrency.NewElection(s, k.Election())
		if err := e.Campaign(ctx, id); err != nil {
			t.Fatal(err)
		}
		return s, FenceOf(e)
	}
	oldSess, old := campaign("r1")
	vk := VerdictKey{"web", "10.0.0.1:80"}
	down := Verdict{State: health.Unhealthy, Since: time.Unix(100, 0), From: health.Healthy, Reason: "tcp: refused", By: "r1"}
	if err := WriteVerdicts(ctx, cli, k, old, map[VerdictKey]Verdict{vk: down}, nil, Change{By: "r1", Op: "verdicts"}); err != nil {
		t.Fatalf("the leader's write: %v", err)
	}
	// r1's lease ends (as when it is cut off for longer than its TTL); r2 wins.
	if _, err := cli.Revoke(ctx, oldSess.Lease()); err != nil {
		t.Fatal(err)
	}
	_, fresh := campaign("r2")
	up := Verdict{State: health.Healthy, Since: time.Unix(200, 0), From: health.Unhealthy, Reason: "tcp: ok", By: "r2"}
	if err := WriteVerdicts(ctx, cli, k, fresh, map[VerdictKey]Verdict{vk: up}, nil, Change{By: "r2", Op: "verdicts"}); err != nil {
		t.Fatalf("the new leader's write: %v", err)
	}
	st, _, err := Load(ctx, cli, k)
	if err != nil {
		t.Fatal(err)
	}
	before := st.Revision
	// The stale leader's late write, and its delete, are refused.
	if err := WriteVerdicts(ctx, cli, k, old, map[VerdictKey]Verdict{vk: down}, nil, Change{By: "r1"}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("stale leader's write: %v, want ErrNotLeader", err)
	}
	if err := WriteVerdicts(ctx, cli, k, old, nil, []VerdictKey{vk}, Change{By: "r1"}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("stale leader's delete: %v, want ErrNotLeader", err)
	}
	st, _, err = Load(ctx, cli, k)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := st.Verdict("web", "10.0.0.1:80"); v.State != health.Healthy || v.By != "r2" || st.Revision != before {
		t.Fatalf("after the stale writes: %+v at %d (before %d)", v, st.Revision, before)
	}
}

// The state's revision is the last write's, a delete's included, whether read whole or
// followed through a watch: the same state has the same revision either way.
func TestRevisionOfLoadAndWatchAgree(t *testing.T) {
	c, k := startStore(t)
	cli := c.Client(t)
	ctx := ctxFor(t)
	s, err := concurrency.NewSession(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e := concurrency.NewElection(s, k.Election())
	if err := e.Campaign(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	f := FenceOf(e)
	if _, err := PutDocument(ctx, cli, k, []byte("services: []\n"), 0, Change{By: "t"}); err != nil {
		t.Fatal(err)
	}
	start, from, err := Load(ctx, cli, k)
	if err != nil {
		t.Fatal(err)
	}
	w := cli.Watch(ctx, k.State(), clientv3WithPrefixFrom(from+1)...)
	a, b := VerdictKey{"web", "a"}, VerdictKey{"web", "b"}
	v := Verdict{State: health.Healthy, Since: time.Unix(1, 0)}
	if err := WriteVerdicts(ctx, cli, k, f, map[VerdictKey]Verdict{a: v, b: v}, nil, Change{}); err != nil {
		t.Fatal(err)
	}
	if err := WriteVerdicts(ctx, cli, k, f, nil, []VerdictKey{b}, Change{}); err != nil {
		t.Fatal(err)
	}
	watched := start
	for watched.Verdicts[b] != (Verdict{}) || len(watched.Verdicts) != 1 {
		r := <-w
		if r.Err() != nil {
			t.Fatal(r.Err())
		}
		watched = watched.Apply(k, r.Events)
	}
	loaded, _, err := Load(ctx, cli, k)
	if err != nil {
		t.Fatal(err)
	}
	if loaded.Revision != watched.Revision || loaded.Revision <= start.Revision || len(loaded.Verdicts) != 1 {
		t.Fatalf("loaded at %d (%d verdicts), watched at %d, started at %d", loaded.Revision, len(loaded.Verdicts), watched.Revision, start.Revision)
	}
	if len(start.Verdicts) != 0 {
		t.Fatal("Apply changed the state it was given")
	}
	if watched.Unmarked {
		t.Fatal("our own writes left the state unmarked")
	}
	// Another client's put and delete: the watcher is at the delete, unmarked; a whole
	// read is behind it until the revision is marked, then both agree.
	foreign := k.Verdict(VerdictKey{"web", "etcdctl"})
	if _, err := cli.Put(ctx, foreign, `{"state":"healthy"}`); err != nil {
		t.Fatal(err)
	}
	del, err := cli.Delete(ctx, foreign)
	if err != nil {
		t.Fatal(err)
	}
	for watched.Revision < del.Header.Revision {
		r := <-w
		watched = watched.Apply(k, r.Events)
	}
	if !watched.Unmarked || watched.Revision != del.Header.Revision {
		t.Fatalf("after a foreign delete: unmarked %v at %d, the delete at %d", watched.Unmarked, watched.Revision, del.Header.Revision)
	}
	if loaded, _, _ = Load(ctx, cli, k); loaded.Revision >= del.Header.Revision {
		t.Fatalf("a whole read at %d, past the delete (%d): the test shows nothing", loaded.Revision, del.Header.Revision)
	}
	if err := MarkRevision(ctx, cli, k, f, Change{By: "r1", Op: "mark"}); err != nil {
		t.Fatal(err)
	}
	for watched.Unmarked {
		r := <-w
		watched = watched.Apply(k, r.Events)
	}
	if loaded, _, _ = Load(ctx, cli, k); loaded.Revision != watched.Revision || loaded.Revision <= del.Header.Revision {
		t.Fatalf("after the mark: loaded at %d, watched at %d, the delete at %d", loaded.Revision, watched.Revision, del.Header.Revision)
	}
}

func clientv3WithPrefixFrom(rev int64) []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(rev)}
}
