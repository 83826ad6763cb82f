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

// decoder walks one document and collects every problem it meets.
type decoder struct {
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

func newDecoder(file string) *decoder {
	return &decoder{file: file, merging: map[*yaml.Node]bool{}, reported: map[Error]bool{}, unknown: map[*yaml.Node]bool{}, known: map[knownKey]knownFields{}}
}

func (d *decoder) errorf(n *yaml.Node, format string, args ...any) {
	if e := d.at(n, format, args...); d.first(e) {
		d.errs = append(d.errs, e)
	}
}

func (d *decoder) warnf(n *yaml.Node, format string, args ...any) {
	if e := d.at(n, format, args...); d.first(e) {
		d.warns = append(d.warns, e)
	}
}

// first reports whether e is reported for the first time.
func (d *decoder) first(e *Error) bool {
	if d.reported[*e] {
		return false
	}
	d.reported[*e] = true
	return true
}

// unknownAt reports whether the unknown field at key is new, before its suggestion is
// worked out: an aliased mapping is walked once per alias.
func (d *decoder) unknownAt(key *yaml.Node) bool {
	if d.unknown[key] {
		return false
	}
	d.unknown[key] = true
	return true
}

func (d *decoder) at(n *yaml.Node, format string, args ...any) *Error {
	e := &Error{File: d.file, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Col = n.Line, n.Column
	}
	return e
}

// tick counts one visited node; false once the budget is spent.
func (d *decoder) tick(n *yaml.Node) bool {
	if d.spent {
		return false
	}
	d.visits++
	if d.visits > maxVisits {
		d.spent = true
		d.errorf(n, "pools file expands to more than %d nodes through aliases; stopped reading it here", maxVisits)
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

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parse reads the single YAML document in data and decodes the pools file.
func (d *decoder) parse(data []byte) *File {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			d.errs = append(d.errs, &Error{File: d.file, Msg: "empty pools file: want a mapping with services:"})
		} else {
			d.syntaxError(err)
		}
		return nil
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		d.errorf(&next, "a pools file holds one YAML document; a second one starts here")
	case !errors.Is(err, io.EOF):
		d.syntaxError(err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = root.Content[0]
	}
	return d.decodeFile(root)
}

func (d *decoder) syntaxError(err error) {
	msg := err.Error()
	e := &Error{File: d.file, Msg: "YAML: " + strings.TrimPrefix(msg, "yaml: ")}
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		if line, err := strconv.Atoi(m[1]); err == nil {
			e.Line = line
			e.Msg = "YAML: " + m[2]
		}
	}
	d.errs = append(d.errs, e)
}

// field is one key/value pair of a mapping.
type field struct {
	name     string
	key, val *yaml.Node
}

// pairs returns the pairs of mapping m with merge keys expanded: explicit
// keys win over merged ones, earlier merge sources over later ones, as the
// YAML merge-key spec says. Duplicate explicit keys are errors.
func (d *decoder) pairs(m *yaml.Node) []field {
	var out []field
	var merges []*yaml.Node
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if !d.tick(k) {
			return out
		}
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merges = append(merges, v)
			continue
		}
		rk := resolve(k)
		if rk == nil || rk.Kind != yaml.ScalarNode {
			d.errorf(k, "a mapping key must be a field name, got %s", describe(k))
			continue
		}
		if prev, ok := seen[rk.Value]; ok {
			d.errorf(k, "duplicate key %q (first at line %d)", rk.Value, prev.Line)
			continue
		}
		seen[rk.Value] = k
		out = append(out, field{name: rk.Value, key: k, val: v})
	}
	for _, mv := range merges {
		for _, src := range d.mergeSources(mv) {
			if d.merging[src] {
				d.errorf(mv, "merge key (<<) refers to the mapping it is part of")
				continue
			}
			d.merging[src] = true
			for _, p := range d.pairs(src) {
				if _, ok := seen[p.name]; ok {
					continue
				}
				seen[p.name] = p.key
				out = append(out, p)
			}
			delete(d.merging, src)
		}
	}
	return out
}

// mergeSources returns the mappings a merge key's value names: one mapping
// or a list of them.
func (d *decoder) mergeSources(v *yaml.Node) []*yaml.Node {
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
				d.errorf(e, "merge key (<<) list entries must be mappings, got %s", describe(e))
				continue
			}
			out = append(out, re)
		}
		return out
	}
	d.errorf(v, "merge key (<<) wants a mapping or a list of mappings, got %s", describe(v))
	return nil
}

