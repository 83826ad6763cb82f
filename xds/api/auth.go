package api

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"crypto/x509"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/stickylb/stickylb/internal/secretfile"
)

// Auth decides who a request comes from: a client certificate verified by the server's
// client CA whose name is on the allow-list, or a bearer token of the tokens file.
// Anything else gets 401 and changes nothing.
type Auth struct {
	// tokens maps a token to its name.
	tokens map[string]string
	// certNames are the certificate names that authenticate (a common name, a DNS or URI
	// SAN); "*" admits every certificate the client CA signed. None: certificates do not
	// authenticate.
	certNames []string
}

// AnyCertificate, as the only name of the allow-list, admits every client certificate the
// API's client CA signed (a CA of the API's own, that signs nothing else).
const AnyCertificate = "*"

// NewAuth returns the authentication of the API: tokens (may be nil) and the client
// certificates named in certNames (may be empty: no certificate authenticates).
func NewAuth(tokens map[string]string, certNames []string) *Auth {
	return &Auth{tokens: tokens, certNames: certNames}
}

// LoadTokens reads a tokens file: one `NAME TOKEN` per line; blank lines and lines
// starting with # are skipped. A token shorter than 16 characters is refused, and so is a
// file others than its owner may read (internal/secretfile's rule).
func LoadTokens(path string) (map[string]string, error) {
	b, err := secretfile.Read(path)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s:%d: want NAME TOKEN", path, n)
		}
		if len(fields[1]) < 16 {
			return nil, fmt.Errorf("%s:%d: the token of %s is shorter than 16 characters", path, n, fields[0])
		}
		if _, dup := out[fields[1]]; dup {
			return nil, fmt.Errorf("%s:%d: a token given twice", path, n)
		}
		out[fields[1]] = fields[0]
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no token", path)
	}
	return out, nil
}

// who is the name a request authenticated as ("" when none), and why not.
func (a *Auth) who(r *http.Request) (string, string) {
	why := "no credentials"
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		c := r.TLS.VerifiedChains[0][0]
		if name, ok := a.certName(c); ok {
			return "cert:" + name, ""
		}
		why = fmt.Sprintf("client certificate %q is not in --api-client-names", c.Subject.CommonName)
	}
	scheme, tok, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") { // RFC 7235: the scheme is case-insensitive
		return "", why
	}
	if tok = strings.TrimSpace(tok); tok == "" {
		return "", why
	}
	// Compare with every token in constant time, so the time taken tells nothing.
	name := ""
	for t, n := range a.tokens {
		if subtle.ConstantTimeCompare([]byte(t), []byte(tok)) == 1 {
			name = n
		}
	}
	if name == "" {
		return "", "a bearer token not in --api-tokens"
	}
	return "token:" + name, ""
}

// certName is the name of c on the allow-list: its common name, a DNS SAN or a URI SAN,
// in that order; with AnyCertificate, the first of those c has.
func (a *Auth) certName(c *x509.Certificate) (string, bool) {
	names := []string{c.Subject.CommonName}
	names = append(names, c.DNSNames...)
	for _, u := range c.URIs {
		names = append(names, u.String())
	}
	for _, n := range names {
		if n != "" && (slices.Contains(a.certNames, n) || slices.Contains(a.certNames, AnyCertificate)) {
			return n, true
		}
	}
	if slices.Contains(a.certNames, AnyCertificate) {
		return "serial:" + c.SerialNumber.String(), true
	}
	return "", false
}

// wrap admits authenticated requests only; refused is called for each refusal with why.
func (a *Auth) wrap(h http.Handler, refused func(r *http.Request, why string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, why := a.who(r)
		r.Header.Set(whoHeader, who) // a client's own value is replaced, with "" when refused
		if who == "" {
			refused(r, why)
			w.Header().Set("WWW-Authenticate", `Bearer realm="stickylb"`)
			writeJSON(w, http.StatusUnauthorized, apiError{Error: "authentication required: a bearer token of --api-tokens, or a client certificate signed by --api-client-ca and named in --api-client-names"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// whoHeader carries the authenticated name to the handlers; a client's own value is
// replaced before any handler runs.
const whoHeader = "X-Stickylb-Authenticated-As"

func whoOf(r *http.Request) string { return r.Header.Get(whoHeader) }
