package xds

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stickylb/stickylb/policies/keys"
	"github.com/stickylb/stickylb/policies/pools"
)

// TestPathRewriteMatchesExtractors: the :path rewrite Envoy applies before hashing yields
// the key Caddy's extractors take, for the paths where both have one (Go's regexp is RE2,
// as Envoy's).
func TestPathRewriteMatchesExtractors(t *testing.T) {
	paths := []string{"/a/b/c", "/a/b/c?x=1", "/users/42/cart;jsessionid=ABC", "/app;jsessionid=XYZ/more?q=/z",
		"/one", "/x/y/z/w/v", "/a/b;jsessionid=K1;other=2"}
	apply := func(u *pools.URLKey, path string) (string, bool) {
		rw := pathRewrite(u)
		re := regexp.MustCompile(rw.Pattern.Regex)
		if !re.MatchString(path) {
			return "", false
		}
		return re.ReplaceAllString(path, strings.ReplaceAll(rw.Substitution, `\1`, "${1}")), true
	}
	for _, idx := range []int{0, 1, 2, -1, -2} {
		u := &pools.URLKey{Source: pools.URLPathSegment, PathSegment: idx}
		for _, p := range paths {
			pathOnly, _, _ := strings.Cut(p, "?")
			want, ok := keys.Segment(pathOnly, idx)
			got, matched := apply(u, p)
			if ok && want != "" && (!matched || got != want) {
				t.Errorf("segment %d of %s: rewrite %q (matched %v), extractor %q", idx, p, got, matched, want)
			}
		}
	}
	u := &pools.URLKey{Source: pools.URLSuffix, Suffix: ";jsessionid="}
	for _, p := range paths {
		pathOnly, _, _ := strings.Cut(p, "?")
		want, ok := keys.Suffix(pathOnly, ";jsessionid=")
		got, matched := apply(u, p)
		if ok && want != "" && (!matched || got != want) {
			t.Errorf("suffix of %s: rewrite %q (matched %v), extractor %q", p, got, matched, want)
		}
	}
}
