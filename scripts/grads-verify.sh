#!/usr/bin/env bash
# grads-verify.sh: one device call that checks the installed blobs' backward after a chunk-gradient change:
# the kcp GPU backward tests (every layout and R, core and module, sm_90a and the compute_80 PTX; the v5 set's
# core stage on gdn_chunk_grads_mma8 and with SplitGrads on mma6), then kcp bench at 32,768 and 120,908 tokens
# (core+bwd and module-b1, with and without --split-grads). Here: scripts/gpu.sh build && scripts/gpu.sh pack
# kcp kcp.test; there: run(command="bash scripts/grads-verify.sh", carry=[".gpu/pack.tgz"]).
# Env: TESTS (a -test.run regex), TEST_TIMEOUT (default 330s), DOCS2 (default 40000,45000,35908; empty skips).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?}
[ -f .gpu/pack.tgz ] && tar -C .gpu -xzf .gpu/pack.tgz
t0=$(date +%s)
(cd kcp && ../.gpu/kcp.test -test.run "${TESTS:-TestGPUBackward$|TestGPUBackwardOptions|TestGPUTensorCoreBackward|TestGPUTensorCorePortable|TestGPUCheckpointRecompute}" \
	-test.v -test.timeout "${TEST_TIMEOUT:-330s}" >"$out/kcp-tests.log" 2>&1)
echo "kcp GPU tests: rc=$? ($(( $(date +%s) - t0 )) s): $(grep -c -- '--- PASS' "$out/kcp-tests.log") PASS lines, $(grep -c -- '--- FAIL' "$out/kcp-tests.log") FAIL, $(grep -c -- '--- SKIP' "$out/kcp-tests.log") SKIP"
grep -E '^(--- |ok|FAIL|panic)' "$out/kcp-tests.log" | grep -v '^    ' | tail -8
python3 scripts/grad-errors.py "$out/kcp-tests.log"
for d in 32768 ${DOCS2-40000,45000,35908}; do
	for f in "" --split-grads; do
		timeout 200 .gpu/kcp bench --docs $d --kernels v5 --modes core+bwd,module-b1 --reps 5 --warmup 2 $f 2>/dev/null |
			grep -E 'median|chunk grads' | sed "s/^/${f:-mma8} /"
	done
done
