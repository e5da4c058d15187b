#!/usr/bin/env bash
# wgmma-t-check.sh: on the GPU machine, build and run ptx/devtest/wgmma_t_check.cu: whether wgmma with a
# transposed B (imm-trans-b 1, B MN-major in the 128-byte swizzle) reads the layout the CPU emulator's
# emu::wgmma_rs_t reads, bit for bit against the K-major form. Prints ptxas's line for the kernels and
# "check ok" / "check FAILED". There: run(command="bash scripts/wgmma-t-check.sh").
set -u
cd "$(dirname "$0")/.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
W=/tmp/wgmma-t-check
mkdir -p "$W"
"$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o "$W/wgmma_t_check" ptx/devtest/wgmma_t_check.cu \
	>"$W/build.log" 2>&1
rc=$?
echo "== build: rc $rc"
grep -E 'error|C7[0-9]+' "$W/build.log" | head -20
[ "$rc" = 0 ] || exit "$rc"
"$W/wgmma_t_check"
