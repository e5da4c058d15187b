#!/usr/bin/env bash
# Parked with walk_folded.patch (thirty-fourth session; its one run is in docs/perf-notes.md, "Measured: the fold,
# the single-product tape walk, the raw q and k rows"): its flags (--fold, --tape-bf16, --raw-qk) are those of the
# patches as they were staged at 9276d53; the landing call of the rebased walk_tape_bf16.patch is tape-land.sh.
# fold-check.sh: the device call for the staged patches of the thirty-second and thirty-third sessions:
# ptx/staging/walk_folded.patch (docs/perf-notes.md, "The output folded into the prep and the walk": the output
# folded into the state walk, its operands formed by the prep's fold phase, gdn_prep_mma_gf, or with --fold-kernel
# by gdn_fold_operands after the prep) and ptx/staging/walk_tape_bf16.patch, which applies after it ("The tape walk
# on single bf16 products" and "The backward on the raw q and k rows": --tape-bf16, --raw-qk).
#   here:  bash scripts/land-prep.sh && bash scripts/gpu.sh pack kcp kcp.test ptxgen
#          (the patches applied; packed again without land-prep's kcp-a, which this call does not use: with it the
#          tree and the pack came to ~63 of the 64 MiB a call sends)
#   there: run(command="bash scripts/fold-check.sh", carry=[".gpu/pack.tgz"])
# land-prep applies every staged patch: while output_wg_qh.patch is staged, B's output kernel (the unfolded path) has
# its Q H on wgmma, so A against B measures that patch and B against F / G the fold.
# 1. ptxgen on ptx/src into B (TARGETS, default sm_90a: that cubin and the compute_80 PTX; TARGETS= builds every
#    target, the blobs to install); the registers and spills of the new entries and the plane walks (sm_90a),
#    and every sm_90a entry whose spill stores grew against ptx/blobs;
# 2. kcp bench --modes MODES (default core,core+bwd) at DOCS (32768) and DOCS2 (40000,45000,35908) for each of SETS
#    (default "A B F G FTR FTR128"): A the committed blobs; B's blobs without the new options; F with --fold; G with --fold
#    --fold-after (O by gdn_output_folded after the unfolded walk: the fold's fallback should F's walk be slower
#    than B's); FTR with --fold --tape-bf16 --raw-qk, core + bwd only (its forward stages are F's, its tape walk,
#    dv local and chunk grads stages the backward changes'); on request K (--fold --fold-kernel), and T
#    (--tape-bf16), R (--raw-qk) and FT (--fold --tape-bf16); FTR128 (FTR with --force-vh 128: the width rule's
#    tape walk cost, a vh 128 chunk 5/3 of a vh 64 one, was measured on the split walk; the single-product walk
#    may move it so far that the 120,908-token pack's tape walk is faster at vh 128), core + bwd only. ROUNDS
#    rounds (default 1), medians of REPS (5); SETS= skips them;
# 3. TESTS (default TestGPUFoldedOutput, TestGPUFoldedBackward, TestGPUFoldEntries, TestGPUTapeBF16,
#    TestGPURawQK) on B's blobs, in what is left of BUDGET seconds from the start (default 560: the call's 600 s
#    limit); the stage table last.
# B's blobs come back as $OUT/blobs-b.tar.gz, the logs as $OUT/logs-fold.tar.gz. Land (install B's blobs built for
# every target: scripts/blobs-local.sh install) only where the tests pass and nothing spills more; turn each option
# on by default only where its stage is faster than B's (FoldedOutput: F or G against B; the state walk's stage
# with the fold says whether the copying warpgroup's product stayed off the walk's chain).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/fold-check}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
[ -f .gpu/pack.tgz ] && tar -C .gpu -xzf .gpu/pack.tgz
work=$(mktemp -d)
mkdir -p "$work/logs" "$work/blobs-b"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
targets=${TARGETS-sm_90a}
if ! .gpu/ptxgen -src ptx/src -out "$work/blobs-b" ${targets:+-targets "$targets"} >"$work/logs/ptxgen.log" 2>&1; then
	echo "fold-check: ptxgen failed:"
	{ grep -m 12 -E 'error|Error' "$work/logs/ptxgen.log" || tail -5 "$work/logs/ptxgen.log"; } | cut -c1-300
	tar -C "$work" -czf "$out/logs-fold.tar.gz" logs
	exit 1
fi
tar -C "$work/blobs-b" -czf "$out/blobs-b.tar.gz" .
echo "fold-check: B's blobs in $(($(date +%s) - t0)) s"
python3 - ptx/blobs/manifest.json "$work/blobs-b/manifest.json" <<'PY'
import json, re, sys
def entries(f):
    for b in json.load(open(f))["blobs"]:
        if b["target"] == "sm_90a":
            # an entry without resources (a hand-made manifest) counts as 0 registers, no spill
            return {e["name"]: {"registers": 0, "spill_stores": 0, "spill_loads": 0, **e.get("resources", {})}
                    for e in b["entries"]}
    return {}
