package pools

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// maxVisits bounds the nodes walked. Aliases let a small file name the same
// subtree many times over (the "billion laughs"); a real pools file, even
// with thousands of backends, stays far below this.
const maxVisits = 1 << 22

// yamlWalker walks a YAML node tree as a pools file is written: mappings with their merge
// keys expanded, scalars of the kinds the file takes, each node counted against maxVisits,
// and every problem reported once, at its line and column. The decoder reads the file's
// fields through it.
type yamlWalker struct {
	file  string
	errs  ErrorList
	warns ErrorList
	// reported holds every problem reported, so a node walked once per alias that names it
	// is reported once: without it a few aliases of a bad mapping multiply its errors.
	reported map[Error]bool
	unknown  map[*yaml.Node]bool // keys reported as unknown fields
	// known caches fields' answer per mapping: a mapping named by many aliases is read
	// once, and each later use costs only its visits (which still count against maxVisits).
	known   map[knownKey]knownFields
	visits  int
	spent   bool
	merging map[*yaml.Node]bool // merge sources being expanded, against cycles
}

func newYAMLWalker(file string) *yamlWalker {
	return &yamlWalker{file: file, merging: map[*yaml.Node]bool{}, reported: map[Error]bool{}, unknown: map[*yaml.Node]bool{}, known: map[knownKey]knownFields{}}
}

func (w *yamlWalker) errorf(n *yaml.Node, format string, args ...any) {
	if e := w.at(n, format, args...); w.first(e) {
		w.errs = append(w.errs, e)
	}
}

func (w *yamlWalker) warnf(n *yaml.Node, format string, args ...any) {
	if e := w.at(n, format, args...); w.first(e) {
		w.warns = append(w.warns, e)
	}
}

// first reports whether e is reported for the first time.
func (w *yamlWalker) first(e *Error) bool {
	if w.reported[*e] {
		return false
	}
	w.reported[*e] = true
	return true
}

// unknownAt reports whether the unknown field at key is new, before its suggestion is
// worked out: an aliased mapping is walked once per alias.
func (w *yamlWalker) unknownAt(key *yaml.Node) bool {
	if w.unknown[key] {
		return false
	}
	w.unknown[key] = true
	return true
}

func (w *yamlWalker) at(n *yaml.Node, format string, args ...any) *Error {
	e := &Error{File: w.file, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Col = n.Line, n.Column
	}
	return e
}

// tick counts one visited node; false once the budget is spent.
func (w *yamlWalker) tick(n *yaml.Node) bool {
	if w.spent {
		return false
	}
	w.visits++
	if w.visits > maxVisits {
		w.spent = true
		w.errorf(n, "pools file expands to more than %d nodes through aliases; stopped reading it here", maxVisits)
		return false
	}
	return true
}

// resolve follows aliases to the node they name.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// document reads the single YAML document in data and returns its root, nil when there is
// none (the problem is reported).
func (w *yamlWalker) document(data []byte) *yaml.Node {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			w.errs = append(w.errs, &Error{File: w.file, Msg: "empty pools file: want a mapping with services:"})
		} else {
			w.syntaxError(err)
		}
		return nil
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		w.errorf(&next, "a pools file holds one YAML document; a second one starts here")
	case !errors.Is(err, io.EOF):
		w.syntaxError(err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = root.Content[0]
	}
	return root
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

func (w *yamlWalker) syntaxError(err error) {
	msg := err.Error()
	e := &Error{File: w.file, Msg: "YAML: " + strings.TrimPrefix(msg, "yaml: ")}
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		if line, err := strconv.Atoi(m[1]); err == nil {
			e.Line = line
			e.Msg = "YAML: " + m[2]
		}
	}
	w.errs = append(w.errs, e)
}

// field is one key/value pair of a mapping.
type field struct {
	name     string
	key, val *yaml.Node
}

