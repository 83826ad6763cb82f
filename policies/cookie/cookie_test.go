package cookie

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"
)

var (
	secretA = []byte("0123456789abcdef0123456789abcdef")
	secretB = []byte("fedcba9876543210fedcba9876543210-second")
	t0      = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
)

func mustCodec(t testing.TB, secrets ...[]byte) *Codec {
	t.Helper()
	c, err := NewCodec(secrets...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestSealOpenRoundTrip(t *testing.T) {
	c := mustCodec(t, secretA)
	p := Payload{Backend: "10.0.0.1:8080", Issued: t0, Expires: t0.Add(30 * time.Minute)}
	v, err := c.Seal(p, "lb_session")
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(v, "+/=;, \"") {
		t.Fatalf("value %q is not plain base64url", v)
	}
	if strings.Contains(v, "10.0.0.1") {
		t.Fatal("backend readable in the value")
	}
	raw, _ := base64.RawURLEncoding.DecodeString(v)
	if bytes.Contains(raw, []byte("10.0.0.1")) {
		t.Fatal("backend readable in the decoded value")
	}
	got, err := c.Open(v, "lb_session", t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if got.Backend != p.Backend || !got.Issued.Equal(p.Issued) || !got.Expires.Equal(p.Expires) {
		t.Fatalf("got %+v, want %+v", got, p)
	}
	// Two seals of one payload differ (random nonce) but both open.
	v2, _ := c.Seal(p, "lb_session")
	if v2 == v {
		t.Fatal("two seals gave the same value")
	}
	t.Logf("cookie value: %d characters for a %d-byte identity", len(v), len(p.Backend))
}

func TestRotation(t *testing.T) {
	old := mustCodec(t, secretB)
	rotated := mustCodec(t, secretA, secretB)
	p := Payload{Backend: "web-1", Issued: t0, Expires: t0.Add(time.Hour)}
	vOld, _ := old.Seal(p, "c")
	if got, err := rotated.Open(vOld, "c", t0); err != nil || got.Backend != "web-1" {
		t.Fatalf("rotated codec did not open a value sealed with the older key: %v", err)
	}
	vNew, _ := rotated.Seal(p, "c")
	if _, err := old.Open(vNew, "c", t0); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("old codec opened a value sealed with the new key: %v", err)
	}
	if _, err := mustCodec(t, secretA).Open(vNew, "c", t0); err != nil {
		t.Fatalf("the first secret seals: %v", err)
	}
	if a, b := old.KeyIDs()[0], rotated.KeyIDs()[1]; a != b {
		t.Fatalf("key id not derived from the secret: %s vs %s", a, b)
	}
}

func TestOpenErrors(t *testing.T) {
	c := mustCodec(t, secretA)
	p := Payload{Backend: "b", Issued: t0, Expires: t0.Add(time.Minute)}
	v, _ := c.Seal(p, "ctx")
	raw, _ := base64.RawURLEncoding.DecodeString(v)
	enc := base64.RawURLEncoding.EncodeToString
	flip := func(i int) string {
		r := bytes.Clone(raw)
		r[i] ^= 1
		return enc(r)
	}
	cases := []struct {
		name, v, ctx string
		now          time.Time
		want         error
		reason       string
	}{
		{"not base64", "!!!", "ctx", t0, ErrMalformed, "malformed"},
		{"empty", "", "ctx", t0, ErrMalformed, "malformed"},
		{"too long", strings.Repeat("A", MaxValueLen+1), "ctx", t0, ErrMalformed, "malformed"},
		{"truncated", enc(raw[:minSealed]), "ctx", t0, ErrMalformed, "malformed"},
		{"version", flip(0), "ctx", t0, ErrVersion, "version"},
		{"key id", flip(2), "ctx", t0, ErrUnknownKey, "unknown_key"},
		{"nonce", flip(10), "ctx", t0, ErrAuth, "auth"},
		{"ciphertext", flip(len(raw) - 20), "ctx", t0, ErrAuth, "auth"},
		{"tag", flip(len(raw) - 1), "ctx", t0, ErrAuth, "auth"},
		{"other cookie name", v, "other", t0, ErrAuth, "auth"},
		{"expired", v, "ctx", t0.Add(time.Minute), ErrExpired, "expired"},
		{"padded base64", v + "==", "ctx", t0, ErrMalformed, "malformed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Open(tc.v, tc.ctx, tc.now)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Open: %v, want %v", err, tc.want)
			}
			if r := Reason(err); r != tc.reason {
				t.Fatalf("Reason = %q, want %q", r, tc.reason)
			}
		})
	}
	if got, err := c.Open(v, "ctx", t0.Add(time.Minute)); err == nil || got.Backend != "b" {
		t.Fatalf("an expired value returns its payload with ErrExpired: %+v %v", got, err)
	}
}

func TestNewCodecRejects(t *testing.T) {
	for name, secrets := range map[string][][]byte{
		"none":        nil,
		"short":       {[]byte("too short")},
		"31 bytes":    {bytes.Repeat([]byte("x"), 31)},
		"older short": {secretA, []byte("short")},
		"repeated":    {secretA, secretA},
	} {
		if _, err := NewCodec(secrets...); !errors.Is(err, ErrSecret) {
			t.Errorf("%s: %v, want ErrSecret", name, err)
		}
	}
	if _, err := NewCodec(bytes.Repeat([]byte("x"), 32)); err != nil {
		t.Errorf("32 bytes rejected: %v", err)
	}
}

