#!/usr/bin/env bash
# sass-stats.sh: on the GPU machine (cuobjdump there), the SASS of the wgmma kernels of an sm_90a cubin,
# counted per function: HGMMA instructions, WARPGROUP.ARRIVE, WARPGROUP.DEPBAR (a wgmma wait), and the HGMMA
# that a wait follows before the next HGMMA (each such wgmma ran alone: serialized). The SASS goes to
# $OUT/NAME.sass.gz for reading here (scripts/sass-diff.py compares two of them by opcode, no GPU needed).
#   run(command="bash scripts/sass-stats.sh [CUBIN] [FUNCTION_REGEX]")
# Defaults: ptx/blobs/gdnkcp.sm_90a.cubin, the walks (_walk_).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
cubin=${1:-ptx/blobs/gdnkcp.sm_90a.cubin}
re=${2:-_walk_}
name=$(basename "$cubin" .cubin)
tmp=$(mktemp)
cuobjdump -sass "$cubin" >"$tmp" || { echo "sass-stats: cuobjdump failed on $cubin" >&2; exit 1; }
[ -n "${OUT:-}" ] && gzip -c "$tmp" >"$OUT/$name.sass.gz"
python3 - "$tmp" "$re" <<'PY'
import re, sys
text = open(sys.argv[1]).read().split("\n")
pat = re.compile(sys.argv[2])
fn, stats = None, {}
for line in text:
    m = re.search(r"Function : (\S+)", line)
    if m:
        fn = m.group(1)
        stats[fn] = dict(hgmma=0, arrive=0, depbar=0, alone=0, last=None)
        continue
    if fn is None:
        continue
    s = stats[fn]
    if "HGMMA" in line:
        s["hgmma"] += 1
        s["last"] = "hgmma"
    elif "WARPGROUP.ARRIVE" in line:
        s["arrive"] += 1
    elif "WARPGROUP.DEPBAR" in line:
        s["depbar"] += 1
        if s["last"] == "hgmma":
            s["alone"] += 1
        s["last"] = "depbar"
print(f"{'function':40s} {'HGMMA':>6s} {'ARRIVE':>6s} {'DEPBAR':>6s} {'HGMMA then a wait':>18s}")
for fn, s in stats.items():
    if pat.search(fn) and s["hgmma"]:
        print(f"{fn:40s} {s['hgmma']:6d} {s['arrive']:6d} {s['depbar']:6d} {s['alone']:18d}")
PY
rm -f "$tmp"
