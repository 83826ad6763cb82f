package pools

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// aliasedBadService is a file of about size bytes: one service with many unknown fields,
// named again and again through aliases, so that every use of the alias walks the unknown
// fields once more and asks for a "did you mean" suggestion for each.
func aliasedBadService(size int) []byte {
	var b strings.Builder
	b.WriteString("bad: &s\n  name: s\n  protocol: http\n  backends: [{address: 10.0.0.1:80}]\n")
	for i := 0; b.Len() < size/10; i++ {
		fmt.Fprintf(&b, "  unknown_field_%d: 1\n", i)
	}
	b.WriteString("services: [*s")
	for b.Len() < size {
		b.WriteString(", *s")
	}
	b.WriteString("]\n")
	return []byte(b.String())
}

// TestAliasedUnknownFieldsLinear: a file naming one bad service through many aliases costs
// memory in proportion to its size, and reports at most 100 errors, then how many more.
func TestAliasedUnknownFieldsLinear(t *testing.T) {
	data := aliasedBadService(64 << 10)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := Parse("a.yaml", data)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("accepted")
	}
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d-byte file: %d bytes allocated", len(data), allocated)
	if limit := uint64(1000 * len(data)); allocated > limit {
		t.Errorf("allocated %d bytes for a %d-byte file, more than %d", allocated, len(data), limit)
	}
	list := err.(ErrorList)
	if len(list) > maxErrors+1 {
		t.Errorf("%d errors reported, want at most %d and a summary", len(list), maxErrors)
	}
	if last := list[len(list)-1]; !strings.HasPrefix(last.Msg, "and ") || !strings.HasSuffix(last.Msg, " more errors") {
		t.Errorf("last entry %q, want \"and N more errors\"", last.Msg)
	}
}

// BenchmarkAliasedUnknownFields is the 600 KiB file of aliases to one bad service.
func BenchmarkAliasedUnknownFields(b *testing.B) {
	data := aliasedBadService(600 << 10)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse("a.yaml", data); err == nil {
			b.Fatal("accepted")
		}
	}
}

// TestEditDistanceWithin against the plain dynamic programme, on every pair of a few names.
func TestEditDistanceWithin(t *testing.T) {
	full := func(a, b string) int {
		prev := make([]int, len(b)+1)
		for j := range prev {
			prev[j] = j
		}
		for i := 1; i <= len(a); i++ {
			cur := make([]int, len(b)+1)
			cur[0] = i
			for j := 1; j <= len(b); j++ {
				cost := 1
				if a[i-1] == b[j-1] {
					cost = 0
				}
				cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			}
			prev = cur
		}
		return prev[len(b)]
	}
	words := []string{"", "a", "ab", "ba", "abc", "balance", "balnce", "blance", "balancee", "maglev", "magelv", "ring_hash", "ringhash", "x", "table_size", "tablesize", "cid_length"}
	for _, a := range words {
		for _, b := range words {
			want := min(full(a, b), maxSuggestDistance+1)
			if got := editDistanceWithin(a, b, maxSuggestDistance); got != want {
				t.Errorf("editDistanceWithin(%q, %q) = %d, want %d", a, b, got, want)
			}
		}
	}
	if !sameLoosely("Max-Sessions", "max_sessions") || sameLoosely("max_session", "max_sessions") || !sameLoosely("_", "") {
		t.Error("sameLoosely")
	}
}
