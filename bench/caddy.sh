#!/usr/bin/env bash
# Whole Caddy on loopback: requests/s of each stickylb policy against round_robin, in one
# run. It builds Caddy from ./cmd/caddy, starts one Caddy serving three backends and one
# front site per policy (3 upstreams each), and runs wrk against each site in turn, ROUNDS
# interleaved rounds (A B C ... A B C ...), so that drift of the machine hits every arm alike.
#
#   hit path: wrk replays a valid session (a cookie the site set, a learned application
#             cookie, a key) through a Lua script, as a returning client does.
#   miss path: no cookie, so every request is a new session (sticky_cookie seals one per
#             request); reported beside the hit path.
#
# Prints, per arm, the median requests/s, the median of its per-round ratio to round_robin
# (same round), and the spread of that ratio (min..max over the rounds). On a shared machine
# the load of other processes swings between one wrk run and the next; so each round also
# runs every arm at the same time as round_robin (two wrk at once, against the same Caddy,
# which shares its CPU between them): the "paired" ratio of those two throughputs is the
# ratio of their costs per request, and outside load hits both alike.
#
#   ROUNDS (default 5), DURATION per wrk run (default 3s), CONNS (default 16), THREADS (1).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
duration=${DURATION:-3s}
conns=${CONNS:-16}
threads=${THREADS:-1}
. bench/need.sh
need go wrk:wrk curl:curl awk:gawk sed:sed base64:coreutils

work=$(mktemp -d)
caddy_pid=""
cleanup() {
	if [ -n "$caddy_pid" ]; then kill "$caddy_pid" 2>/dev/null || true; wait "$caddy_pid" 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/caddy" ./cmd/caddy

b1=19101 b2=19102 b3=19103
ups="127.0.0.1:$b1 127.0.0.1:$b2 127.0.0.1:$b3"
# arm name, port, lb_policy body; sites that need the response get the stickylb handler.
arms=(round_robin sticky_cookie sticky_cookie_miss app_cookie app_cookie_learn sticky_ip sticky_header sticky_url weighted_least_conn cookie)
declare -A port policy
port[round_robin]=19110;         policy[round_robin]="round_robin"
port[sticky_cookie]=19111;       policy[sticky_cookie]="sticky_cookie { secret {env.STICKYLB_SECRET} }"
port[sticky_cookie_miss]=19111
port[app_cookie]=19112;          policy[app_cookie]="app_cookie JSESSIONID { secret {env.STICKYLB_SECRET} }"
port[app_cookie_learn]=19113;    policy[app_cookie_learn]="app_cookie JSESSIONID { mode learn }"
port[sticky_ip]=19114;           policy[sticky_ip]="sticky_ip"
port[sticky_header]=19115;       policy[sticky_header]="sticky_header X-Session"
port[sticky_url]=19116;          policy[sticky_url]="sticky_url { query sid }"
port[weighted_least_conn]=19117; policy[weighted_least_conn]="weighted_least_conn"
port[cookie]=19118;              policy[cookie]="cookie lb {env.STICKYLB_SECRET}"

{
	printf '{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}\n'
	for b in $b1 $b2 $b3; do
		printf ':%s {\n\thandle /login {\n\t\theader Set-Cookie "JSESSIONID=session-%s; Path=/"\n\t\trespond "backend-%s"\n\t}\n\trespond "backend-%s"\n}\n' "$b" "$b" "$b" "$b"
	done
	for a in "${arms[@]}"; do
		[ -n "${policy[$a]:-}" ] || continue
		handler=""
		case $a in app_cookie*) handler=$'\tstickylb\n' ;; esac
		printf ':%s {\n%s\treverse_proxy %s {\n\t\tlb_policy %s\n\t}\n}\n' "${port[$a]}" "$handler" "$ups" "$(sed 's/{ /{\n\t\t\t/; s/ }$/\n\t\t}/' <<<"${policy[$a]}")"
	done
} >"$work/Caddyfile"

STICKYLB_SECRET=$(head -c 32 /dev/urandom | base64) "$work/caddy" run --config "$work/Caddyfile" --adapter caddyfile >"$work/caddy.log" 2>&1 &
caddy_pid=$!
for p in 19110 19118; do
	for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$p/" && break; sleep 0.1; done
done

