#!/bin/sh
# Runs inside a container that scripts/check-package.sh boots with systemd as PID 1 (an
# overlay of the host's root, systemd-nspawn, a private network): installs the .deb, runs
# each daemon by hand and then from its packaged unit, and checks that both behave the same;
# then purges the package. Ends the container with `systemctl exit STATUS` (0 when every
# check passed); everything it prints goes to /shared/log.
set -u
exec >/shared/log 2>&1
step() { echo; echo "== $*"; }
fail() {
	echo "FAIL: $*"
	for f in /run/*.log; do
		[ -e "$f" ] && echo "--- $f" && tail -20 "$f"
	done
	journalctl --no-pager -n 40 -u 'stickylb-*'
	systemctl exit 1
	exit 1
}
# wait_for CMD: until CMD (evaluated here, so it may call the functions below) succeeds, for
# 20 s at most (a daemon's first health verdicts need 1-2 s).
wait_for() {
	n=0
	until eval "$1" >/dev/null 2>&1; do
		n=$((n + 1))
		[ $n -le 200 ] || fail "waited 20 s for: $1 (the status pages: $(verdicts 127.0.0.1:18001; verdicts 127.0.0.1:9100))"
		sleep 0.1
	done
}
# verdicts ADDR: each backend's health on the status page at ADDR, one "service backend state" a line.
verdicts() {
	curl -sf "http://$1/status.json" | python3 -c '
import json, sys
for s in json.load(sys.stdin)["services"]:
    for b in s["backends"]:
        print(s["name"], b["id"], b["health"]["state"])' | sort
}
# decided ADDR N: N backends have a verdict other than unknown.
decided() { [ "$(verdicts "$1" | grep -cv ' unknown$')" -ge "$2" ]; }
# proc_status UNIT FIELD: a field of /proc/PID/status of the unit's main process.
proc_status() {
	pid=$(systemctl show -P MainPID "$1")
	[ "$pid" -gt 0 ] || fail "$1 has no main process"
	sed -n "s/^$2:[[:space:]]*//p" "/proc/$pid/status"
}

step "install: dpkg -i, maintainer scripts with systemd running"
dpkg -i /shared/stickylb.deb || fail "dpkg -i"
getent passwd stickylb || fail "no stickylb user"
systemctl cat stickylb-xds.service >/dev/null || fail "systemd does not know stickylb-xds.service"
stickylb version

step "systemd-analyze verify"
# verify exits 0 on an unknown key or a bad value and only prints them: any output fails.
out=$(systemd-analyze verify /usr/lib/systemd/system/stickylb-xds.service /usr/lib/systemd/system/stickylb-xdp@.service \
	/usr/lib/systemd/system/stickylb-backend@.service 2>&1) || fail "verify: $out"
[ -z "$out" ] || fail "verify said: $out"
echo ok

step "systemd-analyze security"
# The exposure score, and what each unit still leaves open (docs/install.md quotes them).
for unit in stickylb-xds.service stickylb-xdp@t0.service stickylb-backend@t2.service; do
	systemd-analyze security --no-pager "$unit" >/run/security.txt
	tail -1 /run/security.txt
	grep '✗' /run/security.txt | sed 's/^/    /'
done

# A control plane's pools file: a gRPC service checked over TCP (one backend is the admin
# listener itself, one port is closed) and a UDP service checked by ICMP (the default for
# udp; the ping socket is refused here, as on Debian, so the probe needs CAP_NET_RAW).
cat >/etc/stickylb/pools.yaml <<'EOF'
services:
  - name: api
    protocol: grpc
    health_check: {protocol: tcp, interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}
    backends:
      - {address: 127.0.0.1:18001}
      - {address: 127.0.0.1:19002}
  - name: dns
    protocol: udp
    listen: 127.0.0.1:5353
    health_check: {interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}
    backends:
      - {address: 127.0.0.1:53}
EOF
sysctl net.ipv4.ping_group_range

step "stickylb xds by hand (root)"
stickylb xds --pools /etc/stickylb/pools.yaml --listen 0.0.0.0:18000 --admin 127.0.0.1:18001 2>/run/xds-hand.log &
hand=$!
wait_for "curl -sf http://127.0.0.1:18001/healthz"
wait_for "decided 127.0.0.1:18001 3"
verdicts 127.0.0.1:18001 | tee /run/xds-hand.verdicts
kill -TERM $hand
wait $hand