a, b = entries(sys.argv[1]), entries(sys.argv[2])
for n, r in sorted(b.items()):
    if re.search(r"fold|state_walk_planes|tape_walk_planes|offset_walk_planes|dvlocal_mma_g|chunk_grads_mma[68]|output_mma16gn$|prep_mma_g", n):
        print(f"fold-check: {n}: {r['registers']} regs, spill {r['spill_stores']}/{r['spill_loads']} bytes")
grew = [f"{n}:{a.get(n, {}).get('spill_stores', 0)}->{r['spill_stores']}" for n, r in sorted(b.items())
        if r["spill_stores"] > a.get(n, {}).get("spill_stores", 0)]
print("fold-check: spill stores grew against ptx/blobs (sm_90a): " + (" ".join(grew) if grew else "none"))
if b.get("gdn_state_walk_planes_f", {}).get("spill_stores", 0) > 0:
    print("fold-check: gdn_state_walk_planes_f spills: its fallback is GDNKCP_FOLD_AHEAD 0 (the fragments loaded right "
          "before the fold): VARIANTS='a0=GDNKCP_FOLD_AHEAD=0' BENCH_FLAGS=--fold TARGETS=sm_90a bash scripts/knob-sweep.sh")
PY
packs=("${DOCS:-32768}")
[ -n "${DOCS2-40000,45000,35908}" ] && packs+=("${DOCS2-40000,45000,35908}")
for r in $(seq 1 "${ROUNDS:-1}"); do
	for p in "${packs[@]}"; do
		for s in ${SETS-A B F G FTR FTR128}; do
			dir=$work/blobs-b flag= modes=${MODES:-core,core+bwd}
			[ "$s" = A ] && dir=ptx/blobs
			[ "$s" = F ] && flag=--fold
			[ "$s" = K ] && flag='--fold --fold-kernel'
			[ "$s" = G ] && flag='--fold --fold-after'
			[ "$s" = T ] && flag=--tape-bf16 modes=core+bwd
			[ "$s" = FT ] && flag='--fold --tape-bf16' modes=core+bwd
			[ "$s" = R ] && flag=--raw-qk modes=core+bwd
			[ "$s" = FTR ] && flag='--fold --tape-bf16 --raw-qk' modes=core+bwd
			[ "$s" = FTR128 ] && flag='--fold --tape-bf16 --raw-qk --force-vh 128' modes=core+bwd
			# shellcheck disable=SC2086 # flag is a word or none
			GDNKCP_BLOB_DIR=$dir timeout "${BENCH_TIMEOUT:-240}" .gpu/kcp bench --docs "$p" --kernels v5 --modes "$modes" \
				--reps "${REPS:-5}" --warmup 2 $flag >"$work/logs/bench-$s-$p-$r.txt" 2>&1 ||
				echo "fold-check: bench $s at $p, round $r: rc $? (logs/bench-$s-$p-$r.txt)"
		done
	done
done
tests=${TESTS-'TestGPUFoldedOutput|TestGPUFoldedBackward|TestGPUFoldEntries|TestGPUTapeBF16|TestGPURawQK'}
if [ -n "$tests" ]; then
	t1=$(date +%s)
	left=$((${BUDGET:-560} - (t1 - t0)))
	if [ "$left" -lt 60 ]; then
		echo "fold-check: no time left for the tests ($left s of BUDGET); run them alone: TESTS=... SETS= bash scripts/fold-check.sh"
	else
		(cd kcp && GDNKCP_BLOB_DIR=$work/blobs-b timeout "$left" ../.gpu/kcp.test -test.run "$tests" -test.v -test.timeout "${left}s" \
			>"$work/logs/kcp-b.log" 2>&1)
		echo "fold-check: kcp tests on B: rc=$? ($(($(date +%s) - t1)) s; timeout $left s)"
	fi
	[ -f "$work/logs/kcp-b.log" ] && grep -E "^(--- |FAIL|ok|panic)|folded vs unfolded" "$work/logs/kcp-b.log" | sort | uniq -c | sort -rn | head -12
fi
tar -C "$work" -czf "$out/logs-fold.tar.gz" logs
echo "A: the committed blobs; B: ptx/src built (no --fold); F: B with --fold (the prep's fold phase); K: --fold --fold-kernel (gdn_fold_operands, in the prep stage); G: --fold --fold-after (gdn_output_folded after the unfolded walk, in the output stage); FTR: --fold --tape-bf16 --raw-qk; FTR128: FTR at vh 128 (K, T, R, FT on request)"
PYTHONPATH=scripts python3 - "$work/logs" "${ROUNDS:-1}" "${packs[*]}" "${SETS-A B F G FTR FTR128}" <<'PY'
import sys
from benchparse import print_sweep, sweep_rows
logs, rounds, packs, sets = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
print_sweep(sweep_rows(logs, rounds, sets, packs), sets, rounds)
PY
