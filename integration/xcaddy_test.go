package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestXcaddyDocListsEveryModule: the module list xcaddy.md shows is what `caddy
// list-modules` of ./cmd/caddy prints beside Caddy's standard modules, no more, no less.
func TestXcaddyDocListsEveryModule(t *testing.T) {
	bin := builtCaddy(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "list-modules", "--json", "--skip-standard").Output()
	if err != nil {
		t.Fatalf("caddy list-modules: %v", err)
	}
	var mods []struct {
		Name string `json:"module_name"`
		Type string `json:"module_type"`
	}
	if err := json.Unmarshal(out, &mods); err != nil {
		t.Fatalf("caddy list-modules --json: %v\n%s", err, out)
	}
	var got []string
	for _, m := range mods {
		if m.Type == "non-standard" {
			got = append(got, m.Name)
		}
	}
	slices.Sort(got)
	doc := docModuleList(t)
	if !slices.Equal(got, doc) {
		t.Fatalf("xcaddy.md lists %d modules:\n  %s\ncaddy list-modules shows %d:\n  %s",
			len(doc), strings.Join(doc, "\n  "), len(got), strings.Join(got, "\n  "))
	}
	if len(got) < 10 {
		t.Fatalf("only %d modules: %v", len(got), got)
	}
}

// docModuleList reads the code block after "`list-modules` shows" in xcaddy.md, sorted.
func docModuleList(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../xcaddy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "`list-modules` shows")
	if !ok {
		t.Fatal("xcaddy.md: no \"`list-modules` shows\"")
	}
	_, rest, ok = strings.Cut(rest, "```\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("xcaddy.md: no code block after \"`list-modules` shows\"")
	}
	var mods []string
	for _, l := range strings.Split(block, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			mods = append(mods, l)
		}
	}
	slices.Sort(mods)
	return mods
}
