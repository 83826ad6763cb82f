package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// commandLine is one way the shipped artifacts run stickylb: its arguments after the binary.
type commandLine struct {
	where string
	args  []string
}

// Every command and flag that the Kubernetes manifests, the systemd units and the container
// image pass to stickylb is one that `stickylb` takes, as its own usage and --help say: a
// renamed flag fails here, not at a node's start. What issues still to land bring is listed
// in pendingCommands, and an entry fails here once stickylb has it.
func TestDeployedCommandLines(t *testing.T) {
	lines := slicesConcat(manifestCommandLines(t), unitCommandLines(t), dockerfileCommandLines(t))
	if len(lines) < 8 {
		t.Fatalf("found %d command lines: %v", len(lines), lines)
	}
	for _, cl := range lines {
		path, flags := splitCommandLine(cl.args)
		cmd := strings.Join(path, " ")
		if why, ok := pendingCommands[cmd]; ok {
			t.Logf("%s: stickylb %s, pending (%s)", cl.where, cmd, why)
			continue
		}
		if !commandExists(path) {
			t.Errorf("%s: stickylb %s: no such command", cl.where, cmd)
			continue
		}
		known := commandFlags(t, path)
		for _, f := range flags {
			if why, ok := pendingCommands[cmd+" --"+f]; ok {
				t.Logf("%s: stickylb %s --%s, pending (%s)", cl.where, cmd, f, why)
				continue
			}
			if !known[f] {
				t.Errorf("%s: stickylb %s takes no flag --%s", cl.where, cmd, f)
			}
		}
	}
	for entry, why := range pendingCommands {
		cmd, flag, isFlag := strings.Cut(entry, " --")
		path := strings.Fields(cmd)
		if !isFlag && commandExists(path) || isFlag && commandExists(path) && commandFlags(t, path)[flag] {
			t.Errorf("stickylb %s exists now: drop it from pendingCommands (%s)", entry, why)
		}
	}
}

func slicesConcat(ls ...[]commandLine) []commandLine {
	var out []commandLine
	for _, l := range ls {
		out = append(out, l...)
	}
	return out
}

// splitCommandLine returns the command words (up to the first flag or argument that is not a
// lower-case word) and the names of the flags.
func splitCommandLine(args []string) (path, flags []string) {
	i := 0
	for ; i < len(args) && commandWord.MatchString(args[i]); i++ {
		path = append(path, args[i])
	}
	for _, a := range args[i:] {
		if name, ok := strings.CutPrefix(a, "-"); ok {
			name = strings.TrimPrefix(name, "-")
			name, _, _ = strings.Cut(name, "=")
			flags = append(flags, name)
		}
	}
	return path, flags
}

var (
	commandWord = regexp.MustCompile(`^[a-z][a-z-]*$`)
	helpFlag    = regexp.MustCompile(`(?m)^  -([A-Za-z0-9][-A-Za-z0-9_.]*)`)
)

// commandExists reports whether stickylb's usage (that of the whole and that of the first
// command word, printed when it is run without arguments) names `stickylb PATH`.
func commandExists(path []string) bool {
	if len(path) == 0 {
		return false
	}
	var out bytes.Buffer
	run([]string{"help"}, &out, &out)
	run(path[:1], &out, &out)
	return strings.Contains(out.String(), "stickylb "+strings.Join(path, " "))
}

// commandFlags returns the flags `stickylb PATH --help` lists.
func commandFlags(t *testing.T, path []string) map[string]bool {
	t.Helper()
	var out bytes.Buffer
	run(append(append([]string{}, path...), "--help"), &out, &out)
	flags := map[string]bool{}
	for _, m := range helpFlag.FindAllStringSubmatch(out.String(), -1) {
		flags[m[1]] = true
	}
	if len(flags) == 0 && strings.Join(path, " ") != "validate" {
		t.Errorf("stickylb %s --help lists no flag:\n%s", strings.Join(path, " "), out.String())
	}
	return flags
}

// manifestCommandLines finds the stickylb invocations of deploy/kubernetes: the arguments of
// every container of the stickylb image (its entrypoint is the binary) and every exec
// command that runs /usr/bin/stickylb.
func manifestCommandLines(t *testing.T) []commandLine {
	t.Helper()
	files, err := filepath.Glob("../../deploy/kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var out []commandLine
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		for {
			var doc any
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			walkYAML(doc, func(m map[string]any) {
				where := filepath.Base(f)
				if name, ok := m["name"].(string); ok {
					where += " " + name
				}
				if image, _ := m["image"].(string); strings.HasPrefix(image, "stickylb:") {
					args := strs(m["args"])
					if c := strs(m["command"]); len(c) > 0 {
						if c[0] != "/usr/bin/stickylb" {
							t.Errorf("%s: the stickylb image runs %v", where, c)
						}
						args = append(c[1:], args...)
					}
					out = append(out, commandLine{where, args})
				}
				if c := strs(m["command"]); len(c) > 0 && c[0] == "/usr/bin/stickylb" && m["image"] == nil {
					out = append(out, commandLine{where + " (exec)", c[1:]})
				}
			})
		}
	}
	return out
}

