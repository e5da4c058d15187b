#!/usr/bin/env bash
# v6-skel.sh: on the GPU machine, build and run ptx/devtest/grads_v6_skel.cu, the timing and register skeleton
# of docs/grads-v6.md's option B (milestone 1): ptxas' registers and spills for the kernel at
# __launch_bounds__(256, 2) and (256, 1), and its CUDA-event median at 32K (24,576 CTAs) for each.
# There: run(command="bash scripts/v6-skel.sh"). Prints the build's errors (if any), ptxas' lines and the table.
set -u
cd "$(dirname "$0")/.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
W=/tmp/v6-skel
mkdir -p "$W"
"$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o "$W/grads_v6_skel" ptx/devtest/grads_v6_skel.cu \
	>"$W/build.log" 2>&1
rc=$?
echo "== build: rc $rc"
grep -E 'error|warning|C7[0-9]+|registers|spill' "$W/build.log" | head -30
[ "$rc" = 0 ] || exit "$rc"
"$W/grads_v6_skel"
