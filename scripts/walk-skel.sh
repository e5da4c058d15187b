#!/usr/bin/env bash
# walk-skel.sh: on the GPU machine, build and run ptx/devtest/walk_2cta_skel.cu, the timing and register
# skeleton of the vh 64 state walk with one stage, two stages, or -W and k double-buffered and U^T single, at
# one and two CTAs an SM, at 32K (one document) and 120,908 tokens (three): whether two walk CTAs an SM would
# shorten multi-document walks (docs/perf-notes.md, "What next (twenty-third session's view)", item 1). With and
# without its output stores (OUT).
# There: run(command="bash scripts/walk-skel.sh"). Prints the build's errors (if any), ptxas' lines and the table.
set -u
cd "$(dirname "$0")/.."
. scripts/devtest-build.sh
devtest_build walk_2cta_skel || exit $?
"$BIN"
