#!/usr/bin/env bash
# walk-timeline.sh: on the GPU machine, the vh 64 tape and state walks' per-chunk timelines
# (ptx/devtest/walk_timeline.cu): which phase of a chunk takes how long for a state warp and a copying warp, and
# which of the two ends a chunk last (the other waits at the next barrier). Builds the devtest twice from a copy
# of ptx/src with the marks of ptx/staging/walk_marks.patch applied (unless ptx/src has them): plain (the walks'
# CUDA-event times, to compare with kcp bench's "bwd tape walk" and "fwd state walk") and with
# -DGDNKCP_WALK_TIMELINE (the marks on: clock64 stores by warps 0 and 4 of one CTA), and a third time with
# -DGDNKCP_WALK_W128 (both walks' times at vh 128 too, printed alone). NC=chunks (default 512),
# WALKS=tape|state|both (default both). ~1 minute; no Go needed. The patches touch only the copy (kcp's own files
# are not patched: the devtest launches the walks itself).
#   run(command="bash scripts/walk-timeline.sh; PATCHES='tape_dof_first' bash scripts/walk-timeline.sh")
set -u
cd "$(dirname "$0")/.."
root=$(pwd)
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
NC=${NC:-512}
W=/tmp/walk-timeline
rm -rf "$W" && mkdir -p "$W" && cp -r ptx/src ptx/devtest "$W"/
# PATCHES: staged patches (ptx/staging/NAME.patch) applied to the copy, e.g. PATCHES='tape_dof_first' to time a
# staged change; walk_marks is applied too unless ptx/src has its hooks (after scripts/land-prep.sh it does, and
# every staged patch: run the v5.33 timeline before land-prep, or from a clean checkout).
patches=${PATCHES:-}
grep -q 'GDNKCP_TAPE_MARK(9' "$W/src/gdn_tape_planes.cu" || patches="walk_marks $patches"
for p in $patches; do
	if (cd "$W" && git apply -p2 --include="src/*" --reverse --check "$root/ptx/staging/$p.patch" 2>/dev/null); then
		echo "walk-timeline: ptx/src already has ptx/staging/$p.patch (after scripts/land-prep.sh)"
		continue
	fi
	(cd "$W" && { git apply -p2 --include="src/*" "$root/ptx/staging/$p.patch" 2>/dev/null || patch -p2 <"$root/ptx/staging/$p.patch"; }) ||
		{ echo "walk-timeline: ptx/staging/$p.patch does not apply to ptx/src"; exit 1; }
	echo "walk-timeline: applied ptx/staging/$p.patch"
done
echo "walk-timeline: mark hooks: tape walk $(grep -c 'GDNKCP_TAPE_MARK(' "$W/src/gdn_tape_planes.cu"), state walk $(grep -c 'GDNKCP_WALK_MARK(' "$W/src/gdn_walk_planes.cu")"
flags=(-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -lineinfo)
("$NVCC" "${flags[@]}" -o "$W/plain" "$W/devtest/walk_timeline.cu" >"$W/build_plain.log" 2>&1; echo $? >"$W/rc_plain") &
("$NVCC" "${flags[@]}" -DGDNKCP_WALK_TIMELINE -o "$W/tl" "$W/devtest/walk_timeline.cu" >"$W/build_tl.log" 2>&1; echo $? >"$W/rc_tl") &
# A third build times both walks at vh 128 too (-DGDNKCP_WALK_W128), apart so that its failure costs only those lines.
("$NVCC" "${flags[@]}" -DGDNKCP_WALK_W128 -o "$W/w128" "$W/devtest/walk_timeline.cu" >"$W/build_w128.log" 2>&1; echo $? >"$W/rc_w128") &
wait
for v in plain tl; do
	echo "== build $v: rc $(cat "$W/rc_$v")"
	grep -E 'error' "$W/build_$v.log" | head -20
	grep -i 'performance loss' "$W/build_$v.log" | sort -u | head -5  # wgmmas serialised by ptxas
	# ptxas -v: every plane walk's registers and spills (scripts/ptxas-walks.awk; the devtest compiles the whole
	# walk sources, so both widths of the tape walk and the offset walk are listed)
	awk -f "$root/scripts/ptxas-walks.awk" "$W/build_$v.log" | grep planes
done
for v in plain tl; do
	[ "$(cat "$W/rc_$v")" = 0 ] && timeout 120 "$W/$v" "$NC" "$v" "${WALKS:-both}" 2>&1 | tail -40
done
if [ "$(cat "$W/rc_w128")" = 0 ]; then
	timeout 120 "$W/w128" "$NC" w128 "${WALKS:-both}" 2>&1 | grep -E 'vh 128|error|ERROR'
else
	echo "== build w128: rc $(cat "$W/rc_w128")"
	grep -E 'error' "$W/build_w128.log" | head -10
fi
[ -n "${OUT:-}" ] && cp "$W"/build_*.log "$OUT"/ 2>/dev/null
exit 0
