#!/usr/bin/env bash
# staged-emu.sh: the CPU emulator tests on the kernels as the next blob build will see them: a scratch copy of
# ptx/src with every ptx/staging/*.patch applied (git apply, in glob order) and every ptx/staging/*.cu added,
# then `go test ./ptx/cpuemu` with CPUEMU_SRC pointing at it. ptx/src and the blobs are not touched.
#
#   scripts/staged-emu.sh [go test flags...]    # default: -run 'WGMMA|MMA16|MMABackward'
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/ptx"
cp -r "$root/ptx/src" "$work/ptx/src"
shopt -s nullglob
n=0
for p in "$root"/ptx/staging/*.patch; do
	(cd "$work" && git apply "$p") || { echo "staged-emu: $(basename "$p") does not apply to ptx/src" >&2; exit 1; }
	echo "staged-emu: applied $(basename "$p")"
	n=$((n + 1))
done
for f in "$root"/ptx/staging/*.cu; do
	cp "$f" "$work/ptx/src/"
	echo "staged-emu: added $(basename "$f")"
	n=$((n + 1))
done
[ "$n" -gt 0 ] || echo "staged-emu: nothing staged: testing ptx/src as it is"
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-run 'WGMMA|MMA16|MMABackward')
cd "$root"
CPUEMU_SRC="$work/ptx/src" go test ./ptx/cpuemu -count=1 "${args[@]}"
