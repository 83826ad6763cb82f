package l4xdp

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// loadTables loads the program into the kernel with fresh maps, nothing attached or pinned
// (the fixtures and benchmarks run it through BPF_PROG_RUN; a loader uses Open), and NAT
// sources and ports when given (at most one n).
func loadTables(o Options, n ...NAT) (*Tables, error) {
	var nat NAT
	if len(n) > 0 {
		nat = n[0]
	}
	if err := nat.Validate(); err != nil {
		return nil, err
	}
	spec, err := o.spec()
	if err != nil {
		return nil, err
	}
	f := &Tables{}
	if err := spec.LoadAndAssign(&f.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("loading the XDP program: %+v", ve)
		}
		return nil, fmt.Errorf("loading the XDP program (needs root or CAP_BPF): %w", err)
	}
	if err := f.configure(o, nat); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
