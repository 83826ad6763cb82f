package pools

import (
	"math"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/health"
)

// schema is every mapping the decoder reads, by its path in the file ("" is the top
// level), with the fields it accepts there. The decoder takes its lists from here and from
// nowhere else, so this is the whole schema: docs/pools.md documents each path and field, and
// a test holds the two together.
var schema = map[string][]string{
	pathFile:        {"services"},
	pathService:     {"name", "protocol", "listen", "vip", "idle_timeout", "affinity", "balance", "hash", "slow_start", "health_check", "cross_zone", "drained_zones", "forwarding", "tunnel_port", "second_chance", "backends"},
	pathAffinity:    {"mode", "ttl", "max_sessions", "cookie", "app_cookie", "url", "header", "quic_cid"},
	pathCookie:      {"name", "path"},
	pathAppCookie:   {"name", "mode"},
	pathURL:         {"query", "path_segment", "suffix"},
	pathHeader:      {"name"},
	pathQUICCID:     {"cid_length"},
	pathHash:        {"table_size", "min_ring_size", "max_ring_size", "virtual_nodes", "bounded_load"},
	pathSlowStart:   {"window", "aggression", "min_weight_percent"},
	pathHealthCheck: {"protocol", "path", "expect_status", "port", "interval", "timeout", "healthy_threshold", "unhealthy_threshold"},
	pathBackend:     {"address", "weight", "zone", "hash_key", "server_id", "mac", "drain", "forwarding"},
}

// The paths of schema.
const (
	pathFile        = ""
	pathService     = "services[]"
	pathAffinity    = "services[].affinity"
	pathCookie      = "services[].affinity.cookie"
	pathAppCookie   = "services[].affinity.app_cookie"
	pathURL         = "services[].affinity.url"
	pathHeader      = "services[].affinity.header"
	pathQUICCID     = "services[].affinity.quic_cid"
	pathHash        = "services[].hash"
	pathSlowStart   = "services[].slow_start"
	pathHealthCheck = "services[].health_check"
	pathBackend     = "services[].backends[]"
)

// svcState is a service being decoded: the value, and where each field came
// from so that rules spanning several fields can point at the right one.
type svcState struct {
	s    *Service
	node *yaml.Node
	// given maps a dotted path ("balance", "affinity.mode", "hash.table_size")
	// to the field as written; absent paths were omitted.
	given map[string]field
	// bad marks given paths whose value was rejected, so rules that depend
	// on them stay quiet instead of piling on.
	bad      map[string]bool
	backends []*backendState
}

type backendState struct {
	b     *Backend
	node  *yaml.Node
	given map[string]field
	bad   map[string]bool
}

func (st *svcState) has(path string) bool { _, ok := st.given[path]; return ok }

// good reports whether path is usable: omitted (so defaulted) or valid.
func (st *svcState) good(path string) bool { return !st.bad[path] }

// pos is the node to blame for path: its value if given, else the service.
func (st *svcState) pos(path string) *yaml.Node {
	if f, ok := st.given[path]; ok {
		return f.val
	}
	return st.node
}

// keyPos is the key node of path if given, else the service.
func (st *svcState) keyPos(path string) *yaml.Node {
	if f, ok := st.given[path]; ok {
		return f.key
	}
	return st.node
}

// decoder decodes one pools file: its fields, read through the walker, into a File, and
// the rules that span fields (rules.go).
type decoder struct {
	*yamlWalker
}

func newDecoder(file string) *decoder { return &decoder{newYAMLWalker(file)} }

// parse reads the single YAML document in data and decodes the pools file.
func (d *decoder) parse(data []byte) *File {
	root := d.document(data)
	if root == nil {
		return nil
	}
	return d.decodeFile(root)
}

