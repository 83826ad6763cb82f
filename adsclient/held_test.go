package adsclient

import (
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

// TestHeldNACKs: one NACK held per type, due at its time in type order, dropped when a
// newer response of its type comes or its type is unsubscribed; the timer is armed for the
// earliest and off when none is held.
func TestHeldNACKs(t *testing.T) {
	var h heldNACKs
	if h.fire != nil {
		t.Fatal("a timer with nothing held")
	}
	now := time.Now()
	nack := func(typeURL string) *discoveryv3.DiscoveryRequest {
		return &discoveryv3.DiscoveryRequest{TypeUrl: typeURL}
	}
	h.hold(nack("b"), now.Add(time.Hour))
	h.hold(nack("a"), now.Add(time.Hour))
	h.hold(nack("c"), now.Add(2*time.Hour))
	if h.fire == nil {
		t.Fatal("no timer with NACKs held")
	}
	if got := h.due(now); len(got) != 0 {
		t.Fatalf("%d due before their time", len(got))
	}
	h.drop("c")
	h.keep(func(typeURL string) bool { return typeURL != "b" })
	got := h.due(now.Add(3 * time.Hour))
	if len(got) != 1 || got[0].GetTypeUrl() != "a" {
		t.Fatalf("due: %v, want a alone (c dropped, b unsubscribed)", got)
	}
	if h.fire != nil || len(h.by) != 0 {
		t.Fatalf("after every NACK went: timer %v, held %v", h.fire != nil, h.by)
	}
}
