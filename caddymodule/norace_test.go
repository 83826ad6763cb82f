//go:build !race

package caddymodule

// raceEnabled reports whether the race detector is on (allocation counts differ under it).
const raceEnabled = false