// pairs returns the pairs of mapping m with merge keys expanded: explicit
// keys win over merged ones, earlier merge sources over later ones, as the
// YAML merge-key spec says. Duplicate explicit keys are errors.
func (w *yamlWalker) pairs(m *yaml.Node) []field {
	var out []field
	var merges []*yaml.Node
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if !w.tick(k) {
			return out
		}
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merges = append(merges, v)
			continue
		}
		rk := resolve(k)
		if rk == nil || rk.Kind != yaml.ScalarNode {
			w.errorf(k, "a mapping key must be a field name, got %s", describe(k))
			continue
		}
		if prev, ok := seen[rk.Value]; ok {
			w.errorf(k, "duplicate key %q (first at line %d)", rk.Value, prev.Line)
			continue
		}
		seen[rk.Value] = k
		out = append(out, field{name: rk.Value, key: k, val: v})
	}
	for _, mv := range merges {
		for _, src := range w.mergeSources(mv) {
			if w.merging[src] {
				w.errorf(mv, "merge key (<<) refers to the mapping it is part of")
				continue
			}
			w.merging[src] = true
			for _, p := range w.pairs(src) {
				if _, ok := seen[p.name]; ok {
					continue
				}
				seen[p.name] = p.key
				out = append(out, p)
			}
			delete(w.merging, src)
		}
	}
	return out
}

// mergeSources returns the mappings a merge key's value names: one mapping
// or a list of them.
func (w *yamlWalker) mergeSources(v *yaml.Node) []*yaml.Node {
	rv := resolve(v)
	if rv == nil {
		return nil
	}
	switch rv.Kind {
	case yaml.MappingNode:
		return []*yaml.Node{rv}
	case yaml.SequenceNode:
		var out []*yaml.Node
		for _, e := range rv.Content {
			re := resolve(e)
			if re == nil || re.Kind != yaml.MappingNode {
				w.errorf(e, "merge key (<<) list entries must be mappings, got %s", describe(e))
				continue
			}
			out = append(out, re)
		}
		return out
	}
	w.errorf(v, "merge key (<<) wants a mapping or a list of mappings, got %s", describe(v))
	return nil
}

// fields checks that n is a mapping and returns its known fields by name;
// unknown ones are errors naming the closest known field.
func (w *yamlWalker) fields(n *yaml.Node, what string, known []string) (map[string]field, bool) {
	rn := resolve(n)
	if rn == nil || rn.Kind != yaml.MappingNode {
		w.errorf(n, "%s: want a mapping, got %s", what, describe(n))
		return nil, false
	}
	if !w.tick(rn) {
		return nil, false
	}
	k := knownKey{rn, what}
	if c, ok := w.known[k]; ok {
		for range c.visits {
			if !w.tick(rn) {
				return nil, false
			}
		}
		return c.fs, true
	}
	before := w.visits
	fs := map[string]field{}
	for _, p := range w.pairs(rn) {
		if !contains(known, p.name) {
			if w.unknownAt(p.key) {
				w.errorf(p.key, "unknown field %q in %s%s", p.name, what, suggest(p.name, known))
			}
			continue
		}
		fs[p.name] = p
	}
	if !w.spent {
		w.known[k] = knownFields{fs, w.visits - before}
	}
	return fs, true
}

type knownKey struct {
	n    *yaml.Node
	what string
}

// knownFields is fields' answer for one mapping, and how many visits reading it took.
type knownFields struct {
	fs     map[string]field
	visits int
}

// list returns the entries of a sequence; no value counts as an empty list.
func (w *yamlWalker) list(f field) ([]*yaml.Node, bool) {
	rn := resolve(f.val)
	if rn == nil {
		return nil, false
	}
	if rn.Kind == yaml.ScalarNode && rn.ShortTag() == "!!null" {
		return nil, true
	}
	if rn.Kind != yaml.SequenceNode {
		w.errorf(f.val, "%s: want a list, got %s", f.name, describe(f.val))
		return nil, false
	}
	if !w.tick(rn) {
		return nil, false
	}
	return rn.Content, true
}

// scalar returns the resolved scalar node of f, or reports what it got.
func (w *yamlWalker) scalar(f field, want string) (*yaml.Node, bool) {
	rn := resolve(f.val)
	if rn == nil || !w.tick(rn) {
		return nil, false
	}
	if rn.Kind != yaml.ScalarNode || rn.ShortTag() == "!!null" {
		w.errorf(f.val, "%s: want %s, got %s", f.name, want, describe(f.val))
		return nil, false
	}
	return rn, true
}

// str accepts strings, and integers and floats by their text, because a
// zone or hash key such as 1001 is text to the operator. Booleans are
// refused: `name: yes` is more likely a slip than a name.
func (w *yamlWalker) str(f field) (string, bool) {
	return w.strAt(f.name, f.val)
}

// strWhere decodes a string field that must satisfy valid; a value that does not is
// reported with format (which takes the value) at the value's position.
func (w *yamlWalker) strWhere(f field, valid func(string) bool, format string) (string, bool) {
	v, ok := w.str(f)
	if !ok {
		return "", false
	}
	if !valid(v) {
		w.errorf(f.val, format, v)
		return "", false
	}
	return v, true
}

