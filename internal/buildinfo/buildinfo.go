// Package buildinfo says which stickylb a binary holds, from what the Go toolchain stamped
// into it (runtime/debug.ReadBuildInfo): the module version, the VCS revision and time, the
// dirty flag and the Go version. `stickylb version` prints it and every daemon exports it as
// stickylb_build_info, in `stickylb` itself (the main module) and in a Caddy built with the
// modules (stickylb is then a dependency).
//
// The toolchain stamps the VCS fields only for the main module, only with -buildvcs (on by
// default in a checkout; a GOFLAGS=-buildvcs=false in the environment turns it off) and only
// where .git is a directory: a git worktree, whose .git is a file, builds without them. A
// dependency (stickylb inside Caddy) carries its module version and no VCS fields; one
// replaced by a local directory (xcaddy --with MODULE@VERSION=DIR) carries the VERSION given
// and the directory. A pseudo-version (v0.0.0-20261204184014-af3075101ce5) names its commit,
// so a dependency at one reports that revision's first 12 digits and its time.
package buildinfo

import (
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// ModulePath is stickylb's module.
const ModulePath = "github.com/stickylb/stickylb"

// Unknown stands for a field the binary does not carry.
const Unknown = "unknown"

// Info is what a binary says of the stickylb it holds.
type Info struct {
	// Version is the module version: a tag (v0.3.1), a pseudo-version the toolchain derived
	// from the VCS (v0.0.0-20261204184014-af3075101ce5, +dirty when modified), "(devel)"
	// when nothing was stamped, or Unknown when the binary holds no build info.
	Version string `json:"version"`
	// Revision and Time are the VCS commit and its time (RFC 3339); empty when not stamped.
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	// Modified is true when the tree held uncommitted changes at build time.
	Modified bool `json:"modified"`
	// GoVersion is the toolchain that built the binary.
	GoVersion string `json:"go_version"`
	// Platform is GOOS/GOARCH.
	Platform string `json:"platform"`
	// Main is false when stickylb is a dependency of the binary's main module (Caddy).
	Main bool `json:"main"`
	// ReplacedBy is the directory or module a replace directive put in stickylb's place.
	ReplacedBy string `json:"replaced_by,omitempty"`
}

// Read returns the running binary's Info.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: Unknown, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	}
	return FromBuildInfo(bi)
}

// FromBuildInfo picks stickylb's module out of a binary's build info: the main module when
// it is stickylb (or when no dependency is, as in a test binary), else the dependency.
func FromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Version: Unknown, GoVersion: bi.GoVersion, Platform: runtime.GOOS + "/" + runtime.GOARCH}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if p := settings["GOOS"] + "/" + settings["GOARCH"]; p != "/" {
		in.Platform = p
	}
	mod := &bi.Main
	in.Main = true
	if bi.Main.Path != ModulePath {
		for _, d := range bi.Deps {
			if d.Path == ModulePath {
				mod, in.Main = d, false
				break
			}
		}
	}
	if mod.Version != "" {
		in.Version = mod.Version
	}
	if r := mod.Replace; r != nil {
		in.ReplacedBy = r.Path
		if r.Version != "" {
			in.ReplacedBy += "@" + r.Version
		}
	}
	if in.Main {
		in.Revision, in.Time, in.Modified = settings["vcs.revision"], settings["vcs.time"], settings["vcs.modified"] == "true"
	} else if m := pseudoVersion.FindStringSubmatch(in.Version); m != nil {
		t := m[1]
		in.Time = t[0:4] + "-" + t[4:6] + "-" + t[6:8] + "T" + t[8:10] + ":" + t[10:12] + ":" + t[12:14] + "Z"
		in.Revision = m[2]
	}
	return in
}

// pseudoVersion matches the tail of the three pseudo-version forms (vX.0.0-T-R,
// vX.Y.Z-pre.0.T-R, vX.Y.(Z+1)-0.T-R): the UTC commit time and 12 digits of the revision.
var pseudoVersion = regexp.MustCompile(`[-.](\d{14})-([0-9a-f]{12})(?:\+[0-9A-Za-z.-]+)?$`)

// String is what `stickylb version` prints: the version on the first line, then one field a
// line.
func (in Info) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "stickylb %s\n", in.Version)
	field := func(k, v string) { fmt.Fprintf(&b, "  %-9s %s\n", k, v) }
	field("revision", orUnknown(in.Revision))
	field("time", orUnknown(in.Time))
	field("modified", fmt.Sprint(in.Modified))
	if in.ReplacedBy != "" {
		field("replaced", in.ReplacedBy)
	}
	field("go", in.GoVersion+" "+in.Platform)
	return b.String()
}

func orUnknown(s string) string {
	if s == "" {
		return Unknown
	}
	return s
}

// Collector returns the stickylb_build_info gauge: 1, labelled with the version, the
// revision (Unknown when not stamped) and the Go version, as Prometheus' own build_info
// gauges are, so that a query can join any series on the build that made it.
func Collector() prometheus.Collector {
	in := Read()
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "stickylb_build_info",
		Help: "1, labelled with the stickylb build: module version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{
			"version": in.Version, "revision": orUnknown(in.Revision), "goversion": in.GoVersion,
		},
	}, func() float64 { return 1 })
}
