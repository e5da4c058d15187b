#!/usr/bin/env bash
# land-check.sh: the one device call that lands staged kernel changes. After, here, scripts/land-prep.sh:
#   go build -o .gpu/kcp-a ./tools/kcp        # kcp as committed: A's runs, where a patch changes a kernel's ABI
#   scripts/land-v4.sh && go test ./ptx/cpuemu -run 'WGMMA|MMA16|MMABackward|MMA5' && scripts/gpu.sh build &&
#   scripts/gpu.sh pack kcp kcp.test ptxgen kcp-a
# there:
#   run(command="bash scripts/land-check.sh", carry=[".gpu/pack.tgz"])
# it runs, in this order (the device's time is the budget: ~5-6 minutes):
#   0. scripts/walk-regs.sh on B's sources: ptxas of the plane walks alone; a spill stops the call (rc 3);
#   1. scripts/walk-check.sh: the state and tape walks of ptx/src checked against float64 and timed, the
#      wgmma and the mma.sync bodies side by side (nvcc only, before any blob exists);
#   2. scripts/ab-bench.sh with A = the committed blobs (ptx/blobs) and B = ptx/src built by ptxgen:
#      kcp bench at 32,768 tokens (core, core+bwd), alternating A, B, A, B, then the kcp GPU tests of
#      B_TESTS on B's blobs (default: the tensor-core forward and backward, the portable PTX, ten-run
#      repeatability, the checkpoint recompute);
#   3. kcp bench at 120,908 tokens (3 documents) on A and on B, and on B again with --force-vh 64 (the width
#      rule's sm_90a question: with wgmma the state walk's vh 128 costs ~1.4x its vh 64 a chunk, not 2x) and,
#      where B's kcp has the flag, with --launch-order (what the walks' dispatch order saves).
#   4. with WIDTH=1, scripts/width-sweep.sh on B's blobs (both widths on seven one-rank packs: whether the
#      sm_90a width rule, sched.CostRule, still picks the faster width with the new kernels).
#   5. with NCU_B=REGEX, scripts/ncu-source.sh on B's blobs: per-instruction stall samples of one launch of
#      the kernel REGEX names in a 32K-token bench of NCU_MODES (default core+bwd; $OUT/<REGEX>-sass.csv and its
#      summary).
# B's blobs come back as $OUT/blobs-b.tar.gz (the text logs in $OUT/logs.tar.gz): install them (scripts/blobs-local.sh install) only where every
# check passed and no stage got slower. Env: DOCS2 (default 40000,45000,35908; empty skips step 3), B_TESTS,
# B_ARGS: more `kcp bench` arguments for B's runs in steps 2 and 3 (an opt-in the staged patch adds, e.g.
# --tape-former), SPILL_GATE=0 skips the walks' spill gate (step 0), WALK=0 skips step 1, EXTRA2=0 leaves step 3's forced vh 64 and launch-order runs out, WIDTH=1 adds step 4 (SWEEP, REPS as width-sweep.sh reads them), ALT_SRC: the sources
# of B (default ptx/src).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?}
export PATH=/usr/local/cuda/bin:$PATH
[ -f .gpu/pack.tgz ] && tar -C .gpu -xzf .gpu/pack.tgz
# Spill gate (SPILL_GATE=0 skips it): ptxas on the plane walks' sources of B alone (seconds); a walk that
# spills stops the call here, before the blob build and the benches.
if [ "${SPILL_GATE:-1}" = 1 ]; then
	echo "== spill gate (walk-regs.sh on ${ALT_SRC:-ptx/src})"
	SRC=${ALT_SRC:-ptx/src} bash scripts/walk-regs.sh 2>&1 | tee "$out/walk-regs.txt"
	if grep -qE 'walk[a-z0-9_]*: [0-9]+ regs, [1-9][0-9]* bytes spill stores' "$out/walk-regs.txt"; then
		echo "land-check: a plane walk spills (above): stopping before the blob build"
		exit 3
	fi
