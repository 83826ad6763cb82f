package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stickylb/stickylb/internal/testkit/etcdtest"
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
	big := filepath.Join(dir, "big.yaml")
	os.WriteFile(big, append(good, bytes.Repeat([]byte("#\n"), 1<<19)...), 0o644)
	if code, _, errs := run2("pools", "apply", big, "--etcd", ep); code != 1 || !strings.Contains(errs, "1 MiB") {
		t.Fatalf("apply of a 1 MiB+ file: %d %q", code, errs)
	}
}
