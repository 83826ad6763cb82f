package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stickylb/stickylb/internal/testkit/etcdtest"
	"github.com/stickylb/stickylb/xds/store"
)

// pools apply validates as validate does and stores nothing on an error; get prints the
// stored file and its revision; flags may follow FILE; a stale --if-revision conflicts and
// names the stored revision and who stored it; a file over 1 MiB is refused by name of the
// limit.
func TestPoolsApplyGet(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd: skipped under -short")
	}
	c := etcdtest.Start(t, 1, "127.0.0.1")
	ep := c.Endpoints()[0]
	dir := t.TempDir()
	run2 := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(args, &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, _, errs := run2("pools", "get", "--etcd", ep); code != 1 || !strings.Contains(errs, "stickylb pools apply") {
		t.Fatalf("get on an empty store: %d %q", code, errs)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("services:\n  - name: web\n    backends:\n      - {address: \"10.0.0.1:80\", weight: 0}\n"), 0o644)
	code, _, errs := run2("pools", "apply", bad, "--etcd", ep)
	if code != 1 || !strings.Contains(errs, bad+":4:") {
		t.Fatalf("apply of an invalid file: %d %q", code, errs)
	}
	if code, _, _ := run2("pools", "get", "--etcd", ep); code != 1 {
		t.Fatal("an invalid file was stored")
	}
	good, err := os.ReadFile("../../pools.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "pools.yaml")
	os.WriteFile(p, good, 0o644)
	code, out, errs := run2("pools", "apply", "--etcd", ep, p)
	if code != 0 || !strings.Contains(out, "stored at revision") {
		t.Fatalf("apply: %d %q %q", code, out, errs)
	}
	code, out, errs = run2("pools", "get", "--etcd", ep)
	if code != 0 || out != string(good) || !strings.HasPrefix(errs, "revision ") || !strings.Contains(errs, whoAmI()) {
		t.Fatalf("get: %d %q", code, errs)
	}
	var rev int64
	fmt.Sscanf(errs, "revision %d", &rev)
	// Another operator applied meanwhile: an apply of what was read at rev conflicts.
	if code, _, errs := run2("pools", "apply", p, "--etcd", ep); code != 0 {
		t.Fatalf("second apply: %q", errs)
	}
	code, _, errs = run2("pools", "apply", p, "--etcd", ep, "--if-revision", fmt.Sprint(rev))
	if code != 1 || !strings.Contains(errs, "conflict") || !strings.Contains(errs, fmt.Sprintf("revision %d", rev)) || !strings.Contains(errs, whoAmI()) {
		t.Fatalf("stale apply: %d %q", code, errs)
	}
	// Someone else stores the file (a drain through the API): an apply without a revision
	// would undo it unseen, so it is refused, naming them; --if-revision of the revision
	// read, or --force, stores it.
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cur, err := store.GetDocument(ctx, cli, store.KeysOf(""))
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := store.PutDocument(ctx, cli, store.KeysOf(""), append(good, []byte("# drained by bob\n")...), cur.Revision, store.Change{By: "token:bob", Op: "backend_drain"})
	if err != nil {
		t.Fatal(err)
	}
	code, _, errs = run2("pools", "apply", p, "--etcd", ep)
	if code != 1 || !strings.Contains(errs, "token:bob") || !strings.Contains(errs, fmt.Sprintf("--if-revision %d", theirs)) {
		t.Fatalf("apply over someone else's change: %d %q", code, errs)
	}
	if doc, _ := store.GetDocument(ctx, cli, store.KeysOf("")); doc.Revision != theirs {
		t.Fatal("the refused apply was stored")
	}
	if code, _, errs := run2("pools", "apply", p, "--etcd", ep, "--if-revision", fmt.Sprint(theirs)); code != 0 {
		t.Fatalf("apply with --if-revision of their revision: %q", errs)
	}
	if _, err := store.PutDocument(ctx, cli, store.KeysOf(""), good, theirs+1, store.Change{By: "token:bob"}); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := run2("pools", "apply", p, "--etcd", ep, "--force", "--as", "pools-apply-job"); code != 0 {
		t.Fatalf("apply --force: %q", errs)
	}
	// A job naming itself with --as is not someone else to its next run.
	if code, _, errs := run2("pools", "apply", p, "--etcd", ep, "--as", "pools-apply-job"); code != 0 {
		t.Fatalf("the job's second apply: %q", errs)
	}
	if code, _, errs := run2("pools", "get", "--etcd", ep); code != 0 || !strings.Contains(errs, "stored by pools-apply-job") {
		t.Fatalf("stored by: %q", errs)
	}
	big := filepath.Join(dir, "big.yaml")
	os.WriteFile(big, append(good, bytes.Repeat([]byte("#\n"), 1<<19)...), 0o644)
	if code, _, errs := run2("pools", "apply", big, "--etcd", ep); code != 1 || !strings.Contains(errs, "1 MiB") {
		t.Fatalf("apply of a 1 MiB+ file: %d %q", code, errs)
	}
}
