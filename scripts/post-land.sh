#!/usr/bin/env bash
# post-land.sh: one device call after a landing (scripts/land-check.sh, then here
# `scripts/blobs-local.sh install FILES_AT/blobs-b.tar.gz`, `scripts/gpu.sh build` and
# `scripts/gpu.sh pack kcp kcp.test`), on the blobs now embedded in the carried binaries:
#   1. the kcp GPU tests of TESTS (default: every kcp test whose name starts with TestGPU), bounded by
#      TEST_TIMEOUT (default 260 s), less those SKIP names (go test -skip; e.g. SKIP=TestGPUTensorCoreForward/mma,
#      the v4 set's forward subtests, which alone outlast a call's bound after the rest): PASS / FAIL / SKIP counts, the failures and the worst error of each
#      gradient by kernel set and stage (the lines scripts/grads-verify.sh reads);
#   2. scripts/width-sweep.sh (REPS, default 3): both walk widths on its seven one-rank packs, to check that
#      the sm_90a width rule still picks the faster width with the kernels just landed;
#   3. with CP8=1, the bitwise step of scripts/cp-matrix.sh at CP 8 on this one GPU (RPG=8);
#   4. with BENCH_DOCS=LIST (e.g. 32768 and 40000,45000,35908, space-separated packs), kcp bench on the
#      installed blobs, core and core + bwd, medians of 5 (the figures README.md and docs/perf-notes.md quote);
#      BENCH_VARIANTS (flags, + between several of one variant) each core + bwd after it.
# SWEEP=0 leaves step 2 out.
# Each step is skipped ("not run") once DEADLINE seconds (default 540) have passed since the start.
# There: run(command="bash scripts/post-land.sh", carry=[".gpu/pack.tgz"]).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
[ -f .gpu/pack.tgz ] && tar -C .gpu -xzf .gpu/pack.tgz
start=$(date +%s)
deadline=${DEADLINE:-540}
left() { echo $((deadline - ($(date +%s) - start))); }

echo "== 1. kcp GPU tests (${TESTS:-TestGPU})"
t0=$(date +%s)
(cd kcp && timeout "${TEST_TIMEOUT:-260}" ../.gpu/kcp.test -test.run "${TESTS:-TestGPU}" -test.skip "${SKIP:-}" -test.v -test.timeout 600s \
	>"$out/kcp-tests.log" 2>&1)
rc=$?
echo "kcp GPU tests: rc=$rc ($(( $(date +%s) - t0 )) s): $(grep -c -- '--- PASS' "$out/kcp-tests.log") PASS lines," \
	"$(grep -c -- '--- FAIL' "$out/kcp-tests.log") FAIL, $(grep -c -- '--- SKIP' "$out/kcp-tests.log") SKIP"
grep -E '^(--- FAIL|panic|FAIL)|^    --- FAIL' "$out/kcp-tests.log" | head -20
[ "$rc" = 124 ] && echo "kcp GPU tests: stopped by the ${TEST_TIMEOUT:-260} s bound in: $(grep -E '^=== RUN' "$out/kcp-tests.log" | tail -1)"
python3 scripts/grad-errors.py "$out/kcp-tests.log"

echo "== 2. width sweep (REPS=${REPS:-3})"
if [ "${SWEEP:-1}" = 0 ]; then
	echo "width sweep: not run (SWEEP=0)"
elif [ "$(left)" -gt 120 ]; then
	REPS=${REPS:-3} SWEEP_DEADLINE="$(( $(left) - 90 ))" timeout "$(( $(left) - 15 ))" bash scripts/width-sweep.sh 2>&1 | tail -12
else
	echo "width sweep: not run ($(left) s left)"
fi

if [ "${CP8:-0}" = 1 ]; then
	echo "== 3. CP 8 on one GPU, bitwise (RPG=8)"
	if [ "$(left)" -gt 60 ]; then
		RPG=8 STEPS=1 DEADLINE=$(( $(left) - 10 )) RESERVE=0 OUT="$out/cp8" bash scripts/cp-matrix.sh 1 2>&1 | tail -20
	else
		echo "CP 8: not run ($(left) s left)"
	fi
fi
for docs in ${BENCH_DOCS:-}; do
	echo "== 4. kcp bench --docs $docs (installed blobs)"
	if [ "$(left)" -gt 45 ]; then
		timeout "$(( $(left) - 10 ))" .gpu/kcp bench --docs "$docs" --kernels v5 --modes core,core+bwd --reps 5 --warmup 2 2>/dev/null |
			grep -E 'median|walk|prep|output|grads|peak' | head -30
	else
		echo "bench: not run ($(left) s left)"
	fi
	# BENCH_VARIANTS: kcp bench flags, each timed core + bwd after the plain run (e.g. --fp32-qk-grads; + joins
	# several flags into one variant: --split-tape+--split-dvlocal)
	for v in ${BENCH_VARIANTS:-}; do
		echo "== 4. kcp bench --docs $docs ${v//+/ } (core + bwd)"
		if [ "$(left)" -gt 30 ]; then
			# shellcheck disable=SC2046 # the variant's flags as words
			timeout "$(( $(left) - 5 ))" .gpu/kcp bench --docs "$docs" --kernels v5 --modes core+bwd --reps 5 --warmup 2 \
				$(echo "${v//+/ }") 2>/dev/null | grep -E 'median|walk|prep|output|grads|peak' | head -15
		else
			echo "bench: not run ($(left) s left)"
		fi
	done
done
echo "post-land: $(( $(date +%s) - start )) s"