func (d *decoder) decodeFile(root *yaml.Node) *File {
	if rn := resolve(root); rn == nil || rn.Kind == yaml.ScalarNode && rn.ShortTag() == "!!null" {
		d.errorf(root, "empty pools file: want a mapping with services:")
		return nil
	}
	fs, ok := d.fields(root, "the pools file", schema[pathFile])
	if !ok {
		return nil
	}
	f := &File{}
	sf, ok := fs["services"]
	if !ok {
		d.errorf(root, "services: is required (a list of services)")
		return f
	}
	items, ok := d.list(sf)
	if !ok {
		return f
	}
	var states []*svcState
	for _, item := range items {
		st := d.decodeService(item)
		if st == nil {
			continue
		}
		states = append(states, st)
		f.Services = append(f.Services, st.s)
	}
	d.validateFile(states)
	return f
}

// decodeService decodes one entry of services:, fills in the defaults and applies the
// rules that span its fields. Each step below decodes a few fields; a value it rejects is
// marked bad so the rules that depend on it stay quiet.
func (d *decoder) decodeService(n *yaml.Node) *svcState {
	fs, ok := d.fields(n, "service", schema[pathService])
	if !ok {
		return nil
	}
	rn := resolve(n)
	st := &svcState{
		s:     &Service{Line: rn.Line},
		node:  rn,
		given: map[string]field{},
		bad:   map[string]bool{},
	}
	for name, f := range fs {
		st.given[name] = f
	}
	d.decodeNameAndProtocol(st, fs)
	d.decodeAddresses(st, fs)
	if f, ok := fs["affinity"]; ok {
		d.decodeAffinity(st, f)
	}
	d.decodeBalance(st, fs)
	if f, ok := fs["hash"]; ok {
		d.decodeHash(st, f)
	}
	if f, ok := fs["slow_start"]; ok {
		d.decodeSlowStart(st, f)
	}
	if f, ok := fs["health_check"]; ok {
		d.decodeHealthCheck(st, f)
	}
	d.decodeZones(st, fs)
	d.decodeForwarding(st, fs)
	d.decodeBackends(st, fs)

	applyDefaults(st.s, st.has)
	d.validateService(st)
	return st
}

func (d *decoder) decodeNameAndProtocol(st *svcState, fs map[string]field) {
	s := st.s
	if f, ok := fs["name"]; ok {
		if v, ok := d.str(f); !ok {
			st.bad["name"] = true
		} else if !ValidName(v) {
			d.errorf(f.val, "name %q: want lowercase letters, digits and '-' (not at either end), at most %d characters, e.g. web-eu", v, MaxNameLength)
			st.bad["name"] = true
		} else {
			s.Name = v
		}
	}
	if f, ok := fs["protocol"]; ok {
		v, ok := d.str(f)
		switch {
		case !ok:
			st.bad["protocol"] = true
		case v == ProtocolHTTP || v == ProtocolGRPC || v == ProtocolTCP || v == ProtocolUDP:
			s.Protocol = v
		default:
			d.errorf(f.val, "protocol %q: want http, grpc, tcp or udp", v)
			st.bad["protocol"] = true
		}
	}
}

// decodeAddresses decodes where the service is served: listen (Envoy) and vip (XDP), and
// the vip's connection-table idle timeout.
func (d *decoder) decodeAddresses(st *svcState, fs map[string]field) {
	for _, a := range []struct {
		name string
		kind addrKind
		dst  *string
	}{{"listen", addrListen, &st.s.Listen}, {"vip", addrVIP, &st.s.VIP}} {
		f, ok := fs[a.name]
		if !ok {
			continue
		}
		if v, ok := d.str(f); !ok || !d.checkAddr(f.val, a.name, v, a.kind) {
			st.bad[a.name] = true
		} else {
			*a.dst = v
		}
	}
	if f, ok := fs["idle_timeout"]; ok {
		if v, ok := d.duration(f); !ok {
			st.bad["idle_timeout"] = true
		} else if v < time.Second {
			d.errorf(f.val, "idle_timeout %s: want at least 1s (the XDP connection table keeps an idle flow this long)", v)
			st.bad["idle_timeout"] = true
		} else {
			st.s.IdleTimeout = v
		}
	}
}

