package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// bpffsMagic is the f_type statfs reports for a bpffs (BPF_FS_MAGIC in linux/magic.h).
const bpffsMagic = 0xcafe4a11

// bpffsConventional is where a bpffs is mounted by convention (systemd, Cilium, bpftool).
const bpffsConventional = "/sys/fs/bpf"

// ensureBPFFS makes sure the pin root lies on a bpffs, mounting one when none is: pinning
// fails on any other file system, and `ip netns exec` remounts /sys, so /sys/fs/bpf is bare
// in every namespace it enters. The mount point is /sys/fs/bpf when the pin root lies under
// it (as Cilium's agent does), otherwise the pin root itself: never a parent directory of
// the user's, whose contents the mount would hide.
func ensureBPFFS(root string, log *zap.Logger) error {
	root, err := filepath.Abs(root)
	if err != nil {
		return fmt.Errorf("pin root %s: %w", root, err)
	}
	// The pin root need not exist yet (the loader makes it): the file system it will be
	// made on is that of its nearest existing ancestor.
	dir := root
	var st unix.Statfs_t
	for {
		err := unix.Statfs(dir, &st)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.ENOENT) || dir == "/" {
			return fmt.Errorf("statfs %s: %w", dir, err)
		}
		dir = filepath.Dir(dir)
	}
	if uint32(st.Type) == bpffsMagic {
		return nil
	}
	mnt := root
	if root == bpffsConventional || strings.HasPrefix(root, bpffsConventional+"/") {
		mnt = bpffsConventional
	}
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return fmt.Errorf("no bpffs holds the pin root %s, and making %s to mount one failed: %w", root, mnt, err)
	}
	// mode=0700, as systemd mounts it: pinned maps are the forwarder's state, root's only.
	if err := unix.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
		if errors.Is(err, unix.EPERM) {
			// Without CAP_SYS_ADMIN the loader lacks CAP_BPF too, as a rule: its own error,
			// which names the missing permission, says more than this one.
			log.Warn("no bpffs holds the pin root, and this process may not mount one", zap.String("pin_root", root),
				zap.String("mount_point", mnt), zap.Error(err))
			return nil
		}
		return fmt.Errorf("no bpffs holds the pin root %s, and mounting one at %s failed (mount -t bpf bpf %s): %w", root, mnt, mnt, err)
	}
	log.Info("no bpffs held the pin root: mounted one", zap.String("mount_point", mnt), zap.String("pin_root", root))
	if transientMountNS() {
		log.Warn("the bpffs was mounted in a mount namespace other than the host's (as `ip netns exec` makes one per command): "+
			"it and the pins in it end with that namespace, so a restarted loader cannot adopt the forwarder's state "+
			"(its connection table is lost and flows break); mount a bpffs in the host's namespace and pass --pin-root to keep them",
			zap.String("mount_point", mnt))
	}
	return nil
}

// transientMountNS reports whether this process runs in a mount namespace another than its
// parent's: one made for it alone (`ip netns exec`, `unshare -m`), which, and every mount in
// it, ends with it. With no parent to read (PID 1 of a container) it compares with PID 1's.
// When neither can be read it reports false: no warning on a guess.
func transientMountNS() bool {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return false
	}
	for _, pid := range []int{os.Getppid(), 1} {
		if other, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/mnt"); err == nil {
			return other != self
		}
	}
	return false
}