fi
if [ "${WALK:-1}" = 1 ]; then
	echo "== walk-check"
	bash scripts/walk-check.sh 2>&1 | grep -E '^\[|^== build|C75|Used|error' | tee "$out/walk-check.txt"
fi
echo "== ab-bench"
A_KCP=$( [ -x .gpu/kcp-a ] && echo .gpu/kcp-a || echo .gpu/kcp ) A_BLOBS=ptx/blobs ALT_SRC=${ALT_SRC:-ptx/src} MODES=core,core+bwd \
	B_TESTS=${B_TESTS:-'TestGPUTensorCoreForward/v5|TestGPUTensorCoreBackward|TestGPUTensorCorePortable|TestGPURepeatable|TestGPUCheckpointRecompute|TestGPUDispatchOrder'} \
	bash scripts/ab-bench.sh 2>&1 | tail -30 | tee "$out/ab-bench.txt"
docs2=${DOCS2-40000,45000,35908}
if [ -n "$docs2" ] && [ -d /tmp/gdnkcp-blobs-b ]; then
	echo "== kcp bench --docs $docs2 (A: committed blobs, B: ptx/src)"
	for s in A B; do
		d=ptx/blobs bin=.gpu/kcp
		[ $s = A ] && [ -x .gpu/kcp-a ] && bin=.gpu/kcp-a
		extra=()
		[ $s = B ] && d=/tmp/gdnkcp-blobs-b && read -r -a extra <<<"${B_ARGS:-}"
		GDNKCP_BLOB_DIR=$d timeout 240 $bin bench --docs "$docs2" --kernels v5 --modes core,core+bwd --reps 5 --warmup 2 "${extra[@]}" \
			2>/dev/null | grep -E 'median|walk|l2norm|prep|output|chunk grads' | sed "s/^/$s /"
	done
	[ "${EXTRA2:-1}" = 1 ] && GDNKCP_BLOB_DIR=/tmp/gdnkcp-blobs-b timeout 240 .gpu/kcp bench --docs "$docs2" --kernels v5 --modes core,core+bwd \
		--reps 5 --warmup 2 --force-vh 64 2>/dev/null | grep -E 'median|walk' | sed "s/^/B vh64 /"
	# B's walks in launch order, where B's kcp has the flag: what its dispatch order saves, on the same blobs.
	if [ "${EXTRA2:-1}" = 1 ] && .gpu/kcp bench --help 2>/dev/null | grep -q -- --launch-order; then
		GDNKCP_BLOB_DIR=/tmp/gdnkcp-blobs-b timeout 240 .gpu/kcp bench --docs "$docs2" --kernels v5 --modes core,core+bwd \
			--reps 5 --warmup 2 --launch-order 2>/dev/null | grep -E 'median|walk' | sed "s/^/B launch-order /"
	fi
fi
if [ "${WIDTH:-0}" = 1 ] && [ -d /tmp/gdnkcp-blobs-b ]; then
	echo "== width sweep (B's blobs)"
	GDNKCP_BLOB_DIR=/tmp/gdnkcp-blobs-b bash scripts/width-sweep.sh 2>&1 | tail -10
fi
if [ -n "${NCU_B:-}" ] && [ -d /tmp/gdnkcp-blobs-b ]; then
	echo "== ncu source counters: $NCU_B (B's blobs)"
	GDNKCP_BLOB_DIR=/tmp/gdnkcp-blobs-b KERNEL=$NCU_B bash scripts/ncu-source.sh --docs 32768 --kernels v5 --modes "${NCU_MODES:-core+bwd}" 2>&1 | tail -${NCU_LINES:-45}
fi
# The device call brings back at most 8 files: the text logs go back as one logs.tar.gz, so that
# blobs-b.tar.gz and the ncu SASS table (<REGEX>-sass.csv) always fit beside it.
(cd "$out" && { logs=$(ls -- *.txt *.log *.err 2>/dev/null); [ -n "$logs" ] && tar -czf logs.tar.gz $logs && rm -f $logs; })
ls "$out"