func (d *decoder) decodeBalance(st *svcState, fs map[string]field) {
	f, ok := fs["balance"]
	if !ok {
		return
	}
	v, ok := d.str(f)
	switch {
	case !ok:
		st.bad["balance"] = true
	case v == BalanceLeastConn || v == BalanceRoundRobin:
		st.s.Balance = v
	case isHashName(v):
		st.s.Balance, _ = chash.ParseAlgorithm(v)
	default:
		d.errorf(f.val, "balance %q: want weighted_least_conn, weighted_round_robin, maglev or ring_hash%s", v,
			suggestValue(v, []string{BalanceLeastConn, BalanceRoundRobin, BalanceMaglev, BalanceRingHash}))
		st.bad["balance"] = true
	}
}

// decodeForwarding decodes how the XDP tier reaches the backends: forwarding, and the
// tunnel's port and second chance.
func (d *decoder) decodeForwarding(st *svcState, fs map[string]field) {
	if f, ok := fs["forwarding"]; ok {
		if v, ok := d.forwarding(f); ok {
			st.s.Forwarding = v
		} else {
			st.bad["forwarding"] = true
		}
	}
	if f, ok := fs["tunnel_port"]; ok {
		if v, ok := d.intIn(f, 1, 65535, "tunnel_port %d out of range 1..65535 (the UDP port backends decapsulate GUE on; default %d)", DefaultTunnelPort); ok {
			st.s.TunnelPort = uint16(v)
		} else {
			st.bad["tunnel_port"] = true
		}
	}
	if f, ok := fs["second_chance"]; ok {
		if v, ok := d.boolean(f); ok {
			st.s.SecondChance = v
		} else {
			st.bad["second_chance"] = true
		}
	}
}

func (d *decoder) decodeZones(st *svcState, fs map[string]field) {
	s := st.s
	if f, ok := fs["cross_zone"]; ok {
		if v, ok := d.boolean(f); ok {
			s.CrossZone = v
		} else {
			st.bad["cross_zone"] = true
		}
	}
	f, ok := fs["drained_zones"]
	if !ok {
		return
	}
	items, ok := d.list(f)
	if !ok {
		st.bad["drained_zones"] = true
	}
	seen := map[string]int{}
	for _, item := range items {
		v, ok := d.strAt("drained_zones entry", item)
		if !ok {
			st.bad["drained_zones"] = true
			continue
		}
		if !ValidZone(v) {
			d.errorf(item, "drained zone %q: want letters, digits, '.', '_' and '-', at most %d characters", v, MaxZoneLength)
			st.bad["drained_zones"] = true
			continue
		}
		if line, dup := seen[v]; dup {
			d.errorf(item, "drained zone %q listed twice (first at line %d)", v, line)
			continue
		}
		seen[v] = item.Line
		s.DrainedZones = append(s.DrainedZones, v)
	}
}

func (d *decoder) decodeBackends(st *svcState, fs map[string]field) {
	f, ok := fs["backends"]
	if !ok {
		return
	}
	items, ok := d.list(f)
	if !ok {
		st.bad["backends"] = true
	}
	for _, item := range items {
		if bs := d.decodeBackend(item); bs != nil {
			st.backends = append(st.backends, bs)
			st.s.Backends = append(st.s.Backends, bs.b)
		} else {
			st.bad["backends"] = true
		}
	}
}

// block reads the service's block called name (affinity, hash, slow_start, health_check)
// and records its fields as given under "name.".
func (d *decoder) block(st *svcState, f field, name string) (map[string]field, bool) {
	fs, ok := d.fields(f.val, name, schema[pathService+"."+name])
	if !ok {
		st.bad[name] = true
		return nil, false
	}
	for k, g := range fs {
		st.given[name+"."+k] = g
	}
	return fs, true
}

