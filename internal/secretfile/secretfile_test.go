package secretfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A file others may read or write is refused, whoever owns it; group read only when root
// owns the file (the test runs as root for that case, and as the owner otherwise).
func TestReadRefusesFilesOthersMayRead(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(p, []byte("alice 0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	root := os.Geteuid() == 0
	for _, c := range []struct {
		mode os.FileMode
		ok   bool
	}{
		{0o600, true}, {0o400, true}, {0o700, true},
		{0o644, false}, {0o604, false}, {0o602, false}, {0o601, false}, {0o620, false}, {0o610, false}, {0o660, false},
		{0o640, root}, {0o440, root},
	} {
		if err := os.Chmod(p, c.mode); err != nil {
			t.Fatal(err)
		}
		b, err := Read(p)
		switch {
		case c.ok && err != nil:
			t.Errorf("mode %04o (root %v): %v", c.mode, root, err)
		case c.ok && string(b) != "alice 0123456789abcdef\n":
			t.Errorf("mode %04o: read %q", c.mode, b)
		case !c.ok && err == nil:
			t.Errorf("mode %04o (root %v): read", c.mode, root)
		case !c.ok && !strings.Contains(err.Error(), "chmod 600"):
			t.Errorf("mode %04o: the error does not say what to do: %v", c.mode, err)
		}
	}
	if _, err := Read(filepath.Dir(p)); err == nil {
		t.Error("a directory was read")
	}
	big := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(big, make([]byte, MaxSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(big); err == nil || !strings.Contains(err.Error(), "over") {
		t.Errorf("a file over MaxSize: %v", err)
	}
}
