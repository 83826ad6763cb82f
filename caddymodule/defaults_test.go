package caddymodule

import (
	"testing"

	"github.com/stickylb/stickylb/policies/pools"
)

// TestDefaultsAgreeWithPoolsFile: a keyed Caddy policy given no sizes builds the ring a
// pools file given no sizes serves to Envoy and gRPC, and bounds its table the same way.
func TestDefaultsAgreeWithPoolsFile(t *testing.T) {
	for _, name := range []string{"ring", "ring_hash"} {
		p, err := newHashPicker(name, 0, 0, 0, 0, 0)
		if err != nil {
			t.Fatalf("hash %s: %v", name, err)
		}
		if p.algo != pools.BalanceRingHash || p.minRing != pools.DefaultMinRingSize || p.maxRing != pools.DefaultMaxRingSize {
			t.Errorf("hash %s: %s %d..%d, pools file %s %d..%d", name, p.algo, p.minRing, p.maxRing,
				pools.BalanceRingHash, pools.DefaultMinRingSize, pools.DefaultMaxRingSize)
		}
	}
	p, err := newHashPicker("", 0, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p.algo != pools.BalanceMaglev || p.tableSize != pools.DefaultTableSize {
		t.Errorf("default hash %s %d, pools file %s %d", p.algo, p.tableSize, pools.BalanceMaglev, pools.DefaultTableSize)
	}
	if defaultMaxSessions != pools.DefaultMaxSessions || defaultTableTTL != pools.DefaultTTL {
		t.Errorf("sessions %d ttl %s, pools file %d %s", defaultMaxSessions, defaultTableTTL, pools.DefaultMaxSessions, pools.DefaultTTL)
	}
}
