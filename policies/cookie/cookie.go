// Package cookie seals and opens the session cookies stickylb sets: an AEAD-sealed payload
// that names the backend a client is pinned to, and Envoy's stateful-session cookie for
// fleets that mix Caddy and Envoy.
//
// A sealed value is base64url (no padding) of
//
//	version (1) | key id (4) | nonce (24) | XChaCha20-Poly1305(plaintext)
//
// authenticated together with the version, the key id and a context string (the cookie's
// name), so a value cut from one cookie does not open as another. Nothing in it is readable
// without the key. Keys rotate: the first secret seals, every secret opens.
//
// The plaintext of version 2 (what Seal writes) is
//
//	issued (8) | expires (8) | backend length (1) | backend | zeros to a multiple of 64
//
// so the length of a value tells nothing about the length of the backend's identity unless
// identities differ by more than the padding. Version 1 (the first release) has no length
// byte and no padding: issued | expires | backend. Open reads both, so cookies already in
// browsers keep working across the upgrade.
package cookie

import (
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"golang.org/x/crypto/chacha20poly1305"
)

// Version is the format version Seal writes in the first byte of a sealed value.
const Version byte = 2

// versionUnpadded is the first release's format, which Open still reads.
const versionUnpadded byte = 1

// PadTo is the block the plaintext of a sealed value is padded to.
const PadTo = 64

// MinSecretLen is the shortest secret NewCodec accepts, in bytes.
const MinSecretLen = 32

// MaxBackendLen bounds the backend identity a payload may carry.
const MaxBackendLen = 255

// MaxValueLen bounds the sealed values Open reads; anything longer is malformed before any
// decoding, so a client cannot make us decode large values.
const MaxValueLen = 1024

const (
	keyIDLen   = 4
	nonceLen   = chacha20poly1305.NonceSizeX
	headerLen  = 1 + keyIDLen + nonceLen
	timesLen   = 16
	overhead   = chacha20poly1305.Overhead
	minSealed  = headerLen + timesLen + overhead
	hkdfSalt   = "stickylb cookie v1"
	infoAEAD   = "stickylb cookie aead key"
	infoKeyID  = "stickylb cookie key id"
	maxSecrets = 16
)

// strictEncoding decodes values: strict, so a value has one encoding and no two cookie
// strings open to one payload (a cache keyed by the value relies on it). Read-only.
var strictEncoding = base64.RawURLEncoding.Strict()

// Errors Open returns; Reason names them for metrics.
var (
	ErrMalformed  = errors.New("malformed cookie")
	ErrVersion    = errors.New("unsupported cookie version")
	ErrUnknownKey = errors.New("cookie sealed with an unknown key")
	ErrAuth       = errors.New("cookie failed authentication")
	ErrExpired    = errors.New("cookie expired")
	// ErrSecret is returned by NewCodec for a missing or short secret.
	ErrSecret = errors.New("invalid cookie secret")
)

// Reason returns a short, stable label for err (for metrics and logs): "malformed",
// "version", "unknown_key", "auth", "expired", or "other".
func Reason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrMalformed):
		return "malformed"
	case errors.Is(err, ErrVersion):
		return "version"
	case errors.Is(err, ErrUnknownKey):
		return "unknown_key"
	case errors.Is(err, ErrAuth):
		return "auth"
	case errors.Is(err, ErrExpired):
		return "expired"
	}
	return "other"
}

// Payload is what a sealed cookie carries.
type Payload struct {
	Backend string    // backend identity (docs/pools.md: hash_key, else the address)
	Issued  time.Time // when the value was sealed
	Expires time.Time // after this Open fails with ErrExpired
}

type key struct {
	id   [keyIDLen]byte
	aead cipher.AEAD
}

// Codec seals and opens cookie values. It is safe for concurrent use.
type Codec struct {
	keys []key // keys[0] seals
}

// NewCodec derives a codec from secrets (HKDF-SHA256): the first seals, all open. Each secret
// must be at least MinSecretLen bytes; the key id is derived from the secret, so operators
// rotate by prepending a new secret and dropping the oldest later.
func NewCodec(secrets ...[]byte) (*Codec, error) {
	if len(secrets) == 0 {
		return nil, fmt.Errorf("%w: no secret", ErrSecret)
	}
	if len(secrets) > maxSecrets {
		return nil, fmt.Errorf("%w: %d secrets, at most %d", ErrSecret, len(secrets), maxSecrets)
	}
	c := &Codec{keys: make([]key, 0, len(secrets))}
	for i, s := range secrets {
		if len(s) < MinSecretLen {
			return nil, fmt.Errorf("%w: secret #%d is %d bytes, at least %d are needed", ErrSecret, i, len(s), MinSecretLen)
		}
		k, err := deriveKey(s)
		if err != nil {
			return nil, fmt.Errorf("deriving key from secret #%d: %w", i, err)
		}
		for j := range c.keys {
			if c.keys[j].id == k.id {
				return nil, fmt.Errorf("%w: secret #%d repeats secret #%d", ErrSecret, i, j)
			}
		}
		c.keys = append(c.keys, k)
	}
	return c, nil
}

