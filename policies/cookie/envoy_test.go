package cookie

import (
	"encoding/base64"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// TestEnvoyDocExample decodes the example of Envoy's cookie-based session state docs
// (cookie: sticky-host="MS4yLjMuNDo4MA==" pins 1.2.3.4:80), the format before 1.27.
func TestEnvoyDocExample(t *testing.T) {
	addr, exp, err := DecodeEnvoy("MS4yLjMuNDo4MA==")
	if err != nil || addr != "1.2.3.4:80" || !exp.IsZero() {
		t.Fatalf("got %q %v %v", addr, exp, err)
	}
}

// TestEnvoyProtoAgainstProtowire checks the encoding against protobuf's own wire package,
// not against our decoder: field 1 the address, field 2 the expiry in seconds.
func TestEnvoyProtoAgainstProtowire(t *testing.T) {
	exp := time.Unix(1893456000, 0)
	v := EncodeEnvoy("[2001:db8::1]:8443", exp)
	raw, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	want = protowire.AppendTag(want, 1, protowire.BytesType)
	want = protowire.AppendString(want, "[2001:db8::1]:8443")
	want = protowire.AppendTag(want, 2, protowire.VarintType)
	want = protowire.AppendVarint(want, uint64(exp.Unix()))
	if string(raw) != string(want) {
		t.Fatalf("encoded %x, protowire %x", raw, want)
	}
	addr, gotExp, err := DecodeEnvoy(base64.StdEncoding.EncodeToString(want))
	if err != nil || addr != "[2001:db8::1]:8443" || !gotExp.Equal(exp) {
		t.Fatalf("decode: %q %v %v", addr, gotExp, err)
	}
	// Fields in the other order, as any proto writer may emit them.
	var rev []byte
	rev = protowire.AppendTag(rev, 2, protowire.VarintType)
	rev = protowire.AppendVarint(rev, 5)
	rev = protowire.AppendTag(rev, 1, protowire.BytesType)
	rev = protowire.AppendString(rev, "10.1.1.1:80")
	if addr, _, err := DecodeEnvoy(base64.StdEncoding.EncodeToString(rev)); err != nil || addr != "10.1.1.1:80" {
		t.Fatalf("reordered fields: %q %v", addr, err)
	}
}

func TestDecodeEnvoyRejects(t *testing.T) {
	for name, v := range map[string]string{
		"not base64":      "%%%",
		"no port":         base64.StdEncoding.EncodeToString([]byte("1.2.3.4")),
		"bad port":        base64.StdEncoding.EncodeToString([]byte("1.2.3.4:99999")),
		"control char":    base64.StdEncoding.EncodeToString([]byte("a\nb:80")),
		"empty":           "",
		"truncated proto": base64.StdEncoding.EncodeToString([]byte{0x0a, 20, 'x'}),
		"huge":            string(make([]byte, 600)),
	} {
		if _, _, err := DecodeEnvoy(v); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}

func FuzzDecodeEnvoy(f *testing.F) {
	f.Add(EncodeEnvoy("10.0.0.1:80", time.Unix(100, 0)))
	f.Add("MS4yLjMuNDo4MA==")
	f.Fuzz(func(t *testing.T, s string) {
		addr, _, err := DecodeEnvoy(s)
		if err == nil && !validHostPort(addr) {
			t.Fatalf("accepted %q", addr)
		}
	})
}
