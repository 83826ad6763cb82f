package l4xdp

import (
	"maps"
	"slices"
	"testing"
)

// The production objects hold what users run and nothing else: the forwarder's object only
// its program and the maps the loader pins or configures (benchmark floors, the traffic generator and the
// sink live in testprogs_bpfel_test.o, which only test binaries embed), and pass's object
// its XDP_PASS program alone.
func TestProductionObjectsHoldOnlyWhatUsersRun(t *testing.T) {
	lb, err := loadLb()
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(lb.Programs)); !slices.Equal(got, []string{"stickylb_xdp"}) {
		t.Errorf("the forwarder's object holds programs %v, want only stickylb_xdp", got)
	}
	if got, want := slices.Sorted(maps.Keys(lb.Maps)), slices.Sorted(slices.Values(append(pinnedMaps, transientMaps...))); !slices.Equal(got, want) {
		t.Errorf("the forwarder's object holds maps %v, want the pinned and transient ones %v", got, want)
	}
	pass, err := loadPass()
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(pass.Programs)); !slices.Equal(got, []string{"pass_xdp"}) || len(pass.Maps) != 0 {
		t.Errorf("pass's object holds programs %v and %d maps, want pass_xdp alone", got, len(pass.Maps))
	}
}
