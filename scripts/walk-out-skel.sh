#!/usr/bin/env bash
# walk-out-skel.sh: on the GPU machine, build and run ptx/devtest/walk_out_skel.cu, the timing and register skeleton
# of the vh 64 state walk with a third warpgroup computing the chunk's output on wgmma (is the output kernel's time
# free beside the walk's chain?), or forming the backward's dV'_local for the chain (OWG 20-23: is dV'_local's kernel
# free beside the tape walk's?), at 32K (one document) and 120,908 tokens (three).
# There: run(command="bash scripts/walk-out-skel.sh"). Prints the build's errors (if any), ptxas' lines and the table.
set -u
cd "$(dirname "$0")/.."
. scripts/devtest-build.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
devtest_build walk_out_skel 'error|warning|C7[0-9]+|registers|spill|walk_out' 60 || exit $?
timeout "${SKEL_TIMEOUT:-240}" "$BIN"
echo "rc $?"
