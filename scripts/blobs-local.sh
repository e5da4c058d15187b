#!/usr/bin/env bash
# The local half of rebuilding the kernel blobs (ptx/README.md):
#   scripts/blobs-local.sh prepare          build .gpu/ptxgen and .gpu/ptxcheck (CGO_ENABLED=0) to carry
#   scripts/blobs-local.sh install TARBALL  check the blobs.tar.gz (or .tar) that scripts/blobs-remote.sh made,
#                                           replace ptx/blobs with it, and check the embedded blobs
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:-}
case "$cmd" in
prepare)
	mkdir -p .gpu
	CGO_ENABLED=0 go build -o .gpu/ptxgen ./tools/ptxgen
	CGO_ENABLED=0 go build -o .gpu/ptxcheck ./tools/ptxcheck
	ls -l .gpu/ptxgen .gpu/ptxcheck
	echo 'next, on the GPU machine: run(command="bash scripts/blobs-remote.sh", carry=[".gpu/ptxgen", ".gpu/ptxcheck"])'
	;;
install)
	tarball=${2:?usage: scripts/blobs-local.sh install TARBALL}
	[ -f "$tarball" ] || { echo "blobs-local: no such file: $tarball" >&2; exit 2; }
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	tar -xf "$tarball" -C "$tmp"
	if [ ! -f "$tmp/manifest.json" ]; then
		echo "blobs-local: $tarball has no manifest.json (a failed ptxgen run?); nothing installed" >&2
		exit 1
	fi
	echo "== ptxcheck on the new blobs"
	go run ./tools/ptxcheck -v "$tmp"
	echo "== replacing ptx/blobs"
	find ptx/blobs -maxdepth 1 -type f -delete
	find "$tmp" -maxdepth 1 -type f ! -name 'manifest.rejected.json' -exec cp {} ptx/blobs/ \;
	ls -l ptx/blobs
	echo "== ptxcheck on the embedded blobs"
	go run ./tools/ptxcheck -v
	;;
*)
	echo "usage: scripts/blobs-local.sh prepare | install TARBALL" >&2
	exit 2
	;;
esac