func walkYAML(v any, visit func(map[string]any)) {
	switch v := v.(type) {
	case map[string]any:
		visit(v)
		for _, x := range v {
			walkYAML(x, visit)
		}
	case []any:
		for _, x := range v {
			walkYAML(x, visit)
		}
	}
}

func strs(v any) []string {
	l, _ := v.([]any)
	var out []string
	for _, x := range l {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// unitCommandLines reads the ExecStart, ExecReload and ExecStop lines of the systemd units
// that run /usr/bin/stickylb, with $VAR and ${VAR} expanded from the unit's Environment=
// defaults (the EnvironmentFile= an operator writes may add more flags, the defaults here
// must be right on their own).
func unitCommandLines(t *testing.T) []commandLine {
	t.Helper()
	files, err := filepath.Glob("../../examples/systemd/*.service")
	if err != nil || len(files) == 0 {
		t.Fatalf("no units: %v", err)
	}
	var out []commandLine
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		env := map[string]string{}
		var execs []string
		for _, line := range strings.Split(string(raw), "\n") {
			key, value, ok := strings.Cut(line, "=")
			switch {
			case !ok:
			case key == "Environment":
				for _, kv := range unitWords(value) {
					k, v, _ := strings.Cut(kv, "=")
					env[k] = v
				}
			case key == "ExecStart" || key == "ExecReload" || key == "ExecStop":
				execs = append(execs, value)
			}
		}
		for _, e := range execs {
			var args []string
			for _, w := range unitWords(strings.TrimLeft(e, "-+@!:")) {
				switch {
				case strings.HasPrefix(w, "${") && strings.HasSuffix(w, "}"):
					args = append(args, env[w[2:len(w)-1]])
				case strings.HasPrefix(w, "$"):
					args = append(args, strings.Fields(env[w[1:]])...)
				default:
					args = append(args, w)
				}
			}
			if len(args) > 0 && args[0] == "/usr/bin/stickylb" {
				out = append(out, commandLine{filepath.Base(f), args[1:]})
			}
		}
	}
	return out
}

// unitWords splits a unit file's value into words as systemd does: on blanks, with double
// quotes keeping a word together.
func unitWords(s string) []string {
	var words []string
	var w strings.Builder
	quoted, in := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, in = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

// dockerfileCommandLines reads the image's default command (ENTRYPOINT the binary, CMD its
// arguments).
func dockerfileCommandLines(t *testing.T) []commandLine {
	t.Helper()
	const path = "../../packaging/container/Dockerfile"
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var entrypoint, cmd []string
	for _, line := range strings.Split(string(raw), "\n") {
		var dst *[]string
		switch {
		case strings.HasPrefix(line, "ENTRYPOINT "):
			dst = &entrypoint
		case strings.HasPrefix(line, "CMD "):
			dst = &cmd
		default:
			continue
		}
		if err := yaml.Unmarshal([]byte(line[strings.Index(line, " ")+1:]), dst); err != nil {
			t.Fatalf("%s: %q: %v", path, line, err)
		}
	}
	if len(entrypoint) != 1 || entrypoint[0] != "/usr/bin/stickylb" {
		t.Fatalf("%s: ENTRYPOINT %v", path, entrypoint)
	}
	return []commandLine{{"Dockerfile CMD", cmd}}
}

func TestSplitCommandLine(t *testing.T) {
	path, flags := splitCommandLine([]string{"pools", "apply", "/etc/p.yaml", "--etcd=http://e:2379", "-q", "--iface", "eth0", "x"})
	if strings.Join(path, " ") != "pools apply" || strings.Join(flags, " ") != "etcd q iface" {
		t.Errorf("path %v, flags %v", path, flags)
	}
	if got := unitWords(`"A=--pools /etc/x.yaml" B= C=1`); strings.Join(got, "|") != "A=--pools /etc/x.yaml|B=|C=1" {
		t.Errorf("unitWords: %q", got)
	}
}

// A stopping XDP node withdraws its routes and forwards for --drain-time before it exits:
// the unit's TimeoutStopSec leaves it that and 10 s more, or systemd kills it mid-drain.
func TestXDPUnitStopCoversTheDrain(t *testing.T) {
	var help bytes.Buffer
	run([]string{"xdp", "--help"}, &help, &help)
	m := regexp.MustCompile(`(?m)^  -drain-time duration\n(?:\s+.*\n)*?.*\(default ([0-9a-z.]+)\)`).FindStringSubmatch(help.String())
	if m == nil {
		t.Fatalf("stickylb xdp --help gives no --drain-time default:\n%s", help.String())
	}
	drain, err := time.ParseDuration(m[1])
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("../../examples/systemd/stickylb-xdp@.service")
	if err != nil {
		t.Fatal(err)
	}
	stop := regexp.MustCompile(`(?m)^TimeoutStopSec=(\S+)$`).FindStringSubmatch(string(raw))
	if stop == nil {
		t.Fatal("stickylb-xdp@.service sets no TimeoutStopSec")
	}
	d, err := time.ParseDuration(stop[1])
	if err != nil {
		t.Fatalf("TimeoutStopSec=%s: %v", stop[1], err)
	}
	if d < drain+10*time.Second {
		t.Errorf("TimeoutStopSec=%s leaves less than --drain-time's default (%s) and 10 s", d, drain)
	}
}