func TestSealRejectsBadBackend(t *testing.T) {
	c := mustCodec(t, secretA)
	for _, b := range []string{"", strings.Repeat("x", MaxBackendLen+1)} {
		if _, err := c.Seal(Payload{Backend: b, Expires: t0}, "c"); err == nil {
			t.Errorf("Seal accepted a backend of %d bytes", len(b))
		}
	}
	v, err := c.Seal(Payload{Backend: strings.Repeat("x", MaxBackendLen), Issued: t0, Expires: t0.Add(time.Hour)}, "c")
	if err != nil {
		t.Fatal(err)
	}
	if len(v) > MaxValueLen {
		t.Fatalf("the longest sealed value (%d) exceeds what Open reads (%d)", len(v), MaxValueLen)
	}
	if _, err := c.Open(v, "c", t0); err != nil {
		t.Fatal(err)
	}
}

func FuzzOpen(f *testing.F) {
	c := mustCodec(f, secretA, secretB)
	v, _ := c.Seal(Payload{Backend: "10.0.0.1:80", Issued: t0, Expires: t0.Add(time.Hour)}, "c")
	f.Add(v)
	f.Add("")
	f.Add("AQ")
	f.Add(v[:len(v)-3])
	f.Fuzz(func(t *testing.T, s string) {
		p, err := c.Open(s, "c", t0)
		if err == nil && (p.Backend == "" || len(p.Backend) > MaxBackendLen) {
			t.Fatalf("opened a payload Seal cannot produce: %+v", p)
		}
		if err != nil && Reason(err) == "other" {
			t.Fatalf("unclassified error: %v", err)
		}
	})
}

func BenchmarkSeal(b *testing.B) {
	c := mustCodec(b, secretA)
	p := Payload{Backend: "10.0.0.1:8080", Issued: t0, Expires: t0.Add(time.Hour)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Seal(p, "lb_session"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOpen(b *testing.B) {
	c := mustCodec(b, secretA, secretB)
	v, _ := c.Seal(Payload{Backend: "10.0.0.1:8080", Issued: t0, Expires: t0.Add(time.Hour)}, "lb_session")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Open(v, "lb_session", t0); err != nil {
			b.Fatal(err)
		}
	}
}

// release1Vectors are values sealed by the first release's codec (plaintext unpadded), with
// the secret, context and times below. Cookies in browsers outlive a deploy: every later
// codec must go on opening them.
var release1Vectors = []struct{ backend, value string }{
	{"10.0.0.1:80", "AbQM4AA2pUjQi7lMspQB-dQrJ6q-SGr8zQpiUnxobG5fS4K3wjSGCv9ZMDA67L5J7KBU74kqUUkRGpGGLGsIEnafkecdVyUS"},
	{"backend-2.internal.example:8443", "AbQM4AAyqpLpVT-_RZzhw7gBm064sYtV36SQG6dY2HzcAA1mpYApV176HAxggAWKJZQB9wdFnEvzBUr1mIdkYGyuo1BWYtogT-o3s5eQPk-dHIfD9bNp_i6zaZ4"},
	{"[2001:db8::17]:443", "AbQM4ACy_C9luZdyMth8CusMpp9tEOW427bVAtCbALUsL1kOGMtOGDdsUFQK2dJ65W_yLiVzuRbCFxESAHB0PtvFjkWqqvoOJQ8TPLKayg"},
	{"h", "AbQM4ADz8AfneRFT4oe65pIiV0BdrVmegUx5UZKyWafUZH8p_A-6vqT9ogKaUGsEmOcO8pf7Ec8SKL1lPAI"},
}

const (
	release1Secret  = "stickylb-test-vector-secret-0123456789"
	release1Context = "lb_session"
)

func TestOpensRelease1Values(t *testing.T) {
	c, err := NewCodec([]byte(release1Secret))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_100, 0)
	for _, v := range release1Vectors {
		p, err := c.Open(v.value, release1Context, now)
		if err != nil {
			t.Fatalf("%s: %v", v.backend, err)
		}
		if p.Backend != v.backend || p.Issued.Unix() != 1_800_000_000 || p.Expires.Unix() != 4_102_444_800 {
			t.Fatalf("%s: opened %+v", v.backend, p)
		}
	}
}

// TestSealedLengthHidesIdentityLength: the value's length must not tell a client how long
// the backend's identity is (an address of 11 bytes and one of 15 are told apart by it).
func TestSealedLengthHidesIdentityLength(t *testing.T) {
	c := mustCodec(t, secretA)
	lengths := map[int][]string{}
	for _, b := range []string{"h", "10.0.0.1:80", "10.0.0.10:80", "10.0.0.100:8080", "backend-17.internal:8443", strings.Repeat("b", 64-17)} {
		v, err := c.Seal(Payload{Backend: b, Issued: t0, Expires: t0.Add(time.Hour)}, "lb_session")
		if err != nil {
			t.Fatal(err)
		}
		lengths[len(v)] = append(lengths[len(v)], b)
		p, err := c.Open(v, "lb_session", t0)
		if err != nil || p.Backend != b {
			t.Fatalf("%q: opened %+v, %v", b, p, err)
		}
	}
	if len(lengths) != 1 {
		t.Fatalf("value lengths vary with the identity's: %v", lengths)
	}
	// Identities past one block share the next length.
	v, _ := c.Seal(Payload{Backend: strings.Repeat("b", 64-16), Issued: t0, Expires: t0.Add(time.Hour)}, "lb_session")
	w, _ := c.Seal(Payload{Backend: strings.Repeat("b", MaxBackendLen), Issued: t0, Expires: t0.Add(time.Hour)}, "lb_session")
	if _, ok := lengths[len(v)]; ok || len(v) > len(w) {
		t.Fatalf("lengths %d and %d beside %v", len(v), len(w), lengths)
	}
}