step "stickylb-xds.service"
systemctl start stickylb-xds.service || fail "start"
wait_for "curl -sf http://127.0.0.1:18001/healthz"
wait_for "decided 127.0.0.1:18001 3"
verdicts 127.0.0.1:18001 | tee /run/xds-unit.verdicts
cmp /run/xds-hand.verdicts /run/xds-unit.verdicts || fail "the unit's verdicts differ from the hand-started daemon's"
grep -q '^api 127.0.0.1:18001 healthy$' /run/xds-unit.verdicts && grep -q '^api 127.0.0.1:19002 unhealthy$' /run/xds-unit.verdicts &&
	grep -q '^dns 127.0.0.1:53 healthy$' /run/xds-unit.verdicts || fail "unexpected verdicts"
uid=$(proc_status stickylb-xds.service Uid | cut -f1)
[ "$uid" = "$(id -u stickylb)" ] || fail "runs as uid $uid"
caps=$(proc_status stickylb-xds.service CapEff)
echo "uid $uid, CapEff $caps, NoNewPrivs $(proc_status stickylb-xds.service NoNewPrivs)"
[ "$caps" = 0000000000002400 ] || fail "CapEff $caps, want CAP_NET_BIND_SERVICE and CAP_NET_RAW (0x2400)"
[ "$(proc_status stickylb-xds.service NoNewPrivs)" = 1 ] || fail "NoNewPrivs"
curl -sf http://127.0.0.1:18001/metrics | grep '^stickylb_build_info' || fail "no stickylb_build_info"
# The pools file is polled: an edit is served without a reload command.
sed -i 's/      - {address: 127.0.0.1:19002}/      - {address: 127.0.0.1:19002}\n      - {address: 127.0.0.1:19003}/' /etc/stickylb/pools.yaml
wait_for "curl -sf http://127.0.0.1:18001/status.json | grep -q 127.0.0.1:19003"
echo "edit served"
systemctl stop stickylb-xds.service

step "XDP: a veth pair, a pools file with one VIP"
ip link add t0 type veth peer name t1 || fail "veth"
ip addr add 10.200.0.1/24 dev t0
ip link set t0 up
ip link set t1 up
mkdir -p /run/stickylb-test
cat >/run/stickylb-test/xdp.yaml <<'EOF'
services:
  - name: edge
    protocol: tcp
    vip: 10.200.100.1:80
    affinity: {mode: none}
    balance: maglev
    health_check: {protocol: tcp, interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}
    backends:
      - {address: 10.200.0.77:80, mac: "02:00:00:00:00:77"}
      - {address: 10.200.0.78:80, mac: "02:00:00:00:00:78"}
  - name: dns
    protocol: udp
    vip: 10.200.100.2:53
    health_check: {interval: 1s, timeout: 500ms, healthy_threshold: 1, unhealthy_threshold: 1}
    backends:
      - {address: 10.200.0.1:53, mac: "02:00:00:00:00:01"}
  # NAT: the loader turns on forwarding on the interface and reserves the NAT ports in
  # /proc/sys, which the unit's sandbox must let it write.
  - name: nat
    protocol: tcp
    vip: 10.200.100.3:80
    forwarding: nat
    backends:
      - {address: 10.200.0.50:8080}
EOF
cat >/etc/default/stickylb-xdp-t0 <<'EOF'
STICKYLB_XDP_SOURCE="--pools /run/stickylb-test/xdp.yaml"
STICKYLB_XDP_OPTS="--metrics 127.0.0.1:9100 --nat-source 10.200.0.1"
EOF

step "stickylb xdp by hand (root, every capability)"
stickylb xdp --iface t0 --pin-root /sys/fs/bpf/stickylb --pools /run/stickylb-test/xdp.yaml --metrics 127.0.0.1:9100 --nat-source 10.200.0.1 >/run/xdp-hand.out 2>/run/xdp-hand.log &
hand=$!
wait_for "grep -q ready /run/xdp-hand.out"
wait_for "decided 127.0.0.1:9100 3"
verdicts 127.0.0.1:9100 | tee /run/xdp-hand.verdicts
stickylb xdp tables --iface t0 | tee /run/xdp-hand.tables
kill -TERM $hand
wait $hand
ip link show t0 | grep -q xdp || fail "the program left with the hand-started loader"

