package sessions

import (
	"fmt"
	"sort"
	"sync"
)

// Registry holds named tables shared by several handlers and across config
// reloads: a handler Acquires its table when provisioned and Releases it
// when cleaned up. Because a reload provisions the new handlers before it
// cleans up the old ones, a table, and its sessions, outlives the reload.
// The zero value is ready to use; the caller owns the Registry (there is no
// package-level one).
type Registry struct {
	mu     sync.Mutex
	tables map[string]*registered
}

type registered struct {
	table *Table
	refs  int
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{} }

// Acquire returns the table called name, creating it with cfg, and takes a
// reference to it. An existing table is reconfigured with cfg (the latest
// Acquire wins; its Now is ignored). An invalid cfg is an error and neither
// creates, changes nor references a table.
func (r *Registry) Acquire(name string, cfg Config) (*Table, error) {
	if name == "" {
		return nil, fmt.Errorf("acquiring session table: %w: empty table name", ErrInvalidConfig)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if reg, ok := r.tables[name]; ok {
		if err := reg.table.Reconfigure(cfg); err != nil {
			return nil, fmt.Errorf("acquiring session table %q: %w", name, err)
		}
		reg.refs++
		return reg.table, nil
	}
	t, err := New(name, cfg)
	if err != nil {
		return nil, fmt.Errorf("acquiring session table %q: %w", name, err)
	}
	if r.tables == nil {
		r.tables = make(map[string]*registered)
	}
	r.tables[name] = &registered{table: t, refs: 1}
	return t, nil
}

// Release drops a reference taken by Acquire. The last Release removes the
// table from the registry (holders of the *Table may still use it; a later
// Acquire creates a fresh, empty table). Releasing a name that is not held
// does nothing.
func (r *Registry) Release(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	reg, ok := r.tables[name]
	if !ok {
		return
	}
	if reg.refs--; reg.refs == 0 {
		delete(r.tables, name)
	}
}

// Lookup returns the table called name without taking a reference (for
// admin endpoints and metrics).
func (r *Registry) Lookup(name string) (*Table, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	reg, ok := r.tables[name]
	if !ok {
		return nil, false
	}
	return reg.table, true
}

// Each calls fn for every table, in name order. fn runs without the
// registry's lock held, so it may call Acquire or Release.
func (r *Registry) Each(fn func(*Table)) {
	r.mu.Lock()
	tables := make([]*Table, 0, len(r.tables))
	for _, reg := range r.tables {
		tables = append(tables, reg.table)
	}
	r.mu.Unlock()
	sort.Slice(tables, func(i, j int) bool { return tables[i].name < tables[j].name })
	for _, t := range tables {
		fn(t)
	}
}
