package main

// What the operations artifacts (examples/prometheus/alerts.yaml, the Grafana dashboard,
// deploy/kubernetes, examples/systemd) already use and the code does not have yet: the one
// place the tests of those artifacts read it from. Each entry names the issue that brings it.
// Once the code has it, the tests fail until its entry is removed here: a pending entry never
// outlives its reason.

// pendingMetrics are metric names queried before any tier exports them.
var pendingMetrics = map[string]string{}

// pendingCommands are commands ("xdp drain") and flags ("xds --etcd") passed before
// `stickylb` takes them; a command listed whole covers its flags.
var pendingCommands = map[string]string{}
