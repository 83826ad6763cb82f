package sessions

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestRegistryRefcount(t *testing.T) {
	r := NewRegistry()
	cfg := Config{TTL: time.Minute, MaxEntries: 100}
	a, err := r.Acquire("web", cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.Put("k", "b1")
	b, err := r.Acquire("web", cfg) // a second handler, or the next config generation
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatal("second Acquire returned a different table")
	}
	r.Release("web") // the old generation is cleaned up
	got, ok := r.Lookup("web")
	if !ok || got != a {
		t.Fatal("table gone while still referenced")
	}
	mustGet(t, got, "k", "b1") // sessions survived the "reload"
	r.Release("web")
	if _, ok := r.Lookup("web"); ok {
		t.Fatal("table still registered after the last Release")
	}
	r.Release("web") // over-release: no effect
	r.Release("never")
	c, err := r.Acquire("web", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c == a || c.Len() != 0 {
		t.Fatal("Acquire after the last Release must create a fresh table")
	}
}

func TestRegistryAcquireReconfigures(t *testing.T) {
	r := NewRegistry()
	a, err := r.Acquire("api", Config{TTL: time.Minute, MaxEntries: 100})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Acquire("api", Config{TTL: time.Hour, MaxEntries: 5000}); err != nil {
		t.Fatal(err)
	}
	if cfg := a.Config(); cfg.TTL != time.Hour || cfg.MaxEntries != 5000 {
		t.Fatalf("Acquire did not reconfigure: %+v", cfg)
	}
	// An invalid config is refused and takes no reference.
	if _, err := r.Acquire("api", Config{TTL: 0, MaxEntries: 5}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Acquire(invalid) = %v", err)
	}
	if cfg := a.Config(); cfg.TTL != time.Hour || cfg.MaxEntries != 5000 {
		t.Fatalf("invalid Acquire changed the table: %+v", cfg)
	}
	r.Release("api")
	r.Release("api")
	if _, ok := r.Lookup("api"); ok {
		t.Fatal("the refused Acquire took a reference")
	}
	if _, err := r.Acquire("new", Config{TTL: time.Minute}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Acquire(new, invalid) = %v", err)
	}
	if _, ok := r.Lookup("new"); ok {
		t.Fatal("a refused Acquire registered a table")
	}
	if _, err := r.Acquire("", Config{TTL: time.Minute, MaxEntries: 1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Acquire(\"\") = %v", err)
	}
}

func TestRegistryEach(t *testing.T) {
	var r Registry // the zero value works
	cfg := Config{TTL: time.Minute, MaxEntries: 10}
	for _, n := range []string{"c", "a", "b"} {
		if _, err := r.Acquire(n, cfg); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	r.Each(func(tab *Table) {
		names = append(names, tab.Name())
		r.Release(tab.Name()) // fn may call back into the registry
	})
	if !slices.Equal(names, []string{"a", "b", "c"}) {
		t.Fatalf("Each visited %v", names)
	}
	r.Each(func(tab *Table) { t.Fatalf("table %q left after release", tab.Name()) })
}

func TestRegistryConcurrent(t *testing.T) {
	r := NewRegistry()
	cfg := Config{TTL: time.Minute, MaxEntries: 100}
	if _, err := r.Acquire("shared", cfg); err != nil { // held throughout
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Go(func() {
			for i := 0; i < 500; i++ {
				tab, err := r.Acquire("shared", cfg)
				if err != nil {
					t.Error(err)
					return
				}
				tab.Put("k", "b")
				r.Each(func(*Table) {})
				r.Release("shared")
			}
		})
	}
	wg.Wait()
	tab, ok := r.Lookup("shared")
	if !ok {
		t.Fatal("table lost although one reference was held throughout")
	}
	mustGet(t, tab, "k", "b")
	r.Release("shared")
	if _, ok := r.Lookup("shared"); ok {
		t.Fatal("refcount unbalanced: table still registered")
	}
}