// decodeAffinity decodes what identifies a session: the mode, the session table's limits,
// and the block of the mode (cookie, app_cookie, url, header or quic_cid).
func (d *decoder) decodeAffinity(st *svcState, af field) {
	fs, ok := d.block(st, af, "affinity")
	if !ok {
		st.bad["affinity.mode"] = true
		return
	}
	a := &st.s.Affinity
	d.decodeMode(st, af, fs)
	d.decodeSessionLimits(st, fs)
	if f, ok := fs["cookie"]; ok {
		a.Cookie = d.decodeCookie(f)
	}
	if f, ok := fs["app_cookie"]; ok {
		a.AppCookie = d.decodeAppCookie(st, f)
	}
	if f, ok := fs["url"]; ok {
		a.URL = d.decodeURL(f)
	}
	if f, ok := fs["header"]; ok {
		a.Header = d.decodeHeader(f)
	}
	if f, ok := fs["quic_cid"]; ok {
		a.QUICCID = d.decodeQUICCID(f)
	}
}

func (d *decoder) decodeMode(st *svcState, af field, fs map[string]field) {
	f, ok := fs["mode"]
	if !ok {
		d.errorf(af.key, "affinity: mode is required (none, cookie, app_cookie, url, header, source_ip or quic_cid)")
		st.bad["affinity.mode"] = true
		return
	}
	v, ok := d.str(f)
	modes := []string{ModeNone, ModeCookie, ModeAppCookie, ModeURL, ModeHeader, ModeSourceIP, ModeQUICCID}
	switch {
	case !ok:
		st.bad["affinity.mode"] = true
	case contains(modes, v):
		st.s.Affinity.Mode = v
	default:
		d.errorf(f.val, "affinity mode %q: want none, cookie, app_cookie, url, header, source_ip or quic_cid%s", v, suggestValue(v, modes))
		st.bad["affinity.mode"] = true
	}
}

// decodeSessionLimits decodes ttl and max_sessions.
func (d *decoder) decodeSessionLimits(st *svcState, fs map[string]field) {
	a := &st.s.Affinity
	if f, ok := fs["ttl"]; ok {
		v, ok := d.duration(f)
		switch {
		case !ok:
			st.bad["affinity.ttl"] = true
		case v < 1e9:
			d.errorf(f.val, "ttl %s: want at least 1s (it is the session lifetime)", v)
			st.bad["affinity.ttl"] = true
		case v%1e9 != 0:
			d.errorf(f.val, "ttl %s: want whole seconds (cookies carry expiry in seconds)", v)
			st.bad["affinity.ttl"] = true
		default:
			a.TTL = v
		}
	}
	if f, ok := fs["max_sessions"]; ok {
		if v, ok := d.intIn(f, 1, MaxSessionsLimit, "max_sessions %d out of range 1..%d", MaxSessionsLimit); ok {
			a.MaxSessions = int(v)
		} else {
			st.bad["affinity.max_sessions"] = true
		}
	}
}

func (d *decoder) decodeCookie(f field) *Cookie {
	return sub(d, f, pathCookie, func(c *Cookie, fs map[string]field) {
		if g, ok := fs["name"]; ok {
			if v, ok := d.strWhere(g, validToken, "cookie name %q: want a cookie name (letters, digits and !#$%%&'*+-.^_`|~)"); ok {
				c.Name = v
			}
		}
		if g, ok := fs["path"]; ok {
			isPath := func(v string) bool {
				return strings.HasPrefix(v, "/") && !strings.ContainsAny(v, "; \t\r\n") && printable(v)
			}
			if v, ok := d.strWhere(g, isPath, "cookie path %q: want an absolute path such as / or /app, without ';' or spaces"); ok {
				c.Path = v
			}
		}
	})
}

