package api

import (
	"bufio"
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// Auth decides who a request comes from: a client certificate verified by the server's
// client CA (its subject's common name, else its first SAN), or a bearer token of the
// tokens file. Anything else gets 401 and changes nothing.
type Auth struct {
	// tokens maps a token to its name.
	tokens map[string]string
	// certs: a verified client certificate authenticates (the TLS config verifies it).
	certs bool
}

// NewAuth returns the authentication of the API: tokens (may be nil) and, when certs is
// set, verified client certificates.
func NewAuth(tokens map[string]string, certs bool) *Auth {
	return &Auth{tokens: tokens, certs: certs}
}

// LoadTokens reads a tokens file: one `NAME TOKEN` per line; blank lines and lines
// starting with # are skipped. A token shorter than 16 characters is refused.
func LoadTokens(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
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

type whoKey struct{}

// who is the name a request authenticated as, "" when none.
func (a *Auth) who(r *http.Request) string {
	if a.certs && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		c := r.TLS.VerifiedChains[0][0]
		switch {
		case c.Subject.CommonName != "":
			return "cert:" + c.Subject.CommonName
		case len(c.DNSNames) > 0:
			return "cert:" + c.DNSNames[0]
		case len(c.URIs) > 0:
			return "cert:" + c.URIs[0].String()
		}
		return "cert:" + c.SerialNumber.String()
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return ""
	}
	// Compare with every token in constant time, so the time taken tells nothing.
	name := ""
	for t, n := range a.tokens {
		if subtle.ConstantTimeCompare([]byte(t), []byte(tok)) == 1 {
			name = n
		}
	}
	if name == "" {
		return ""
	}
	return "token:" + name
}

// wrap admits authenticated requests only; refused calls refused for each refusal.
func (a *Auth) wrap(h http.Handler, refused func(*http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who := a.who(r)
		if who == "" {
			refused(r)
			w.Header().Set("WWW-Authenticate", `Bearer realm="stickylb"`)
			writeJSON(w, http.StatusUnauthorized, apiError{Error: "authentication required: a bearer token of --api-tokens, or a client certificate signed by --api-client-ca"})
			return
		}
		r.Header.Set(whoHeader, who)
		h.ServeHTTP(w, r)
	})
}

// whoHeader carries the authenticated name to the handlers; a client's own value is
// replaced before any handler runs.
const whoHeader = "X-Stickylb-Authenticated-As"

func whoOf(r *http.Request) string { return r.Header.Get(whoHeader) }
