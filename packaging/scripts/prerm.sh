#!/bin/sh
# Before the files go (deb: prerm remove; rpm: %preun 0), not on an upgrade: the units stop,
# and the XDP forwarder and the backend agent are detached from each interface they hold
# under their default pin roots (a stopped stickylb-xdp@ or stickylb-backend@ leaves its
# program running; with the package gone nothing would manage it).
set -e
case "$1" in
remove|0) ;;
*) exit 0 ;;
esac
[ -n "${DPKG_ROOT:-}" ] && exit 0
if [ -d /run/systemd/system ]; then
	systemctl stop stickylb-xds.service 'stickylb-xdp@*.service' 'stickylb-backend@*.service' || true
fi
for dir in /sys/fs/bpf/stickylb/*/; do
	[ -e "${dir}link" ] || continue
	iface=$(basename "$dir")
	if stickylb xdp detach --iface "$iface"; then
		echo "stickylb: detached the XDP forwarder from $iface"
	fi
done
for dir in /sys/fs/bpf/stickylb-backend/*/; do
	[ -e "${dir}link" ] || continue
	iface=$(basename "$dir")
	if stickylb backend detach --iface "$iface"; then
		echo "stickylb: detached the backend agent from $iface"
	fi
done
exit 0