func deriveKey(secret []byte) (key, error) {
	var k key
	ak, err := hkdf.Key(sha256.New, secret, []byte(hkdfSalt), infoAEAD, chacha20poly1305.KeySize)
	if err != nil {
		return k, err
	}
	id, err := hkdf.Key(sha256.New, secret, []byte(hkdfSalt), infoKeyID, keyIDLen)
	if err != nil {
		return k, err
	}
	copy(k.id[:], id)
	k.aead, err = chacha20poly1305.NewX(ak)
	return k, err
}

// KeyIDs returns the key ids of the codec's keys, sealing key first, as hex (for logs).
func (c *Codec) KeyIDs() []string {
	out := make([]string, len(c.keys))
	for i, k := range c.keys {
		out[i] = fmt.Sprintf("%x", k.id)
	}
	return out
}

// Seal returns the cookie value for p, bound to context (the cookie's name).
func (c *Codec) Seal(p Payload, context string) (string, error) {
	if p.Backend == "" || len(p.Backend) > MaxBackendLen {
		return "", fmt.Errorf("sealing cookie: backend identity of %d bytes (want 1..%d)", len(p.Backend), MaxBackendLen)
	}
	k := &c.keys[0]
	m := paddedLen(len(p.Backend))
	buf := make([]byte, headerLen, headerLen+m+overhead)
	buf[0] = Version
	copy(buf[1:], k.id[:])
	if _, err := rand.Read(buf[1+keyIDLen : headerLen]); err != nil {
		return "", fmt.Errorf("sealing cookie: nonce: %w", err)
	}
	var plain [maxPlain]byte // zeroed: the padding
	binary.BigEndian.PutUint64(plain[0:], uint64(p.Issued.Unix()))
	binary.BigEndian.PutUint64(plain[8:], uint64(p.Expires.Unix()))
	plain[timesLen] = byte(len(p.Backend))
	copy(plain[timesLen+1:], p.Backend)
	ad := additionalData(buf[:1+keyIDLen], context)
	buf = k.aead.Seal(buf, buf[1+keyIDLen:headerLen], plain[:m], ad)
	return base64.RawURLEncoding.EncodeToString(buf), nil
}

// maxPlain is the longest padded plaintext: the longest backend, rounded up.
const maxPlain = (timesLen + 1 + MaxBackendLen + PadTo - 1) / PadTo * PadTo

// paddedLen is the plaintext length of a version-2 value for a backend of n bytes.
func paddedLen(n int) int { return (timesLen + 1 + n + PadTo - 1) / PadTo * PadTo }

func additionalData(head []byte, context string) []byte {
	ad := make([]byte, 0, len(head)+len(context))
	return append(append(ad, head...), context...)
}

// Open authenticates v under context and returns its payload. It fails with ErrMalformed,
// ErrVersion, ErrUnknownKey, ErrAuth or ErrExpired (a payload is returned with ErrExpired
// only). It never panics, whatever v holds.
func (c *Codec) Open(v, context string, now time.Time) (Payload, error) {
	if len(v) > MaxValueLen {
		return Payload{}, fmt.Errorf("%w: %d bytes", ErrMalformed, len(v))
	}
	raw, err := strictEncoding.DecodeString(v)
	if err != nil {
		return Payload{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if len(raw) < 1 {
		return Payload{}, fmt.Errorf("%w: empty", ErrMalformed)
	}
	if raw[0] != Version && raw[0] != versionUnpadded {
		return Payload{}, fmt.Errorf("%w: %d", ErrVersion, raw[0])
	}
	if len(raw) < minSealed+1 {
		return Payload{}, fmt.Errorf("%w: %d bytes", ErrMalformed, len(raw))
	}
	// Compare against every key in constant time, so timing tells nothing about ids.
	var k *key
	for i := range c.keys {
		if subtle.ConstantTimeCompare(c.keys[i].id[:], raw[1:1+keyIDLen]) == 1 {
			k = &c.keys[i]
		}
	}
	if k == nil {
		return Payload{}, ErrUnknownKey
	}
	plain, err := k.aead.Open(nil, raw[1+keyIDLen:headerLen], raw[headerLen:], additionalData(raw[:1+keyIDLen], context))
	if err != nil {
		return Payload{}, ErrAuth
	}
	p := Payload{
		Issued:  time.Unix(int64(binary.BigEndian.Uint64(plain[0:])), 0),
		Expires: time.Unix(int64(binary.BigEndian.Uint64(plain[8:])), 0),
	}
	if raw[0] == versionUnpadded {
		p.Backend = string(plain[timesLen:])
	} else {
		// Authenticated, so a bad length means a key was misused, not a forgery; still
		// never index past the plaintext.
		if len(plain) < timesLen+1 || int(plain[timesLen]) > len(plain)-timesLen-1 {
			return Payload{}, fmt.Errorf("%w: backend length", ErrMalformed)
		}
		p.Backend = string(plain[timesLen+1 : timesLen+1+int(plain[timesLen])])
	}
	if !now.Before(p.Expires) {
		return p, fmt.Errorf("%w at %s", ErrExpired, p.Expires.UTC().Format(time.RFC3339))
	}
	return p, nil
}
