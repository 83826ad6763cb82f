// What a routing announcer needs of the forwarder: the VIP addresses it serves, told before
// a VIP's tables go, and whether it can still forward at all.

package l4xdp

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf/link"
)

// ServedFunc hears the VIP addresses (no port, no protocol: what a router routes) the
// forwarder serves once an apply is done. It is called during each apply that writes the
// maps, under the loader's lock, after the tables of every VIP that stays or arrives are
// installed and before the tables of a VIP that leaves are deleted: an announcer that
// withdraws the addresses missing from it does so while their packets are still forwarded.
// It must return soon (it holds up the apply); it may wait briefly for a withdrawal to be
// sent.
type ServedFunc func(addrs []netip.Addr)

// servedLocked tells cfg.Served the addresses of vips, the VIPs the apply keeps, but those
// whose table is not in the map (a new VIP whose write failed: nothing forwards it).
func (l *Loader) servedLocked(vips []VIP) {
	if l.cfg.Served == nil {
		return
	}
	addrs := make([]netip.Addr, 0, len(vips))
	for _, v := range vips {
		var meta lbVipMeta
		if err := l.maps.objs.Vips.Lookup(v.key(true), &meta); err != nil || meta.Id != v.ID {
			continue
		}
		addrs = append(addrs, v.Addr.Addr().Unmap())
	}
	l.cfg.Served(uniqueAddrs(addrs))
}

// ServedAddrs reads the VIP addresses the program forwards from its maps: those a previous
// loader installed too, before this one has applied anything (a node restarted while its
// control plane is down keeps serving them, and so announces them).
func (l *Loader) ServedAddrs() ([]netip.Addr, error) {
	var addrs []netip.Addr
	var k lbVipKey
	var meta lbVipMeta
	it := l.maps.objs.Vips.Iterate()
	for it.Next(&k, &meta) {
		addrs = append(addrs, netip.AddrFrom16(k.Addr).Unmap())
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the VIPs of the program: %w", err)
	}
	return uniqueAddrs(addrs), nil
}

func uniqueAddrs(addrs []netip.Addr) []netip.Addr {
	slices.SortFunc(addrs, netip.Addr.Compare)
	return slices.Compact(addrs)
}

// Forwarding says why the program cannot forward with the loader's tables, nil while it
// can: the interface is gone, down or without carrier, the program was detached from it
// (its link forced off, `bpftool link detach`), or its maps cannot be read. What it finds
// for certain (all but a netlink or map read that failed, which may pass) is
// ErrNotForwarding. Tables behind the config are not its to say: see Stale.
func (l *Loader) Forwarding() error {
	err := l.linkError()
	l.noteLink(err)
	if err != nil {
		return err
	}
	info, err := l.lnk.Info()
	if err != nil {
		return fmt.Errorf("reading the XDP link: %w", err)
	}
	if x := info.XDP(); x == nil || int(x.Ifindex) != l.iface.Index {
		return notForwarding{fmt.Sprintf("the XDP program is no longer attached to %s", l.cfg.Iface)}
	}
	if _, err := l.ServedAddrs(); err != nil {
		return err
	}
	return nil
}

// Running reports whether a forwarder is pinned for cfg's interface and attached to it: a
// loader opened now adopts a program that has kept forwarding (a restart, not a cold start).
func Running(cfg Config) bool {
	lnk, err := link.LoadPinnedLink(filepath.Join(cfg.pinDir(), "link"), nil)
	if err != nil {
		return false
	}
	defer lnk.Close()
	info, err := lnk.Info()
	if err != nil {
		return false
	}
	x := info.XDP()
	return x != nil && x.Ifindex != 0
}
