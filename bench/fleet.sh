#!/usr/bin/env bash
# The control plane at fleet scale (BenchmarkFleet in ./xds): SUBSCRIBERS nodes of the
# project's ADS client in PROCESSES processes, on 1,000 http services x 100 backends in 3
# zones, against the project's server and go-control-plane's own server fed the same
# snapshots (the floor), one arm after the other. Each node subscribes by name to one
# service's cluster and endpoints.
#
#   SUBSCRIBERS (default 10000), PROCESSES (default 2), EDITS per arm (default 20: as many
#   health transitions; the percentiles are over them).
#
# Prints each arm's figures and the ratio of the project's server to the floor. Needs about
# 6 GB of memory at 10,000 subscribers and two file descriptors per subscriber (the server's
# process holds one per node, each node process one per node it runs).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/need.sh
need go awk:gawk
subs=${SUBSCRIBERS:-10000}
procs=${PROCESSES:-2}
edits=${EDITS:-20}
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $((subs / procs + 1000)) ]; then
	ulimit -n $((subs + 1000)) 2>/dev/null || {
		echo "fleet.sh: $subs subscribers need more open files than ulimit -n $(ulimit -n) allows" >&2
		exit 1
	}
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
load0=$(cut -d' ' -f1-3 /proc/loadavg)
FLEET_SUBSCRIBERS=$subs FLEET_PROCESSES=$procs go test -count=1 -timeout 120m -run '^$' -bench '^BenchmarkFleet$' \
	-benchtime "${edits}x" ./xds | tee "$out"
noskip "$out"
load1=$(cut -d' ' -f1-3 /proc/loadavg)
echo
echo "$subs subscribers in $procs processes, $edits edits and $edits health transitions per arm;" \
	"load average $load0 at the start, $load1 at the end; $(nproc) CPUs"
awk '
	$1 ~ /^BenchmarkFleet\/arm=/ {
		arm = $1; sub(/^BenchmarkFleet\/arm=/, "", arm); sub(/-[0-9]+$/, "", arm); arms[++n] = arm
		for (i = 3; i < NF; i++) if ($(i+1) ~ /[a-zA-Z]/ && $(i+1) != "ns/op") v[arm, $(i+1)] = $i
	}
	END {
		if (n != 2) { print "fleet.sh: want the figures of both arms" > "/dev/stderr"; exit 1 }
		split("sync-s restart-s edit-p50-ms edit-p99-ms health-p50-ms health-p99-ms server-B/sub server-MB client-B/sub parse-ms", m, " ")
		printf "%-16s %16s %18s %8s\n", "", arms[1], arms[2], "ratio"
		for (i = 1; i in m; i++) {
			a = v[arms[1], m[i]]; b = v[arms[2], m[i]]
			printf "%-16s %16s %18s %7.2fx\n", m[i], a, b, (b > 0 ? a / b : 0)
		}
	}' "$out"
