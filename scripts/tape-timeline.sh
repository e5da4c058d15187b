#!/usr/bin/env bash
# tape-timeline.sh: on the GPU machine, the tape walk's per-chunk timeline (ptx/devtest/tape_timeline.cu): which
# phase of a chunk takes how long for a state warp and a copying warp, and which of the two ends a chunk last
# (the other waits at the next barrier). Builds the devtest twice from a copy of ptx/src with the marks of
# ptx/staging/tape_marks.patch applied (unless ptx/src has them): plain (its CUDA-event time, to compare with
# kcp bench's "bwd tape walk") and with -DGDNKCP_WALK_TIMELINE (the marks on: clock64 stores by warps 0 and 4
# of one CTA). NC=chunks (default 512). ~1 minute; no Go needed. The patches touch only the copy (kcp's own
# files are not patched: the devtest launches the walk itself).
#   run(command="bash scripts/tape-timeline.sh; PATCHES=tape_dvl_ahead bash scripts/tape-timeline.sh")
set -u
cd "$(dirname "$0")/.."
root=$(pwd)
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
NC=${NC:-512}
W=/tmp/tape-timeline
rm -rf "$W" && mkdir -p "$W" && cp -r ptx/src ptx/devtest "$W"/
# PATCHES: staged patches (ptx/staging/NAME.patch) applied to the copy, e.g. PATCHES='tape_dvl_ahead' to time a
# staged change; tape_marks is applied too unless ptx/src has its hooks (after scripts/land-prep.sh it does, and
# every staged patch: run the v5.33 timeline before land-prep, or from a clean checkout).
patches=${PATCHES:-}
grep -q 'GDNKCP_TAPE_MARK(9' "$W/src/gdn_tape_planes.cu" || patches="tape_marks $patches"
for p in $patches; do
	if (cd "$W" && git apply -p2 --include="src/*" --reverse --check "$root/ptx/staging/$p.patch" 2>/dev/null); then
		echo "tape-timeline: ptx/src already has ptx/staging/$p.patch (after scripts/land-prep.sh)"
		continue
	fi
	(cd "$W" && { git apply -p2 --include="src/*" "$root/ptx/staging/$p.patch" 2>/dev/null || patch -p2 <"$root/ptx/staging/$p.patch"; }) ||
		{ echo "tape-timeline: ptx/staging/$p.patch does not apply to ptx/src"; exit 1; }
	echo "tape-timeline: applied ptx/staging/$p.patch"
done
grep -c 'GDNKCP_TAPE_MARK(' "$W/src/gdn_tape_planes.cu" | sed 's/^/tape-timeline: mark hooks in the walk: /'
flags=(-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -lineinfo)
("$NVCC" "${flags[@]}" -o "$W/plain" "$W/devtest/tape_timeline.cu" >"$W/build_plain.log" 2>&1; echo $? >"$W/rc_plain") &
("$NVCC" "${flags[@]}" -DGDNKCP_WALK_TIMELINE -o "$W/tl" "$W/devtest/tape_timeline.cu" >"$W/build_tl.log" 2>&1; echo $? >"$W/rc_tl") &
wait
for v in plain tl; do
	echo "== build $v: rc $(cat "$W/rc_$v")"
	grep -E 'error' "$W/build_$v.log" | head -20
	# ptxas -v: the line after "Compiling entry function 'gdn_tape_walk_planes'" with its registers and spills
	grep -A3 "function 'gdn_tape_walk_planes'" "$W/build_$v.log" | grep -E 'registers|spill' | head -3
done
for v in plain tl; do
	[ "$(cat "$W/rc_$v")" = 0 ] && timeout 120 "$W/$v" "$NC" "$v" 2>&1 | tail -24
done
[ -n "${OUT:-}" ] && cp "$W"/build_*.log "$OUT"/ 2>/dev/null
exit 0
