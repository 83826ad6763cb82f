// Package fanout runs a test's many independent calls (one a key, through a real proxy or a
// real grpc-go client) on a few goroutines, so thousands of keys take seconds.
package fanout

import (
	"errors"
	"sync"
)

// Each calls f(i) for every i in [0, n) on workers goroutines, worker w taking w,
// w+workers, ... A worker stops at its first error; Each returns the errors joined (nil when
// every call succeeded). f must be safe to run concurrently for different i.
func Each(n, workers int, f func(i int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				if err := f(i); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
