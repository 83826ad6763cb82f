#!/usr/bin/env bash
# Builds what stickylb ships, into dist/:
#   stickylb                    the static binary (CGO_ENABLED=0), stamped with the checkout's
#                               VCS revision, time and dirty flag (stickylb version shows them)
#   stickylb_VERSION-1_ARCH.deb the package (nfpm, packaging/nfpm.yaml): the binary, the systemd
#   stickylb-VERSION-1.ARCH.rpm units, /etc/stickylb/pools.yaml, the stickylb system user
#   ca-certificates.crt         the build machine's CA bundle, for the container image
#   Dockerfile, passwd, group   the image's recipe and its files (buildah bud dist/, docker build dist/)
#   pkgversion                  the packages' version (below)
# VERSION is the module version Go stamped, without its v: a tag (0.3.1), or for a commit past
# no tag its pseudo-version with ~ (0.0.0~20261204184014.af3075101ce5, sorting before 0.0.0).
#
# Run it from a clone: Go stamps VCS fields only where .git is a directory, and a git worktree
# has a .git file. GOFLAGS=-buildvcs=false in the environment is overridden.
set -euo pipefail
cd "$(dirname "$0")/.."
dist=dist
mkdir -p "$dist"

if [ ! -d .git ]; then
	echo "scripts/package.sh: $(pwd)/.git is not a directory (a git worktree?); Go stamps no VCS revision there: package from a clone" >&2
	exit 1
fi
arch=$(go env GOARCH)
CGO_ENABLED=0 go build -buildvcs=true -trimpath -ldflags='-s -w' -o "$dist/stickylb" ./cmd/stickylb

# The binary says what it is; the package's version is that, and nothing else.
version=$("$dist/stickylb" version | sed -n '1s/^stickylb //p')
revision=$("$dist/stickylb" version | sed -n 's/^  revision *//p')
if [ "$revision" != "$(git rev-parse HEAD)" ]; then
	echo "scripts/package.sh: the binary says revision $revision, the checkout is at $(git rev-parse HEAD)" >&2
	exit 1
fi
pkgversion=${version#v}
case "$pkgversion" in
*-*) pkgversion="${pkgversion%%-*}~$(echo "${pkgversion#*-}" | tr -- '-' '.')" ;;
esac

echo "$pkgversion" >"$dist/pkgversion"
gzip -9n <CHANGELOG.md >"$dist/changelog.gz"
maintainer=$(sed -n 's/^maintainer: //p' packaging/nfpm.yaml)
{
	echo "stickylb ($pkgversion-1) unstable; urgency=medium"
	echo
	echo "  * Built from revision $revision."
	echo "    The changes are in /usr/share/doc/stickylb/changelog.gz."
	echo
	echo " -- $maintainer  $(date -R -u -d "@$(git log -1 --format=%ct)")"
} | gzip -9n >"$dist/changelog.Debian.gz"
cp /etc/ssl/certs/ca-certificates.crt "$dist/ca-certificates.crt"
cp packaging/container/Dockerfile packaging/container/passwd packaging/container/group "$dist/"

# nfpm is built from MODULE@VERSION, outside this module's go.mod: as a tool of the module its
# requirements would raise versions the binaries link (viper, through GoBGP).
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
GOBIN=$tools go install github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.48.0
export STICKYLB_PKG_VERSION="$pkgversion"
for packager in deb rpm; do
	case "$packager/$arch" in
	deb/*) pkgarch=$arch ;;
	rpm/amd64) pkgarch=x86_64 ;;
	rpm/arm64) pkgarch=aarch64 ;;
	*) pkgarch=$arch ;;
	esac
	STICKYLB_PKG_ARCH=$pkgarch "$tools/nfpm" package --config packaging/nfpm.yaml --packager "$packager" --target "$dist/"
done
echo "scripts/package.sh: stickylb $version ($revision) -> $(ls "$dist"/*.deb "$dist"/*.rpm | tr '\n' ' ')"
