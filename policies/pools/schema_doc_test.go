package pools

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docSchema reads docs/pools.md: each section headed by a path (## `services[].hash`, or
// ## top level) documents that mapping's fields, one table row per field, name first.
func docSchema(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "docs", "pools.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	heading := regexp.MustCompile("^## (?:`([^`]+)`|(top level))$")
	row := regexp.MustCompile("^\\| `([a-z_]+)` \\|")
	doc := map[string][]string{}
	path, in := "", false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			m := heading.FindStringSubmatch(line)
			in = m != nil
			if in {
				path = m[1] // "" for the top level
				if _, dup := doc[path]; dup {
					t.Errorf("docs/pools.md documents %q twice", path)
				}
				doc[path] = []string{}
			}
			continue
		}
		if m := row.FindStringSubmatch(line); in && m != nil {
			doc[path] = append(doc[path], m[1])
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return doc
}

// TestDocsDescribeEveryField: docs/pools.md describes exactly the fields the decoder
// accepts, mapping by mapping, in both directions.
func TestDocsDescribeEveryField(t *testing.T) {
	doc := docSchema(t)
	for path, fields := range schema {
		documented, ok := doc[path]
		if !ok {
			t.Errorf("docs/pools.md has no section for %q (fields %v)", path, fields)
			continue
		}
		for _, f := range fields {
			if !slices.Contains(documented, f) {
				t.Errorf("the decoder accepts %s.%s; docs/pools.md does not describe it", path, f)
			}
		}
		for _, f := range documented {
			if !slices.Contains(fields, f) {
				t.Errorf("docs/pools.md describes %s.%s; the decoder does not accept it", path, f)
			}
		}
	}
	for path := range doc {
		if _, ok := schema[path]; !ok {
			t.Errorf("docs/pools.md documents %q, a mapping the decoder does not read", path)
		}
	}
}

// TestSchemaIsWhatTheDecoderReads: every path of schema is a mapping the decoder checks
// against exactly that path's fields, so the doc test above compares the docs with what the
// decoder does, not with a list beside it.
func TestSchemaIsWhatTheDecoderReads(t *testing.T) {
	for path, fields := range schema {
		_, err := Parse("s.yaml", []byte(at(path, "zzzz: 1")))
		want := "unknown field \"zzzz\""
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "known fields: "+strings.Join(fields, ", ")) {
			t.Errorf("%q: an unknown field is not checked against %v:\n%v", path, fields, err)
		}
		for _, f := range fields {
			_, err := Parse("s.yaml", []byte(at(path, f+": null")))
			if err != nil && strings.Contains(err.Error(), "unknown field \""+f+"\"") {
				t.Errorf("%s.%s: documented but refused: %v", path, f, err)
			}
		}
	}
}

// at builds a file whose mapping at path holds entry (as YAML flow text).
func at(path, entry string) string {
	if path == "" {
		return "{" + entry + "}"
	}
	v := "{" + entry + "}"
	parts := strings.Split(path, ".")
	for i := len(parts) - 1; i >= 0; i-- {
		p := parts[i]
		if name, ok := strings.CutSuffix(p, "[]"); ok {
			v = "{" + name + ": [" + v + "]}"
		} else {
			v = "{" + p + ": " + v + "}"
		}
	}
	return v
}
