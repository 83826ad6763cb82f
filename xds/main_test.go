package xds

import (
	"os"
	"testing"
)

// TestMain runs the tests, or, in a child process of BenchmarkFleet, that process's nodes.
func TestMain(m *testing.M) {
	if spec := os.Getenv(fleetChildEnv); spec != "" {
		os.Exit(runFleetNodes(spec))
	}
	os.Exit(m.Run())
}
