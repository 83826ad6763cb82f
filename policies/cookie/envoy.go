package cookie

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"
)

// Envoy's stateful-session cookie (envoy.http.stateful_session.cookie) holds the standard
// base64 of a small protobuf message, envoy.Cookie { string address = 1; uint64 expires = 2; }
// (expires in seconds). Envoy versions before 1.27 wrote the plain base64 of "ip:port";
// DecodeEnvoy reads both. Older Envoys computed expires from a monotonic clock (seconds since
// boot); newer ones write wall-clock time and enforce it. DecodeEnvoy returns an expiry only
// when it can be wall-clock time (at or after WallClockFloor).
//
// The format is not authenticated: a client can write any address and any expiry into it.

// WallClockFloor is the earliest expiry read as wall-clock time, in Unix seconds
// (2001-01-01 UTC); a smaller value was written from a monotonic clock and counts as no
// expiry.
const WallClockFloor = 978_307_200

// maxEnvoyLen bounds the Envoy cookie values DecodeEnvoy reads.
const maxEnvoyLen = 512

// EncodeEnvoy returns an Envoy stateful-session cookie value pinning address ("ip:port").
func EncodeEnvoy(address string, expires time.Time) string {
	b := make([]byte, 0, 2+len(address)+11)
	b = append(b, 0x0a) // field 1, length-delimited
	b = appendVarint(b, uint64(len(address)))
	b = append(b, address...)
	if !expires.IsZero() && expires.Unix() > 0 {
		b = append(b, 0x10) // field 2, varint
		b = appendVarint(b, uint64(expires.Unix()))
	}
	return base64.StdEncoding.EncodeToString(b)
}

// DecodeEnvoy returns the address an Envoy stateful-session cookie value pins, and its
// expiry: zero when the value has none or one before WallClockFloor. The address must be
// "host:port".
func DecodeEnvoy(v string) (address string, expires time.Time, err error) {
	if len(v) > maxEnvoyLen {
		return "", time.Time{}, fmt.Errorf("%w: envoy cookie of %d bytes", ErrMalformed, len(v))
	}
	raw, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("%w: envoy cookie: %v", ErrMalformed, err)
	}
	if addr, exp, perr := parseEnvoyProto(raw); perr == nil && validHostPort(addr) {
		return addr, exp, nil
	}
	if s := string(raw); validHostPort(s) { // the format before Envoy 1.27
		return s, time.Time{}, nil
	}
	return "", time.Time{}, fmt.Errorf("%w: envoy cookie holds no host:port", ErrMalformed)
}

func parseEnvoyProto(b []byte) (string, time.Time, error) {
	var addr string
	var exp time.Time
	for len(b) > 0 {
		tag, n := readVarint(b)
		if n <= 0 {
			return "", exp, errBadProto
		}
		b = b[n:]
		switch tag {
		case 0x0a:
			l, n := readVarint(b)
			if n <= 0 || l > uint64(len(b)-n) {
				return "", exp, errBadProto
			}
			addr = string(b[n : n+int(l)])
			b = b[n+int(l):]
		case 0x10:
			x, n := readVarint(b)
			if n <= 0 {
				return "", exp, errBadProto
			}
			if x >= WallClockFloor && x < 1<<40 {
				exp = time.Unix(int64(x), 0)
			}
			b = b[n:]
		default:
			return "", exp, errBadProto
		}
	}
	return addr, exp, nil
}

var errBadProto = errors.New("bad protobuf")

func appendVarint(b []byte, x uint64) []byte {
	for x >= 0x80 {
		b = append(b, byte(x)|0x80)
		x >>= 7
	}
	return append(b, byte(x))
}

// readVarint decodes a protobuf varint; n <= 0 means b holds none.
func readVarint(b []byte) (uint64, int) {
	var x uint64
	for i := 0; i < len(b) && i < 10; i++ {
		x |= uint64(b[i]&0x7f) << (7 * i)
		if b[i] < 0x80 {
			return x, i + 1
		}
	}
	return 0, 0
}

func validHostPort(s string) bool {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return false
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 || p > 65535 {
		return false
	}
	for i := 0; i < len(host); i++ {
		if c := host[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}
