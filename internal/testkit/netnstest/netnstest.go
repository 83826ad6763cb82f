// Package netnstest is the test kit for network namespaces, veths and bpffs mounts: the
// XDP tests of l4xdp, cmd/stickylb and integration build their rigs with it. Names are
// unique to the test (a random prefix), every command is bounded in time, and everything a
// kit made is removed when the test ends, passed or failed.
package netnstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// CommandTimeout bounds each command a kit runs (ip, sysctl, ethtool, nft, mount): a stuck
// one fails the test instead of hanging CI.
const CommandTimeout = 30 * time.Second

// NeedRoot skips tb unless it runs as root (namespaces, veths and BPF need it; CI runs as
// root).
func NeedRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("network namespaces and XDP need root (CI runs as root)")
	}
}

// Kit holds the namespaces and mounts of one test. Its methods fail the test they were
// given (New's, or For's) on any error.
type Kit struct {
	tb     testing.TB
	prefix string
	state  *state
}

type state struct {
	mu     sync.Mutex
	ns     map[string]netns.NsHandle
	order  []string
	mounts []string
}

// New makes a kit for tb with a fresh name prefix (short: interface and namespace names
// are bounded) and registers its teardown. It skips tb unless it runs as root.
func New(tb testing.TB, prefix string) *Kit {
	tb.Helper()
	NeedRoot(tb)
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	k := &Kit{tb: tb, prefix: prefix + hex.EncodeToString(b), state: &state{ns: map[string]netns.NsHandle{}}}
	tb.Cleanup(k.teardown)
	return k
}

// For returns the kit failing tb instead (a subtest's), over the same namespaces.
func (k *Kit) For(tb testing.TB) *Kit { return &Kit{tb: tb, prefix: k.prefix, state: k.state} }

// Prefix is what every name this kit makes starts with.
func (k *Kit) Prefix() string { return k.prefix }

// Name is namespace ns's full name (for `ip netns exec`).
func (k *Kit) Name(ns string) string { return k.prefix + ns }

// AddNS makes namespaces, each with lo up.
func (k *Kit) AddNS(names ...string) {
	k.tb.Helper()
	for _, ns := range names {
		k.Run("ip", "netns", "add", k.Name(ns))
		h, err := netns.GetFromName(k.Name(ns))
		k.state.mu.Lock()
		k.state.order = append(k.state.order, ns)
		if err == nil {
			k.state.ns[ns] = h
		}
		k.state.mu.Unlock()
		if err != nil {
			k.tb.Fatalf("opening namespace %s: %v", ns, err)
		}
		k.In(ns, "ip", "link", "set", "lo", "up")
	}
}

// Veth makes a veth pair: name in namespace ns, peer in peerNS (which may be ns), both up.
func (k *Kit) Veth(ns, name, peerNS, peer string) {
	k.tb.Helper()
	k.In(ns, "ip", "link", "add", name, "type", "veth", "peer", "name", peer, "netns", k.Name(peerNS))
	k.In(ns, "ip", "link", "set", name, "up")
	k.In(peerNS, "ip", "link", "set", peer, "up")
}

// BPFFS mounts a bpffs of the test's own and returns its path: `ip netns exec` remounts
// /sys, hiding /sys/fs/bpf, so pinned state lives here.
func (k *Kit) BPFFS() string {
	k.tb.Helper()
	dir, err := os.MkdirTemp("", k.prefix+"-bpffs-")
	if err != nil {
		k.tb.Fatal(err)
	}
	k.Run("mount", "-t", "bpf", "bpf", dir)
	k.state.mu.Lock()
	k.state.mounts = append(k.state.mounts, dir)
	k.state.mu.Unlock()
	return dir
}

// Run runs a command, bounded by CommandTimeout, and returns its output, trimmed.
func (k *Kit) Run(args ...string) string {
	k.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), CommandTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		k.tb.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// In runs a command in namespace ns.
func (k *Kit) In(ns string, args ...string) string {
	k.tb.Helper()
	return k.Run(append([]string{"ip", "netns", "exec", k.Name(ns)}, args...)...)
}

// Do runs fn on a thread in namespace ns: sockets it opens, ifindexes and netlink calls are
// that namespace's.
func (k *Kit) Do(ns string, fn func() error) error {
	k.state.mu.Lock()
	h, ok := k.state.ns[ns]
	k.state.mu.Unlock()
	if !ok {
		return fmt.Errorf("no namespace %s in this kit", ns)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	if err := netns.Set(h); err != nil {
		return fmt.Errorf("entering namespace %s: %w", ns, err)
	}
	defer netns.Set(orig)
	return fn()
}

// MustDo is Do, failing the test on an error.
func (k *Kit) MustDo(ns string, fn func() error) {
	k.tb.Helper()
	if err := k.Do(ns, fn); err != nil {
		k.tb.Fatal(err)
	}
}

// teardown deletes the namespaces (their veths go with them) and unmounts the bpffs mounts,
// each command bounded in time.
func (k *Kit) teardown() {
	s := k.state
	s.mu.Lock()
	defer s.mu.Unlock()
	run := func(args ...string) {
		ctx, cancel := context.WithTimeout(context.Background(), CommandTimeout)
		defer cancel()
		exec.CommandContext(ctx, args[0], args[1:]...).Run()
	}
	for _, h := range s.ns {
		h.Close()
	}
	for i := len(s.order) - 1; i >= 0; i-- {
		run("ip", "netns", "del", k.Name(s.order[i]))
	}
	for _, dir := range s.mounts {
		run("umount", dir)
		os.Remove(dir)
	}
}
