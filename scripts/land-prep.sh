#!/usr/bin/env bash
# land-prep.sh: everything here that comes before the device call of scripts/land-check.sh, in one command:
#   1. .gpu/kcp-a: kcp as committed (A's runs, for staged patches that change a kernel's arguments);
#   2. scripts/land-v4.sh: every ptx/staging/*.patch (and *.cu) into the tree;
#   3. the emulator tests of the kernels the patches touch (scripts/staged-emu.sh's default set);
#   4. scripts/gpu.sh build and a pack of kcp, kcp.test, ptxgen and kcp-a.
# Then: run(command="WIDTH=1 bash scripts/land-check.sh", carry=[".gpu/pack.tgz"]). Install B's blobs only
# where every check passed and no stage got slower (scripts/blobs-local.sh install FILES_AT/blobs-b.tar.gz,
# go test ./ptx ./kcp); otherwise `git apply -R` the slower patch from the tree (git show HEAD:ptx/staging/X)
# and build again. Stops at the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! git diff --quiet || ! git diff --cached --quiet; then
	echo "land-prep: the working tree has uncommitted changes; commit or stash them first" >&2
	exit 1
fi
mkdir -p .gpu
CGO_ENABLED=0 go build -ldflags='-s -w' -o .gpu/kcp-a ./tools/kcp
echo "land-prep: .gpu/kcp-a built at $(git rev-parse --short HEAD)"
bash scripts/land-v4.sh
go test ./ptx/cpuemu -count=1 -run 'WGMMA|MMA16|MMABackward|MMA5|DvLocal|MMAPrep|PlaneWalks|TapePlanes|TapeFormer|Folded|KernelSyntax'
go build ./... && go vet ./...
bash scripts/gpu.sh build >/dev/null
bash scripts/gpu.sh pack kcp kcp.test ptxgen kcp-a
echo 'land-prep: ready: run(command="WIDTH=1 bash scripts/land-check.sh", carry=[".gpu/pack.tgz"])'
echo 'land-prep: the tree now holds the staged patches applied to ptx/src and removed from ptx/staging (and from' \
	'the index): commit nothing with git add -A until the landing is decided (install and commit, or git checkout' \
	'ptx/src && git checkout HEAD -- ptx/staging)'
