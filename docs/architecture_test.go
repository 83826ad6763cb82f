// Package docs holds the tests that keep the documentation true to the code: the import
// table of architecture.md against every package's imports, the files the commands of
// README.md and the guides name against the repository, .ci/run's header against its
// steps, and the licences README.md states against LICENSE and the BPF sources.
package docs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/stickylb/stickylb"

// adapters are the packages that put policies into a tier; none may import another.
var adapters = []string{"caddymodule", "xds", "l4xdp", "l4bgp"}

// contractLayer sits between the control plane and the node tiers; it imports no adapter.
var contractLayer = []string{"fleetview", "adsclient"}

// thirdParty maps the table's plain words for modules outside this one to the import-path
// prefixes they stand for. A word the table uses that is not here fails the test, so a new
// dependency is named in the doc and here together.
var thirdParty = map[string]string{
	"xxhash":                       "github.com/cespare/xxhash",
	"x/crypto":                     "golang.org/x/crypto",
	"x/net":                        "golang.org/x/net",
	"x/sys":                        "golang.org/x/sys",
	"yaml":                         "go.yaml.in/yaml",
	"zap":                          "go.uber.org/zap",
	"Caddy":                        "github.com/caddyserver/caddy",
	"Envoy API types":              "github.com/envoyproxy/go-control-plane/envoy",
	"go-control-plane":             "github.com/envoyproxy/go-control-plane/pkg",
	"go-control-plane's type URLs": "github.com/envoyproxy/go-control-plane/pkg/resource",
	"cncf/xds":                     "github.com/cncf/xds",
	"grpc":                         "google.golang.org/grpc",
	"protobuf":                     "google.golang.org/protobuf",
	"the Prometheus client":        "github.com/prometheus/client_golang",
	"cilium/ebpf":                  "github.com/cilium/ebpf",
	"netlink":                      "github.com/vishvananda/netlink",
	"netns":                        "github.com/vishvananda/netns",
	"etcd's client":                "go.etcd.io/etcd/client",
	"etcd's API types":             "go.etcd.io/etcd/api",
	"etcd's server":                "go.etcd.io/etcd/server",
	"GoBGP":                        "github.com/osrg/gobgp/v4",
}

// room is one row of architecture.md's table.
type room struct {
	line    int
	path    string   // as the table writes it, without backticks: "xds/", "internal/testkit/*", "."
	terms   []string // the "may import" column, split at commas
	allow   []func(pkg, imp string) bool
	anyPath bool // "everything"
}

// allowed reports whether the row lets pkg import imp.
func (r room) allowed(pkg, imp string) bool {
	return slices.ContainsFunc(r.allow, func(a func(pkg, imp string) bool) bool { return a(pkg, imp) })
}

// covers reports whether the row is about package pkg (a path relative to the module).
func (r room) covers(pkg string) bool {
	p := strings.TrimSuffix(r.path, "/")
	if prefix, ok := strings.CutSuffix(p, "/*"); ok {
		return strings.HasPrefix(pkg, prefix+"/")
	}
	return pkg == p
}

// readRooms parses the table under "## The rooms".
func readRooms(t *testing.T) []room {
	t.Helper()
	b, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	var rooms []room
	in := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == "## The rooms"
			continue
		case !in || !strings.HasPrefix(line, "| `"):
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) != 3 {
			t.Fatalf("architecture.md:%d: want 3 cells (path | holds | may import), got %d", n, len(cells))
		}
		head := strings.TrimSpace(cells[0])
		r := room{line: n, path: strings.Trim(strings.Fields(head)[0], "`")}
		imports := strings.TrimSpace(cells[2])
		r.anyPath = imports == "everything"
		if !r.anyPath && imports != "stdlib only" {
			for _, term := range strings.Split(imports, ",") {
				term = strings.TrimSpace(term)
				a, ok := allows(term)
				if !ok {
					t.Errorf("architecture.md:%d: %s: the test does not know what %q stands for (add it to thirdParty)", n, r.path, term)
					continue
				}
				r.terms, r.allow = append(r.terms, term), append(r.allow, a)
			}
		}
		rooms = append(rooms, r)
	}
	if len(rooms) == 0 {
		t.Fatal("architecture.md: no table under ## The rooms")
	}
	return rooms
}

// allows returns what term of a row allows: whether package pkg may import imp
// (module-relative for this module's packages, the full path otherwise). ok is false for a
// term the test does not know.
func allows(term string) (allow func(pkg, imp string) bool, ok bool) {
	if p, ok := thirdParty[term]; ok {
		return func(_, imp string) bool { return imp == p || strings.HasPrefix(imp, p+"/") }, true
	}
	switch {
	case term == "adapters":
		return func(_, imp string) bool { return slices.Contains(adapters, imp) }, true
	case term == "`policies`":
		return func(_, imp string) bool { return strings.HasPrefix(imp, "policies/") }, true
	case term == "other `policies/*`":
		return func(pkg, imp string) bool { return strings.HasPrefix(imp, "policies/") && imp != pkg }, true
	case strings.HasPrefix(term, "`") && strings.HasSuffix(term, "`"):
		pat := strings.Trim(term, "`")
		if prefix, ok := strings.CutSuffix(pat, "/*"); ok {
			return func(_, imp string) bool { return strings.HasPrefix(imp, prefix+"/") }, true
		}
		return func(_, imp string) bool { return imp == pat }, true
	}
	return nil, false
}