step "stickylb-xdp@t0.service (adopts what the hand-started loader pinned)"
systemctl start stickylb-xdp@t0.service || fail "start"
wait_for "curl -sf http://127.0.0.1:9100/metrics"
wait_for "decided 127.0.0.1:9100 3"
verdicts 127.0.0.1:9100 | tee /run/xdp-unit.verdicts
stickylb xdp tables --iface t0 | tee /run/xdp-unit.tables
cmp /run/xdp-hand.verdicts /run/xdp-unit.verdicts || fail "the unit's verdicts differ from the hand-started loader's"
cmp /run/xdp-hand.tables /run/xdp-unit.tables || fail "the unit's tables differ from the hand-started loader's"
grep -q '^dns 10.200.0.1:53 healthy$' /run/xdp-unit.verdicts || fail "the ICMP check does not pass under the unit"
journalctl -u stickylb-xdp@t0.service --no-pager | grep -q "adopted the running forwarder" || fail "the unit did not adopt the pinned forwarder"
caps=$(proc_status stickylb-xdp@t0.service CapEff)
echo "uid $(proc_status stickylb-xdp@t0.service Uid | cut -f1), CapEff $caps"
# CAP_NET_ADMIN 12, CAP_NET_RAW 13, CAP_PERFMON 38, CAP_BPF 39.
[ "$caps" = 000000c000003000 ] || fail "CapEff $caps, want CAP_BPF CAP_PERFMON CAP_NET_ADMIN CAP_NET_RAW (0xc000003000)"
curl -sf http://127.0.0.1:9100/metrics | grep '^stickylb_build_info' || fail "no stickylb_build_info"
systemctl restart stickylb-xdp@t0.service || fail "restart"
wait_for "curl -sf http://127.0.0.1:9100/metrics"

step "stickylb-xdp@t0.service from nothing: it attaches, and writes NAT's sysctls itself"
systemctl stop stickylb-xdp@t0.service
stickylb xdp detach --iface t0 || fail "detach"
sysctl -w net.ipv4.conf.t0.forwarding=0
[ -z "$(sysctl -n net.ipv4.ip_local_reserved_ports)" ] || fail "detach left reserved ports: $(sysctl -n net.ipv4.ip_local_reserved_ports)"
systemctl start stickylb-xdp@t0.service || fail "start"
wait_for "curl -sf http://127.0.0.1:9100/metrics"
wait_for "decided 127.0.0.1:9100 3"
stickylb xdp tables --iface t0 >/run/xdp-fresh.tables
cmp /run/xdp-hand.tables /run/xdp-fresh.tables || fail "the unit's fresh tables differ from the hand-started loader's"
[ "$(sysctl -n net.ipv4.conf.t0.forwarding)" = 1 ] || fail "the unit did not turn on forwarding for NAT"
sysctl net.ipv4.conf.t0.forwarding net.ipv4.ip_local_reserved_ports
[ "$(sysctl -n net.ipv4.ip_local_reserved_ports)" = 61000-65535 ] || fail "the unit did not reserve the NAT ports"
systemctl stop stickylb-xdp@t0.service
ip link show t0 | grep -q xdp || fail "stopping the unit detached the program"
echo "stopped; the program stays attached"

step "stickylb backend by hand, then stickylb-backend@t2.service (adopts the pinned agent)"
ip link add t2 type veth peer name t3 || fail "veth"
ip addr add 10.201.0.2/24 dev t2
ip link set t2 up
ip link set t3 up
cat >/etc/default/stickylb-backend-t2 <<'EOF'
STICKYLB_LB_SOURCE=10.201.0.1
STICKYLB_BACKEND_OPTS="--metrics 127.0.0.1:9200"
EOF
stickylb backend --iface t2 --lb-source 10.201.0.1 --metrics 127.0.0.1:9200 >/run/backend-hand.out 2>/run/backend-hand.log &
hand=$!
wait_for "grep -q ready /run/backend-hand.out"
curl -sf http://127.0.0.1:9200/metrics | grep '^stickylb_backend_packets_total{path="decap"}' || fail "the hand-started agent counts no decap path"
kill -TERM $hand
wait $hand
stickylb backend stats --iface t2 | grep -q '"refused"' || fail "the agent's counters left with the hand-started agent"
systemctl start stickylb-backend@t2.service || fail "start"
wait_for "curl -sf http://127.0.0.1:9200/metrics"
journalctl -u stickylb-backend@t2.service --no-pager | grep -q "adopted the running agent" || fail "the unit did not adopt the pinned agent"
caps=$(proc_status stickylb-backend@t2.service CapEff)
echo "uid $(proc_status stickylb-backend@t2.service Uid | cut -f1), CapEff $caps"
# CAP_NET_ADMIN 12, CAP_PERFMON 38, CAP_BPF 39.
[ "$caps" = 000000c000001000 ] || fail "CapEff $caps, want CAP_BPF CAP_PERFMON CAP_NET_ADMIN (0xc000001000)"
curl -sf http://127.0.0.1:9200/metrics | grep '^stickylb_build_info' || fail "no stickylb_build_info"
curl -sf http://127.0.0.1:9200/status.json | grep -q '"10.201.0.1/32"' || fail "status.json does not name the LB source"
systemctl stop stickylb-backend@t2.service
stickylb backend stats --iface t2 | grep -q '"decap"' || fail "stopping the unit removed the agent"
echo "stopped; the agent stays attached"

