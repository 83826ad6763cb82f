#!/usr/bin/env bash
# Builds the packages and the image (scripts/package.sh) and checks each with the tool that
# consumes it. CI runs it as root on a fresh clone (.ci/run); it installs what it needs.
#  1. the binary: `stickylb version` names the checkout's revision (package.sh refuses otherwise)
#  2. the .deb: dpkg-deb --info and --contents list what is expected; lintian reports no error
#     (its warnings are printed)
#  3. the .rpm: rpm lists the same files, less the Debian-only ones, and the same scripts
#  4. dpkg --root: the package installs, removes and purges cleanly into an empty root; the
#     maintainer scripts run from this machine with DPKG_ROOT set (--force-script-chrootless)
#     and make the system user in that root's files
#  5. systemd: a container booted with systemd as its PID 1 (systemd-nspawn on an overlay of
#     this machine's root, private network) installs the .deb, runs each daemon by hand and from
#     its packaged unit, checks they behave the same (Caddy too, under a caddy.service with the
#     package's drop-in), and purges it (packaging/test/in-systemd.sh)
#  6. the image: buildah builds dist/Dockerfile on scratch and runs `stickylb version` in it
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo; echo "-- $*"; }

need=()
for tool in lintian:lintian buildah:buildah rpm:rpm systemd-nspawn:systemd-container curl:curl python3:python3 \
	ip:iproute2 sysctl:procps; do
	command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool##*:}")
