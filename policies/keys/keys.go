// Package keys extracts session keys from HTTP requests: a query parameter, a path segment,
// a path suffix such as ";jsessionid=", or a header. Keys come from clients, so every
// extractor bounds what it returns.
//
// Values are taken as the client sent them, percent-encoding included, as Envoy hashes
// query parameters and paths: "a%20b" and "a b" are different keys, and a Caddy node and an
// Envoy node hash the same bytes.
package keys

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// DefaultMaxLen is the longest key a session table keeps verbatim; longer keys are kept as a
// digest (Key.TableKey), so a table's memory per entry stays bounded.
const DefaultMaxLen = 256

// MaxValueLen is the longest value an extractor accepts at all; a longer one is ErrTooLong
// and the request is treated as carrying no key.
const MaxValueLen = 8 << 10

// Errors of Extract. A caller treats all of them as "no key": the request is balanced as a
// new session.
var (
	ErrMissing = errors.New("session key missing")
	ErrEmpty   = errors.New("session key empty")
	ErrTooLong = errors.New("session key too long")
)

// Key is an extracted session key.
type Key struct {
	// Value is the key as the client sent it; it is what consistent hashing hashes, so that
	// every tier hashes the same bytes.
	Value string
	// TableKey is what a session table stores: Value itself when it is at most the
	// extractor's maximum length, else a fixed-size digest of it.
	TableKey string
}

// digestPrefix marks digested table keys; it cannot start a verbatim key longer than the
// limit, and a verbatim key equal to a digest would have to be exactly its length.
const digestPrefix = "\x00sha256:"

// NewKey returns the Key of value v for a table that keeps keys of up to maxLen bytes
// verbatim (maxLen <= 0: DefaultMaxLen).
func NewKey(v string, maxLen int) Key {
	if maxLen <= 0 {
		maxLen = DefaultMaxLen
	}
	if len(v) <= maxLen {
		return Key{Value: v, TableKey: v}
	}
	sum := sha256.Sum256([]byte(v))
	return Key{Value: v, TableKey: digestPrefix + base64.RawStdEncoding.EncodeToString(sum[:])}
}

// Extractor takes a session key from a request.
type Extractor interface {
	// Extract returns the request's key, or ErrMissing, ErrEmpty or ErrTooLong.
	Extract(r *http.Request) (Key, error)
	// String describes the extractor ("query sid", "path_segment 2", ...) for logs and
	// table names.
	String() string
}

func finish(v string, maxLen int) (Key, error) {
	switch {
	case v == "":
		return Key{}, ErrEmpty
	case len(v) > MaxValueLen:
		return Key{}, fmt.Errorf("%w: %d bytes (at most %d)", ErrTooLong, len(v), MaxValueLen)
	}
	return NewKey(v, maxLen), nil
}

type query struct {
	name   string
	maxLen int
}

// Query extracts the first value of query parameter name, not percent-decoded. A parameter
// without "=" has an empty value.
func Query(name string, maxLen int) Extractor { return query{name, maxLen} }

func (q query) String() string { return "query " + q.name }

func (q query) Extract(r *http.Request) (Key, error) {
	v, ok := QueryValue(r.URL.RawQuery, q.name)
	if !ok {
		return Key{}, ErrMissing
	}
	return finish(v, q.maxLen)
}

// QueryValue returns the raw value of the first parameter called name in rawQuery (split on
// '&'; the name compared as sent).
func QueryValue(rawQuery, name string) (string, bool) {
	for rawQuery != "" {
		var part string
		part, rawQuery, _ = strings.Cut(rawQuery, "&")
		k, v, _ := strings.Cut(part, "=")
		if k == name {
			return v, true
		}
	}
	return "", false
}

type pathSegment struct {
	index, maxLen int
}

// PathSegment extracts segment index of the escaped path, counting from 0 after the leading
// "/"; a negative index counts from the end (-1 is the last segment). "/a/b/c" has segments
// a, b, c; "/a//c" has an empty segment 1.
func PathSegment(index, maxLen int) Extractor { return pathSegment{index, maxLen} }

func (p pathSegment) String() string { return "path_segment " + strconv.Itoa(p.index) }

func (p pathSegment) Extract(r *http.Request) (Key, error) {
	v, ok := Segment(r.URL.EscapedPath(), p.index)
	if !ok {
		return Key{}, ErrMissing
	}
	return finish(v, p.maxLen)
}

// Segment returns segment index of path (see PathSegment).
func Segment(path string, index int) (string, bool) {
	path = strings.TrimPrefix(path, "/")
	if path == "" {
		return "", false
	}
	n := strings.Count(path, "/") + 1
	if index < 0 {
		index += n
	}
	if index < 0 || index >= n {
		return "", false
	}
	for i := 0; i < index; i++ {
		_, path, _ = strings.Cut(path, "/")
	}
	seg, _, _ := strings.Cut(path, "/")
	return seg, true
}

type pathSuffix struct {
	marker string
	maxLen int
}

// PathSuffix extracts the value that follows marker (such as ";jsessionid=") in the escaped
// path, up to the next ';', '/' or the end. The marker is matched as written
// (case-sensitive), at its first occurrence.
func PathSuffix(marker string, maxLen int) Extractor { return pathSuffix{marker, maxLen} }

func (p pathSuffix) String() string { return "suffix " + p.marker }

func (p pathSuffix) Extract(r *http.Request) (Key, error) {
	v, ok := Suffix(r.URL.EscapedPath(), p.marker)
	if !ok {
		return Key{}, ErrMissing
	}
	return finish(v, p.maxLen)
}

// Suffix returns the value after marker in path (see PathSuffix).
func Suffix(path, marker string) (string, bool) {
	if marker == "" {
		return "", false
	}
	i := strings.Index(path, marker)
	if i < 0 {
		return "", false
	}
	v := path[i+len(marker):]
	if j := strings.IndexAny(v, ";/?"); j >= 0 {
		v = v[:j]
	}
	return v, true
}

type header struct {
	name   string
	maxLen int
}

// Header extracts request header name; repeated header lines are joined with "," in order
// (as gRPC joins metadata; Envoy hashes only the first value). "Host" reads the request's
// host.
func Header(name string, maxLen int) Extractor {
	return header{http.CanonicalHeaderKey(name), maxLen}
}

func (h header) String() string { return "header " + h.name }

func (h header) Extract(r *http.Request) (Key, error) {
	if h.name == "Host" {
		if r.Host == "" {
			return Key{}, ErrMissing
		}
		return finish(r.Host, h.maxLen)
	}
	vals, ok := r.Header[h.name]
	if !ok || len(vals) == 0 {
		return Key{}, ErrMissing
	}
	if len(vals) == 1 {
		return finish(vals[0], h.maxLen)
	}
	total := 0
	for _, v := range vals {
		total += len(v) + 1
		if total > MaxValueLen+1 {
			return Key{}, fmt.Errorf("%w: more than %d bytes", ErrTooLong, MaxValueLen)
		}
	}
	return finish(strings.Join(vals, ","), h.maxLen)
}
