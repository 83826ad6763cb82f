package grpctest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// ShufflingEnv is grpc-go's switch between its two ways of turning endpoint (and locality)
// weights into ring weights: on, its default, weighted pick-first shuffling turns them into
// rounded fixed-point fractions; false keeps them exact. grpc-go reads it once, at start, so
// a test that checks a mode other than its process's runs itself again (ExactWeights).
const ShufflingEnv = "GRPC_EXPERIMENTAL_PF_WEIGHTED_SHUFFLING"

// ExactWeights reports whether this process runs grpc-go with ShufflingEnv=false. When it
// does not, it first runs the calling test again in a child process that does (its output
// logged), and fails the test when the child does not pass; the caller then returns, or goes
// on in grpc-go's default mode.
func ExactWeights(t *testing.T) bool {
	t.Helper()
	if os.Getenv(ShufflingEnv) == "false" {
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), ShufflingEnv+"=false")
	out, err := cmd.CombinedOutput()
	t.Logf("child (%s=false):\n%s", ShufflingEnv, out)
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Errorf("child (%s=false) failed: %v", ShufflingEnv, err)
	}
	return false
}