// fields checks that n is a mapping and returns its known fields by name;
// unknown ones are errors naming the closest known field.
func (d *decoder) fields(n *yaml.Node, what string, known []string) (map[string]field, bool) {
	rn := resolve(n)
	if rn == nil || rn.Kind != yaml.MappingNode {
		d.errorf(n, "%s: want a mapping, got %s", what, describe(n))
		return nil, false
	}
	if !d.tick(rn) {
		return nil, false
	}
	k := knownKey{rn, what}
	if c, ok := d.known[k]; ok {
		for range c.visits {
			if !d.tick(rn) {
				return nil, false
			}
		}
		return c.fs, true
	}
	before := d.visits
	fs := map[string]field{}
	for _, p := range d.pairs(rn) {
		if !contains(known, p.name) {
			if d.unknownAt(p.key) {
				d.errorf(p.key, "unknown field %q in %s%s", p.name, what, suggest(p.name, known))
			}
			continue
		}
		fs[p.name] = p
	}
	if !d.spent {
		d.known[k] = knownFields{fs, d.visits - before}
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
func (d *decoder) list(f field) ([]*yaml.Node, bool) {
	rn := resolve(f.val)
	if rn == nil {
		return nil, false
	}
	if rn.Kind == yaml.ScalarNode && rn.ShortTag() == "!!null" {
		return nil, true
	}
	if rn.Kind != yaml.SequenceNode {
		d.errorf(f.val, "%s: want a list, got %s", f.name, describe(f.val))
		return nil, false
	}
	if !d.tick(rn) {
		return nil, false
	}
	return rn.Content, true
}

// scalar returns the resolved scalar node of f, or reports what it got.
func (d *decoder) scalar(f field, want string) (*yaml.Node, bool) {
	rn := resolve(f.val)
	if rn == nil || !d.tick(rn) {
		return nil, false
	}
	if rn.Kind != yaml.ScalarNode || rn.ShortTag() == "!!null" {
		d.errorf(f.val, "%s: want %s, got %s", f.name, want, describe(f.val))
		return nil, false
	}
	return rn, true
}

// str accepts strings, and integers and floats by their text, because a
// zone or hash key such as 1001 is text to the operator. Booleans are
// refused: `name: yes` is more likely a slip than a name.
func (d *decoder) str(f field) (string, bool) {
	return d.strAt(f.name, f.val)
}

// strWhere decodes a string field that must satisfy valid; a value that does not is
// reported with format (which takes the value) at the value's position.
func (d *decoder) strWhere(f field, valid func(string) bool, format string) (string, bool) {
	v, ok := d.str(f)
	if !ok {
		return "", false
	}
	if !valid(v) {
		d.errorf(f.val, format, v)
		return "", false
	}
	return v, true
}

func (d *decoder) strAt(name string, n *yaml.Node) (string, bool) {
	rn, ok := d.scalar(field{name: name, val: n}, "a string")
	if !ok {
		return "", false
	}
	switch rn.ShortTag() {
	case "!!str", "!!int", "!!float":
		return rn.Value, true
	}
	d.errorf(n, "%s: want a string, got %s (quote it if you mean the text)", name, describe(n))
	return "", false
}

// integer accepts YAML integers only: "3" in quotes is a string, 3.0 a float.
func (d *decoder) integer(f field) (int64, bool) {
	rn, ok := d.scalar(f, "an integer")
	if !ok {
		return 0, false
	}
	if rn.ShortTag() != "!!int" {
		d.errorf(f.val, "%s: want an integer, got %s", f.name, describe(f.val))
		return 0, false
	}
	var v int64
	if err := rn.Decode(&v); err != nil {
		d.errorf(f.val, "%s: integer %s does not fit in 64 bits", f.name, rn.Value)
		return 0, false
	}
	return v, true
}

// number accepts integers and finite floats.
func (d *decoder) number(f field) (float64, bool) {
	rn, ok := d.scalar(f, "a number")
	if !ok {
		return 0, false
	}
	switch rn.ShortTag() {
	case "!!int", "!!float":
	default:
		d.errorf(f.val, "%s: want a number, got %s", f.name, describe(f.val))
		return 0, false
	}
	var v float64
	if err := rn.Decode(&v); err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		d.errorf(f.val, "%s: want a finite number, got %s", f.name, rn.Value)
		return 0, false
	}
	return v, true
}

// boolean accepts true and false only (YAML 1.2), not yes/no/on/off.
func (d *decoder) boolean(f field) (bool, bool) {
	rn, ok := d.scalar(f, "true or false")
	if !ok {
		return false, false
	}
	if rn.ShortTag() != "!!bool" {
		d.errorf(f.val, "%s: want true or false, got %s", f.name, describe(f.val))
		return false, false
	}
	var v bool
	if err := rn.Decode(&v); err != nil {
		d.errorf(f.val, "%s: want true or false, got %s", f.name, rn.Value)
		return false, false
	}
	return v, true
}

// duration accepts Go duration strings ("30m", "1h30m", "500ms") and a bare
// 0; any other bare number is refused, since its unit would be a guess.
func (d *decoder) duration(f field) (time.Duration, bool) {
	rn, ok := d.scalar(f, "a duration such as 30s")
	if !ok {
		return 0, false
	}
	switch rn.ShortTag() {
	case "!!str":
	case "!!int", "!!float":
		if v, err := strconv.ParseFloat(strings.ReplaceAll(rn.Value, "_", ""), 64); err == nil && v == 0 {
			return 0, true
		}
		d.errorf(f.val, "%s: %s has no unit; write a duration such as %ss or %sm", f.name, rn.Value, rn.Value, rn.Value)
		return 0, false
	default:
		d.errorf(f.val, "%s: want a duration such as 30s, got %s", f.name, describe(f.val))
		return 0, false
	}
	v, err := time.ParseDuration(rn.Value)
	if err != nil {
		if _, nerr := strconv.ParseFloat(rn.Value, 64); nerr == nil {
			d.errorf(f.val, "%s: %q has no unit; write a duration such as %ss or %sm", f.name, rn.Value, rn.Value, rn.Value)
		} else {
			d.errorf(f.val, "%s: bad duration %q: want a number with a unit (ms, s, m, h), e.g. 30s or 1h30m", f.name, rn.Value)
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

// suggest returns ` (did you mean "x"?)` for the known name closest to an
// unknown one: same letters ignoring case, '-' and '_', or at most two edits. It
// allocates nothing but its answer and takes time linear in the names' lengths.
func suggest(name string, known []string) string {
	best, bestDist := "", maxSuggestDistance+1
	for _, k := range known {
		if sameLoosely(k, name) {
			return fmt.Sprintf(" (did you mean %q?)", k)
		}
		if dist := editDistanceWithin(name, k, maxSuggestDistance); dist < bestDist {
			best, bestDist = k, dist
		}
	}
	if best == "" || len(name) < 3 {
		return "; known fields: " + strings.Join(known, ", ")
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// maxSuggestDistance is the most edits a suggestion may be away.
const maxSuggestDistance = 2

// sameLoosely reports whether a and b spell the same letters ignoring ASCII case, '-'
// and '_' (maxSessions, max-sessions and max_sessions).
func sameLoosely(a, b string) bool {
	i, j := 0, 0
	for {
		for i < len(a) && (a[i] == '_' || a[i] == '-') {
			i++
		}
		for j < len(b) && (b[j] == '_' || b[j] == '-') {
			j++
		}
		if i == len(a) || j == len(b) {
			return i == len(a) && j == len(b)
		}
		if lower(a[i]) != lower(b[j]) {
			return false
		}
		i++
		j++
	}
}

func lower(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// editDistanceWithin is the Levenshtein distance of a and b when it is at most max, and
// max+1 otherwise. It only fills the band of cells within max of the diagonal, so it
// takes O(len(a) * max) time, and it stops early when no cell of a row is within max.
func editDistanceWithin(a, b string, max int) int {
	if d := len(a) - len(b); d > max || -d > max {
		return max + 1
	}
	const inf = 1 << 30
	var prevBuf, curBuf [64 + 1]int
	if len(b) > 64 {
		return max + 1
	}
	prev, cur := prevBuf[:len(b)+1], curBuf[:len(b)+1]
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		lo, hi := i-max, i+max
		if lo < 1 {
			lo = 1
		}
		if hi > len(b) {
			hi = len(b)
		}
		for j := range cur {
			cur[j] = inf
		}
		if i <= max {
			cur[0] = i
		}
		rowMin := cur[0]
		for j := lo; j <= hi; j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			rowMin = min(rowMin, cur[j])
		}
		if rowMin > max {
			return max + 1
		}
		prev, cur = cur, prev
	}
	return min(prev[len(b)], max+1)
}
