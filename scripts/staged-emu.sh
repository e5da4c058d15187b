#!/usr/bin/env bash
# staged-emu.sh: the CPU emulator tests on the tree as the next blob build will see it: a scratch copy of the
# working tree (tracked and untracked files, not ignored ones) with every ptx/staging/*.patch applied (git
# apply, in glob order: a patch may touch ptx/src, the emulator tests and kcp together) and every
# ptx/staging/*.cu added to ptx/src, then `go test ./ptx/cpuemu` there. The working tree is not touched.
#
#   scripts/staged-emu.sh [go test flags...]    # default: -run 'WGMMA|MMA16|MMABackward|MMA5'
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$root" && git ls-files -co --exclude-standard -z |
	while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done | xargs -0 cp --parents -t "$work")
shopt -s nullglob
n=0
for p in "$work"/ptx/staging/*.patch; do
	(cd "$work" && git apply "$p") || { echo "staged-emu: $(basename "$p") does not apply" >&2; exit 1; }
	echo "staged-emu: applied $(basename "$p")"
	n=$((n + 1))
done
for f in "$work"/ptx/staging/*.cu; do
	cp "$f" "$work/ptx/src/"
	echo "staged-emu: added $(basename "$f") to ptx/src"
	n=$((n + 1))
done
[ "$n" -gt 0 ] || echo "staged-emu: nothing staged: testing the tree as it is"
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-run 'WGMMA|MMA16|MMABackward|MMA5')
cd "$work"
go test ./ptx/cpuemu -count=1 "${args[@]}"
