package caddymodule

import (
	"encoding/json"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/sessions"
)

// Caddyfile syntax of the selection policies, used as `lb_policy <name> ...` inside
// reverse_proxy. Every subdirective takes the arguments shown; anything else is an error
// that names the line.

// loadFallback parses `fallback <policy> [args] [{...}]` at the dispenser's current
// position into the JSON of a selection policy module, as Caddy's own policies do.
func loadFallback(d *caddyfile.Dispenser, dst *json.RawMessage) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	if *dst != nil {
		return d.Err("fallback selection policy already specified")
	}
	name := d.Val()
	modID := "http.reverse_proxy.selection_policies." + name
	unm, err := caddyfile.UnmarshalModule(d, modID)
	if err != nil {
		return err
	}
	sel, ok := unm.(reverseproxy.Selector)
	if !ok {
		return d.Errf("module %s (%T) is not a reverseproxy.Selector", modID, unm)
	}
	*dst = caddyconfig.JSONModuleObject(sel, "policy", name, nil)
	return nil
}

// oneArg returns the single argument of the current subdirective.
func oneArg(d *caddyfile.Dispenser) (string, error) {
	if !d.NextArg() {
		return "", d.ArgErr()
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.ArgErr()
	}
	return v, nil
}

func durationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	name := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return d.Errf("%s: invalid duration %q", name, v)
	}
	if dur <= 0 {
		return d.Errf("%s: %s must be positive", name, v)
	}
	*dst = caddy.Duration(dur)
	return nil
}

func intArg(d *caddyfile.Dispenser, min int) (int, error) {
	name := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, d.Errf("%s: invalid number %q", name, v)
	}
	if n < min {
		return 0, d.Errf("%s: %d is below %d", name, n, min)
	}
	return n, nil
}

func uintArg(d *caddyfile.Dispenser) (uint64, error) {
	n, err := intArg(d, 1)
	return uint64(n), err
}

func floatArg(d *caddyfile.Dispenser) (float64, error) {
	name := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, d.Errf("%s: invalid number %q", name, v)
	}
	return f, nil
}

// secretOption parses secret_file and insecure_demo_secret.
func secretOption(d *caddyfile.Dispenser, o *SecretOptions) error {
	switch d.Val() {
	case "secret_file":
		v, err := oneArg(d)
		if err != nil {
			return err
		}
		o.SecretFile = v
	case "insecure_demo_secret":
		if d.NextArg() {
			return d.ArgErr()
		}
		o.InsecureDemoSecret = true
	}
	return nil
}

