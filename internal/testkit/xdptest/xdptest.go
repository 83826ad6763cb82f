// Package xdptest opens the XDP tier's loader for the tests of the packages above l4xdp
// (the command, the end-to-end tests): a real program attached to a veth of a namespace of
// the test's own. The l4xdp package's own tests cannot import it (an import cycle) and
// keep their rig.
package xdptest

import (
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/stickylb/stickylb/internal/testkit/netnstest"
	"github.com/stickylb/stickylb/l4xdp"
)

// Loader opens a loader in generic mode on veth v0 of namespace "lb", made by a netnstest
// kit with the given name prefix, pinning under a bpffs of the test's own. It skips t
// unless it runs as root; when t ends the loader is closed and its program detached (a
// failed detach fails t).
func Loader(t *testing.T, prefix string) *l4xdp.Loader {
	t.Helper()
	kit := netnstest.New(t, prefix)
	kit.AddNS("lb")
	kit.Veth("lb", "v0", "lb", "v1")
	cfg := l4xdp.Config{Iface: "v0", Mode: l4xdp.ModeGeneric, PinRoot: kit.BPFFS()}
	var l *l4xdp.Loader
	kit.MustDo("lb", func() (err error) {
		l, err = l4xdp.Open(cfg, zaptest.NewLogger(t))
		return err
	})
	// Registered after the kit's teardown, so run before it: the namespace still exists.
	t.Cleanup(func() {
		l.Close()
		if err := l4xdp.Detach(cfg); err != nil {
			t.Error(err)
		}
	})
	return l
}
