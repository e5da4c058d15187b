#!/usr/bin/env bash
# The mixed tape widths' measurement (docs/perf-notes.md, "Mixed tape widths"), in one device call:
#
#   here:  bash scripts/gpu.sh build && bash scripts/gpu.sh pack kcp kcp.test
#   there: run(command="bash scripts/mixed-tape.sh", carry=[".gpu/pack.tgz"])
#
# TestGPUMixedTape first (the split tape walk's gradients bitwise against vh 64; TESTS=0 skips it),
# then `kcp bench --modes core+bwd` on DOCS (default: issue 6's three documents) without (a) and with
# --mixed-tape (m: the vh 128 half on the rank's stream; p: both halves on side streams, the vh 128 one
# at the greatest priority, --mixed-tape-priority), a, m, p in each of ROUNDS rounds, medians of REPS; a
# table of the tape walk and the total last. Logs and JSON under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .gpu/pack.tgz ] && tar -C .gpu -xzf .gpu/pack.tgz
out=${OUT:-/tmp/mixed-tape}
mkdir -p "$out"
DOCS=${DOCS:-40000,45000,35908}
REPS=${REPS:-5}
ROUNDS=${ROUNDS:-2}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${TESTS:-1}" = 1 ]; then
	(cd kcp && ../.gpu/kcp.test -test.run 'TestGPUMixedTape' -test.v -test.timeout 400s) >"$out/test.log" 2>&1
	echo "TestGPUMixedTape: rc=$? pass=$(grep -c -- '--- PASS' "$out/test.log") fail=$(grep -c -- '--- FAIL' "$out/test.log")"
	grep -E -- '--- FAIL|^panic|Error:|Messages:' "$out/test.log" | head -20
fi
for r in $(seq 1 "$ROUNDS"); do
	for v in a m p; do
		flag=
		[ "$v" = m ] && flag=--mixed-tape
		[ "$v" = p ] && flag='--mixed-tape --mixed-tape-priority'
		if ! .gpu/kcp bench --docs "$DOCS" --kernels v5 --modes core+bwd --reps "$REPS" --json $flag \
			>"$out/$v$r.json" 2>"$out/$v$r.err"; then
			echo "bench $v$r failed:"
			tail -3 "$out/$v$r.err"
		fi
	done
done
python3 - "$out" "$ROUNDS" <<'PY'
import json, sys, os
out, rounds = sys.argv[1], int(sys.argv[2])
print(f"{'variant':8} {'round':>5} {'tape walk ms':>13} {'chunk grads ms':>15} {'total ms':>9} {'walks at vh 128':>16}")
for v in "amp":
    for r in range(1, rounds + 1):
        p = os.path.join(out, f"{v}{r}.json")
        try:
            row = json.load(open(p))[0]
        except Exception as e:
            print(f"{v:8} {r:5} (no result: {e})")
            continue
        st = row["stage_median_ms"]
        print(f"{v:8} {r:5} {st.get('bwd tape walk', 0):13.3f} {st.get('bwd chunk grads', 0):15.3f} "
              f"{row['median_ms']:9.3f} {row.get('tape_walks_vh128', 0):16d}")
PY
