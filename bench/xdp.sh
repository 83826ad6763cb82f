#!/usr/bin/env bash
# The XDP forwarder's benchmarks, in one run, with the ratios README.md quotes. Needs root
# (BPF programs, network namespaces the benchmark makes and removes itself).
#
#   BPF_PROG_RUN, ns/packet: our established-flow and new-flow paths against a program that
#     only swaps MACs and returns XDP_TX (the floor); and a new flow above the CPU's insert
#     cap (a flood: hash and pick, no entry written); and the new-connection path of each
#     algorithm (BenchmarkProgRunAlgorithms: Maglev, WRR, WLC scanning 3, WLC's two choices
#     of 20).
#   NAT through BPF_PROG_RUN (BenchmarkProgRunNAT), ns/packet: a packet of an established
#     NAT flow each way (client -> backend: translated and routed by bpf_fib_lookup; the
#     backend's reply -> client) beside an established DR flow and the floor, in one run; and
#     the floor plus one bpf_fib_lookup, the share of NAT's cost that is the kernel's FIB; and a
#     new NAT flow (its SYN claims a port and writes both entries).
#   Tunnel through BPF_PROG_RUN (BenchmarkProgRunTunnel), ns/packet: a packet of an
#     established flow encapsulated in GUE (next hop and MTU from the FIB's answer of the last
#     second) beside an established DR flow, the floor, and the floor of encapsulation (a
#     program that only makes room for the outer headers and writes them from a template with
#     the packet's lengths and checksum); and a packet of a flow that moved to this node (not
#     remembered: the second-chance table at every packet). Goal: tunnel at most 1.3x DR.
#   The backend agent through BPF_PROG_RUN (BenchmarkAgent, ./l4xdp/agent), ns/packet: its
#     decapsulation beside a bare TC program that only strips the outer headers and one that
#     passes everything; and its second-chance hop (the socket lookup, the rewrite, the
#     redirect). Goal: the agent's decap at most 2x the bare decap.
#   Live frames, packets/s at the backends: one generator feeds our forwarder and nftables
#     netdev `fwd` doing the same DR rewrite; a figure comes only from a run in which no drop
#     counter moved (the benchmark fails otherwise). The floor arm runs the same pipeline with
#     an LB that only rewrites MACs and redirects: subtracting it leaves the LB's own cost.
#   Live NAT frames (BenchmarkLiveNAT): the same pipeline with addresses, our NAT against
#     nftables in the inet family (DNAT + SNAT, conntrack, the stack forwarding: what a user
#     would run for NAT without XDP), flows established before timing, beside our DR arm and
#     the floor. Goal: NAT under 2x DR per packet.
#
# COUNT runs of each (default 5); the medians are compared.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/need.sh
if [ "$(id -u)" -ne 0 ]; then
	echo "xdp.sh: needs root (BPF programs, network namespaces)" >&2
	exit 1
fi
# The live-frames benchmark drives ip, sysctl, ethtool and nft (its nftables arm) in the
# namespaces it makes; BPF_PROG_RUN needs only go.
need go ip:iproute2 nft:nftables ethtool:ethtool sysctl:procps mount:mount awk:gawk
count=${COUNT:-5}
frames=${FRAMES:-2000000}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -count=1 -run '^$' -bench 'BenchmarkProgRun' -benchtime 2000000x -count "$count" ./l4xdp | tee "$out"
noskip "$out"
go test -count=1 -run '^$' -bench 'BenchmarkAgent' -benchtime 2000000x -count "$count" ./l4xdp/agent | tee -a "$out"
noskip "$out"
go test -count=1 -run '^$' -bench 'BenchmarkLive(Frames|NAT)$' -benchtime "${frames}x" -count "$count" ./l4xdp | tee -a "$out"
noskip "$out"