step "Caddy with the package's drop-in: the cookie secret as a credential"
# caddy.service as Caddy's packages install it (the parts that matter here), the caddy user,
# and a Caddy built with stickylb's modules (scripts/check-package.sh built /shared/caddy).
install -m 0755 /shared/caddy /usr/bin/caddy
useradd --system --user-group --create-home --home-dir /var/lib/caddy --shell /usr/sbin/nologin caddy || fail "useradd caddy"
mkdir -p /etc/caddy /etc/systemd/system/caddy.service.d
cat >/etc/systemd/system/caddy.service <<'UNIT'
[Unit]
Description=Caddy
After=network.target network-online.target
Requires=network-online.target
[Service]
Type=notify
User=caddy
Group=caddy
ExecStart=/usr/bin/caddy run --environ --config /etc/caddy/Caddyfile
ExecReload=/usr/bin/caddy reload --config /etc/caddy/Caddyfile --force
TimeoutStopSec=5s
LimitNOFILE=1048576
PrivateTmp=true
ProtectSystem=full
AmbientCapabilities=CAP_NET_ADMIN CAP_NET_BIND_SERVICE
[Install]
WantedBy=multi-user.target
UNIT
cp /usr/share/doc/stickylb/examples/caddy.service.d/stickylb.conf /etc/systemd/system/caddy.service.d/
head -c 48 /dev/urandom | base64 >/etc/caddy/stickylb.secrets
chmod 0600 /etc/caddy/stickylb.secrets
# caddyfile SECRET_FILE: a sticky site on :28080 in front of a backend on :28081.
caddyfile() {
	cat <<CADDYFILE
{
	admin localhost:2019
}
:28080 {
	reverse_proxy 127.0.0.1:28081 {
		lb_policy sticky_cookie {
			secret_file $1
		}
	}
}
:28081 {
	respond "backend"
}
CADDYFILE
}
caddyfile /etc/caddy/stickylb.secrets >/run/Caddyfile.hand
caddyfile '{env.CREDENTIALS_DIRECTORY}/stickylb.secrets' >/etc/caddy/Caddyfile
# set_cookie URL JAR: the Set-Cookie header of a GET (empty when none), with the jar sent.
set_cookie() { curl -s -o /dev/null -D - -b "$2" -c "$2" "$1" | tr -d '\r' | sed -n 's/^[Ss]et-[Cc]ookie: //p'; }

caddy run --config /run/Caddyfile.hand --adapter caddyfile 2>/run/caddy-hand.log &
hand=$!
wait_for "curl -sf http://127.0.0.1:28080/"
first=$(set_cookie http://127.0.0.1:28080/ /run/jar)
echo "by hand (root, the secret file itself): Set-Cookie: $first"
[ -n "$first" ] || fail "the hand-started Caddy set no cookie"
kill -TERM $hand
wait $hand

systemctl daemon-reload
systemctl start caddy.service || fail "start caddy.service"
wait_for "curl -sf http://127.0.0.1:28080/"
echo "caddy.service runs as uid $(proc_status caddy.service Uid | cut -f1) (caddy: $(id -u caddy)); the secret file is $(stat -c '%U %a' /etc/caddy/stickylb.secrets)"
again=$(set_cookie http://127.0.0.1:28080/ /run/jar)
[ -z "$again" ] || fail "caddy.service did not open the hand-started Caddy's cookie (it set a new one: $again)"
echo "the cookie the hand-started Caddy sealed opens under the unit: no new cookie"
[ -n "$(set_cookie http://127.0.0.1:28080/ /run/nojar)" ] || fail "caddy.service set no cookie for a new client"
systemctl reload caddy.service || fail "systemctl reload caddy (caddy reload)"
[ -z "$(set_cookie http://127.0.0.1:28080/ /run/jar)" ] || fail "after the reload the cookie does not open"
echo "reloaded; the cookie still opens"
systemctl stop caddy.service

step "purge: the units stop, the forwarder and the agent are detached, the files go"
dpkg -P stickylb || fail "dpkg -P"
ip link show t0 | grep -q xdp && fail "the program stays attached after the purge"
[ ! -e /sys/fs/bpf/stickylb-backend/t2 ] || fail "the backend agent stays pinned after the purge"
[ -z "$(sysctl -n net.ipv4.ip_local_reserved_ports)" ] || fail "the purge left NAT's reserved ports"
[ ! -e /usr/bin/stickylb ] && [ ! -e /etc/stickylb ] || fail "files left: $(ls -d /usr/bin/stickylb /etc/stickylb 2>/dev/null)"
systemctl cat stickylb-xds.service >/dev/null 2>&1 && fail "systemd still knows stickylb-xds.service"
echo
echo "PASS"
systemctl exit 0
