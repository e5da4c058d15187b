#!/usr/bin/env bash
# rebuild-same.sh: one device call for a kernel-source change meant to keep (or barely change) the machine code:
# rebuild every blob from ptx/src, compare it with the committed ptx/blobs function by function
# (scripts/same-sass.py), run kcp GPU tests on the new blobs (GDNKCP_BLOB_DIR, so nothing is re-embedded) and time
# kcp bench on the committed blobs (A) and the new ones (B), A B A B.
#   here:  bash scripts/gpu.sh build && bash scripts/gpu.sh pack kcp kcp.test ptxgen
#   there: run(command="bash scripts/rebuild-same.sh", carry=[".gpu/pack.tgz"])
#   here:  go run ./tools/ptxcheck FILES_AT/blobs (after untarring blobs.tar.gz), then
#          scripts/blobs-local.sh install FILES_AT/blobs.tar.gz
# Env: TESTS (a -test.run filter of kcp's GPU tests; '^$' runs none), DOCS (space-separated packs to bench,
# default 32K and issue 6's three documents), MODES (kcp bench --modes, default core+bwd), ROUNDS (default 2).
# $OUT gets blobs.tar.gz and logs.tar.gz (ptxgen.log, same-sass.txt, tests.log, the bench JSON): a call brings back
# 8 files at most, and the blobs must be one of them (the thirty-seventh session lost a rebuild to the bench logs).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?OUT must name the folder whose files come back}
logs=$out/logs
mkdir -p "$logs"
trap 'tar -C "$out" -czf "$out/logs.tar.gz" logs && rm -rf "$logs"' EXIT
export PATH=/usr/local/cuda/bin:$PATH
[ -f .gpu/pack.tgz ] && tar -C .gpu -xzf .gpu/pack.tgz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
new=/tmp/gdnkcp-new-blobs
rm -rf "$new" && mkdir -p "$new"
t0=$(date +%s)
if ! .gpu/ptxgen -src ptx/src -out "$new" >"$logs/ptxgen.log" 2>&1; then
	tail -30 "$logs/ptxgen.log"
	exit 1
fi
echo "ptxgen: $(($(date +%s) - t0)) s; $(tail -1 "$logs/ptxgen.log")"
tar -C "$new" -czf "$out/blobs.tar.gz" .
python3 scripts/same-sass.py ptx/blobs "$new" >"$logs/same-sass.txt" 2>&1
echo "same-sass rc=$? (0: every function identical)"
head -40 "$logs/same-sass.txt"
TESTS=${TESTS:-TestGPUSplitWalks|TestGPUTensorCoreBackward|TestGPURepeatable|TestGPUForwardCore|TestGPUBackward$|TestGPUCheckpointRecompute}
if [ "$TESTS" != '^$' ]; then
	t0=$(date +%s)
	(cd kcp && GDNKCP_BLOB_DIR=$new ../.gpu/kcp.test -test.v -test.run "$TESTS" -test.timeout 300s) >"$logs/tests.log" 2>&1
	echo "kcp GPU tests on the new blobs ($TESTS): rc=$? ($(($(date +%s) - t0)) s): $(grep -c -- '--- PASS' "$logs/tests.log") PASS lines, $(grep -c -- '--- FAIL' "$logs/tests.log") FAIL, $(grep -c -- '--- SKIP' "$logs/tests.log") SKIP"
	grep -E -- '--- FAIL|^panic' "$logs/tests.log" | head -10
fi
printf '%-20s %-9s %-3s %5s %9s  %s\n' pack mode set round "total ms" "stages (ms)"
for docs in ${DOCS:-32768 40000,45000,35908}; do
	for r in $(seq 1 "${ROUNDS:-2}"); do
		for set in A B; do
			log="$logs/bench-$set-${docs%%,*}-$r.json"
			if [ "$set" = B ]; then
				GDNKCP_BLOB_DIR=$new timeout 120 .gpu/kcp bench --docs "$docs" --kernels v5 --modes "${MODES:-core+bwd}" --reps 5 --warmup 2 --json >"$log" 2>"$log.err"
			else
				timeout 120 .gpu/kcp bench --docs "$docs" --kernels v5 --modes "${MODES:-core+bwd}" --reps 5 --warmup 2 --json >"$log" 2>"$log.err"
			fi || { echo "$docs $set: failed: $(tail -1 "$log.err")"; continue; }
			python3 - "$log" "$docs" "$set" "$r" <<'PY'
import json, sys
for row in json.load(open(sys.argv[1])):
    st = "  ".join(f"{k.replace('fwd ', 'f:').replace('bwd ', 'b:')} {v:.3f}" for k, v in row["stage_median_ms"].items() if v >= 0.01)
    print(f"{sys.argv[2]:20} {row['mode']:9} {sys.argv[3]:3} {sys.argv[4]:>5} {row['median_ms']:9.3f}  {st}")
PY
		done
	done
done
