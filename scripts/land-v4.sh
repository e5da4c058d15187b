#!/usr/bin/env bash
# Lands whatever waits in ptx/staging (kernels and patches proven on the CPU emulator, not yet built into
# the blobs) in ptx/src, so that the next blob build holds them. (Named after its first use, the v4 / v5
# tensor-core kernels, landed on 2026-12-01: docs/mma-kernels.md.)
#
#   scripts/land-v4.sh [FILE.cu ...]   # default: every .cu of ptx/staging (known ones in dependency order)
#
# With nothing staged (no ptx/staging/*.cu, no ptx/staging/*.patch, or no ptx/staging at all) it says so and
# exits 0. Otherwise, first every ptx/staging/*.patch (made with git diff from the root) is applied (git
# apply) and removed. For each file: git mv to ptx/src; its includes of ../src/X become X; an #include of it
# joins ptx/src/gdnkcp.cu (before util.cu); the cpuemu runner's #include "../../staging/F" becomes "F" (the
# emulator compiles with -I ptx/src) and the Go test's const "../staging/F" becomes "../src/F"; comments
# naming ptx/staging/F name ptx/src/F. It stops at the first thing it does not find as expected, and
# removes ptx/staging once it is empty.
#
# Afterwards, here: `go test ./ptx/cpuemu` (the emulator tests of the moved kernels must pass as before);
# `go test ./ptx` fails on the manifest's sources hash until the blobs are rebuilt. Then on the GPU machine
# (see scripts/dev-cycle.sh): scripts/gpu.sh build && scripts/blobs-local.sh prepare, the GPU tests and the
# bench in one device call, scripts/blobs-local.sh install FILES_AT/blobs.tar.gz; then commit sources, blobs
# and manifest together, and update the kernels' design notes (docs/) and docs/perf-notes.md.
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.."
order=(gdn_walk_mma.cu gdn_bwalk_mma.cu gdn_prep_mma.cu gdn_output_mma.cu gdn_dvlocal_mma.cu gdn_chunk_grads_mma.cu gdn_chunk_grads_mma5.cu)
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
	for f in "${order[@]}"; do [ -f "ptx/staging/$f" ] && files+=("$f"); done
	for f in ptx/staging/*.cu; do
		b=$(basename "$f")
		[[ " ${order[*]} " == *" $b "* ]] || files+=("$b")
	done
fi
# Staged changes to kernels already in ptx/src (ptx/staging/*.patch, made with git diff from the root)
# go in first: ptx/src must keep matching the committed blobs until the blobs are rebuilt.
patched=0
for p in ptx/staging/*.patch; do
	[ -e "$p" ] || continue
	git apply "$p" || { echo "land-v4: $p does not apply" >&2; exit 1; }
	git rm -q "$p"
	echo "land-v4: applied $p"
	patched=$((patched + 1))
done
if [ ${#files[@]} -eq 0 ]; then
	if [ "$patched" -gt 0 ]; then
		echo "land-v4: $patched patch(es) applied, no kernel staged in ptx/staging"
	else
		echo "land-v4: nothing staged in ptx/staging (no .cu, no .patch): nothing to land"
	fi
	if [ -d ptx/staging ]; then
		rmdir ptx/staging 2>/dev/null || echo "land-v4: ptx/staging keeps: $(ls ptx/staging | tr '\n' ' ')"
	fi
	exit 0
fi
for f in "${files[@]}"; do
	src=ptx/staging/$f
	[ -f "$src" ] || { echo "land-v4: $src does not exist" >&2; exit 1; }
	[ ! -e "ptx/src/$f" ] || { echo "land-v4: ptx/src/$f exists already" >&2; exit 1; }
	git mv "$src" "ptx/src/$f"
	sed -i 's|#include "\.\./src/|#include "|' "ptx/src/$f"
	if grep -q '\.\./' "ptx/src/$f"; then
		echo "land-v4: ptx/src/$f still includes a relative path:" >&2
		grep -n '\.\./' "ptx/src/$f" >&2
		exit 1
	fi
	grep -q "^#include \"$f\"" ptx/src/gdnkcp.cu || sed -i "s|^#include \"util.cu\"|#include \"$f\"\n#include \"util.cu\"|" ptx/src/gdnkcp.cu
	grep -q "^#include \"$f\"" ptx/src/gdnkcp.cu || { echo "land-v4: could not add $f to ptx/src/gdnkcp.cu" >&2; exit 1; }
	hits=$(grep -l "staging/$f" ptx/cpuemu/*.go ptx/cpuemu/testdata/*.cpp 2>/dev/null || true)
	for h in $hits; do
		sed -i "s|#include \"\.\./\.\./staging/$f\"|#include \"$f\"|; s|\"\.\./staging/$f\"|\"../src/$f\"|; s|ptx/staging/$f|ptx/src/$f|g" "$h"
	done
	echo "land-v4: $f -> ptx/src ($(echo $hits | wc -w) emulator files updated)"
done
rmdir ptx/staging 2>/dev/null || echo "land-v4: ptx/staging keeps: $(ls ptx/staging | tr '\n' ' ')"
echo "land-v4: ptx/src/gdnkcp.cu now includes:"
grep '^#include' ptx/src/gdnkcp.cu
