package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestFromBuildInfo(t *testing.T) {
	settings := []debug.BuildSetting{{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "arm64"},
		{Key: "vcs.revision", Value: "af3075101ce51fffb34c9d7afed81d806c692b53"},
		{Key: "vcs.time", Value: "2026-12-04T18:40:14Z"}, {Key: "vcs.modified", Value: "true"}}
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want Info
	}{
		{"stickylb built from a checkout", debug.BuildInfo{GoVersion: "go1.26.8",
			Main:     debug.Module{Path: ModulePath, Version: "v0.0.0-20261204184014-af3075101ce5+dirty"},
			Settings: settings},
			Info{Version: "v0.0.0-20261204184014-af3075101ce5+dirty", Revision: "af3075101ce51fffb34c9d7afed81d806c692b53",
				Time: "2026-12-04T18:40:14Z", Modified: true, GoVersion: "go1.26.8", Platform: "linux/arm64", Main: true}},
		// Caddy's VCS fields are Caddy's checkout's, not stickylb's: none is taken.
		{"a Caddy with stickylb at a tag", debug.BuildInfo{GoVersion: "go1.26.8",
			Main:     debug.Module{Path: "caddy", Version: "(devel)"},
			Deps:     []*debug.Module{{Path: "github.com/caddyserver/caddy/v2", Version: "v2.11.9"}, {Path: ModulePath, Version: "v0.3.1"}},
			Settings: settings},
			Info{Version: "v0.3.1", GoVersion: "go1.26.8", Platform: "linux/arm64"}},
		{"xcaddy --with MODULE@v0.0.0=DIR", debug.BuildInfo{GoVersion: "go1.26.8",
			Main: debug.Module{Path: "caddy", Version: "(devel)"},
			Deps: []*debug.Module{{Path: ModulePath, Version: "v0.0.0", Replace: &debug.Module{Path: "/src/stickylb"}}}},
			Info{Version: "v0.0.0", GoVersion: "go1.26.8", ReplacedBy: "/src/stickylb", Platform: Read().Platform}},
		// A pseudo-version names its commit, whether the module was fetched or replaced.
		{"xcaddy --with MODULE@PSEUDO-VERSION=DIR", debug.BuildInfo{GoVersion: "go1.26.8",
			Main: debug.Module{Path: "caddy", Version: "(devel)"},
			Deps: []*debug.Module{{Path: ModulePath, Version: "v0.0.0-20261204184014-af3075101ce5", Replace: &debug.Module{Path: "/src/stickylb"}}}},
			Info{Version: "v0.0.0-20261204184014-af3075101ce5", Revision: "af3075101ce5", Time: "2026-12-04T18:40:14Z",
				GoVersion: "go1.26.8", ReplacedBy: "/src/stickylb", Platform: Read().Platform}},
		{"a Caddy with stickylb at a pseudo-version after a tag", debug.BuildInfo{GoVersion: "go1.26.8",
			Main: debug.Module{Path: "caddy", Version: "(devel)"},
			Deps: []*debug.Module{{Path: ModulePath, Version: "v0.3.2-0.20261204184014-af3075101ce5"}}},
			Info{Version: "v0.3.2-0.20261204184014-af3075101ce5", Revision: "af3075101ce5", Time: "2026-12-04T18:40:14Z",
				GoVersion: "go1.26.8", Platform: Read().Platform}},
		{"no version stamped", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "command-line-arguments"}},
			Info{Version: Unknown, GoVersion: "go1.26.8", Main: true, Platform: Read().Platform}},
	} {
		if got := FromBuildInfo(&tc.bi); got != tc.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
}

func TestString(t *testing.T) {
	in := Info{Version: "v0.3.1", Revision: "af30751", Time: "2026-12-04T18:40:14Z", GoVersion: "go1.26.8", Platform: "linux/amd64", Main: true}
	want := "stickylb v0.3.1\n  revision  af30751\n  time      2026-12-04T18:40:14Z\n  modified  false\n  go        go1.26.8 linux/amd64\n"
	if got := in.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if got := (Info{Version: "v0.0.0", ReplacedBy: "/src"}).String(); !strings.Contains(got, "revision  unknown\n") || !strings.Contains(got, "replaced  /src\n") {
		t.Errorf("got\n%s", got)
	}
}

// The gauge carries the binary's own build: in a test binary, its Go version and no revision.
func TestCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	in := Read()
	if len(mfs) != 1 || mfs[0].GetName() != "stickylb_build_info" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v", mfs)
	}
	m := mfs[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	want := map[string]string{"version": in.Version, "revision": orUnknown(in.Revision), "goversion": in.GoVersion}
	if m.GetGauge().GetValue() != 1 || len(labels) != 3 || labels["version"] != want["version"] ||
		labels["revision"] != want["revision"] || labels["goversion"] != want["goversion"] {
		t.Errorf("got %v = %v, want %v = 1", labels, m.GetGauge().GetValue(), want)
	}
	if in.GoVersion == "" || in.Version == "" {
		t.Errorf("the test binary's build info: %+v", in)
	}
}
