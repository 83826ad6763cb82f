package fleetview

import (
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"

	"github.com/stickylb/stickylb/policies/pools"
)

// TestAssemblerIncompleteCluster: a cluster whose endpoints never arrive does not freeze the
// rest of the view. The services whose endpoints came are applied, every update still
// ACKed (nothing was rejected); the waiting service keeps its last good state (or is left
// out when it never had one), and the assembler lists it with the time it started waiting.
func TestAssemblerIncompleteCluster(t *testing.T) {
	f, err := pools.Parse("pools.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	var applied []*View
	a := &Assembler{Apply: func(v *View) error { applied = append(applied, v); return nil }}
	cs, ls := Encode(f, nil)
	c, l := byName(cs, ls)
	if err := a.Clusters("1", c); err != nil {
		t.Fatal(err)
	}
	if err := a.Endpoints("1", l); err != nil || len(applied) != 1 {
		t.Fatalf("the whole view: %v, %d applied", err, len(applied))
	}

	// Version 2: web gains a backend; quic's endpoints are missing from the response.
	wlc4 := "      - {address: 10.0.6.4:25, forwarding: dr}\n"
	f2, err := pools.Parse("pools.yaml", []byte(strings.Replace(file, wlc4, wlc4+"      - {address: 10.0.6.9:25}\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	cs2, ls2 := Encode(f2, nil)
	c2, l2 := byName(cs2, ls2)
	delete(l2, "quic")
	if err := a.Clusters("2", c2); err != nil {
		t.Fatalf("clusters of version 2: %v (nothing was rejected: want an ACK)", err)
	}
	if err := a.Endpoints("2", l2); err != nil {
		t.Fatalf("endpoints of version 2 without quic's: %v (nothing was rejected: want an ACK)", err)
	}
	last := applied[len(applied)-1]
	if got := len(last.File.Service("wlc").Backends); got != 5 {
		t.Fatalf("%d views applied; the last holds %d backends of wlc, want version 2's 5: one cluster without endpoints froze the view", len(applied), got)
	}
	q := last.File.Service("quic")
	if q == nil || len(q.Backends) != 2 {
		t.Fatalf("quic, waiting for its endpoints, is %+v in the applied view, want its last good state (2 backends)", q)
	}
	w := a.Waiting()
	if len(w) != 1 || w[0].Service != "quic" || !w[0].Kept || w[0].Since.IsZero() {
		t.Fatalf("waiting: %+v, want quic since version 2, its last good state kept", w)
	}
	since := w[0].Since

	// A new cluster that never had endpoints is left out, and waits too; quic still waits
	// since the same time.
	cs3, ls3 := Encode(f2, nil)
	extra := proto.Clone(cs3[0]).(*clusterv3.Cluster)
	extra.Name = "late"
	cs3 = append(cs3, extra)
	c3, l3 := byName(cs3, ls3)
	_, full := byName(cs3, ls3)
	delete(l3, "quic")
	if err := a.Clusters("3", c3); err != nil {
		t.Fatal(err)
	}
	last = applied[len(applied)-1]
	if last.File.Service("late") != nil || last.File.Service("quic") == nil {
		t.Fatal("a cluster that never had endpoints was applied, or a waiting one dropped")
	}
	w = a.Waiting()
	if len(w) != 2 || w[0].Service != "late" || w[0].Kept || w[1].Service != "quic" || !w[1].Since.Equal(since) {
		t.Fatalf("waiting: %+v, want late (nothing kept) and quic (since %s)", w, since)
	}

	// The endpoints arrive: nothing waits, the whole view is applied.
	if err := a.Endpoints("3", full); err != nil {
		t.Fatal(err)
	}
	if w := a.Waiting(); len(w) != 1 || w[0].Service != "late" {
		t.Fatalf("quic's endpoints arrived; waiting %+v, want late only", w)
	}
	lateCLA := proto.Clone(ls3[0]).(*endpointv3.ClusterLoadAssignment)
	lateCLA.ClusterName = "late"
	full["late"] = lateCLA
	if err := a.Endpoints("4", full); err != nil {
		t.Fatal(err)
	}
	if w := a.Waiting(); len(w) != 0 || applied[len(applied)-1].File.Service("late") == nil {
		t.Fatalf("every endpoint arrived; waiting %+v", w)
	}
}