// listed is a package of the module as `go list` reports it.
type listed struct {
	ImportPath string
	Imports    []string
}

// modulePackages lists every package of the module with its non-test imports, paths of
// this module relative to it ("." for the root).
func modulePackages(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports", "./...")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	rel := func(p string) string {
		if p == module {
			return "."
		}
		if r, ok := strings.CutPrefix(p, module+"/"); ok {
			return r
		}
		return p
	}
	pkgs := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		var imps []string
		for _, imp := range p.Imports {
			if !isStdlib(imp) {
				imps = append(imps, rel(imp))
			}
		}
		pkgs[rel(p.ImportPath)] = imps
	}
	return pkgs
}

// isStdlib: standard-library paths have no dot in their first element.
func isStdlib(imp string) bool {
	first, _, _ := strings.Cut(imp, "/")
	return !strings.Contains(first, ".")
}

// TestArchitectureImportTable: every package has a row in architecture.md's table, every
// row names a package, each package imports (tests aside) only what its row allows, and
// every word of a row stands for something the package imports.
func TestArchitectureImportTable(t *testing.T) {
	rooms := readRooms(t)
	pkgs := modulePackages(t)
	for _, pkg := range slices.Sorted(maps.Keys(pkgs)) {
		imps := pkgs[pkg]
		i := slices.IndexFunc(rooms, func(r room) bool { return r.covers(pkg) })
		if i < 0 {
			t.Errorf("package %s has no row in architecture.md's table", pkg)
			continue
		}
		r := rooms[i]
		if r.anyPath {
			continue
		}
		for _, imp := range imps {
			if !r.allowed(pkg, imp) {
				t.Errorf("architecture.md:%d: %s imports %s, which its row (%s) does not allow", r.line, pkg, imp, strings.Join(r.terms, ", "))
			}
		}
	}
	for _, r := range rooms {
		var covered []string
		for pkg := range pkgs {
			if r.covers(pkg) {
				covered = append(covered, pkg)
			}
		}
		if len(covered) == 0 {
			t.Errorf("architecture.md:%d: no package %s", r.line, r.path)
			continue
		}
		for i, term := range r.terms {
			used := slices.ContainsFunc(covered, func(pkg string) bool {
				return slices.ContainsFunc(pkgs[pkg], func(imp string) bool { return r.allow[i](pkg, imp) })
			})
			if !used {
				t.Errorf("architecture.md:%d: %s: %s is listed, but no package of the row imports it", r.line, r.path, term)
			}
		}
	}
}

// TestArchitectureRules checks the rules the table must keep, whatever it says: adapters
// import no other adapter, the contract layer imports no adapter, policies import nothing
// of the module outside policies, and only test kits import test kits.
func TestArchitectureRules(t *testing.T) {
	pkgs := modulePackages(t)
	for _, pkg := range slices.Sorted(maps.Keys(pkgs)) {
		imps := pkgs[pkg]
		top, _, _ := strings.Cut(pkg, "/")
		for _, imp := range imps {
			impTop, _, _ := strings.Cut(imp, "/")
			var broken string
			switch {
			case slices.Contains(adapters, top) && slices.Contains(adapters, impTop) && impTop != top:
				broken = "an adapter imports another adapter"
			case slices.Contains(contractLayer, top) && slices.Contains(adapters, impTop):
				broken = "the contract layer imports an adapter"
			case top == "policies" && !isStdlib(imp) && !strings.Contains(impTop, ".") && impTop != "policies":
				broken = "policies import the module's packages outside policies"
			case strings.HasPrefix(imp, "internal/testkit/") && !strings.HasPrefix(pkg, "internal/testkit/"):
				broken = "production code imports a test kit"
			}
			if broken != "" {
				t.Errorf("%s imports %s: %s", pkg, imp, broken)
			}
		}
	}
}

// The matching must be able to fail: imports a row does not allow are refused.
func TestArchitectureTermsRefuse(t *testing.T) {
	var r room
	for _, term := range []string{"other `policies/*`", "zap"} {
		a, ok := allows(term)
		if !ok {
			t.Fatalf("%q unknown", term)
		}
		r.allow = append(r.allow, a)
	}
	for _, imp := range []string{"policies/plan", "xds", "go.uber.org/zapx", "fleetview"} {
		if r.allowed("policies/plan", imp) {
			t.Errorf("%s allowed", imp)
		}
	}
	for _, imp := range []string{"policies/pools", "go.uber.org/zap", "go.uber.org/zap/zapcore"} {
		if !r.allowed("policies/plan", imp) {
			t.Errorf("%s refused", imp)
		}
	}
	if _, ok := allows("leftpad"); ok {
		t.Error("an unknown word is known")
	}
	if !(room{path: "internal/testkit/*"}).covers("internal/testkit/testwait") || (room{path: "xds/"}).covers("xdsx") {
		t.Error("row paths")
	}
}