done
if [ ${#need[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
		{ apt-get update -qq && apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }
fi

step "scripts/package.sh"
./scripts/package.sh
deb=$(ls dist/stickylb_*.deb)
rpm=$(ls dist/stickylb-*.rpm)
dist/stickylb version

# What the package holds (files; directories follow from them). The rpm holds the same
# without the Debian-only files (changelog.Debian.gz, the lintian override).
expected=$(
	cat <<'EOF'
/etc/stickylb/pools.yaml
/usr/bin/stickylb
/usr/lib/systemd/system/stickylb-backend@.service
/usr/lib/systemd/system/stickylb-xdp@.service
/usr/lib/systemd/system/stickylb-xds.service
/usr/lib/sysusers.d/stickylb.conf
/usr/share/doc/stickylb/README.md
/usr/share/doc/stickylb/changelog.Debian.gz
/usr/share/doc/stickylb/changelog.gz
/usr/share/doc/stickylb/copyright
/usr/share/doc/stickylb/examples/caddy.service.d/stickylb.conf
/usr/share/doc/stickylb/examples/envoy/bootstrap.yaml
/usr/share/doc/stickylb/examples/grafana/stickylb.json
/usr/share/doc/stickylb/examples/prometheus/alerts.yaml
/usr/share/doc/stickylb/install.md
/usr/share/lintian/overrides/stickylb
EOF
)
debian_only='/usr/share/doc/stickylb/changelog.Debian.gz|/usr/share/lintian/overrides/stickylb'

step "dpkg-deb --info"
info=$(dpkg-deb --info "$deb")
echo "$info"
for want in "Package: stickylb" "Version: $(cat dist/pkgversion)-1" "Architecture: $(go env GOARCH)" "Section: net"; do
	grep -qx " $want" <<<"$info" || { echo "dpkg-deb --info: no \"$want\"" >&2; exit 1; }
done
for f in postinst prerm postrm conffiles; do
	grep -qE "^ +[0-9]+ bytes, +[0-9]+ lines +\*? +$f\b" <<<"$info" || { echo "dpkg-deb --info: no $f" >&2; exit 1; }
done
[ "$(dpkg-deb --ctrl-tarfile "$deb" | tar -xOf - ./conffiles)" = /etc/stickylb/pools.yaml ] ||
	{ echo "conffiles is not /etc/stickylb/pools.yaml" >&2; exit 1; }

step "dpkg-deb --contents"
got=$(dpkg-deb --contents "$deb" | awk '$1 !~ /^d/ {sub(/^\./, "", $6); print $6}' | sort)
if [ "$got" != "$expected" ]; then
	echo "the .deb holds:"; echo "$got"; echo "expected:"; echo "$expected"
	diff <(echo "$expected") <(echo "$got") || true
	exit 1
fi
dpkg-deb --contents "$deb" | awk '{print $1, $2, $6}'

step "lintian"
# Errors (E:) fail the step; warnings and the overridden tags are printed (docs/install.md
# lists them). Exit status 2 is lintian's for tags at or above --fail-on (here every tag, the
# overridden ones included); anything else but 0 is lintian failing.
status=0
out=$(lintian --fail-on error --tag-display-limit 0 --show-overrides "$deb" 2>&1) || status=$?
grep -v 'running with root privileges' <<<"$out"
[ "$status" -eq 0 ] || [ "$status" -eq 2 ] || { echo "lintian exited $status" >&2; exit 1; }
! grep -q '^E:' <<<"$out" || { echo "lintian reports errors" >&2; exit 1; }

step "rpm"
rpm -qip "$rpm" | grep -E '^(Name|Version|Release|Architecture|License) '
got=$(rpm -qlpv "$rpm" | awk '$1 !~ /^d/ {print $NF}' | sort)
want=$(grep -vE "^($debian_only)$" <<<"$expected")
[ "$got" = "$want" ] || { echo "the .rpm holds:"; echo "$got"; diff <(echo "$want") <(echo "$got"); exit 1; }
for s in postinstall preuninstall postuninstall; do
	rpm -qp --scripts "$rpm" | grep -q "^$s scriptlet" || { echo "the .rpm has no $s scriptlet" >&2; exit 1; }
done
echo "the .rpm holds the .deb's files less the Debian-only ones, and its three scriptlets"

step "dpkg --root: install, remove, purge into an empty root"
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/var/lib/dpkg/{info,updates,triggers}
touch "$root/var/lib/dpkg/status"
dpkgr() { dpkg --root="$root" --force-script-chrootless --log=/dev/null "$@"; }
dpkgr -i "$deb"
grep -q '^stickylb:x:[0-9]*:[0-9]*:stickylb control plane:/nonexistent:/usr/sbin/nologin$' "$root/etc/passwd" ||
	{ echo "postinst made no stickylb user in the root's /etc/passwd" >&2; exit 1; }
[ "$(dpkgr -L stickylb | grep -c '^/')" -gt 15 ]
dpkgr -r stickylb
left=$(cd "$root" && find . -path ./var/lib/dpkg -prune -o -type f -print | sort)
[ "$left" = "$(printf '%s\n' ./etc/.pwd.lock ./etc/group ./etc/gshadow ./etc/passwd ./etc/shadow ./etc/stickylb/pools.yaml)" ] ||
	{ echo "after remove:"; echo "$left"; exit 1; }
dpkgr -P stickylb
left=$(cd "$root" && find . -path ./var/lib/dpkg -prune -o -print | sort)
[ "$left" = "$(printf '%s\n' . ./etc ./etc/.pwd.lock ./etc/group ./etc/gshadow ./etc/passwd ./etc/shadow ./var ./var/lib)" ] ||
	{ echo "after purge:"; echo "$left"; exit 1; }
echo "installed, removed (the conffile stays), purged (only the user's entries stay)"

step "systemd: the package in a container booted with systemd as PID 1"
# The container's root is this machine's root under an overlay whose upper layer is a tmpfs,
# in a mount namespace of its own: nothing the container writes reaches this machine. The
# container gets its own network namespace, a fresh bpffs at /sys/fs/bpf, and the
# capabilities the XDP unit asks for (nspawn's default set lacks CAP_BPF and CAP_PERFMON).
# It boots into stickylb-check.target: basic.target and the check, nothing this machine enables.
# A Caddy with stickylb's modules, for the drop-in's check.
caddydir=$(mktemp -d)
trap 'rm -rf "$root" "$caddydir"' EXIT
caddy=$caddydir/caddy
go build -o "$caddy" ./cmd/caddy
unshare --mount --propagation private bash -s "$deb" "$caddy" <<'EOF'
set -euo pipefail
w=$(mktemp -d)
mount -t tmpfs tmpfs "$w"
mkdir -p "$w/upper/etc/systemd/system" "$w/upper/usr/local/sbin" "$w/work" "$w/root" "$w/shared" "$w/bpf"
mount -t bpf bpf "$w/bpf"
systemd-id128 new >"$w/upper/etc/machine-id"
cp "$1" "$w/shared/stickylb.deb"
cp "$2" "$w/shared/caddy"
install -m 0755 packaging/test/in-systemd.sh "$w/upper/usr/local/sbin/stickylb-check"
cat >"$w/upper/etc/systemd/system/stickylb-check.service" <<'UNIT'
[Unit]
After=basic.target
[Service]
Type=oneshot
ExecStart=/usr/local/sbin/stickylb-check
UNIT
cat >"$w/upper/etc/systemd/system/stickylb-check.target" <<'UNIT'
[Unit]
Requires=basic.target stickylb-check.service
After=basic.target
AllowIsolate=yes
UNIT
mount -t overlay overlay -o "lowerdir=/,upperdir=$w/upper,workdir=$w/work" "$w/root"
status=0
timeout 300 systemd-nspawn -D "$w/root" --register=no --keep-unit --quiet --private-network \
	--capability=CAP_BPF,CAP_PERFMON,CAP_NET_ADMIN --system-call-filter=bpf \
	--bind="$w/shared:/shared" --bind="$w/bpf:/sys/fs/bpf" \
	--boot -- systemd.unit=stickylb-check.target </dev/null >"$w/console" 2>&1 || status=$?
cat "$w/shared/log" 2>/dev/null || { echo "no log; the console:"; tail -50 "$w/console"; }
[ "$status" -eq 0 ] || { echo "the container exited $status" >&2; exit 1; }
EOF

step "the container image (buildah, scratch)"
store=$(mktemp -d)
trap 'rm -rf "$root" "$caddydir"; buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs rm -a >/dev/null 2>&1; rm -rf "$store"' EXIT
B=(buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs)
"${B[@]}" bud --quiet --isolation chroot -t stickylb:check dist/
"${B[@]}" inspect --format 'user {{.OCIv1.Config.User}}, entrypoint {{.OCIv1.Config.Entrypoint}}, cmd {{.OCIv1.Config.Cmd}}{{"\n"}}' stickylb:check
[ "$("${B[@]}" inspect --format '{{.OCIv1.Config.User}}' stickylb:check)" = 65532:65532 ] || { echo "the image does not run as 65532" >&2; exit 1; }
ctr=$("${B[@]}" from stickylb:check)
in_image=$("${B[@]}" run --isolation chroot "$ctr" -- /usr/bin/stickylb version)
echo "$in_image"
[ "$in_image" = "$(dist/stickylb version)" ] || { echo "the image's stickylb version differs from dist/stickylb's" >&2; exit 1; }
echo "check-package: every check passed"
