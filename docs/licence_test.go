package docs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLicence: LICENSE is the Apache License 2.0, whole; every C source and header of the
// BPF program (the vendored libbpf headers aside) carries the GPL-2.0 SPDX line, and every
// program declares the GPL licence the kernel's GPL-only helpers need.
func TestLicence(t *testing.T) {
	b, err := os.ReadFile("../LICENSE")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for _, want := range []string{"Apache License", "Version 2.0, January 2004", "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
		"9. Accepting Warranty or Additional Liability.", "END OF TERMS AND CONDITIONS", "APPENDIX: How to apply the Apache License to your work."} {
		if !strings.Contains(text, want) {
			t.Errorf("LICENSE lacks %q", want)
		}
	}
	srcs, err := filepath.Glob("../l4xdp/bpf/*.[ch]")
	if err != nil || len(srcs) < 3 {
		t.Fatalf("BPF sources: %v %v", srcs, err)
	}
	for _, p := range srcs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		src := string(b)
		if !strings.HasPrefix(src, "// SPDX-License-Identifier: GPL-2.0\n") {
			t.Errorf("%s: the first line is not // SPDX-License-Identifier: GPL-2.0", p)
		}
		if strings.HasSuffix(p, ".c") && !strings.Contains(src, `char _license[] SEC("license") = "GPL";`) {
			t.Errorf("%s: no GPL _license section", p)
		}
	}
}
