package certpool

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stickylb/stickylb/internal/testkit/testcert"
)

func TestFromFile(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, "ca")
	pool, err := FromFile(ca.WriteCA(filepath.Join(dir, "ca.pem")))
	if err != nil {
		t.Fatal(err)
	}
	if !pool.Equal(ca.Pool) {
		t.Error("the pool read from the file is not the CA's")
	}
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := FromFile(empty); err == nil || !strings.Contains(err.Error(), "holds no PEM certificate") {
		t.Errorf("a file without certificates: %v, want 'holds no PEM certificate'", err)
	}
	if _, err := FromFile(filepath.Join(dir, "missing.pem")); err == nil || !strings.Contains(err.Error(), "missing.pem") {
		t.Errorf("a missing file: %v, want an error naming it", err)
	}
}
