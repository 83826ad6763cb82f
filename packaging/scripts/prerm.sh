#!/bin/sh
# Before the files go (deb: prerm remove; rpm: %preun 0), not on an upgrade: the units stop,
# and the XDP forwarder is detached from each interface it holds under the default pin root
# (a stopped stickylb-xdp@ leaves its program forwarding; with the package gone nothing would
# manage it).
set -e
case "$1" in
remove|0) ;;
*) exit 0 ;;
esac
[ -n "${DPKG_ROOT:-}" ] && exit 0
if [ -d /run/systemd/system ]; then
	systemctl stop stickylb-xds.service 'stickylb-xdp@*.service' || true
fi
for dir in /sys/fs/bpf/stickylb/*/; do
	[ -e "${dir}link" ] || continue
	iface=$(basename "$dir")
	if stickylb xdp detach --iface "$iface"; then
		echo "stickylb: detached the XDP forwarder from $iface"
	fi
done
exit 0
