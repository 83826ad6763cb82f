package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/stickylb/stickylb/policies/chash"
	"github.com/stickylb/stickylb/policies/keys"
	"github.com/stickylb/stickylb/policies/sessions"
)

// Defaults of the keyed policies' session tables.
const (
	defaultTableTTL    = sessions.DefaultTTL
	defaultMaxSessions = sessions.DefaultMaxEntries
)

// KeyedOptions are the options every keyed policy (sticky_url, sticky_header, sticky_ip,
// app_cookie) shares: a bounded session table consulted first, then the consistent hash of
// the key, which Envoy computes the same way, then a fallback when the request has no key.
type KeyedOptions struct {
	// TTL of a session without requests. Default 30m (sticky_ip: no table unless set).
	TTL caddy.Duration `json:"ttl,omitempty"`
	// MaxSessions bounds the table; past it, expired sessions are swept and then the ones
	// closest to expiry evicted. Default 100000.
	MaxSessions int `json:"max_sessions,omitempty"`
	// Table names the session table; handlers naming the same table share it (they must
	// agree on ttl and max_sessions), and it survives reloads. Default: one table per
	// handler, named after the policy's key and the handler's site (listen addresses and
	// route matchers), so it survives reloads that keep the site.
	Table string `json:"table,omitempty"`
	// NoTable turns the table off: the key's consistent hash alone decides (as Envoy).
	NoTable bool `json:"no_table,omitempty"`
	// Hash is maglev (default) or ring.
	Hash string `json:"hash,omitempty"`
	// TableSize is Maglev's lookup table size, a prime. Default 65537.
	TableSize uint64 `json:"table_size,omitempty"`
	// MinRingSize and MaxRingSize size the ring (as Envoy and gRPC). Default 1024 and 4096.
	MinRingSize uint64 `json:"min_ring_size,omitempty"`
	MaxRingSize uint64 `json:"max_ring_size,omitempty"`
	// VirtualNodes gives every upstream this many ring points per unit of weight (hash ring
	// only; exclusive with MinRingSize and MaxRingSize): the ring then grows with the
	// upstreams, so adding or losing one moves only its own keys. Static upstreams weigh 1;
	// a stickylb_xds source's weigh the pools file's weights in units of its service's
	// smallest weight. The pools file's hash.virtual_nodes, on the same ring.
	VirtualNodes uint64 `json:"virtual_nodes,omitempty"`
	// BoundedLoad turns on Envoy's bounded load (hash_balance_factor, as a factor: 1.25
	// is Envoy's 125): a key whose hashed upstream has more than its share of in-flight
	// requests times the factor goes to the next upstream in Envoy's probe order. It trades
	// agreement between nodes for balance, so it is off (0) by default; at least 1 when set.
	BoundedLoad float64 `json:"bounded_load,omitempty"`
	// MaxKeyLength: keys longer than this are kept in the table by a digest. Default 256.
	MaxKeyLength int `json:"max_key_length,omitempty"`
	// FallbackRaw picks the upstream of a request that carries no key. Default
	// weighted_least_conn.
	FallbackRaw json.RawMessage `json:"fallback,omitempty" caddy:"namespace=http.reverse_proxy.selection_policies inline_key=policy"`
}

// maxKeyLength is MaxKeyLength or its default.
func (o *KeyedOptions) maxKeyLength() int {
	if o.MaxKeyLength == 0 {
		return keys.DefaultMaxLen
	}
	return o.MaxKeyLength
}

// keyedCore is the machinery behind KeyedOptions.
type keyedCore struct {
	table    *sharedTable
	tableKey string
	owner    any // the config the table was acquired for
	hasher   *hashPicker
	fallback reverseproxy.Selector
	index    upstreamIndex
	stats    *scopeStats
	scope    string
	// learnOnly: keys enter the table only through learn (the upstream issued them), never
	// because a client sent them; a client's unknown key is hashed and not stored, so a
	// flood of invented keys cannot evict real sessions (app_cookie learn mode).
	learnOnly bool
	picks     pickLog
}

