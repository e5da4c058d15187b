#!/usr/bin/env bash
# width-sweep.sh: the measurement behind a width rule (DESIGN.md §4: "other GPUs: a profile of their own,
# chosen by measurement"). For each pack of SWEEP (one rank holds it), `kcp bench` at --force-vh 64 and at
# --force-vh 128, core and core+bwd, and a table of the walks' stage medians: the forward state walk (core,
# where it writes bf16 H / V' only), the state walk of core+bwd (fp32 copies too) and the tape walk, with
# the faster width of each marked. Run on the GPU machine with the blobs to measure in GDNKCP_BLOB_DIR
# (default: the embedded ones):
#   run(command="bash scripts/width-sweep.sh", carry=[".gpu/pack.tgz"])
# Env: SWEEP (packs separated by ';', each a --docs list), SWEEP_DEADLINE (seconds: no pack is started after
# it, and the table still prints for those measured), REPS (default 5), KERNELS (default v5), MODES
# (default core,core+bwd; add module-b1 for the module stage, whose kept forward stores fp32 H and V' slots:
# the sm_90a rule's 9/4 forward cost, against the core stage's lean 2 (15/8 before v5.34); its columns are printed too).
# The JSON of every bench lands in $OUT/sweep/ (or /tmp/width-sweep); with OUT set they are packed into
# $OUT/sweep.tgz at the end (a device call brings back 8 files at most). Each cell marks the faster width and, where
# the width rule (`kcp plan --cp 1`, for the GPU present or PLAN_ARCH; the core stage's cells planned
# --lean-forward, as the GPU backend plans that stage) picks the other one, "rule N!"; the last line counts them.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .gpu/pack.tgz ] && [ ! -x .gpu/kcp ] && tar -C .gpu -xzf .gpu/pack.tgz
out=${OUT:-/tmp/width-sweep}/sweep
mkdir -p "$out"
sweep=${SWEEP:-'65536;32768,32768;21845,21845,21846;16384,16384,16384,16384;40000,45000,35908;8192,8192,8192,8192,8192,8192,8192,8192;4096,4096,4096,4096,4096,4096,4096,4096,4096,4096,4096,4096,4096,4096,4096,4096'}
IFS=';' read -ra packs <<<"$sweep"
i=0
t0=$(date +%s)
for p in "${packs[@]}"; do
	if [ "${SWEEP_DEADLINE:-0}" -gt 0 ] && [ $(( $(date +%s) - t0 )) -gt "$SWEEP_DEADLINE" ]; then
		echo "width-sweep: SWEEP_DEADLINE (${SWEEP_DEADLINE} s) passed: pack $p and those after it not run"
		break
	fi
	for vh in 64 128; do
		f="$out/$i-$vh.json"
		timeout 240 .gpu/kcp bench --docs "$p" --kernels "${KERNELS:-v5}" --modes "${MODES:-core,core+bwd}" --reps "${REPS:-5}" \
			--warmup 2 --force-vh "$vh" --json >"$f" 2>"$out/$i-$vh.err" || { echo "width-sweep: pack $p vh $vh failed:"; tail -3 "$out/$i-$vh.err"; }
	done
	i=$((i + 1))
done
python3 - "$out" "${PLAN_ARCH:-}" "${packs[@]}" <<'PY'
import json, sys, os, subprocess
d, arch, packs = sys.argv[1], sys.argv[2], sys.argv[3:]
def rule(p, lean):
    """The width rule's vh for each walk of pack p on one rank (kcp plan), or {} if it cannot say."""
    cmd = [".gpu/kcp", "plan", "--docs", p, "--cp", "1", "--layout", "C", "--json"] + (["--arch", arch] if arch else [])
    try:
        pj = json.loads(subprocess.run(cmd + (["--lean-forward"] if lean else []), capture_output=True, text=True, check=True).stdout)
        return {w["walk"]: w["vh_b"] for w in pj["ranks"][0]["walks"]}
    except Exception:
        return {}
wrong, cells = [], 0
def load(f):
    try:
        data = json.load(open(f))
    except Exception:
        return {}
    rows = data if isinstance(data, list) else data.get("rows", [data])
    return {r["mode"]: r for r in rows}
module = any("module-b1" in load(os.path.join(d, f"{i}-64.json")) for i in range(len(packs)))
head = f"{'pack (docs x chunks)':34} {'state core 64/128':>22} {'state c+b 64/128':>22} {'tape 64/128':>22} {'core+bwd 64/128':>22}"
if module:
    head += f" {'state b1 64/128':>22} {'tape b1 64/128':>22} {'module-b1 64/128':>22}"
print(head)
for i, p in enumerate(packs):
    a, b = load(os.path.join(d, f"{i}-64.json")), load(os.path.join(d, f"{i}-128.json"))
    docs = [int(x) for x in p.split(",")]
    chunks = sorted({(x + 63) // 64 for x in docs})
    name = f"{len(docs)} x {'/'.join(map(str, chunks))}"
    picks = {False: rule(p, False), True: rule(p, True)}
    def cell(mode, stage):
        global cells
        try:
            x, y = a[mode]["stage_median_ms"][stage], b[mode]["stage_median_ms"][stage]
        except KeyError:
            return f"{'-':>22}"
        m = "64" if x < y else "128"
        pick = picks[mode.startswith("core")].get("tape" if "tape" in stage else "state")
        cells += 1
        if pick is not None and str(pick) != m:
            wrong.append(f"{name} {mode} {stage}: rule {pick}, faster {m} ({x:.3f} / {y:.3f} ms)")
            return f"{x:7.3f} {y:7.3f} ({m:>3}, rule {pick}!)".rjust(30)
        return f"{x:7.3f} {y:7.3f} ({m:>3})".rjust(22)
    def tot(mode):
        try:
            x, y = a[mode]["median_ms"], b[mode]["median_ms"]
        except KeyError:
            return f"{'-':>22}"
        return f"{x:7.3f} {y:7.3f}".rjust(22)
    line = f"{name:34} {cell('core', 'state walk')} {cell('core+bwd', 'fwd state walk')} {cell('core+bwd', 'bwd tape walk')} {tot('core+bwd')}"
    if module:
        line += f" {cell('module-b1', 'fwd state walk')} {cell('module-b1', 'bwd tape walk')} {tot('module-b1')}"
    print(line)
print(f"width rule: picks the faster width in {cells - len(wrong)} of {cells} cells" + "".join("\n  " + w for w in wrong))
PY
if [ -n "${OUT:-}" ]; then
	tar -C "$OUT" -czf "$OUT/sweep.tgz" sweep && rm -rf "$out" && echo "width-sweep: the JSON files are in sweep.tgz"
fi
