package caddymodule

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/stickylb/stickylb/policies/cookie"
)

// SecretOptions are where a sealing policy (sticky_cookie, app_cookie prefix mode) takes its
// secrets from. They are resolved at provision, so the config (the admin API's /config/,
// autosave.json) holds placeholders and paths, never a secret: write secrets as
// {env.NAME} or keep them in a file, not as {$NAME}, which the Caddyfile adapter replaces.
type SecretOptions struct {
	// Secrets seal and open: the first seals, every one opens (rotation). Each at least 32
	// bytes once placeholders such as {env.STICKYLB_SECRET} are replaced.
	Secrets []string `json:"secrets,omitempty"`
	// SecretFile names a file of secrets, one a line (blank lines and lines starting
	// with # skipped): the first seals, every one opens. Placeholders are replaced in the
	// path. Exclusive with Secrets.
	SecretFile string `json:"secret_file,omitempty"`
	// InsecureDemoSecret lets a demo run with no secret configured: when Secrets and
	// SecretFile yield nothing (an unset variable), a secret built into stickylb, and
	// therefore known to everyone, seals the cookies, with a warning at every start. For
	// demos only.
	InsecureDemoSecret bool `json:"insecure_demo_secret,omitempty"`
}

// demoSecret is the secret InsecureDemoSecret falls back to. It is public by design: it
// lets Caddyfile.example run without setup, and the log says so at every start.
const demoSecret = "stickylb-public-demo-secret-never-use-it-for-real-traffic"

// maxSecretFile bounds the secret file read at provision.
const maxSecretFile = 64 << 10

// codec resolves the secrets and builds a cookie codec; policy names the policy in errors
// and in the demo warning.
func (o *SecretOptions) codec(logger *zap.Logger, policy string) (*cookie.Codec, error) {
	if o.SecretFile != "" && len(o.Secrets) > 0 {
		return nil, errors.New("set secret or secret_file, not both")
	}
	repl := caddy.NewReplacer()
	var secrets []string
	from := "secret"
	if o.SecretFile != "" {
		path := repl.ReplaceKnown(o.SecretFile, "")
		from = "secret_file " + path
		var err error
		if secrets, err = readSecretFile(path); err != nil {
			return nil, err
		}
	} else {
		for _, s := range o.Secrets {
			secrets = append(secrets, repl.ReplaceKnown(s, ""))
		}
	}
	if o.InsecureDemoSecret && allEmpty(secrets) {
		logger.Warn("sealing cookies with stickylb's public demo secret: anyone can forge and read these cookies; set a secret (e.g. STICKYLB_SECRET) before serving real traffic",
			zap.String("policy", policy))
		secrets = []string{demoSecret}
	}
	if len(secrets) == 0 {
		if o.SecretFile != "" {
			return nil, fmt.Errorf("%s holds no secret", from)
		}
		return nil, errors.New("no secret: set `secret` (at least 32 bytes), e.g. secret {env.STICKYLB_SECRET}, or `secret_file`")
	}
	keys := make([][]byte, 0, len(secrets))
	for i, v := range secrets {
		if len(v) < cookie.MinSecretLen {
			what := from
			if i > 0 {
				what = fmt.Sprintf("older secret #%d of %s", i, from)
			}
			if v == "" && o.SecretFile == "" {
				return nil, fmt.Errorf("secret %q is empty (an unset environment variable?); it must be at least %d bytes", o.Secrets[i], cookie.MinSecretLen)
			}
			return nil, fmt.Errorf("%s is %d bytes; it must be at least %d", what, len(v), cookie.MinSecretLen)
		}
		keys = append(keys, []byte(v))
	}
	return cookie.NewCodec(keys...)
}

func allEmpty(ss []string) bool {
	for _, s := range ss {
		if s != "" {
			return false
		}
	}
	return true
}

// readSecretFile returns the secrets of a secret file, in order.
func readSecretFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("secret_file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return nil, fmt.Errorf("secret_file %s: %w", path, err)
	}
	if len(b) > maxSecretFile {
		return nil, fmt.Errorf("secret_file %s is over %d bytes", path, maxSecretFile)
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), maxSecretFile)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("secret_file %s: %w", path, err)
	}
	return out, nil
}
