package l4xdp

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// loadTables loads the program into the kernel with fresh maps, nothing attached or pinned
// (the fixtures and benchmarks run it through BPF_PROG_RUN; a loader uses Open).
func loadTables(o Options) (*Tables, error) {
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
	if err := f.configure(o); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
