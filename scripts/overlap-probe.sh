#!/usr/bin/env bash
# overlap-probe.sh (device run): kcp's overlap benchmarks (kcp/gpu_overlap_bench_test.go) at 32,768 tokens in
# one document and at 120,908 tokens in three: BenchmarkGPUWalkOutputOverlap (the state walk and the output)
# and BenchmarkGPUTapeGradsOverlap (the tape walk and the chunk gradients, replayed at the end of a B1
# backward), each pair alone and together on two streams in both launch orders, CUDA-event medians of
# BENCHTIME runs (default 20x); "saved-ms" is what running the second behind the first on the SMs the walk
# leaves idle saves (docs/mma-kernels.md, "Design, not built ... consumers behind the walks").
# The "flags" case (the design itself: gdn_state_walk_planes_f and gdn_output_mma16gn_claim, from
# ptx/staging/parked/walk_consumer_flags.patch, measured and parked) runs only on blobs that have those entries: BLOBS=DIR runs on a built
# blob directory instead of the embedded blobs (GDNKCP_BLOB_DIR), e.g. one of scripts/knob-sweep.sh's
# /tmp/knob-sweep/blobs-NAME after scripts/land-prep.sh applied the patch, in the same call.
# PACKS: the packs, space-separated (default "32768 40000,45000,35908"); BENCH: the benchmark regex (default
# Overlap: both).
# Here: scripts/gpu.sh build && scripts/gpu.sh pack kcp.test
# There: run(command="bash scripts/overlap-probe.sh", carry=[".gpu/pack.tgz"])
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .gpu/pack.tgz ] && [ ! -x .gpu/kcp.test ] && tar -C .gpu -xzf .gpu/pack.tgz
if [ -n "${BLOBS:-}" ]; then
	[ -f "$BLOBS/manifest.json" ] || { echo "overlap-probe: BLOBS=$BLOBS has no manifest.json" >&2; exit 2; }
	export GDNKCP_BLOB_DIR=$BLOBS
	echo "overlap-probe: blobs of $BLOBS"
fi
for docs in ${PACKS:-32768 40000,45000,35908}; do
	echo "== docs $docs"
	(cd kcp && GDNKCP_OVERLAP_DOCS=$docs timeout "${PROBE_TIMEOUT:-240}" ../.gpu/kcp.test -test.run '^$' \
		-test.bench "${BENCH:-Overlap}" -test.benchtime "${BENCHTIME:-20x}" -test.v 2>&1 |
		grep -E 'Benchmark|ms|tokens|FAIL|differs|SKIP|panic|ok')
done
