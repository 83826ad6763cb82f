package pools

import (
	"fmt"
	"strings"
)

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
