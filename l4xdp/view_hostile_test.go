package l4xdp

import (
	"fmt"
	"strings"
	"testing"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/stickylb/stickylb/policies/pools"
)

// lcFile: web on 10.0.0.100:80 under weighted least connections, backends 10.0.5.1 and
// 10.0.5.2 (MACs ending in their number) of the given weights.
func lcFile(w1, w2 uint32) string {
	return fmt.Sprintf("services:\n  - name: web\n    protocol: tcp\n    vip: 10.0.0.100:80\n    affinity: {mode: none}\n"+
		"    balance: weighted_least_conn\n    backends:\n"+
		"      - {address: 10.0.5.1:80, mac: \"02:00:00:00:05:01\", weight: %d}\n"+
		"      - {address: 10.0.5.2:80, mac: \"02:00:00:00:05:02\", weight: %d}\n", w1, w2)
}

// A view's weights are held to the pools file's bounds (1..pools.MaxWeight) where they are
// decoded: a control plane that sends 1 and 2^30 is refused (the node NACKs and keeps its
// view), where the forwarder's weight x 100 used to wrap 2^30 to 0 and send the heavy
// backend no new flow. The largest weight the file allows works end to end.
func TestFedWeightBounds(t *testing.T) {
	l := newFedLoader(t, "")
	heavy := func(n int) int {
		got := 0
		for _, b := range flowBackends(t, l, n) {
			if b == 2 {
				got++
			}
		}
		return got
	}
	err := feedEdited(t, l, lcFile(1, 1), func(ls []*endpointv3.ClusterLoadAssignment) {
		ls[0].Endpoints[0].LbEndpoints[1].LoadBalancingWeight = wrapperspb.UInt32(1 << 30)
	})
	if err == nil {
		t.Fatalf("weights 1 and 2^30 were applied: the heavy backend got %d/1000 new flows", heavy(1000))
	}
	if !strings.Contains(err.Error(), "weight 1073741824") {
		t.Fatalf("weight 2^30: %v, want an error naming the weight", err)
	}
	refused := err
	// The loader holds its own input to the same bound (a pools.File built by other means).
	f, err := pools.Parse("pools.yaml", []byte(lcFile(1, 1)))
	if err != nil {
		t.Fatal(err)
	}
	f.Services[0].Backends[1].Weight = 1 << 30
	if err := l.ApplyView(f, func(string, string) Verdict { return Verdict{} }); err == nil || !strings.Contains(err.Error(), "weight") {
		t.Fatalf("ApplyView with weight 2^30: %v, want a weight error", err)
	}
	// 1 and the largest weight: each new flow stays active, so least connections sends the
	// heavy backend all but at most one of them (the first pick on a tie may go either way).
	if err := feedEdited(t, l, lcFile(1, pools.MaxWeight), nil); err != nil {
		t.Fatal(err)
	}
	err = refused
	got := heavy(1000)
	if got < 999 {
		t.Fatalf("weights 1 and %d: the heavy backend got %d/1000 new flows, want >= 999", pools.MaxWeight, got)
	}
	t.Logf("weight 2^30 refused (%v); weights 1 and %d: the heavy backend got %d/1000 new flows", err, pools.MaxWeight, got)
}

// feedEdited is feed with the control plane's load assignments edited before they are
// decoded (edit may be nil); it returns the decoder's or the loader's refusal.
func feedEdited(t *testing.T, l *Loader, src string, edit func([]*endpointv3.ClusterLoadAssignment)) error {
	t.Helper()
	v, err := decodeFed(t, src, nil, edit)
	if err != nil {
		return err
	}
	return l.ApplyView(v.File, fedVerdicts(v))
}
