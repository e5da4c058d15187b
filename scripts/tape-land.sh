#!/usr/bin/env bash
# tape-land.sh: the device call of v5.36's landing (the single-product tape walk and the raw-row dV'_local as the
# v5 defaults, the output's Q H on wgmma, Blackwell's dV'_local without zero fills, load_hoist): one call that
#   1. builds the blobs of ptx/src for every target (ptxgen) and sends them back first ($OUT/blobs.tar.gz), with
#      the registers and spills of the entries v5.36 adds or changes and every sm_90a entry whose spill stores
#      grew against ptx/blobs, and ptxcheck --gpu on them;
#   2. times kcp bench core + bwd at DOCS (32768) and DOCS2 (40000,45000,35908) on the new blobs for each of SETS
#      (default "A D S FQ"): A the committed blobs (ptx/blobs) with --split-tape --split-dvlocal (v5.35 as it
#      runs); D the defaults; S --split-tape --split-dvlocal (v5.35's tape walk and dV'_local on the new blobs:
#      S against A measures output_wg_qh and load_hoist, D against S the single-product tape walk and dV'_local);
#      FQ --fp32-qk-grads (v5.36's chunk gradients on fp32 qn, kn; v5.36's own landing ran RG, --raw-qk-grads, the
#      raw-row chunk gradients that v5.37 made the default; their copy_raw issues every load first since the
#      thirty-fourth session's fix, the first form ran 20% slower than mma8); medians of REPS (5). Eight kcp bench
#      runs at ~25-30 s each; SETS / DOCS2 cut them down;
#   3. runs TESTS (default: the landing's own GPU tests and the backward's) on the new blobs in what is left of
#      BUDGET seconds (default 560) from the start; the stage table last. TESTS_FIRST=1 runs the tests before
#      the benches, in TEST_BUDGET seconds (default 240).
# Here first: bash scripts/land-prep.sh && bash scripts/gpu.sh pack kcp kcp.test ptxgen (the staged patches applied;
#             ptxcheck too where the 64 MiB allow)
# There:      run(command="bash scripts/tape-land.sh", carry=[".gpu/pack.tgz"]) (~7-9 minutes; with little device
#             time: TESTS_FIRST=1 TEST_BUDGET=150 TESTS='TestGPUSingleTape|TestGPURawQK' DOCS2= — the blobs come
#             back first either way)
# Then here:  scripts/blobs-local.sh install FILES_AT/blobs.tar.gz && go test ./..., commit the applied tree (the
#             patches leave ptx/staging: land-prep removed them from the index) with the blobs and manifest.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/tape-land}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
[ -f .gpu/pack.tgz ] && tar -C .gpu -xzf .gpu/pack.tgz
work=$(mktemp -d)
blobs=$work/blobs
mkdir -p "$work/logs" "$blobs"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
if ! .gpu/ptxgen -src ptx/src -out "$blobs" ${TARGETS:+-targets "$TARGETS"} >"$work/logs/ptxgen.log" 2>&1; then
	echo "tape-land: ptxgen failed:"
	{ grep -m 12 -E 'error|Error' "$work/logs/ptxgen.log" || tail -5 "$work/logs/ptxgen.log"; } | cut -c1-300
	tar -C "$work" -czf "$out/logs.tar.gz" logs
	exit 1
fi
tar -C "$blobs" -czf "$out/blobs.tar.gz" .
echo "tape-land: blobs in $(($(date +%s) - t0)) s; $(tail -1 "$work/logs/ptxgen.log" | cut -c1-200)"
python3 - ptx/blobs/manifest.json "$blobs/manifest.json" <<'PY'
import json, re, sys
def entries(f):
    out = {}
    for b in json.load(open(f))["blobs"]:
        out[b["target"]] = {e["name"]: {"registers": 0, "spill_stores": 0, **e.get("resources", {})} for e in b["entries"]}
    return out
a, b = entries(sys.argv[1]), entries(sys.argv[2])
for n, r in sorted(b.get("sm_90a", {}).items()):
    if re.search(r"_walk_planes_h|_w128_h|dvlocal_mma_g|chunk_grads_mma[68]r?$|output_mma16g", n):
        print(f"tape-land: sm_90a {n}: {r['registers']} regs, spill {r['spill_stores']} bytes")
for t in sorted(b):
    grew = [f"{n}:{a.get(t, {}).get(n, {}).get('spill_stores', 0)}->{r['spill_stores']}" for n, r in sorted(b[t].items())
            if r["spill_stores"] > a.get(t, {}).get(n, {}).get("spill_stores", 0)]
    if grew:
        print(f"tape-land: {t}: spill stores grew against ptx/blobs: " + " ".join(grew))
PY
if [ -x .gpu/ptxcheck ]; then # packed only where the pack has room (it embeds the blobs: ~30 MB)
	.gpu/ptxcheck --gpu "$blobs" >"$work/logs/ptxcheck.log" 2>&1
	echo "tape-land: ptxcheck --gpu rc=$? $(tail -1 "$work/logs/ptxcheck.log" | cut -c1-200)"
