#!/usr/bin/env bash
# wgmma-t-check.sh: on the GPU machine, build and run ptx/devtest/wgmma_t_check.cu: whether wgmma with a
# transposed B (imm-trans-b 1, B MN-major in the 128-byte swizzle) reads the layout the CPU emulator's
# emu::wgmma_rs_t reads, bit for bit against the K-major form. Prints ptxas's line for the kernels and
# "check ok" / "check FAILED". There: run(command="bash scripts/wgmma-t-check.sh").
set -u
cd "$(dirname "$0")/.."
. scripts/devtest-build.sh
devtest_build wgmma_t_check 'error|C7[0-9]+' 20 || exit $?
"$BIN"
