package caddymodule

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/stickylb/stickylb/policies/sessions"
)

// Process-wide state that must outlive one config: Caddy swaps configs by provisioning the
// new one before cleaning up the old, so values kept in usage pools (refcounted by the
// modules that use them) carry over a reload while values no config uses are dropped.
var (
	// tablePool holds session tables by name (*sharedTable).
	tablePool = caddy.NewUsagePool()
	// clockPool holds slow-start clocks by weighted_least_conn instance key (*clockStore).
	clockPool = caddy.NewUsagePool()
	// drains is the set of upstreams drained through the admin API. It is not refcounted:
	// an operator's drain holds until undrained, across reloads, as Caddy keeps its own
	// per-host state.
	drains = newDrainSet()
)

// sharedTable is a session table in the usage pool.
type sharedTable struct {
	*sessions.Table
	// policy names the module that created the table, for the admin API.
	policy string

	mu sync.Mutex
	// users holds, per config (see configOwner), the ttl and bound its handlers asked
	// for and how many of them did: handlers of one config must agree, while a reload's
	// new config may change both (it reconfigures the table its predecessor still uses).
	users map[any]*tableUser
}

type tableUser struct {
	cfg  sessions.Config
	refs int
}

// Destruct implements caddy.Destructor; a table nobody uses is simply dropped.
func (*sharedTable) Destruct() error { return nil }

// acquireTable returns the named table for a handler of the config owner, creating it or
// applying cfg to the existing one (a reload may change ttl or max_sessions). Handlers of
// one config that name one table with a different ttl or max_sessions are a config error.
// The caller must releaseTable in Cleanup.
func acquireTable(name, policy string, owner any, cfg sessions.Config) (*sharedTable, error) {
	v, loaded, err := tablePool.LoadOrNew(name, func() (caddy.Destructor, error) {
		t, err := sessions.New(name, cfg)
		if err != nil {
			return nil, err
		}
		return &sharedTable{Table: t, policy: policy, users: map[any]*tableUser{}}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("session table %q: %w", name, err)
	}
	st := v.(*sharedTable)
	st.mu.Lock()
	defer st.mu.Unlock()
	if u := st.users[owner]; u != nil && owner != nil {
		if u.cfg.TTL != cfg.TTL || u.cfg.MaxEntries != cfg.MaxEntries {
			_, _ = tablePool.Delete(name)
			return nil, fmt.Errorf("session table %q is shared by handlers with different settings (ttl %s and %s, max_sessions %d and %d): give them the same ttl and max_sessions, or different tables",
				name, u.cfg.TTL, cfg.TTL, u.cfg.MaxEntries, cfg.MaxEntries)
		}
		u.refs++
		return st, nil
	}
	if loaded {
		if err := st.Reconfigure(cfg); err != nil {
			_, _ = tablePool.Delete(name)
			return nil, fmt.Errorf("session table %q: %w", name, err)
		}
	}
	if owner != nil {
		st.users[owner] = &tableUser{cfg: cfg, refs: 1}
	}
	return st, nil
}

// releaseTable drops one reference to st (named name) taken by acquireTable for owner.
func releaseTable(st *sharedTable, name string, owner any) {
	if owner != nil {
		st.mu.Lock()
		if u := st.users[owner]; u != nil {
			if u.refs--; u.refs <= 0 {
				delete(st.users, owner)
			}
		}
		st.mu.Unlock()
	}
	_, _ = tablePool.Delete(name)
}

// eachTable calls fn for every live table in name order.
func eachTable(fn func(name string, t *sharedTable)) {
	var names []string
	byName := map[string]*sharedTable{}
	tablePool.Range(func(k, v any) bool {
		if st, ok := v.(*sharedTable); ok {
			names = append(names, k.(string))
			byName[k.(string)] = st
		}
		return true
	})
	sort.Strings(names)
	for _, n := range names {
		fn(n, byName[n])
	}
}

// drainSet records upstreams (by dial address) that take no new sessions. gen changes on
// every edit so cached hash tables know to rebuild without reading the set per request.
type drainSet struct {
	mu  sync.RWMutex
	set map[string]time.Time
	// src are the upstreams the control plane's view drains (stickylb_xds sources, see
	// setSource); list leaves them out, as they are not the operator's to undrain.
	src map[string]bool
	gen atomic.Uint64
	// empty is true while set and src are empty: the common case costs one atomic load
	// per pick.
	empty atomic.Bool
}

func newDrainSet() *drainSet {
	d := &drainSet{set: map[string]time.Time{}}
	d.empty.Store(true)
	return d
}

// drained reports whether addr is drained.
func (d *drainSet) drained(addr string) bool {
	if d.empty.Load() {
		return false
	}
	d.mu.RLock()
	_, ok := d.set[addr]
	ok = ok || d.src[addr]
	d.mu.RUnlock()
	return ok
}

// setSource replaces the upstreams drained by the control plane's views.
func (d *drainSet) setSource(ids map[string]bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(ids) == len(d.src) {
		same := true
		for id := range ids {
			if !d.src[id] {
				same = false
				break
			}
		}
		if same {
			return
		}
	}
	d.src = ids
	d.empty.Store(len(d.set) == 0 && len(d.src) == 0)
	d.gen.Add(1)
}

// drain marks addr drained; it reports false if it already was.
func (d *drainSet) drain(addr string, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.set[addr]; ok {
		return false
	}
	d.set[addr] = now
	d.empty.Store(false)
	d.gen.Add(1)
	return true
}

// undrain clears addr; it reports false if it was not drained.
func (d *drainSet) undrain(addr string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.set[addr]; !ok {
		return false
	}
	delete(d.set, addr)
	d.empty.Store(len(d.set) == 0 && len(d.src) == 0)
	d.gen.Add(1)
	return true
}

// list returns the drained addresses with the time each was drained.
func (d *drainSet) list() map[string]time.Time {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make(map[string]time.Time, len(d.set))
	for k, v := range d.set {
		out[k] = v
	}
	return out
}

// generation changes whenever the set does.
func (d *drainSet) generation() uint64 { return d.gen.Load() }
