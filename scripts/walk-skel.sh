#!/usr/bin/env bash
# walk-skel.sh: on the GPU machine, build and run ptx/devtest/walk_2cta_skel.cu, the timing and register
# skeleton of the vh 64 state walk: stages, copier warps, cp.async or bulk (TMA) copies, output staging, one or
# two CTAs an SM and the real walk's features one at a time, at 32K (one document) and 120,908 tokens (three).
# Its lines are the rows of docs/perf-notes.md's table in "What next (twenty-fourth session's view)" (each
# variant ran that session; the list as it stands was assembled after the device time was spent and has not
# been compiled as a whole).
# There: run(command="bash scripts/walk-skel.sh"). Prints the build's errors (if any), ptxas' lines and the table.
set -u
cd "$(dirname "$0")/.."
. scripts/devtest-build.sh
devtest_build walk_2cta_skel || exit $?
"$BIN"