// keyedOption parses one subdirective shared by the keyed policies; handled is false
// when the subdirective is not one of them.
func keyedOption(d *caddyfile.Dispenser, o *KeyedOptions) (handled bool, err error) {
	switch d.Val() {
	case "ttl":
		return true, durationArg(d, &o.TTL)
	case "max_sessions":
		o.MaxSessions, err = intArg(d, 1)
	case "table":
		o.Table, err = oneArg(d)
	case "no_table":
		if d.NextArg() {
			return true, d.ArgErr()
		}
		o.NoTable = true
	case "hash":
		var v string
		if v, err = oneArg(d); err == nil {
			if _, ok := chash.ParseAlgorithm(v); !ok {
				return true, d.Errf("hash: %q: want %s or %s", v, hashMaglev, hashRing)
			}
			o.Hash = v
		}
	case "table_size":
		o.TableSize, err = uintArg(d)
	case "min_ring_size":
		o.MinRingSize, err = uintArg(d)
	case "max_ring_size":
		o.MaxRingSize, err = uintArg(d)
	case "virtual_nodes":
		o.VirtualNodes, err = uintArg(d)
	case "max_key_length":
		o.MaxKeyLength, err = intArg(d, 1)
	case "bounded_load":
		var f float64
		if f, err = floatArg(d); err == nil {
			if f < 1 {
				return true, d.Errf("bounded_load: %v: the factor must be at least 1 (1.25 lets an upstream take 25%% over its share)", f)
			}
			o.BoundedLoad = f
		}
	case "fallback":
		err = loadFallback(d, &o.FallbackRaw)
	default:
		return false, nil
	}
	return true, err
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax:
//
//	lb_policy sticky_cookie [<name>] {
//	    name      <cookie name>              # default lb_session
//	    secret    <secret> [<older>...]      # each >= 32 bytes; first seals; use {env.NAME}
//	    secret_file <path>                   # or: one secret a line, first seals
//	    insecure_demo_secret                 # no secret set: a public demo secret, with a warning
//	    ttl       <duration>                 # default 30m, sliding
//	    format    sealed|envoy
//	    path      <path>
//	    domain    <domain>
//	    max_age   <duration>
//	    secure    auto|always|never
//	    http_only [true|false]
//	    same_site lax|strict|none
//	    keep_cache_control                   # default: responses that set the cookie are private
//	    fallback  <policy> [<args...>]       # default weighted_least_conn
//	}
func (s *StickyCookie) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // policy name
	switch args := d.RemainingArgs(); len(args) {
	case 0:
	case 1:
		s.Name = args[0]
	default:
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		var err error
		switch d.Val() {
		case "name":
			s.Name, err = oneArg(d)
		case "secret":
			if s.Secrets != nil {
				return d.Err("secret already specified (list older secrets after the first, on one line)")
			}
			s.Secrets = d.RemainingArgs()
			if len(s.Secrets) == 0 {
				return d.ArgErr()
			}
		case "secret_file", "insecure_demo_secret":
			err = secretOption(d, &s.SecretOptions)
		case "ttl":
			err = durationArg(d, &s.TTL)
		case "format":
			s.Format, err = oneArg(d)
			if err == nil && s.Format != formatSealed && s.Format != formatEnvoy {
				return d.Errf("format: %q: want %s or %s", s.Format, formatSealed, formatEnvoy)
			}
		case "path":
			s.Path, err = oneArg(d)
		case "domain":
			s.Domain, err = oneArg(d)
		case "max_age":
			err = durationArg(d, &s.MaxAge)
		case "secure":
			s.Secure, err = oneArg(d)
			if err == nil && s.Secure != secureAuto && s.Secure != secureAlways && s.Secure != secureNever {
				return d.Errf("secure: %q: want auto, always or never", s.Secure)
			}
		case "http_only":
			v := true
			if d.NextArg() {
				b, perr := strconv.ParseBool(d.Val())
				if perr != nil {
					return d.Errf("http_only: %q: want true or false", d.Val())
				}
				v = b
				if d.NextArg() {
					return d.ArgErr()
				}
			}
			s.HTTPOnly = &v
		case "same_site":
			s.SameSite, err = oneArg(d)
			if err == nil && s.SameSite != "lax" && s.SameSite != "strict" && s.SameSite != "none" {
				return d.Errf("same_site: %q: want lax, strict or none", s.SameSite)
			}
		case "keep_cache_control":
			if d.NextArg() {
				return d.ArgErr()
			}
			s.KeepCacheControl = true
		case "fallback":
			err = loadFallback(d, &s.FallbackRaw)
		default:
			return d.Errf("sticky_cookie: unknown subdirective %q", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax:
//
//	lb_policy app_cookie <name> {
//	    mode          prefix|learn     # default prefix
//	    secret        <secret> [<older>...]   # prefix mode: secret, secret_file or
//	    secret_file   <path>                  # insecure_demo_secret, as sticky_cookie
//	    ttl           <duration>       # learn: table TTL; prefix: lifetime of the prefix (default 30m)
//	    keep_cache_control             # prefix mode; default: responses whose cookie is prefixed are private
//	    max_sessions  <n>              # learn mode
//	    max_new_per_client <n>|off     # learn mode: new sessions a client address starts a minute (default 60)
//	    table         <name>           # learn mode: share a table between handlers
//	    hash          maglev|ring      # learn mode: for values not in the table
//	    table_size / min_ring_size / max_ring_size / virtual_nodes / max_key_length <n>
//	    fallback      <policy> [<args...>]
//	}
func (a *AppCookie) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // policy name
	args := d.RemainingArgs()
	if len(args) != 1 {
		return d.Errf("app_cookie: want the application's cookie name, e.g. lb_policy app_cookie JSESSIONID")
	}
	a.Name = args[0]
	for d.NextBlock(0) {
		switch d.Val() {
		case "mode":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			if v != appModePrefix && v != appModeLearn {
				return d.Errf("mode: %q: want %s or %s", v, appModePrefix, appModeLearn)
			}
			a.Mode = v
		case "secret":
			if a.Secrets != nil {
				return d.Err("secret already specified")
			}
			if a.Secrets = d.RemainingArgs(); len(a.Secrets) == 0 {
				return d.ArgErr()
			}
		case "secret_file", "insecure_demo_secret":
			if err := secretOption(d, &a.SecretOptions); err != nil {
				return err
			}
		case "keep_cache_control":
			if d.NextArg() {
				return d.ArgErr()
			}
			a.KeepCacheControl = true
		case "max_new_per_client":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			if v == "off" {
				a.MaxNewPerClient = -1
				break
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > sessions.MaxNewPerClient {
				return d.Errf("max_new_per_client: %q: want a number from 1 to %d, or off", v, sessions.MaxNewPerClient)
			}
			a.MaxNewPerClient = n
		default:
			handled, err := keyedOption(d, &a.KeyedOptions)
			if err != nil {
				return err
			}
			if !handled {
				return d.Errf("app_cookie: unknown subdirective %q", d.Val())
			}
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax:
//
//	lb_policy sticky_url {
//	    query <name> | path_segment <n> | suffix <marker>   # exactly one
//	    ttl / max_sessions / table / no_table / hash / table_size /
//	    min_ring_size / max_ring_size / virtual_nodes / max_key_length / bounded_load / fallback
//	}
func (s *StickyURL) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // policy name
	if d.NextArg() {
		return d.Errf("sticky_url takes no arguments; set query, path_segment or suffix in its block")
	}
	for d.NextBlock(0) {
		var err error
		switch d.Val() {
		case "query":
			s.Query, err = oneArg(d)
		case "path_segment":
			var n int
			v, aerr := oneArg(d)
			if aerr != nil {
				return aerr
			}
			if n, err = strconv.Atoi(v); err != nil {
				return d.Errf("path_segment: invalid index %q (0 is the first segment, -1 the last)", v)
			}
			s.PathSegment = &n
		case "suffix":
			s.Suffix, err = oneArg(d)
		default:
			handled, kerr := keyedOption(d, &s.KeyedOptions)
			if kerr != nil {
				return kerr
			}
			if !handled {
				return d.Errf("sticky_url: unknown subdirective %q", d.Val())
			}
		}
		if err != nil {
			return err
		}
	}
	if err := s.validateKey(); err != nil {
		return d.Err(err.Error())
	}
	return nil
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax:
//
//	lb_policy sticky_header <name> {
//	    ttl / max_sessions / table / no_table / hash / table_size /
//	    min_ring_size / max_ring_size / virtual_nodes / max_key_length / bounded_load / fallback
//	}
func (s *StickyHeader) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // policy name
	args := d.RemainingArgs()
	if len(args) != 1 {
		return d.Errf("sticky_header: want one header name, e.g. lb_policy sticky_header X-Session")
	}
	s.Name = args[0]
	for d.NextBlock(0) {
		handled, err := keyedOption(d, &s.KeyedOptions)
		if err != nil {
			return err
		}
		if !handled {
			return d.Errf("sticky_header: unknown subdirective %q", d.Val())
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax:
//
//	lb_policy sticky_ip {
//	    hash maglev|ring
//	    table_size <prime>
//	    ttl <duration>            # keep a table too (default: hash only)
//	    bounded_load <factor>     # Envoy's bounded load, e.g. 1.25; default off
//	    max_sessions / table / min_ring_size / max_ring_size / virtual_nodes / fallback
//	}
func (s *StickyIP) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // policy name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		handled, err := keyedOption(d, &s.KeyedOptions)
		if err != nil {
			return err
		}
		if !handled {
			return d.Errf("sticky_ip: unknown subdirective %q", d.Val())
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up the policy from Caddyfile tokens. Syntax:
//
//	lb_policy weighted_least_conn [<weight>...] {
//	    weight <upstream> <weight>      # by dial address; overrides the positional weights
//	    slow_start <duration>
//	    aggression <a>                  # default 1.0
//	    min_weight_percent <p>          # default 10
//	    clocks <name>                   # share slow-start clocks between handlers
//	}
func (p *WeightedLeastConn) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // policy name
	ws, err := parseWeights(d.RemainingArgs())
	if err != nil {
		return d.Err(err.Error())
	}
	if len(ws) > 0 {
		p.Weights = ws
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "weight":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.Errf("weight: want <upstream address> <weight>")
			}
			w, err := parseWeights(args[1:])
			if err != nil {
				return d.Err(err.Error())
			}
			if p.WeightsByAddress == nil {
				p.WeightsByAddress = map[string]int{}
			}
			if _, dup := p.WeightsByAddress[args[0]]; dup {
				return d.Errf("weight: %s already has a weight", args[0])
			}
			p.WeightsByAddress[args[0]] = w[0]
		case "slow_start":
			if err := durationArg(d, &p.SlowStart); err != nil {
				return err
			}
		case "aggression":
			f, err := floatArg(d)
			if err != nil {
				return err
			}
			if f <= 0 {
				return d.Errf("aggression: %v must be above 0 (1.0 ramps linearly)", f)
			}
			p.Aggression = f
		case "min_weight_percent":
			f, err := floatArg(d)
			if err != nil {
				return err
			}
			if f < 0 || f > 100 {
				return d.Errf("min_weight_percent: %v is outside 0..100", f)
			}
			p.MinWeightPercent = &f
		case "clocks":
			v, err := oneArg(d)
			if err != nil {
				return err
			}
			p.Clocks = v
		default:
			return d.Errf("weighted_least_conn: unknown subdirective %q", d.Val())
		}
	}
	return nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*StickyCookie)(nil)
	_ caddyfile.Unmarshaler = (*AppCookie)(nil)
	_ caddyfile.Unmarshaler = (*StickyURL)(nil)
	_ caddyfile.Unmarshaler = (*StickyHeader)(nil)
	_ caddyfile.Unmarshaler = (*StickyIP)(nil)
	_ caddyfile.Unmarshaler = (*WeightedLeastConn)(nil)
)
