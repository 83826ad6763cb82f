# Sourced by the benchmark scripts: `need TOOL:PACKAGE ...` makes sure each TOOL is on the
# PATH before any benchmark runs, so that none of them skips an arm halfway (a benchmark
# that skips prints no figure, and the script then has no ratio to print). As root it
# installs the missing ones from Debian's packages, as scripts/test.sh does; otherwise it
# exits 1 naming them. A TOOL with no PACKAGE (go) can only be demanded.
need() {
	local script missing=() pkgs=() manual=() t
	script=$(basename "$0")
	for t in "$@"; do
		command -v "${t%%:*}" >/dev/null 2>&1 && continue
		missing+=("${t%%:*}")
		if [ "${t#*:}" = "$t" ] || [ -z "${t#*:}" ]; then manual+=("${t%%:*}"); else pkgs+=("${t#*:}"); fi
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	if [ ${#manual[@]} -gt 0 ]; then
		echo "$script: missing ${manual[*]}: install it (Go: the version go.mod names) and put it on the PATH" >&2
		exit 1
	fi
	if [ "$(id -u)" -ne 0 ]; then
		echo "$script: missing ${missing[*]} (Debian packages: ${pkgs[*]}); install them, or run as root to have them installed" >&2
		exit 1
	fi
	echo "$script: installing ${pkgs[*]} for ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${pkgs[@]}"; }; then
		echo "$script: installing ${pkgs[*]} failed; the benchmarks need ${missing[*]}" >&2
		exit 1
	fi
	for t in "${missing[@]}"; do
		command -v "$t" >/dev/null 2>&1 || { echo "$script: $t is still missing after installing ${pkgs[*]}" >&2; exit 1; }
	done
}

# noskip FILE: exits 1 when a benchmark in go test's output FILE skipped, printing each
# skipped one with the reason it gave: a skipped arm leaves a ratio without one side.
noskip() {
	if grep -q -- '--- SKIP' "$1"; then
		echo "$(basename "$0"): a benchmark skipped, so its figures are missing:" >&2
		awk '/--- SKIP/ { s = 1; print; next } s && /^    / { print; next } { s = 0 }' "$1" >&2
		exit 1
	fi
}
