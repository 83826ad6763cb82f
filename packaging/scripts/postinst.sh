#!/bin/sh
# After the files are in place (deb: postinst configure; rpm: %post 1 or 2): the system user
# of stickylb-xds.service, systemd told of the units, and running units restarted on an
# upgrade (stickylb-xdp@ adopts its pinned program and maps: no flow drops; stickylb-backend@
# replaces its TC program in place, through its pinned link). Nothing is
# enabled or started on a first install: the pools file comes first.
# DPKG_ROOT is honoured (dpkg --root with --force-script-chrootless runs this from the host
# for another root): the user is made in that root's files, and systemd is left alone.
set -e
upgrade=
case "$1" in
configure) [ -n "$2" ] && upgrade=1 ;;
1) ;;
2) upgrade=1 ;;
*) exit 0 ;;
esac
root="${DPKG_ROOT:-}"
if command -v systemd-sysusers >/dev/null 2>&1; then
	systemd-sysusers --root="${root:-/}" stickylb.conf
else
	# Exit status 9: the user exists already.
	useradd ${root:+--prefix "$root"} --system --user-group --no-create-home \
		--home-dir /nonexistent --shell /usr/sbin/nologin --comment "stickylb control plane" stickylb || [ $? -eq 9 ]
fi
if [ -z "$root" ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
	if [ -n "$upgrade" ]; then
		systemctl try-restart stickylb-xds.service 'stickylb-xdp@*.service' 'stickylb-backend@*.service' || true
	fi
fi
exit 0