func (d *decoder) decodeAppCookie(st *svcState, f field) *AppCookie {
	return sub(d, f, pathAppCookie, func(c *AppCookie, fs map[string]field) {
		c.Name = d.requiredName(f, fs, "app_cookie name %q: want a cookie name (letters, digits and !#$%%&'*+-.^_`|~)",
			"app_cookie: name is required (the application's session cookie, e.g. JSESSIONID)")
		if g, ok := fs["mode"]; ok {
			isMode := func(v string) bool { return v == AppCookiePrefix || v == AppCookieLearn }
			if v, ok := d.strWhere(g, isMode, "app_cookie mode %q: want prefix or learn"); ok {
				c.Mode = v
			} else {
				st.bad["affinity.app_cookie.mode"] = true
			}
		}
	})
}

// decodeURL decodes the one source of a URL key: query, path_segment or suffix.
func (d *decoder) decodeURL(f field) *URLKey {
	return sub(d, f, pathURL, func(u *URLKey, fs map[string]field) {
		var set []string
		if g, ok := fs["query"]; ok {
			set = append(set, "query")
			isName := func(v string) bool { return v != "" && printable(v) && !strings.ContainsAny(v, "&=#? \t") }
			if v, ok := d.strWhere(g, isName, "url query %q: want a query parameter name (no '&', '=', '#', '?' or spaces)"); ok {
				u.Source, u.Query = URLQuery, v
			}
		}
		if g, ok := fs["path_segment"]; ok {
			set = append(set, "path_segment")
			if v, ok := d.integer(g); ok {
				if v >= math.MinInt32 && v <= math.MaxInt32 {
					u.Source, u.PathSegment = URLPathSegment, int(v)
				} else {
					d.errorf(g.val, "url path_segment %d out of range (0 is the first segment, -1 the last)", v)
				}
			}
		}
		if g, ok := fs["suffix"]; ok {
			set = append(set, "suffix")
			isMarker := func(v string) bool { return v != "" && printable(v) && !strings.ContainsAny(v, " \t") }
			if v, ok := d.strWhere(g, isMarker, "url suffix %q: want a marker such as \";jsessionid=\" (no spaces)"); ok {
				u.Source, u.Suffix = URLSuffix, v
			}
		}
		switch len(set) {
		case 0:
			d.errorf(f.key, "url: set one of query, path_segment or suffix")
		case 1:
		default:
			d.errorf(f.key, "url: set exactly one of query, path_segment or suffix, not %s", strings.Join(set, " and "))
		}
	})
}

func (d *decoder) decodeHeader(f field) *HeaderKey {
	return sub(d, f, pathHeader, func(h *HeaderKey, fs map[string]field) {
		h.Name = d.requiredName(f, fs, "header name %q: want an HTTP header name such as x-session",
			"header: name is required (the request header carrying the session key)")
	})
}

// requiredName decodes the name field block f must have, a cookie or header name (an
// RFC 9110 token); bad reports a bad one (format takes the value), missing a missing one.
func (d *decoder) requiredName(f field, fs map[string]field, bad, missing string) string {
	g, ok := fs["name"]
	if !ok {
		d.errorf(f.key, "%s", missing)
		return ""
	}
	v, _ := d.strWhere(g, validToken, bad)
	return v
}

func (d *decoder) decodeQUICCID(f field) *QUICCID {
	return sub(d, f, pathQUICCID, func(q *QUICCID, fs map[string]field) {
		if g, ok := fs["cid_length"]; ok {
			if v, ok := d.intIn(g, MinCIDLength, MaxCIDLength, "quic_cid cid_length %d out of range %d..%d (byte 0, then the 2-byte server id, at most QUIC's 20 bytes)", MinCIDLength, MaxCIDLength); ok {
				q.CIDLength = int(v)
			}
		}
	})
}

