// Package secretfile reads files of secrets (the change API's bearer tokens, a client's
// token) and refuses one that others than its owner may read, as OpenSSH does private keys:
// a token anyone on the host can read changes the fleet.
package secretfile

import (
	"fmt"
	"io"
	"os"
	"syscall"
)

// MaxSize bounds what Read reads: a file of secrets is a few lines.
const MaxSize = 1 << 20

// Read returns the content of path once Check has passed on the file opened (so a file
// swapped between the check and the read is not the one read).
func Read(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := Check(path, fi); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(b) > MaxSize {
		return nil, fmt.Errorf("%s is over %d bytes: not a file of secrets", path, MaxSize)
	}
	return b, nil
}

// Check refuses a file of secrets that others may read or change: any permission for
// others, group write or execute, or group read unless root owns the file. Root-owned and
// group-readable is how secrets reach a process by its group: a Kubernetes Secret volume
// with an fsGroup (kubelet writes it as root, mode 0440), a package's root:GROUP 0640 file.
// (PostgreSQL takes its key files by the same rule.)
func Check(path string, fi os.FileInfo) error {
	perm := fi.Mode().Perm()
	owner := -1
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		owner = int(st.Uid)
	}
	switch {
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file", path)
	case perm&0o007 != 0, perm&0o030 != 0, perm&0o040 != 0 && owner != 0:
		return fmt.Errorf("%s may be read or changed by others than its owner (mode %04o): anyone who reads a token can change the fleet; "+
			"chmod 600 it (or 640 with root as its owner, for a group of readers)", path, perm)
	}
	return nil
}
