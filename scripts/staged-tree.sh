#!/usr/bin/env bash
# staged-tree.sh DIR: a copy of the working tree (tracked and untracked files, not ignored ones) in DIR, with
# every ptx/staging/*.patch applied (git apply, in glob order: a patch may touch ptx/src, the emulator tests
# and kcp together) and every ptx/staging/*.cu added to ptx/src: the tree as the next blob build will see it.
# The working tree is not touched. Used by staged-emu.sh and nvcc-check.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:?usage: staged-tree.sh DIR}
mkdir -p "$work"
(cd "$root" && git ls-files -co --exclude-standard -z |
	while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done | xargs -0 cp --parents -t "$work")
shopt -s nullglob
n=0
for p in "$work"/ptx/staging/*.patch; do
	(cd "$work" && git apply "$p") || { echo "staged-tree: $(basename "$p") does not apply" >&2; exit 1; }
	echo "staged-tree: applied $(basename "$p")"
	n=$((n + 1))
done
for f in "$work"/ptx/staging/*.cu; do
	cp "$f" "$work/ptx/src/"
	echo "staged-tree: added $(basename "$f") to ptx/src"
	n=$((n + 1))
done
[ "$n" -gt 0 ] || echo "staged-tree: nothing staged: the tree as it is"