func (d *decoder) decodeHash(st *svcState, hf field) {
	fs, ok := d.block(st, hf, "hash")
	if !ok {
		return
	}
	h := &st.s.Hash
	fail := func(name string) { st.bad["hash."+name] = true }
	if f, ok := fs["table_size"]; ok {
		v, ok := d.integer(f)
		switch {
		case !ok:
			fail("table_size")
		case v < 2 || v > MaxTableSize:
			d.errorf(f.val, "table_size %d out of range: want a prime up to %d (default %d)", v, MaxTableSize, DefaultTableSize)
			fail("table_size")
		case !isPrime(uint64(v)):
			d.errorf(f.val, "table_size %d is not prime: Maglev needs a prime table size (e.g. 65537, 131071, 1000003)", v)
			fail("table_size")
		default:
			h.TableSize = uint64(v)
		}
	}
	ring := func(name string, dst *uint64) {
		f, ok := fs[name]
		if !ok {
			return
		}
		if v, ok := d.intIn(f, 1, MaxRingSize, name+" %d out of range 1..%d", MaxRingSize); ok {
			*dst = uint64(v)
		} else {
			fail(name)
		}
	}
	ring("min_ring_size", &h.MinRingSize)
	ring("max_ring_size", &h.MaxRingSize)
	d.decodeVirtualNodes(st, fs)
	if f, ok := fs["bounded_load"]; ok {
		v, ok := d.integer(f)
		switch {
		case !ok:
			fail("bounded_load")
		case v != 0 && (v < 100 || v > math.MaxUint32):
			d.errorf(f.val, "bounded_load %d: want 0 (off) or a percentage of the average load of at least 100, e.g. 125", v)
			fail("bounded_load")
		default:
			h.BoundedLoad = uint32(v)
		}
	}
}

func (d *decoder) decodeSlowStart(st *svcState, sf field) {
	fs, ok := d.block(st, sf, "slow_start")
	if !ok {
		return
	}
	ss := &SlowStart{}
	st.s.SlowStart = ss
	if f, ok := fs["window"]; ok {
		if v, ok := d.duration(f); ok {
			if v < 0 {
				d.errorf(f.val, "slow_start window %s: want 0 or more", v)
			} else {
				ss.Window = v
			}
		}
	} else {
		d.errorf(sf.key, "slow_start: window is required (how long a new backend takes to reach full weight, e.g. 30s)")
	}
	if f, ok := fs["aggression"]; ok {
		if v, ok := d.number(f); ok {
			if v <= 0 {
				d.errorf(f.val, "slow_start aggression %v: want more than 0 (1.0 ramps linearly)", v)
			} else {
				ss.Aggression = v
			}
		}
	}
	if f, ok := fs["min_weight_percent"]; ok {
		if v, ok := d.number(f); ok {
			if v < 0 || v > 100 {
				d.errorf(f.val, "slow_start min_weight_percent %v out of range 0..100", v)
			} else {
				ss.MinWeightPercent = v
			}
		}
	}
}

func (d *decoder) decodeHealthCheck(st *svcState, hf field) {
	fs, ok := d.block(st, hf, "health_check")
	if !ok {
		return
	}
	hc := &HealthCheck{}
	st.s.HealthCheck = hc
	d.decodeProbe(st, hc, fs)
	d.decodeProbeTiming(st, hc, fs)
}

// decodeProbe decodes what a probe sends and expects: protocol, path, expect_status, port.
func (d *decoder) decodeProbe(st *svcState, hc *HealthCheck, fs map[string]field) {
	fail := func(name string) { st.bad["health_check."+name] = true }
	if f, ok := fs["protocol"]; ok {
		v, ok := d.str(f)
		switch {
		case !ok:
			fail("protocol")
		case v == HealthHTTP || v == HealthTCP || v == HealthICMP:
			hc.Protocol = v
		default:
			d.errorf(f.val, "health_check protocol %q: want http, tcp or icmp", v)
			fail("protocol")
		}
	}
	if f, ok := fs["path"]; ok {
		if v, ok := d.str(f); ok && strings.HasPrefix(v, "/") && printable(v) && !strings.ContainsAny(v, " \t") {
			hc.Path = v
		} else if ok {
			d.errorf(f.val, "health_check path %q: want an absolute path such as /healthz", v)
		}
	}
	if f, ok := fs["expect_status"]; ok {
		items, listOK := d.list(f)
		seen := map[int64]bool{}
		for _, item := range items {
			v, ok := d.integer(field{name: "expect_status entry", val: item})
			if !ok {
				continue
			}
			if v < 100 || v > 599 {
				d.errorf(item, "expect_status %d: want an HTTP status 100..599", v)
				continue
			}
			if seen[v] {
				d.errorf(item, "expect_status %d listed twice", v)
				continue
			}
			seen[v] = true
			hc.ExpectStatus = append(hc.ExpectStatus, int(v))
		}
		if listOK && len(items) == 0 {
			d.errorf(f.val, "expect_status is empty: list the accepted statuses or remove it for 200-399")
		}
	}
	if f, ok := fs["port"]; ok {
		if v, ok := d.intIn(f, 1, 65535, "health_check port %d out of range 1..65535 (omit it to probe the backend's own port)"); ok {
			hc.Port = int(v)
		}
	}
}

