#!/usr/bin/env bash
# walk-variants.sh: one device call that times compile-time variants of the wgmma walks, keeps the
# fastest one that does not spill, and A/B-checks it against the committed blobs:
#   1. scripts/walk-check.sh with VARIANTS (its form: NAME=-DMACRO=V,-DMACRO2=V2 ..., space-separated; every
#      macro a `#define MACRO V` default under #ifndef in some ptx/src file): the state and tape walks of
#      each, float64 checks, vh 64 == vh 128 bitwise, a rerun bitwise, times;
#   2. the pick: the least state + tape walk time at vh 64 (512 chunks; the state walk's h16 + v16 and the
#      tape walk's bf16 D^T + dV'^T rows: what kcp's v5 core stage launches) among the variants
#      whose builds report no spill; its -D values become the defaults in this copy of ptx/src;
#   3. scripts/land-check.sh with WALK=0 (scripts/ab-bench.sh: A = ptx/blobs, B = ptx/src as picked, the kcp
#      GPU tests of B_TESTS on B, kcp bench at 32K; DOCS2 as land-check reads it, default empty here), then,
#      with B_DOCS (default 40000,45000,35908; empty skips it), kcp bench on B's blobs alone.
# Here first: scripts/gpu.sh build && scripts/gpu.sh pack kcp kcp.test ptxgen
# There: run(command="VARIANTS='a=-DX=1 b=-DX=4' bash scripts/walk-variants.sh", carry=[".gpu/pack.tgz"])
# Then here: set the picked defaults ("walk-variants: picked ...") in ptx/src and install
# FILES_AT/blobs-b.tar.gz (scripts/blobs-local.sh install): TestEmbeddedBlobsMatchSources fails on a mismatch.
set -uo pipefail
cd "$(dirname "$0")/.."
variants=${VARIANTS:?VARIANTS: NAME=-DMACRO=V,... space-separated}
[ -f .gpu/pack.tgz ] && tar -C .gpu -xzf .gpu/pack.tgz
names=()
for v in $variants; do
	names+=("${v%%=*}")
	IFS=, read -r -a defs <<< "${v#*=}"
	for d in "${defs[@]}"; do
		m=${d#-D}
		m=${m%%=*}
		grep -lq "^#define $m " ptx/src/* || { echo "walk-variants: no '#define $m' default in ptx/src" >&2; exit 2; }
	done
done
VARIANTS="$variants" bash scripts/walk-check.sh 2>&1 | grep -E '^\[|^== build|Used|spill|error' | tee "${OUT:-/tmp}/walk-variants.txt"
best="" bestt=""
for n in "${names[@]}"; do
	if grep -hE '[1-9][0-9]* bytes spill' "/tmp/walk-check/build_$n.log" "/tmp/walk-check/tbuild_$n.log" 2>/dev/null | grep -q .; then
		echo "walk-variants: $n spills: not a candidate"
		continue
	fi
	t=$(awk -v n="[$n]" '$1 == n && /vh  64 h16\+v16  / {for (i = 1; i <= NF; i++) if ($i == "median") s = $(i + 1)}
		$1 == n && $2 == "tape" && /vh  64 dV. bf16 / {for (i = 1; i <= NF; i++) if ($i == "median") p = $(i + 1)}
		END {if (s != "" && p != "") printf "%.3f", s + p}' "${OUT:-/tmp}/walk-variants.txt")
	[ -n "$t" ] || { echo "walk-variants: $n has no state and tape time: not a candidate"; continue; }
	{ grep -q "^\[$n\] check ok" "${OUT:-/tmp}/walk-variants.txt" && grep -q "^\[$n\] tape check ok" "${OUT:-/tmp}/walk-variants.txt"; } ||
		{ echo "walk-variants: $n failed its state or tape check"; continue; }
	echo "walk-variants: $n state + tape at vh 64: $t ms"
	if [ -z "$best" ] || awk -v a="$t" -v b="$bestt" 'BEGIN {exit !(a < b)}'; then best=$n bestt=$t; fi
done
[ -n "$best" ] || { echo "walk-variants: no candidate" >&2; exit 1; }
for v in $variants; do
	[ "${v%%=*}" = "$best" ] || continue
	IFS=, read -r -a defs <<< "${v#*=}"
	for d in "${defs[@]}"; do
		m=${d#-D} && val=${m#*=} && m=${m%%=*}
		sed -i "s/^#define $m .*/#define $m $val/" $(grep -l "^#define $m " ptx/src/*)
	done
	echo "walk-variants: picked $best ($bestt ms): ${v#*=}"
done
WALK=0 DOCS2=${DOCS2:-} bash scripts/land-check.sh
bd=${B_DOCS-40000,45000,35908}
if [ -n "$bd" ] && [ -d /tmp/gdnkcp-blobs-b ]; then
	GDNKCP_BLOB_DIR=/tmp/gdnkcp-blobs-b timeout 200 .gpu/kcp bench --docs "$bd" --kernels v5 --modes core,core+bwd \
		--reps 5 --warmup 2 2>/dev/null | grep -E 'median|walk|grads' | sed 's/^/B /'
fi
