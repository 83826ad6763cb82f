package docs

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestCIRunHeaderListsEveryStep: the header of .ci/run numbers every step the script runs
// ("N. name: ..."), in the script's order, each by the name its `step` line prints.
func TestCIRunHeaderListsEveryStep(t *testing.T) {
	b, err := os.ReadFile("../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	var header, steps []string
	item := regexp.MustCompile(`^#\s+(\d+)\. ([^:.]+)[:.]`)
	step := regexp.MustCompile(`^step "([^"(]+)`)
	for _, l := range strings.Split(string(b), "\n") {
		if m := item.FindStringSubmatch(l); m != nil {
			header = append(header, m[2])
		}
		if m := step.FindStringSubmatch(l); m != nil {
			if name := strings.TrimSpace(m[1]); name != "go mod download" && name != "done" {
				steps = append(steps, name)
			}
		}
	}
	if len(steps) < 7 || !slices.Equal(header, steps) {
		t.Fatalf(".ci/run's header lists %q;\nits steps are %q", header, steps)
	}
}