// decodeProbeTiming decodes when probes run and when they decide: interval, timeout and
// the thresholds.
func (d *decoder) decodeProbeTiming(st *svcState, hc *HealthCheck, fs map[string]field) {
	fail := func(name string) { st.bad["health_check."+name] = true }
	if f, ok := fs["interval"]; ok {
		v, ok := d.duration(f)
		switch {
		case !ok:
			fail("interval")
		case v < health.MinInterval || v > health.MaxInterval:
			d.errorf(f.val, "health_check interval %s out of range %s..%s", v, health.MinInterval, health.MaxInterval)
			fail("interval")
		default:
			hc.Interval = v
		}
	}
	if f, ok := fs["timeout"]; ok {
		v, ok := d.duration(f)
		switch {
		case !ok:
			fail("timeout")
		case v <= 0:
			d.errorf(f.val, "health_check timeout %s: want more than 0", v)
			fail("timeout")
		default:
			hc.Timeout = v
		}
	}
	thresh := func(name string, dst *int) {
		f, ok := fs[name]
		if !ok {
			return
		}
		if v, ok := d.intIn(f, 1, 1000, "health_check "+name+" %d out of range 1..1000"); ok {
			*dst = int(v)
		}
	}
	thresh("healthy_threshold", &hc.HealthyThreshold)
	thresh("unhealthy_threshold", &hc.UnhealthyThreshold)
}

func (d *decoder) decodeBackend(n *yaml.Node) *backendState {
	fs, ok := d.fields(n, "backend", schema[pathBackend])
	if !ok {
		return nil
	}
	rn := resolve(n)
	bs := &backendState{b: &Backend{Line: rn.Line}, node: rn, given: fs, bad: map[string]bool{}}
	d.decodeBackendAddress(bs, n, fs)
	d.decodeBackendIdentity(bs, fs)
	d.decodeBackendForwarding(bs, fs)
	return bs
}

// decodeBackendAddress decodes where the backend is and how much it takes: address, weight.
func (d *decoder) decodeBackendAddress(bs *backendState, n *yaml.Node, fs map[string]field) {
	b := bs.b
	fail := func(name string) { bs.bad[name] = true }
	if f, ok := fs["address"]; ok {
		if v, ok := d.str(f); !ok || !d.checkAddr(f.val, "address", v, addrBackend) {
			fail("address")
		} else {
			b.Address = v
		}
	} else {
		d.errorf(n, "backend: address is required (ip:port)")
		fail("address")
	}
	if f, ok := fs["weight"]; ok {
		v, ok := d.integer(f)
		switch {
		case !ok:
			fail("weight")
		case v == 0:
			d.errorf(f.val, "weight 0: want 1..%d; to stop new sessions to a backend, set drain: true", MaxWeight)
			fail("weight")
		case v < 1 || v > MaxWeight:
			d.errorf(f.val, "weight %d out of range 1..%d", v, MaxWeight)
			fail("weight")
		default:
			b.Weight = uint32(v)
		}
	}
}

