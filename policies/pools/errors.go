package pools

import (
	"fmt"
	"sort"
	"strings"
)

// maxErrors caps how many errors one parse reports: a file that is wrong
// everywhere (say, not a pools file at all) would otherwise print thousands
// of lines nobody reads.
const maxErrors = 100

// Error is one problem in a pools file. Line and Col are 1-based; Line 0
// means the problem concerns the whole file (empty, unreadable, too large,
// or a YAML reader error the parser could not place). Col 0 means the parser
// gave a line but no column (YAML syntax errors).
type Error struct {
	File      string
	Line, Col int
	Msg       string
	// Err is the underlying cause when there is one (an I/O error from Load).
	Err error
}

// Error formats the problem as "file:line:col: msg", dropping the parts
// that are unknown.
func (e *Error) Error() string {
	switch {
	case e.Line == 0:
		return fmt.Sprintf("%s: %s", e.File, e.Msg)
	case e.Col == 0:
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Col, e.Msg)
}

// Unwrap returns the underlying cause, if any.
func (e *Error) Unwrap() error { return e.Err }

// ErrorList is every problem found in one parse, sorted by position.
type ErrorList []*Error

// Error prints one problem per line.
func (l ErrorList) Error() string {
	var b strings.Builder
	for i, e := range l {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Unwrap exposes the entries to errors.Is and errors.As.
func (l ErrorList) Unwrap() []error {
	out := make([]error, len(l))
	for i, e := range l {
		out[i] = e
	}
	return out
}

// normalize sorts by position, drops exact duplicates (an aliased node is
// walked once per use) and caps the list at maxErrors.
func (l ErrorList) normalize() ErrorList {
	if len(l) == 0 {
		return nil
	}
	sort.SliceStable(l, func(i, j int) bool {
		a, b := l[i], l[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		if a.Col != b.Col {
			return a.Col < b.Col
		}
		return a.Msg < b.Msg
	})
	out := l[:1]
	for _, e := range l[1:] {
		p := out[len(out)-1]
		if e.File == p.File && e.Line == p.Line && e.Col == p.Col && e.Msg == p.Msg {
			continue
		}
		out = append(out, e)
	}
	if len(out) > maxErrors {
		rest := len(out) - maxErrors
		first := out[maxErrors]
		out = append(out[:maxErrors:maxErrors], &Error{
			File: first.File, Line: first.Line, Col: first.Col,
			Msg: fmt.Sprintf("and %d more errors", rest),
		})
	}
	return out
}