fi
run_benches() {
	for p in "${packs[@]}"; do
		for s in ${SETS-A D S FQ}; do
			flag= dir=$blobs
			[ "$s" = A ] && flag='--split-tape --split-dvlocal' dir=ptx/blobs
			[ "$s" = S ] && flag='--split-tape --split-dvlocal'
			[ "$s" = FQ ] && flag=--fp32-qk-grads
			# shellcheck disable=SC2086 # flag is words or none
			GDNKCP_BLOB_DIR=$dir timeout "${BENCH_TIMEOUT:-240}" .gpu/kcp bench --docs "$p" --kernels v5 --modes core+bwd \
				--reps "${REPS:-5}" --warmup 2 $flag >"$work/logs/bench-$s-$p-1.txt" 2>&1 ||
				echo "tape-land: bench $s at $p: rc $? (logs/bench-$s-$p-1.txt)"
			echo "tape-land: $s $p: $(grep -m1 -o 'median of [0-9]*: [0-9.]* ms' "$work/logs/bench-$s-$p-1.txt")"
		done
	done
}
run_tests() {
	tests=${TESTS-'TestGPUBackward$|TestGPUSingleTape|TestGPURawQK|TestGPURepeatable'}
	if [ -n "$tests" ]; then
		t1=$(date +%s)
		left=$((${BUDGET:-560} - (t1 - t0)))
		if [ "$left" -lt 30 ]; then
			echo "tape-land: no time left for the tests ($left s of BUDGET)"
		else
			(cd kcp && GDNKCP_BLOB_DIR=$blobs timeout "$left" ../.gpu/kcp.test -test.run "$tests" -test.v -test.timeout "${left}s" \
				>"$work/logs/kcp.log" 2>&1)
			echo "tape-land: kcp tests: rc=$? ($(($(date +%s) - t1)) s; timeout $left s)"
			grep -E '^(--- FAIL|FAIL|ok|panic)' "$work/logs/kcp.log" | head -12
			echo "tape-land: top-level PASS $(grep -c '^--- PASS' "$work/logs/kcp.log"), subtests PASS $(grep -c '^    --- PASS' "$work/logs/kcp.log"), FAIL lines $(grep -c -- '--- FAIL' "$work/logs/kcp.log")"
			grep -E 'single-product tape walk|split tape walk' "$work/logs/kcp.log" | head -4 | cut -c1-240
		fi
	fi
}
# CP_PROBE="1 2 4": the exact CP split inside one GPU, measured with what exists: kcp run at CP_PROBE_DOCS (32768)
# over R ranks of one GPU (layout C, the core stage, B1; ranks on their own streams, exchanging through host
# memory), the slowest rank's median. What splitting one document's walks into R segments on one card could give.
run_cp_probe() {
	for r in ${CP_PROBE:-}; do
		GDNKCP_BLOB_DIR=$blobs timeout 120 .gpu/kcp run --backend gpu --docs "${CP_PROBE_DOCS:-32768}" --cp "$r" --layout C \
			--stage core --mode b1 --check=false --reps 5 --warmup 2 --no-progress --json >"$work/logs/cp-probe-$r.json" \
			2>"$work/logs/cp-probe-$r.err" || echo "tape-land: cp probe R=$r: rc $? ($(tail -1 "$work/logs/cp-probe-$r.err" | cut -c1-200))"
		python3 - "$work/logs/cp-probe-$r.json" "$r" <<'PY' || true
import json, sys
g = json.load(open(sys.argv[1]))["gpu"]
print(f"tape-land: cp probe R={sys.argv[2]}: slowest rank {g['slowest_rank']} {g['slowest_ms']:.3f} ms, exchanges {100*g['exchange_share']:.1f}%")
for rk in g["ranks"]:
    st = " ".join(f"{s['stage'].replace('forward: ', 'f:').replace('backward: ', 'b:')}={s['ms']:.3f}" for s in rk["stages"] if s["ms"] >= 0.02)
    print(f"  rank {rk['rank']}: fwd {rk['forward_ms']:.3f} bwd {rk['backward_ms']:.3f} exch {rk['exchange_ms']:.3f} | {st}"[:400])
PY
	done
}
packs=("${DOCS:-32768}")
[ -n "${DOCS2-40000,45000,35908}" ] && packs+=("${DOCS2-40000,45000,35908}")
if [ -n "${TESTS_FIRST:-}" ]; then # the tests in TEST_BUDGET seconds of BUDGET, then the benches
	BUDGET=$(($(date +%s) - t0 + ${TEST_BUDGET:-240}))
	run_tests
	tar -C "$work" -czf "$out/logs.tar.gz" logs
	run_benches
else
	run_benches
	run_cp_probe
	run_tests
fi
tar -C "$work" -czf "$out/logs.tar.gz" logs
echo "A: v5.35's blobs; D: v5.36's defaults; S: --split-tape --split-dvlocal (v5.35's tape walk and dV'_local); FQ: --fp32-qk-grads"
PYTHONPATH=scripts python3 - "$work/logs" "${packs[*]}" "${SETS-A D S FQ}" <<'PY'
import sys
from benchparse import print_sweep, sweep_rows
logs, packs, sets = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
print_sweep(sweep_rows(logs, 1, sets, packs), sets, 1)
PY