// decodeBackendIdentity decodes how the backend is named and placed: zone, hash_key,
// server_id.
func (d *decoder) decodeBackendIdentity(bs *backendState, fs map[string]field) {
	b := bs.b
	fail := func(name string) { bs.bad[name] = true }
	if f, ok := fs["zone"]; ok {
		if v, ok := d.str(f); ok && ValidZone(v) {
			b.Zone = v
		} else if ok {
			d.errorf(f.val, "zone %q: want letters, digits, '.', '_' and '-', at most %d characters", v, MaxZoneLength)
			fail("zone")
		} else {
			fail("zone")
		}
	}
	if f, ok := fs["hash_key"]; ok {
		if v, ok := d.str(f); ok && ValidHashKey(v) {
			b.HashKey = v
		} else if ok {
			d.errorf(f.val, "hash_key %q: want 1..%d printable characters without spaces", v, MaxHashKeyLength)
			fail("hash_key")
		} else {
			fail("hash_key")
		}
	}
	if f, ok := fs["server_id"]; ok {
		if v, ok := d.intIn(f, 1, 65535, "server_id %d out of range 1..65535 (it fills 2 bytes of the QUIC connection ID; 0 means none)"); ok {
			b.ServerID = uint16(v)
		} else {
			fail("server_id")
		}
	}
}

// decodeBackendForwarding decodes what the forwarder needs: mac, drain, forwarding.
func (d *decoder) decodeBackendForwarding(bs *backendState, fs map[string]field) {
	b := bs.b
	fail := func(name string) { bs.bad[name] = true }
	if f, ok := fs["forwarding"]; ok {
		if v, ok := d.forwarding(f); ok {
			b.Forwarding = v
		} else {
			fail("forwarding")
		}
	}
	if f, ok := fs["mac"]; ok {
		if v, ok := d.str(f); ok && d.checkMAC(f.val, v) {
			b.MAC = v
		} else {
			fail("mac")
		}
	}
	if f, ok := fs["drain"]; ok {
		if v, ok := d.boolean(f); ok {
			b.Drain = v
		} else {
			fail("drain")
		}
	}
}

// forwarding decodes a forwarding field (a service's or a backend's).
func (d *decoder) forwarding(f field) (Forwarding, bool) {
	v, ok := d.str(f)
	if !ok {
		return "", false
	}
	if !Forwarding(v).Known() {
		d.errorf(f.val, "forwarding %q: want auto, dr, nat or tunnel%s", v, suggestValue(v, []string{string(ForwardingAuto), string(ForwardingDR), string(ForwardingNAT), string(ForwardingTunnel)}))
		return "", false
	}
	return Forwarding(v), true
}

// intIn decodes an integer field that must lie in lo..hi; one outside is reported with
// format, which takes the value, then args.
func (d *decoder) intIn(f field, lo, hi int64, format string, args ...any) (int64, bool) {
	v, ok := d.integer(f)
	if !ok {
		return 0, false
	}
	if v < lo || v > hi {
		d.errorf(f.val, format, append([]any{v}, args...)...)
		return 0, false
	}
	return v, true
}

// sub decodes block f (a mapping with the fields of schema[path]) into a new T with fill.
// A T is returned even when f is not a mapping (that is reported), so the rules know the
// block was written.
func sub[T any](d *decoder, f field, path string, fill func(*T, map[string]field)) *T {
	t := new(T)
	if fs, ok := d.fields(f.val, f.name, schema[path]); ok {
		fill(t, fs)
	}
	return t
}

// isHashName reports whether v names a consistent hash (chash.ParseAlgorithm: "ring" is
// ring_hash).
func isHashName(v string) bool {
	_, ok := chash.ParseAlgorithm(v)
	return ok
}

// suggestValue is suggest for enumerated values.
func suggestValue(v string, allowed []string) string {
	s := suggest(v, allowed)
	if strings.HasPrefix(s, " (") {
		return s
	}
	return ""
}
