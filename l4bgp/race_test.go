//go:build race

package l4bgp

// raceBuild: the race detector is on (see TestGracefulRestart).
const raceBuild = true
