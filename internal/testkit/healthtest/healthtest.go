// Package healthtest holds a health view a test sets by hand, for servers (the xDS server)
// that take a view instead of probing.
package healthtest

import (
	"sync"

	"github.com/stickylb/stickylb/policies/health"
	"github.com/stickylb/stickylb/policies/pools"
)

// Switch is a health view in which every backend is healthy until the test turns its
// address down. Its methods are safe for concurrent use: the server reads the view while
// the test flips it.
type Switch struct {
	mu   sync.Mutex
	down map[string]bool
}

// View is the health of b (by its address); its signature is that of a server's view.
func (s *Switch) View(_ string, b *pools.Backend) health.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down[b.Address] {
		return health.Unhealthy
	}
	return health.Healthy
}

// Down marks the backend at addr unhealthy.
func (s *Switch) Down(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down == nil {
		s.down = map[string]bool{}
	}
	s.down[addr] = true
}
