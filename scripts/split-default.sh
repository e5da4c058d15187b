#!/usr/bin/env bash
# split-default.sh: one device call checking the walks split between the widths by default (the offset and tape
# walks, and the core stage's state walk; GPUOptions.SingleWidth opts out) on the installed blobs:
#   here:  bash scripts/gpu.sh build && bash scripts/gpu.sh pack kcp kcp.test
#   there: run(command="bash scripts/split-default.sh", carry=[".gpu/pack.tgz"])
# 1. scripts/post-land.sh with TESTS (default: the split walks, the raw-row and fp32 q / k gradients, the tensor-core
#    backward, ten-run repeatability) and kcp bench core, core + bwd on BENCH_DOCS (default issue 6's three documents
#    and 32K), each followed by core + bwd with --single-width;
# 2. kcp bench --modes PACK_MODE (default core) on PACKS (default: 3 x 342 and 4 x 256 chunks, where sm_90a's
#    model splits the state and tape walks 8 and 0 heads of 48 (v5.39: the tape walk's uncapped 30 heads measured slower),
#    and issue 6's pack) by default and
#    with --single-width, A B A B when ROUNDS=2: the state and tape walks' times and splits, and the total.
# TESTS='^$' runs no test; BENCH_DOCS= no step-1 bench; BENCH_VARIANTS= no --single-width runs in step 1.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/split-default}
mkdir -p "$OUT"
[ -f .gpu/pack.tgz ] && tar -C .gpu -xzf .gpu/pack.tgz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TESTS=${TESTS:-TestGPUSplitWalks|TestGPURawQK|TestGPUTensorCoreBackward|TestGPURepeatable} TEST_TIMEOUT=${TEST_TIMEOUT:-220} \
	SWEEP=0 DEADLINE=${DEADLINE:-420} BENCH_DOCS=${BENCH_DOCS-40000,45000,35908 32768} BENCH_VARIANTS=${BENCH_VARIANTS---single-width} \
	bash scripts/post-land.sh
mode=${PACK_MODE:-core}
echo "== 2. kcp bench --modes $mode: the walks' splits, default against --single-width"
printf '%-34s %-15s %5s %14s %13s %9s  %s\n' pack variant round "state walk ms" "tape walk ms" "total ms" "split walks at vh 128"
for docs in ${PACKS:-21888,21888,21888 16384,16384,16384,16384 40000,45000,35908}; do
	for r in $(seq 1 "${ROUNDS:-1}"); do
		for v in default --single-width; do
			flag=
			[ "$v" = default ] || flag=$v
			# shellcheck disable=SC2086 # flag is a word or none
			timeout 90 .gpu/kcp bench --docs "$docs" --kernels v5 --modes "$mode" --reps 5 --warmup 2 --json $flag \
				>"$OUT/core.json" 2>"$OUT/core.err" || { echo "$docs $v: failed: $(tail -1 "$OUT/core.err")"; continue; }
			python3 - "$OUT/core.json" "$docs" "$v" "$r" <<'PY'
import json, sys
row = json.load(open(sys.argv[1]))[0]
st = row["stage_median_ms"]
state = st.get("state walk", st.get("fwd state walk", 0))
print(f"{sys.argv[2]:34} {sys.argv[3]:15} {sys.argv[4]:>5} {state:14.3f} {st.get('bwd tape walk', 0):13.3f} {row['median_ms']:9.3f}  {row.get('split_walks_vh128', {})}")
PY
		done
	done
done
