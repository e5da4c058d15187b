#!/usr/bin/env bash
# Per-instruction stall sampling of one kernel (ncu SourceCounters), for reading where a kernel waits.
# There (device run, carry .gpu/pack.tgz or .gpu/kcp):
#   run(command="KERNEL=state_walk_mma16 bash scripts/ncu-source.sh --docs 32768 --kernels v5 --modes core")
# The arguments after the script name go to `kcp bench` (one launch of KERNEL is profiled, the first).
# Writes $OUT/<KERNEL>-sass.csv (ncu --page source --print-source sass: every SASS instruction with its
# stall samples) and prints the summary of scripts/ncu-sass.py. Here, on that csv: scripts/ncu-phases.py (split at
# the barriers) or scripts/ncu-range.py (split where you say, per-warp-and-chunk counts, --list).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?}
export PATH=/usr/local/cuda/bin:$PATH
[ -f .gpu/pack.tgz ] && tar -C .gpu -xzf .gpu/pack.tgz
k=${KERNEL:?KERNEL names the kernel (a regex)}
rep=/tmp/gdnkcp-src-$$
timeout ${NCU_TIMEOUT:-200} ncu --clock-control none --kernel-name "regex:$k" --launch-skip ${SKIP:-0} --launch-count 1 \
	--section SourceCounters --section WarpStateStats --section SpeedOfLight -f -o "$rep" \
	.gpu/kcp bench --reps 1 --warmup 0 "$@" >"$out/ncu-source.log" 2>&1
echo "ncu rc=$?"; grep -E "==(PROF|ERROR)==" "$out/ncu-source.log" | head -4
name=$(echo "$k" | tr -c 'A-Za-z0-9_\n' '_')
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$out/$name-sass.csv" 2>"$out/ncu-source.err"
echo "sass csv: $(wc -l <"$out/$name-sass.csv") lines"; head -c 600 "$out/ncu-source.err"
python3 scripts/ncu-sass.py "$out/$name-sass.csv" | head -${LINES_OUT:-60}
