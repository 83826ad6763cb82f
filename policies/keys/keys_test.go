package keys

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func req(target string) *http.Request { return httptest.NewRequest("GET", target, nil) }

func TestQuery(t *testing.T) {
	e := Query("sid", 0)
	cases := []struct {
		target, want string
		err          error
	}{
		{"/?sid=abc", "abc", nil},
		{"/?a=1&sid=abc&sid=def", "abc", nil}, // first occurrence
		{"/?sid=a%20b", "a%20b", nil},         // as sent: not percent-decoded
		{"/?sid=a+b", "a+b", nil},             // '+' stays
		{"/?sidx=1&xsid=2", "", ErrMissing},   // whole names only
		{"/", "", ErrMissing},                 // no query
		{"/?sid", "", ErrEmpty},               // no '='
		{"/?sid=", "", ErrEmpty},              // empty value
		{"/?sid=a=b", "a=b", nil},             // value keeps further '='
		{"/p;sid=x?q=1", "", ErrMissing},      // path parameters are not query
		{"/?SID=abc", "", ErrMissing},         // names are case-sensitive
	}
	for _, tc := range cases {
		k, err := e.Extract(req(tc.target))
		if !errors.Is(err, tc.err) || k.Value != tc.want {
			t.Errorf("%s: got %q %v, want %q %v", tc.target, k.Value, err, tc.want, tc.err)
		}
	}
	if e.String() != "query sid" {
		t.Errorf("String = %q", e.String())
	}
}

func TestPathSegment(t *testing.T) {
	cases := []struct {
		target string
		index  int
		want   string
		err    error
	}{
		{"/users/42/cart", 0, "users", nil},
		{"/users/42/cart", 1, "42", nil},
		{"/users/42/cart", 2, "cart", nil},
		{"/users/42/cart", 3, "", ErrMissing},
		{"/users/42/cart", -1, "cart", nil},
		{"/users/42/cart", -3, "users", nil},
		{"/users/42/cart", -4, "", ErrMissing},
		{"/users//cart", 1, "", ErrEmpty},
		{"/users/42/", 2, "", ErrEmpty}, // trailing slash: an empty last segment
		{"/", 0, "", ErrMissing},
		{"/a%2Fb/c", 0, "a%2Fb", nil}, // an encoded slash does not split
		{"/caf%C3%A9/x", 0, "caf%C3%A9", nil},
		{"/a/b?x=/y", 1, "b", nil}, // the query is not path
	}
	for _, tc := range cases {
		k, err := PathSegment(tc.index, 0).Extract(req(tc.target))
		if !errors.Is(err, tc.err) || k.Value != tc.want {
			t.Errorf("%s [%d]: got %q %v, want %q %v", tc.target, tc.index, k.Value, err, tc.want, tc.err)
		}
	}
}

func TestPathSuffix(t *testing.T) {
	e := PathSuffix(";jsessionid=", 0)
	cases := []struct {
		target, want string
		err          error
	}{
		{"/app/page;jsessionid=ABC123", "ABC123", nil},
		{"/app/page;jsessionid=ABC123?x=1", "ABC123", nil},
		{"/app/page;jsessionid=ABC123;other=1", "ABC123", nil},
		{"/app;jsessionid=ABC123/more", "ABC123", nil},
		{"/app/page;jsessionid=", "", ErrEmpty},
		{"/app/page", "", ErrMissing},
		{"/app/page;JSESSIONID=ABC", "", ErrMissing},  // case-sensitive
		{"/app/page?;jsessionid=ABC", "", ErrMissing}, // in the query, not the path
	}
	for _, tc := range cases {
		k, err := e.Extract(req(tc.target))
		if !errors.Is(err, tc.err) || k.Value != tc.want {
			t.Errorf("%s: got %q %v, want %q %v", tc.target, k.Value, err, tc.want, tc.err)
		}
	}
}

