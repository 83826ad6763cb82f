package sessions

import (
	"fmt"
	"hash/maphash"
	"net/netip"
	"sync"
	"time"
)

// DefaultNewPerClient is how many new sessions a ClientCap admits from one client address
// a minute when none is configured: far above what one user starts (a login, a few
// tabs), a sixtieth of what a flood needs to churn a table of a few thousand sessions in a
// minute; a client behind a NAT shared by many users may meet it at a login storm, and
// then its sessions go by their hash instead of the table (see ClientCap).
const DefaultNewPerClient = 60

// Count-min sketch dimensions: capRows rows of capWidth 16-bit counters, 64 KiB a cap.
const (
	capRows  = 4
	capWidth = 8192
	// MaxNewPerClient is the largest bound a ClientCap takes (its counters are 16 bits).
	MaxNewPerClient = 1<<16 - 1
)

// ClientCap bounds the new sessions each client address may start in a minute (a fixed
// window: a client may start up to twice the bound across a window's edge). Client
// addresses are the attacker's to choose, so the counts live in bounded memory whatever
// their number: a count-min sketch (capRows x capWidth counters, with conservative
// update) under a seed drawn per cap, so a client cannot aim at another's counters. A
// sketch never counts a client short; it may count it over by what colliding clients
// started, which stays well under the bound unless some hundred thousand sessions a
// minute are started in all. An IPv6 client is counted by its /64, which one host is
// commonly given whole. Safe for concurrent use.
type ClientCap struct {
	max   uint16
	now   func() time.Time
	seed  maphash.Seed
	mu    sync.Mutex
	start time.Time // the current window's
	rows  [capRows][capWidth]uint16
}

// NewClientCap admits perMinute new sessions a minute from each client (1 to
// MaxNewPerClient). now is the clock; nil means time.Now.
func NewClientCap(perMinute int, now func() time.Time) (*ClientCap, error) {
	if perMinute < 1 || perMinute > MaxNewPerClient {
		return nil, fmt.Errorf("%w: new sessions per client must be in [1, %d], got %d", ErrInvalidConfig, MaxNewPerClient, perMinute)
	}
	if now == nil {
		now = time.Now
	}
	return &ClientCap{max: uint16(perMinute), now: now, seed: maphash.MakeSeed()}, nil
}

// Admit reports whether client may start another session now, and counts it when it may.
// The zero Addr (a client whose address is unknown) is one client.
func (c *ClientCap) Admit(client netip.Addr) bool {
	client = client.Unmap()
	if p, err := client.Prefix(64); err == nil && client.Is6() {
		client = p.Addr()
	}
	b := client.As16()
	h := maphash.Bytes(c.seed, b[:])
	var idx [capRows]uint32
	for r := range idx {
		idx[r] = uint32(h>>(16*r)) % capWidth
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := c.now(); now.Sub(c.start) >= time.Minute || now.Before(c.start) {
		c.start = now
		c.rows = [capRows][capWidth]uint16{}
	}
	est := c.rows[0][idx[0]]
	for r := 1; r < capRows; r++ {
		est = min(est, c.rows[r][idx[r]])
	}
	if est >= c.max {
		return false
	}
	for r := range idx { // conservative update: only the counters at the estimate
		if c.rows[r][idx[r]] == est {
			c.rows[r][idx[r]]++
		}
	}
	return true
}
