package xds

import (
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

func snapshotOf(t *testing.T, version string) *cachev3.Snapshot {
	t.Helper()
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.ClusterType: nil, resource.EndpointType: nil})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// TestAcksRollBackToTheLastWholeACK: the rollback target is the newest snapshot ACKed on
// every type asked for, even when its last ACK arrives after the next was set; a push's
// NACKs count once, and a rejected version is not set again.
func TestAcksRollBackToTheLastWholeACK(t *testing.T) {
	a := newAcks()
	if _, fresh, _ := a.nack(resource.ClusterType); fresh {
		t.Fatal("a NACK before anything was set counted")
	}
	a.asked(resource.ClusterType)
	a.asked(resource.EndpointType)
	v1, v2, v3 := snapshotOf(t, "1"), snapshotOf(t, "2"), snapshotOf(t, "3")
	a.set(v1)
	a.ack(resource.ClusterType, "1")
	if a.acked != nil {
		t.Fatal("acked on one type of two")
	}
	a.set(v2)
	a.ack(resource.EndpointType, "1") // the late ACK: v2 is set already
	if a.acked != v1 {
		t.Fatalf("acked %v, want version 1", a.acked.GetVersion(resource.ClusterType))
	}
	version, fresh, rollback := a.nack(resource.ClusterType)
	if version != "2" || !fresh || rollback != v1 || a.current != v1 {
		t.Fatalf("NACK of 2: version %q fresh %v rollback %v current %v", version, fresh, rollback, a.current)
	}
	if _, fresh, _ := a.nack(resource.EndpointType); fresh {
		t.Fatal("the second NACK of one push counted again")
	}
	if a.set(v2) {
		t.Fatal("the rejected version was set again")
	}
	if !a.set(v3) || a.current != v3 {
		t.Fatal("a newer version was not set")
	}
	a.ackSent(resource.ClusterType)
	a.ackSent(resource.EndpointType)
	if a.acked != v3 {
		t.Fatalf("delta ACKs of what was sent: acked %v, want version 3", a.acked.GetVersion(resource.ClusterType))
	}
}

// TestAcksPendingIsBounded: a node that never ACKs leaves at most maxPending snapshots
// remembered.
func TestAcksPendingIsBounded(t *testing.T) {
	a := newAcks()
	a.asked(resource.ClusterType)
	for i := range 3 * maxPending {
		a.set(snapshotOf(t, string(rune('a'+i))))
	}
	if len(a.pending) != maxPending {
		t.Fatalf("%d pending, want %d", len(a.pending), maxPending)
	}
}
