#!/usr/bin/env bash
# A/B timing of two kernel source trees in one device call: builds ptx/src (A, unless dev-cycle.sh already
# built it into /tmp/gdnkcp-blobs) and ALT_SRC (B, default .gpu/src-b: a copy of ptx/src with the candidate
# change, carried inside .gpu/pack.tgz) with .gpu/ptxgen, then runs `kcp bench` on each blob set in turn,
# alternating A, B, A, B (ROUNDS, default 2) so that drift of the machine shows, and prints one line per
# stage and set last. B's blobs come back as $OUT/blobs-b.tar.gz.
# Here: mkdir -p .gpu && cp -r ptx/src .gpu/src-b, edit it, scripts/gpu.sh pack kcp kcp.test ptxgen src-b.
# There: run(command="bash scripts/ab-bench.sh", carry=[".gpu/pack.tgz"])
# Env: DOCS (default 32768), MODES (default core,core+bwd), REPS (default 5), KERNELS (default v5);
# A_BLOBS: a built blob directory to use as A instead (e.g. ptx/blobs, the committed blobs, with ALT_SRC=ptx/src
# to time the working tree's sources against them); B_TESTS: a kcp test regex to run on B's blobs afterwards;
# A_KCP: the kcp binary for A's runs (default .gpu/kcp), where B changes a kernel's arguments and the
# current kcp cannot launch A's blobs (e.g. .gpu/kcp-a, built before scripts/land-v4.sh applied the patch);
# B_ARGS: more `kcp bench` arguments for B's runs only (an opt-in the patch adds, e.g. --tape-former).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?}
export PATH=/usr/local/cuda/bin:$PATH
[ -f .gpu/pack.tgz ] && [ ! -x .gpu/ptxgen ] && tar -C .gpu -xzf .gpu/pack.tgz
alt=${ALT_SRC:-.gpu/src-b}
[ -d "$alt" ] || { echo "ab-bench: no $alt" >&2; exit 1; }
a=${A_BLOBS:-/tmp/gdnkcp-blobs} b=/tmp/gdnkcp-blobs-b
if [ ! -f "$a/manifest.json" ]; then
	mkdir -p "$a" && .gpu/ptxgen -src ptx/src -out "$a" >"$out/ptxgen-a.log" 2>&1 || { tail -20 "$out/ptxgen-a.log"; exit 1; }
fi
rm -rf "$b" && mkdir -p "$b"
.gpu/ptxgen -src "$alt" -out "$b" >"$out/ptxgen-b.log" 2>&1 || { tail -20 "$out/ptxgen-b.log"; exit 1; }
tar -C "$b" -czf "$out/blobs-b.tar.gz" .
python3 - "$a/manifest.json" "$b/manifest.json" <<'PY'
import json, sys
sets = [json.load(open(p)) for p in sys.argv[1:]]
def regs(m):
    return {e["name"]: e.get("resources") or {} for bl in m["blobs"] if bl["target"] == "sm_90a" for e in bl["entries"]}
ra, rb = (regs(m) for m in sets)
for name in sorted(ra):
    x, y = ra[name], rb.get(name, {})
    if x != y:
        print(f"  sm_90a {name}: A regs {x.get('registers')} spills {x.get('spill_stores')}, B regs {y.get('registers')} spills {y.get('spill_stores')}")
PY
for r in $(seq 1 "${ROUNDS:-2}"); do
	for s in A B; do
		dir=$a; [ $s = B ] && dir=$b
		bin=.gpu/kcp; [ $s = A ] && bin=${A_KCP:-.gpu/kcp}
		extra=(); [ $s = B ] && read -r -a extra <<<"${B_ARGS:-}"
		GDNKCP_BLOB_DIR=$dir timeout ${BENCH_TIMEOUT:-240} $bin bench --docs "${DOCS:-32768}" --kernels "${KERNELS:-v5}" \
			--modes "${MODES:-core,core+bwd}" --reps "${REPS:-5}" --warmup 2 "${extra[@]}" 2>/dev/null >"$out/bench-$s-$r.txt"
	done
done
if [ -n "${B_TESTS:-}" ]; then
	t0=$(date +%s)
	(cd kcp && GDNKCP_BLOB_DIR=$b ../.gpu/kcp.test -test.run "$B_TESTS" -test.v -test.timeout 300s >"$out/kcp-b.log" 2>&1)
	echo "kcp tests on B's blobs: rc=$? ($(( $(date +%s) - t0 )) s)"
	grep -E "^(--- |FAIL|ok|panic)" "$out/kcp-b.log" | head -20
fi
# One line per (mode, stage): the set's figures over the rounds.
PYTHONPATH=scripts python3 - "$out" "${ROUNDS:-2}" <<'PY'
import sys, collections
from benchparse import stages
out, rounds = sys.argv[1], int(sys.argv[2])
rows = collections.OrderedDict()
for r in range(1, rounds + 1):
    for s in "AB":
        for mode, stage, ms in stages(f"{out}/bench-{s}-{r}.txt"):
            rows.setdefault((mode, stage), {"A": [], "B": []})[s].append(ms)
print(f"{'mode':10s} {'stage':22s} {'A (ms)':>18s} {'B (ms)':>18s}")
for (mode, stage), v in rows.items():
    f = lambda xs: " ".join(f"{x:.3f}" for x in xs)
    print(f"{mode:10s} {stage:22s} {f(v['A']):>18s} {f(v['B']):>18s}")
PY
