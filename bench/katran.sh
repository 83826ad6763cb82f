#!/usr/bin/env bash
# Katran beside stickylb through BPF_PROG_RUN, in one process, on the same frames.
#
#   sudo bench/katran.sh KATRAN_DIR
#
# KATRAN_DIR is a checkout of Katran (github.com/facebookincubator/katran); nothing of it is
# in this repository. The script builds Katran's balancer program from it with Katran's own
# flags (those of katran/lib/Makefile-bpf, which build_bpf_modules_opensource.sh runs: clang
# -O2 -emit-llvm piped to llc -march=bpf, -DDEBUG -D__KERNEL__, its linux_includes), then
# runs BenchmarkKatran (l4xdp/katran_test.go, compiled only with -tags katran), which loads
# it with cilium/ebpf, fills its maps as Katran's tester does (one TCP VIP, three reals, its
# ring, its default MAC; an LRU per CPU), and times both programs on five paths:
# established, new flow (every SYN a new 5-tuple, inserted), SYNs above the insert cap, a
# packet for no VIP (XDP_PASS), and tunnel (an established flow of a second VIP: Katran's
# IPIP beside our GUE of a forwarding: tunnel VIP with second chance, whose goal is at most
# 1.3x our DR established packet); per call (repeat=1, as Katran's perf tester) and in a
# tight loop (repeat=N behind a wrapper that writes the frame back and tail-calls the
# program under test). Each arm's verdict and output frame are checked before it is timed
# and its counters after, so the timed path is the real one. Rounds interleave the arms;
# the table gives the medians.
#
#   PACKETS per arm and round (default 1000000); the rounds are BenchmarkKatran's (7).
set -euo pipefail
if [ $# -ne 1 ] || [ ! -d "$1" ]; then
	echo "usage: $0 KATRAN_DIR (a checkout of github.com/facebookincubator/katran)" >&2
	exit 2
fi
katran=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
. bench/need.sh
if [ "$(id -u)" -ne 0 ]; then
	echo "katran.sh: needs root (BPF programs)" >&2
	exit 1
fi
need go clang:clang llc:llvm awk:gawk
packets=${PACKETS:-1000000}

src=""
for f in katran/lib/bpf/balancer.bpf.c katran/lib/bpf/balancer_kern.c; do
	[ -f "$katran/$f" ] && { src="$katran/$f"; break; }
done
if [ -z "$src" ]; then
	echo "katran.sh: no katran/lib/bpf/balancer.bpf.c (or balancer_kern.c) in $katran" >&2
	exit 1
fi
if grep -q '#include <bpf/' "$src" && [ ! -f /usr/include/bpf/bpf_helpers.h ]; then
	echo "katran.sh: installing libbpf-dev (this checkout includes libbpf's headers)" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libbpf-dev
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Katran's Makefile-bpf: its build directory holds include/ (a copy of linux_includes) and
# katran/lib/bpf, and compiles with -I include -I . and these flags.
obj="$work/balancer.bpf.o"
clang -I"$katran/katran/lib/linux_includes" -I"$katran" -DDEBUG -D__KERNEL__ -Wno-unused-value -Wno-pointer-sign \
	-Wno-compare-distinct-pointer-types -O2 -emit-llvm -c -g "$src" -o - | llc -march=bpf -filetype=obj -o "$obj"
rev=$(git -C "$katran" rev-parse --short HEAD 2>/dev/null || echo "unknown revision")

load0=$(cut -d' ' -f1-3 /proc/loadavg)
out="$work/out"
KATRAN_OBJ="$obj" go test -tags katran -count=1 -timeout 60m -run '^$' -bench '^BenchmarkKatran$' -benchtime "${packets}x" ./l4xdp | tee "$out"
noskip "$out"
load1=$(cut -d' ' -f1-3 /proc/loadavg)

echo
echo "Katran ($rev, $(basename "$src")) beside stickylb, BPF_PROG_RUN ns/packet, medians of the rounds of $packets packets"
echo "load average $load0 at the start, $load1 at the end; $(nproc) CPUs"
awk '
	$1 ~ /^BenchmarkKatran\/round=/ {
		split($1, part, "/"); mode = part[3]; path = part[4]; impl = part[5]; sub(/-[0-9]+$/, "", impl)
		sub(/^mode=/, "", mode); sub(/^path=/, "", path); sub(/^impl=/, "", impl)
		for (i = 2; i <= NF; i++) if ($i == "ns/packet") { k = mode SUBSEP path SUBSEP impl; v[k, ++n[k]] = $(i-1) }
	}
	function med(mode, path, impl,   k, i, j, t, a, m) {
		k = mode SUBSEP path SUBSEP impl; m = n[k]
		if (m == 0) { printf "katran.sh: no figure for mode=%s path=%s impl=%s\n", mode, path, impl > "/dev/stderr"; bad = 1; return 0 }
		for (i = 1; i <= m; i++) a[i] = v[k, i]
		for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
	}
	END {
		wr = med("loop", "floor", "wrapper"); wrn = med("loop", "new-flow", "wrapper")
		fl = med("loop", "floor", "floor-direct"); fc = med("call", "floor", "floor")
		printf "\n%-12s | %28s | %40s\n", "", "per call (repeat=1)", "tight loop, net of the wrapper"
		printf "%-12s | %8s %8s %10s | %8s %8s %10s %11s\n", "path", "stickylb", "katran", "ratio", "stickylb", "katran", "ratio", "(raw ratio)"
		split("established new-flow over-cap pass tunnel", paths, " ")
		for (x = 1; x <= 5; x++) {
			p = paths[x]; w = p == "new-flow" ? wrn : wr
			cs = med("call", p, "stickylb"); ck = med("call", p, "katran")
			ls = med("loop", p, "stickylb"); lk = med("loop", p, "katran")
			printf "%-12s | %8.1f %8.1f %9.2fx | %8.1f %8.1f %9.2fx %10.2fx\n", p, cs, ck, cs / ck, ls - w, lk - w, (ls - w) / (lk - w), ls / lk
		}
		ct = med("call", "tunnel", "stickylb"); cd = med("call", "established", "stickylb")
		lt = med("loop", "tunnel", "stickylb"); ld = med("loop", "established", "stickylb")
		printf "\nthe stickylb tunnel (GUE, second chance) against stickylb DR, established: per call %.2fx; in the loop %.2fx net of the wrapper (goal at most 1.3x), %.2fx raw\n", ct / cd, (lt - wr) / (ld - wr), lt / ld
		de = med("loop", "established", "stickylb-direct"); dov = med("loop", "over-cap", "stickylb-direct")
		printf "\nfloor (swap MACs, XDP_TX): per call %.1f ns; in the loop %.1f ns run directly\n", fc, fl
		printf "the wrapper (write the frame back, tail call; a program that returns XDP_TX): %.1f ns, %.1f ns writing a new 5-tuple too\n", wr, wrn
		printf "stickylb in the loop without the wrapper: established %.1f ns (%.1fx the floor), over the cap %.1f ns (%.1fx)\n", de, de / fl, dov, dov / fl
		exit bad
	}' "$out"