// provision sets up the core. module is the policy whose embedded KeyedOptions is o (for
// LoadModule of its FallbackRaw), key what the policy keys on (e.g. app_cookie:JSESSIONID:
// the default table name derives from it and from the handler's place in the config, see
// defaultTableName), useTable whether the policy keeps a session table.
func (k *keyedCore) provision(ctx caddy.Context, module any, o *KeyedOptions, policy, key string, useTable bool) error {
	var err error
	if k.hasher, err = newHashPicker(o.Hash, o.TableSize, o.MinRingSize, o.MaxRingSize, o.VirtualNodes, o.BoundedLoad); err != nil {
		return fmt.Errorf("%s: %w", policy, err)
	}
	o.MaxKeyLength = o.maxKeyLength()
	name := o.Table
	if name == "" {
		name = key
		if useTable {
			name = defaultTableName(ctx, key)
		}
	}
	k.scope = name
	k.picks = pickLog(mayRetry(ctx))
	if useTable {
		cfg := sessions.Config{TTL: time.Duration(o.TTL), MaxEntries: o.MaxSessions}
		if cfg.TTL == 0 {
			cfg.TTL = defaultTableTTL
		}
		if cfg.MaxEntries == 0 {
			cfg.MaxEntries = defaultMaxSessions
		}
		k.owner = configOwner(ctx)
		if k.table, err = acquireTable(name, policy, k.owner, cfg); err != nil {
			return fmt.Errorf("%s: %w", policy, err)
		}
		k.tableKey = name
	}
	if o.FallbackRaw == nil {
		o.FallbackRaw = caddyconfig.JSONModuleObject(WeightedLeastConn{}, "policy", "weighted_least_conn", nil)
	}
	mod, err := ctx.LoadModule(module, "FallbackRaw")
	if err != nil {
		return fmt.Errorf("%s: loading fallback selection policy: %w", policy, err)
	}
	k.fallback = mod.(reverseproxy.Selector)
	k.stats = acquireScope(k.scope)
	registerMetrics(ctx)
	return nil
}

// validate checks the options shared by keyed policies.
func (o *KeyedOptions) validate(policy string) error {
	if o.TTL < 0 {
		return fmt.Errorf("%s: ttl must not be negative", policy)
	}
	if o.MaxSessions < 0 {
		return fmt.Errorf("%s: max_sessions must not be negative", policy)
	}
	if o.BoundedLoad != 0 && o.BoundedLoad < 1 {
		return fmt.Errorf("%s: bounded_load must be at least 1", policy)
	}
	if o.MaxKeyLength < 0 {
		return fmt.Errorf("%s: max_key_length must not be negative", policy)
	}
	if o.NoTable && (o.TTL > 0 || o.MaxSessions > 0 || o.Table != "") {
		return fmt.Errorf("%s: no_table conflicts with ttl, max_sessions and table", policy)
	}
	return nil
}

// cleanup releases shared state.
func (k *keyedCore) cleanup() {
	if k.table != nil {
		releaseTable(k.table, k.tableKey, k.owner)
	}
	if k.stats != nil {
		releaseScope(k.scope)
	}
}

// selectKey returns the upstream for key: its live mapping in the table if that upstream
// may still serve, else the key's consistent hash among the upstreams eligible for new
// sessions (remembered in the table). vars are the request's.
func (k *keyedCore) selectKey(vars map[string]any, pool reverseproxy.UpstreamPool, key keys.Key) *reverseproxy.Upstream {
	t := k.picks.tried(vars)
	reason := ""
	if k.table != nil {
		if id, ok := k.table.Get(key.TableKey); ok {
			var u *reverseproxy.Upstream
			if u, reason = checkPin(&k.index, pool, id, t); u != nil {
				k.stats.hits.Add(1)
				k.picks.record(vars, u)
				return u
			}
		}
	}
	u := k.hasher.pick(pool, chash.KeyHash(key.Value), t, requestTime(vars, k.hasher.now))
	if u == nil {
		return nil
	}
	if reason != "" {
		k.stats.repins.add(reason)
	} else {
		k.stats.misses.Add(1)
	}
	// A re-pin moves a key the table holds; a new key is stored unless only the upstream
	// may add keys.
	if k.table != nil && (!k.learnOnly || reason != "") {
		k.table.Put(key.TableKey, identity(u))
	}
	k.picks.record(vars, u)
	return u
}

// learn maps key to u because the upstream issued it.
func (k *keyedCore) learn(key keys.Key, u *reverseproxy.Upstream) {
	if k.table != nil {
		k.table.Put(key.TableKey, identity(u))
	}
}

// selectExtracted picks by the key e extracts from r, or as for a request without one.
func (k *keyedCore) selectExtracted(e keys.Extractor, pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	vars := requestVars(r)
	key, err := e.Extract(r)
	if err != nil {
		return k.selectUnkeyed(vars, pool, r, w)
	}
	return k.selectKey(vars, pool, key)
}

// selectUnkeyed picks for a request without a key, with the fallback policy.
func (k *keyedCore) selectUnkeyed(vars map[string]any, pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	u := k.fallback.Select(poolForNew(pool, k.picks.tried(vars)), r, w)
	k.picks.record(vars, u)
	return u
}