func (w *yamlWalker) strAt(name string, n *yaml.Node) (string, bool) {
	rn, ok := w.scalar(field{name: name, val: n}, "a string")
	if !ok {
		return "", false
	}
	switch rn.ShortTag() {
	case "!!str", "!!int", "!!float":
		return rn.Value, true
	}
	w.errorf(n, "%s: want a string, got %s (quote it if you mean the text)", name, describe(n))
	return "", false
}

// integer accepts YAML integers only: "3" in quotes is a string, 3.0 a float.
func (w *yamlWalker) integer(f field) (int64, bool) {
	rn, ok := w.scalar(f, "an integer")
	if !ok {
		return 0, false
	}
	if rn.ShortTag() != "!!int" {
		w.errorf(f.val, "%s: want an integer, got %s", f.name, describe(f.val))
		return 0, false
	}
	var v int64
	if err := rn.Decode(&v); err != nil {
		w.errorf(f.val, "%s: integer %s does not fit in 64 bits", f.name, rn.Value)
		return 0, false
	}
	return v, true
}

// number accepts integers and finite floats.
func (w *yamlWalker) number(f field) (float64, bool) {
	rn, ok := w.scalar(f, "a number")
	if !ok {
		return 0, false
	}
	switch rn.ShortTag() {
	case "!!int", "!!float":
	default:
		w.errorf(f.val, "%s: want a number, got %s", f.name, describe(f.val))
		return 0, false
	}
	var v float64
	if err := rn.Decode(&v); err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		w.errorf(f.val, "%s: want a finite number, got %s", f.name, rn.Value)
		return 0, false
	}
	return v, true
}

// boolean accepts true and false only (YAML 1.2), not yes/no/on/off.
func (w *yamlWalker) boolean(f field) (bool, bool) {
	rn, ok := w.scalar(f, "true or false")
	if !ok {
		return false, false
	}
	if rn.ShortTag() != "!!bool" {
		w.errorf(f.val, "%s: want true or false, got %s", f.name, describe(f.val))
		return false, false
	}
	var v bool
	if err := rn.Decode(&v); err != nil {
		w.errorf(f.val, "%s: want true or false, got %s", f.name, rn.Value)
		return false, false
	}
	return v, true
}

// duration accepts Go duration strings ("30m", "1h30m", "500ms") and a bare
// 0; any other bare number is refused, since its unit would be a guess.
func (w *yamlWalker) duration(f field) (time.Duration, bool) {
	rn, ok := w.scalar(f, "a duration such as 30s")
	if !ok {
		return 0, false
	}
	switch rn.ShortTag() {
	case "!!str":
	case "!!int", "!!float":
		if v, err := strconv.ParseFloat(strings.ReplaceAll(rn.Value, "_", ""), 64); err == nil && v == 0 {
			return 0, true
		}
		w.errorf(f.val, "%s: %s has no unit; write a duration such as %ss or %sm", f.name, rn.Value, rn.Value, rn.Value)
		return 0, false
	default:
		w.errorf(f.val, "%s: want a duration such as 30s, got %s", f.name, describe(f.val))
		return 0, false
	}
	v, err := time.ParseDuration(rn.Value)
	if err != nil {
		if _, nerr := strconv.ParseFloat(rn.Value, 64); nerr == nil {
			w.errorf(f.val, "%s: %q has no unit; write a duration such as %ss or %sm", f.name, rn.Value, rn.Value, rn.Value)
		} else {
			w.errorf(f.val, "%s: bad duration %q: want a number with a unit (ms, s, m, h), e.g. 30s or 1h30m", f.name, rn.Value)
		}
		return 0, false
	}
	return v, true
}

// describe names what a node holds, for "want X, got Y" messages.
func describe(n *yaml.Node) string {
	rn := resolve(n)
	if rn == nil {
		return "nothing"
	}
	switch rn.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.DocumentNode:
		return "a document"
	}
	v := rn.Value
	if len(v) > 40 {
		v = v[:37] + "..."
	}
	switch t := rn.ShortTag(); t {
	case "!!null":
		return "no value"
	case "!!str":
		return fmt.Sprintf("string %q", v)
	case "!!int":
		return "integer " + v
	case "!!float":
		return "number " + v
	case "!!bool":
		return "boolean " + v
	case "!!timestamp":
		return "timestamp " + v
	default:
		return fmt.Sprintf("a value tagged %s", t)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
