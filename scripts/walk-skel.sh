#!/usr/bin/env bash
# walk-skel.sh: on the GPU machine, build and run ptx/devtest/walk_2cta_skel.cu, the timing and register
# skeleton of the vh 64 state walk with one stage, two stages, or -W and k double-buffered and U^T single, at
# one and two CTAs an SM, at 32K (one document) and 120,908 tokens (three): whether two walk CTAs an SM would
# shorten multi-document walks (docs/perf-notes.md, "What next (twenty-third session's view)", item 1). With and
# without its output stores (OUT).
# There: run(command="bash scripts/walk-skel.sh"). Prints the build's errors (if any), ptxas' lines and the table.
set -u
cd "$(dirname "$0")/.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
W=/tmp/walk-skel
mkdir -p "$W"
"$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o "$W/walk_2cta_skel" ptx/devtest/walk_2cta_skel.cu \
	>"$W/build.log" 2>&1
rc=$?
echo "== build: rc $rc"
grep -E 'error|warning|C7[0-9]+|registers|spill' "$W/build.log" | head -30
[ "$rc" = 0 ] || exit "$rc"
"$W/walk_2cta_skel"
