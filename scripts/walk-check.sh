#!/usr/bin/env bash
# walk-check.sh: on the GPU machine, build ptx/devtest/walk_check.cu (the v5 state walk) and, with
# TAPE=1 (the default), tape_check.cu (the tape walk) once per variant: by default the sm_90a wgmma bodies
# ("wgmma") and, with -DGDNKCP_NO_WGMMA, the mma.sync bodies ("mma"); print ptxas's registers / spills /
# wgmma notes for the walks, run each (check against float64 + timing). NC=chunks for the timing (default
# 512). Output tail: the runs. Where the sources have no wgmma body for a walk, both variants build the
# mma.sync one. VARIANTS='tl=-DGDNKCP_WALK_TIMELINE' prints the state and tape walks' per-phase timelines
# (cycles a chunk of warps 0 and 4 at vh 64; needs the walks' GDNKCP_WALK_MARK / GDNKCP_TAPE_MARK hooks in
# ptx/src, ptx/staging/gdn_walk-timeline.patch until it lands).
set -u
cd "$(dirname "$0")/.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
NC=${NC:-512}
W=/tmp/walk-check
mkdir -p "$W"
flags=(-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -lineinfo)
VARIANTS=${VARIANTS:-"wgmma mma"}
# variant name -> extra flags: mma = -DGDNKCP_NO_WGMMA; NAME=FLAG,FLAG... otherwise (e.g. early=-DGDNKCP_WG_WAIT_EARLY)
for v in $VARIANTS; do
	extra=()
	[ "$v" = mma ] && extra=(-DGDNKCP_NO_WGMMA)
	case "$v" in *=*) IFS=, read -r -a extra <<< "${v#*=}"; v=${v%%=*} ;; esac
	( "$NVCC" "${flags[@]}" "${extra[@]}" -o "$W/walk_check_$v" ptx/devtest/walk_check.cu > "$W/build_$v.log" 2>&1; echo $? > "$W/rc_$v" ) &
	if [ "${TAPE:-1}" = 1 ]; then
		( "$NVCC" "${flags[@]}" "${extra[@]}" -o "$W/tape_check_$v" ptx/devtest/tape_check.cu > "$W/tbuild_$v.log" 2>&1; echo $? > "$W/trc_$v" ) &
	fi
done
wait
names=$(for v in $VARIANTS; do echo "${v%%=*}"; done)
for v in $names; do
	echo "== build $v: rc $(cat "$W/rc_$v")"
	grep -E '^ptxas|error' "$W/build_$v.log" | grep -A2 -E 'C7[0-9]+|state_walk_mma16|error' | grep -v 'summary\|^--$' | head -12
	if [ "${TAPE:-1}" = 1 ]; then
		echo "== build tape $v: rc $(cat "$W/trc_$v")"
		grep -E '^ptxas|error' "$W/tbuild_$v.log" | grep -A2 -E 'C7[0-9]+|tape_walk_mma|error' | grep -v 'summary\|^--$' | head -12
	fi
done
for v in $names; do
	[ "$(cat "$W/rc_$v")" = 0 ] && "$W/walk_check_$v" "$NC" "$v" 2>&1 | tail -26
	[ "${TAPE:-1}" = 1 ] && [ "$(cat "$W/trc_$v")" = 0 ] && "$W/tape_check_$v" "$NC" "$v" 2>&1 | tail -28
done
# NCU=NAME: per-instruction stall sampling of that variant's first timed launch (vh 64, h16 + v16).
if [ -n "${NCU:-}" ] && [ "$(cat "$W/rc_$NCU")" = 0 ]; then
	export PATH=/usr/local/cuda/bin:$PATH
	timeout ${NCU_TIMEOUT:-240} ncu --clock-control none --kernel-name regex:state_walk --launch-skip ${SKIP:-3} --launch-count 1 \
		--section SourceCounters --section WarpStateStats --section SpeedOfLight -f -o "$W/ncu" "$W/walk_check_$NCU" "$NC" ncu >"$W/ncu.log" 2>&1
	echo "ncu rc=$?"
	ncu -i "$W/ncu.ncu-rep" --page source --csv --print-source sass >"$W/sass.csv" 2>/dev/null
	python3 scripts/ncu-sass.py "$W/sass.csv" ${NCU_TOP:-30} | head -${LINES_OUT:-70}
	[ -n "${OUT:-}" ] && cp "$W/sass.csv" "$OUT/$NCU-sass.csv"
fi
