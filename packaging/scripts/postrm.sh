#!/bin/sh
# After the files are gone (deb: postrm; rpm: %postun). On purge, the units' enablement links
# go too. The stickylb user stays (files it owned may remain). Honours DPKG_ROOT.
set -e
root="${DPKG_ROOT:-}"
if [ "$1" = purge ]; then
	rm -f "$root"/etc/systemd/system/*.wants/stickylb-xds.service \
		"$root"/etc/systemd/system/*.wants/stickylb-xdp@*.service \
		"$root"/etc/systemd/system/*.wants/stickylb-backend@*.service
	rmdir "$root/etc/stickylb" 2>/dev/null || true
fi
if [ -z "$root" ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
exit 0