func TestHeader(t *testing.T) {
	e := Header("x-session", 0)
	r := req("/")
	if _, err := e.Extract(r); !errors.Is(err, ErrMissing) {
		t.Fatalf("missing: %v", err)
	}
	r.Header.Add("X-Session", "")
	if _, err := e.Extract(r); !errors.Is(err, ErrEmpty) {
		t.Fatalf("empty: %v", err)
	}
	r.Header.Set("X-Session", "a")
	r.Header.Add("X-Session", "b")
	r.Header.Add("X-Session", "c, d")
	if k, err := e.Extract(r); err != nil || k.Value != "a,b,c, d" {
		t.Fatalf("repeated values: %q %v (want joined with \",\" in order)", k.Value, err)
	}
	r.Host = "shop.example"
	if k, err := Header("host", 0).Extract(r); err != nil || k.Value != "shop.example" {
		t.Fatalf("host: %q %v", k.Value, err)
	}
	big := req("/")
	for i := 0; i < 3; i++ {
		big.Header.Add("X-Session", strings.Repeat("x", MaxValueLen/2))
	}
	if _, err := e.Extract(big); !errors.Is(err, ErrTooLong) {
		t.Fatalf("oversized joined value: %v", err)
	}
}

func TestOversized(t *testing.T) {
	long := strings.Repeat("k", 300)
	k, err := Query("sid", 0).Extract(req("/?sid=" + long))
	if err != nil || k.Value != long {
		t.Fatalf("300-byte key: %v", err)
	}
	if k.TableKey == long || len(k.TableKey) > DefaultMaxLen {
		t.Fatalf("a key over the limit must be digested for the table: %d bytes", len(k.TableKey))
	}
	k2, _ := Query("sid", 0).Extract(req("/?sid=" + long[:299] + "j"))
	if k2.TableKey == k.TableKey {
		t.Fatal("distinct long keys share a digest")
	}
	if k3, _ := Query("sid", 400).Extract(req("/?sid=" + long)); k3.TableKey != long {
		t.Fatal("maxLen 400 should keep a 300-byte key verbatim")
	}
	if _, err := Query("sid", 0).Extract(req("/?sid=" + strings.Repeat("k", MaxValueLen+1))); !errors.Is(err, ErrTooLong) {
		t.Fatalf("past MaxValueLen: %v", err)
	}
	if k := NewKey("short", 0); k.TableKey != "short" {
		t.Fatal("short key digested")
	}
}

func FuzzExtractors(f *testing.F) {
	f.Add("/a/b;jsessionid=x", "sid=1&x", "v", int8(1))
	f.Fuzz(func(t *testing.T, path, rawQuery, hv string, idx int8) {
		r := &http.Request{Header: http.Header{"X-K": {hv, hv}}}
		r.URL = &(*req("/").URL)
		r.URL.Path, r.URL.RawPath, r.URL.RawQuery = path, "", rawQuery
		for _, e := range []Extractor{Query("sid", 16), PathSegment(int(idx), 16), PathSuffix(";jsessionid=", 16), Header("x-k", 16)} {
			k, err := e.Extract(r)
			if err != nil {
				if !errors.Is(err, ErrMissing) && !errors.Is(err, ErrEmpty) && !errors.Is(err, ErrTooLong) {
					t.Fatalf("%s: unexpected error %v", e, err)
				}
				continue
			}
			if k.Value == "" || len(k.Value) > MaxValueLen {
				t.Fatalf("%s: value out of bounds: %d bytes", e, len(k.Value))
			}
			if (len(k.Value) <= 16) != (k.TableKey == k.Value) || len(k.TableKey) > len(digestPrefix)+43 {
				t.Fatalf("%s: table key of %d bytes for a %d-byte value", e, len(k.TableKey), len(k.Value))
			}
		}
	})
}

func BenchmarkExtract(b *testing.B) {
	r := req("/shop/42/cart;jsessionid=0123456789ABCDEF?sid=0123456789abcdef&x=1")
	r.Header.Set("X-Session", "0123456789abcdef")
	for _, e := range []Extractor{Query("sid", 0), PathSegment(1, 0), PathSuffix(";jsessionid=", 0), Header("x-session", 0)} {
		b.Run(strings.ReplaceAll(e.String(), " ", "="), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.Extract(r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