# A valid session for each hit-path arm, taken from the site as a client would.
setcookie() { curl -s -D - -o /dev/null "$1" | tr -d '\r' | awk -v n="$2" 'tolower($1) == "set-cookie:" && index($2, n"=") == 1 { sub(/;.*/, "", $2); print $2; exit }'; }
declare -A header path
header[sticky_cookie]="Cookie: $(setcookie "http://127.0.0.1:${port[sticky_cookie]}/" lb_session)"
header[app_cookie]="Cookie: $(setcookie "http://127.0.0.1:${port[app_cookie]}/login" JSESSIONID)"
header[app_cookie_learn]="Cookie: $(setcookie "http://127.0.0.1:${port[app_cookie_learn]}/login" JSESSIONID)"
header[sticky_header]="X-Session: user-0001"
header[cookie]="Cookie: $(setcookie "http://127.0.0.1:${port[cookie]}/" lb)"
path[sticky_url]="/?sid=user-0001"
for a in sticky_cookie app_cookie app_cookie_learn cookie; do
	case ${header[$a]} in *=*) ;; *) echo "no session cookie from $a: ${header[$a]}" >&2; exit 1 ;; esac
done

# The Lua script replays the arm's session on every request.
cat >"$work/replay.lua" <<'LUA'
local h = os.getenv("REPLAY_HEADER")
if h and h ~= "" then
	local name, value = h:match("^([^:]+):%s*(.*)$")
	wrk.headers[name] = value
end
local p = os.getenv("REPLAY_PATH")
if p and p ~= "" then wrk.path = p end
LUA

# run ARM OUT: one wrk run against ARM's site, its output in OUT.
run() {
	REPLAY_HEADER="${header[$1]:-}" REPLAY_PATH="${path[$1]:-}" \
		wrk -t"$threads" -c"$conns" -d"$duration" -s "$work/replay.lua" "http://127.0.0.1:${port[$1]}/" >"$2" 2>&1
}
# rps ARM OUT: the requests/s of a run, failing on errors.
rps() {
	if grep -qE 'Non-2xx|Socket errors' "$2"; then echo "$1: $(grep -E 'Non-2xx|Socket errors' "$2")" >&2; exit 1; fi
	awk -v arm="$1" '/^Requests\/sec:/ { print $2; found = 1 } END { if (!found) { print "caddy.sh: no requests/s from wrk against " arm > "/dev/stderr"; exit 1 } }' "$2" || { cat "$2" >&2; exit 1; }
}

results="$work/results" paired="$work/paired"
: >"$results"
: >"$paired"
for r in $(seq "$rounds"); do
	for a in "${arms[@]}"; do
		run "$a" "$work/out"
		v=$(rps "$a" "$work/out")
		echo "$r $a $v" >>"$results"
		printf 'round %d %-20s %10.0f req/s\n' "$r" "$a" "$v"
	done
	for a in "${arms[@]}"; do
		[ "$a" != round_robin ] || continue
		run "$a" "$work/outa" &
		pa=$!
		run round_robin "$work/outb"
		wait "$pa"
		va=$(rps "$a" "$work/outa")
		vb=$(rps round_robin "$work/outb")
		echo "$r $a $va $vb" >>"$paired"
		printf 'round %d %-20s %10.0f req/s beside round_robin %10.0f\n' "$r" "$a" "$va" "$vb"
	done
done

echo
printf '%-20s %12s %10s %16s %12s %16s\n' arm "req/s (med)" "x rr" "spread" "paired x rr" "spread"
awk -v pf="$paired" '
	{ rps[$1, $2] = $3; if (!($2 in seen)) { seen[$2] = 1; order[++n] = $2 }; if ($1 > R) R = $1 }
	function median(a, k,   i, j, t) {
		for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
	}
	END {
		while ((getline line < pf) > 0) { split(line, f, " "); pq[f[1], f[2]] = f[3] / f[4] }
		for (x = 1; x <= n; x++) {
			arm = order[x]; delete v; delete q; delete p; lo = 1e9; hi = 0; plo = 1e9; phi = 0
			for (r = 1; r <= R; r++) {
				v[r] = rps[r, arm]; q[r] = rps[r, arm] / rps[r, "round_robin"]
				if (q[r] < lo) lo = q[r]; if (q[r] > hi) hi = q[r]
				p[r] = arm == "round_robin" ? 1 : pq[r, arm]
				if (p[r] < plo) plo = p[r]; if (p[r] > phi) phi = p[r]
			}
			printf "%-20s %12.0f %10.3f %7.3f..%.3f %12.3f %7.3f..%.3f\n", arm, median(v, R), median(q, R), lo, hi, median(p, R), plo, phi
		}
	}' "$results"
