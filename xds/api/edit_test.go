package api

import (
	"errors"
	"strings"
	"testing"

	"github.com/stickylb/stickylb/policies/pools"
)

const editFile = `# head comment
services:
  - name: web # the web tier
    protocol: http
    listen: 0.0.0.0:10000
    balance: weighted_least_conn
    backends:
      - {address: 10.0.1.1:8080, weight: 3} # big
      - address: 10.0.1.2:8080
        hash_key: web-2
        zone: zone-b
`

// Edits keep comments, key order and each mapping's style; a bad value is named by its
// path (services[NAME], backends[IDENTITY]) rather than its line.
func TestEditKeepsTheFileAndNamesPaths(t *testing.T) {
	d, err := parseDoc([]byte(editFile))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := d.service("web")
	if err != nil {
		t.Fatal(err)
	}
	list, i, err := backend(svc, "web-2")
	if err != nil || i != 1 {
		t.Fatalf("backend by hash_key: %d %v", i, err)
	}
	set(list.Content[i], "drain", scalar("!!bool", "true"))
	_, j, _ := backend(svc, "10.0.1.1:8080")
	set(list.Content[j], "weight", scalar("!!int", "0"))
	if err := zoneList(svc, "zone-b", true); err != nil {
		t.Fatal(err)
	}
	out, err := d.encode()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# head comment", "# the web tier", "weight: 0} # big", "drain: true", "drained_zones: [zone-b]"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("edited file lacks %q:\n%s", want, out)
		}
	}
	_, perr := pools.Parse("pools.yaml", out)
	if perr == nil {
		t.Fatal("weight 0 validated")
	}
	got := errorStrings(perr, pathError(out))
	if len(got) != 1 || !strings.HasPrefix(got[0], "services[web].backends[10.0.1.1:8080].weight: 0: want 1..10000") {
		t.Fatalf("errors: %q", got)
	}
	if _, err := d.service("nope"); !errors.As(err, new(errNotFound)) {
		t.Fatalf("unknown service: %v", err)
	}
}

// An error whose message starts with the field's name does not name it twice: the path
// ends with it.
func TestPathErrorNamesTheFieldOnce(t *testing.T) {
	data := []byte("services:\n  - name: web\n    protocol: http\n    listen: 0.0.0.0:80\n    backends:\n      - {address: 10.0.1.1:8080, weight: abc}\n")
	_, perr := pools.Parse("pools.yaml", data)
	got := errorStrings(perr, pathError(data))
	if len(got) != 1 || got[0] != `services[web].backends[10.0.1.1:8080].weight: want an integer, got string "abc"` {
		t.Fatalf("errors: %q", got)
	}
}

// A backend written through an alias or a merge key is not edited (it would change every
// place that names it): the operator edits the file.
func TestEditRefusesAliases(t *testing.T) {
	d, err := parseDoc([]byte("x: &b {address: 10.0.0.1:80}\nservices:\n  - name: web\n    backends:\n      - *b\n      - {<<: *b, weight: 2, hash_key: k}\n"))
	if err != nil {
		t.Fatal(err)
	}
	svc, _ := d.service("web")
	for _, id := range []string{"10.0.0.1:80", "k"} {
		if _, _, err := backend(svc, id); !errors.Is(err, errUnsupported) {
			t.Errorf("%s: %v, want errUnsupported", id, err)
		}
	}
}