# median NAME UNIT: the median of the UNIT metric over NAME's runs.
median() {
	awk -v name="$1" -v unit="$2" '$1 ~ "^"name"(-[0-9]+)?$" { for (i = 2; i <= NF; i++) if ($i == unit) print $(i-1) }' "$out" |
		sort -g | awk -v name="$1" -v unit="$2" '{ v[NR] = $1 } END {
			if (NR == 0) { print "xdp.sh: no " unit " figure of " name " in the output" > "/dev/stderr"; exit 1 }
			print v[int((NR + 1) / 2)] }'
}
floor=$(median 'BenchmarkProgRun/path=floor' ns/packet)
est=$(median 'BenchmarkProgRun/path=established' ns/packet)
new=$(median 'BenchmarkProgRun/path=new-flow' ns/packet)
over=$(median 'BenchmarkProgRun/path=new-flow-over-cap' ns/packet)
amag=$(median 'BenchmarkProgRunAlgorithms/new-flow=maglev' ns/packet)
awrr=$(median 'BenchmarkProgRunAlgorithms/new-flow=wrr' ns/packet)
awlc=$(median 'BenchmarkProgRunAlgorithms/new-flow=wlc-scan-3' ns/packet)
awlc2=$(median 'BenchmarkProgRunAlgorithms/new-flow=wlc-two-choices-20' ns/packet)
lfloor=$(median 'BenchmarkLiveFrames/arm=floor' ns/packet)
lours=$(median 'BenchmarkLiveFrames/arm=stickylb' ns/packet)
lnft=$(median 'BenchmarkLiveFrames/arm=nftables' ns/packet)
ours=$(median 'BenchmarkLiveFrames/arm=stickylb' pps)
nft=$(median 'BenchmarkLiveFrames/arm=nftables' pps)
nfloor=$(median 'BenchmarkProgRunNAT/path=floor' ns/packet)
nfib=$(median 'BenchmarkProgRunNAT/path=fib-lookup' ns/packet)
ndr=$(median 'BenchmarkProgRunNAT/path=dr-established' ns/packet)
nest=$(median 'BenchmarkProgRunNAT/path=nat-established' ns/packet)
nrep=$(median 'BenchmarkProgRunNAT/path=nat-reply' ns/packet)
nnew=$(median 'BenchmarkProgRunNAT/path=nat-new-flow' ns/packet)
lnfloor=$(median 'BenchmarkLiveNAT/arm=floor' ns/packet)
lndr=$(median 'BenchmarkLiveNAT/arm=stickylb-dr' ns/packet)
lnnat=$(median 'BenchmarkLiveNAT/arm=stickylb-nat' ns/packet)
lnnft=$(median 'BenchmarkLiveNAT/arm=nftables-nat' ns/packet)
tfloor=$(median 'BenchmarkProgRunTunnel/path=floor' ns/packet)
tenc=$(median 'BenchmarkProgRunTunnel/path=encap-floor' ns/packet)
tdr=$(median 'BenchmarkProgRunTunnel/path=dr-established' ns/packet)
test=$(median 'BenchmarkProgRunTunnel/path=tunnel-established' ns/packet)
tmov=$(median 'BenchmarkProgRunTunnel/path=tunnel-moved-flow' ns/packet)
abare=$(median 'BenchmarkAgent/path=bare' ns/packet)
adecap=$(median 'BenchmarkAgent/path=bare-decap' ns/packet)
aagent=$(median 'BenchmarkAgent/path=agent-decap' ns/packet)
asc=$(median 'BenchmarkAgent/path=agent-second-chance' ns/packet)
echo
echo "medians of $count runs"
awk -v am="$amag" -v aw="$awrr" -v al="$awlc" -v al2="$awlc2" -v f="$floor" -v e="$est" -v n="$new" -v c="$over" -v o="$ours" -v t="$nft" -v lf="$lfloor" -v lo="$lours" -v ln="$lnft" 'BEGIN {
	printf "BPF_PROG_RUN   floor %.0f ns/packet, established %.0f (%.1fx the floor), new connection (SYN) %.0f (%.1fx), above the insert cap %.0f\n", f, e, e / f, n, n / f, c
	printf "new connection by algorithm: maglev %.0f ns/packet, wrr %.0f, wlc (pool of 3) %.0f, wlc (two choices of 20) %.0f\n", am, aw, al, al2
	printf "live frames    stickylb %.2f Mpps, nftables netdev fwd %.2f Mpps: stickylb %.2fx nftables\n", o / 1e6, t / 1e6, o / t
	printf "               per packet: floor %.0f ns, stickylb %.0f, nftables %.0f; over the floor %.0f vs %.0f ns (%.1fx less)\n", lf, lo, ln, lo - lf, ln - lf, (ln - lf) / (lo - lf)
}'
awk -v f="$nfloor" -v fl="$nfib" -v d="$ndr" -v e="$nest" -v r="$nrep" -v nw="$nnew" -v lf="$lnfloor" -v ld="$lndr" -v ln="$lnnat" -v lt="$lnnft" 'BEGIN {
	printf "NAT, BPF_PROG_RUN  floor %.0f ns/packet, DR established %.0f, NAT established %.0f (%.2fx DR; goal under 2x), NAT reply %.0f (%.2fx DR)\n", f, d, e, e / d, r, r / d
	printf "                   new NAT flow (a port claimed, both entries written; each run first deletes the two of the run before) %.0f\n", nw
	printf "                   one bpf_fib_lookup costs %.0f ns (floor + lookup %.0f): NAT keeps each answer a second per backend and per flow, so a packet of an established flow does not pay it\n", fl - f, fl
	printf "NAT, live frames   per packet: floor %.0f ns, stickylb DR %.0f, stickylb NAT %.0f, nftables DNAT+SNAT %.0f: stickylb NAT %.2fx faster than nftables\n", lf, ld, ln, lt, lt / ln
	printf "                   over the floor: DR %.0f ns, NAT %.0f (%.2fx DR), nftables %.0f (%.1fx stickylb NAT)\n", ld - lf, ln - lf, (ln - lf) / (ld - lf), lt - lf, (lt - lf) / (ln - lf)
}'
awk -v f="$tfloor" -v ef="$tenc" -v d="$tdr" -v t="$test" -v m="$tmov" -v ab="$abare" -v ad="$adecap" -v ag="$aagent" -v sc="$asc" 'BEGIN {
	printf "tunnel, BPF_PROG_RUN  floor %.0f ns/packet, encapsulation floor %.0f, DR established %.0f, tunnel established %.0f (%.2fx DR; goal at most 1.3x; %.2fx the encapsulation floor), a moved flow %.0f\n", f, ef, d, t, t / d, t / ef, m
	printf "                      over the floor: DR %.0f ns, tunnel %.0f (%.2fx DR), encapsulation floor %.0f\n", d - f, t - f, (t - f) / (d - f), ef - f
	printf "agent, BPF_PROG_RUN   pass-all %.0f ns/packet, bare decap %.0f, agent decap %.0f (%.2fx the bare decap; goal at most 2x), second-chance hop %.0f\n", ab, ad, ag, ag / ad, sc
	printf "                      over pass-all: bare decap %.0f ns, agent decap %.0f (%.2fx)\n", ad - ab, ag - ab, (ag - ab) / (ad - ab)
}'
