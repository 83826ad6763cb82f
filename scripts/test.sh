#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs what the tests need (as root, from
# Debian's packages), fetches the Go modules, then `go test ./...`.
# Tests that need root (XDP, network namespaces, ICMP) skip when not root; run as root to run them.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
# chromium: the status page's tests drive it headless (they skip without it). nft: the
# replicated control plane's end-to-end test cuts a replica off from etcd with it. etcd
# itself needs nothing installed: the tests build its members from the Go module
# (internal/testkit/etcdtest/member, go.etcd.io/etcd/server/v3/embed).
# bird (BIRD 2): the router of the BGP speaker's tests (l4bgp, a process on loopback) and of the
# L4 fleet's end-to-end tests (integration/routed_*).
# prometheus: promtool checks and tests examples/prometheus/alerts.yaml (cmd/stickylb).
for tool in clang:clang llvm-strip:llvm bpftool:bpftool ip:iproute2 ethtool:ethtool nft:nftables wrk:wrk ping:iputils-ping chromium:chromium bird:bird2 \
	promtool:prometheus; do
	command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool##*:}")
done
[ -e /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" -eq 0 ]; then
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${need[@]}"
		# The package enables a system-wide bird; the tests start their own, in a namespace.
		if [[ " ${need[*]} " == *" bird2 "* ]] && command -v systemctl >/dev/null 2>&1; then
			systemctl disable --now bird >/dev/null 2>&1 || true
		fi
	else
		echo "scripts/test.sh: missing ${need[*]}; run as root to install them (tests that need them will skip)" >&2
	fi
fi

go mod download
exec go test -count=1 -timeout 20m "$@" ./...
