#!/usr/bin/env bash
# nvcc-check.sh (this machine, no GPU): compiles the kernels with whatever nvcc is on PATH, as they are (base:
# ptx/src) and as the next blob build will see them (staged: scripts/staged-tree.sh, every ptx/staging patch
# applied in a scratch copy), so that a staged change is compiled before device time is spent on it. The
# working tree and the blobs are not touched.
#   1. The whole of gdnkcp.cu, base and staged, for a Hopper cubin (sm_90a, or sm_90 where nvcc predates 12.0:
#      then the walks' mma.sync form, which the Blackwell cubins run too) and for the compute_80 PTX assembled
#      by ptxas for sm_80: registers / spill stores / spill loads of every staged entry, and of base where
#      they differ.
#      Also: entries whose compute_80 PTX has chains of serialized global loads (scripts/ptx-serial-loads.py) that
#      base's has not (a note).
#   2. For each -D variant (WALK_VARIANTS for gdn_walk_planes.cu, TAPE_VARIANTS for gdn_tape_planes.cu, as in
#      scripts/walk-regs.sh; "-" for none, flags joined by commas go on one compile; default "-"): the walks'
#      registers, and where the Hopper cubin is sm_90, sm_90a's wgmma path through nvcc's front end (-ptx with
#      __CUDA_ARCH_FEAT_SM90_ALL defined: its C++ and asm operands compile; the PTX is not assembled).
# Exit 1 on a compile error, or where a staged walk spills more than base's.
#
#   WALK_VARIANTS='- -DGDNKCP_WP_H_FRAGS=0' TAPE_VARIANTS='- -DGDNKCP_TAPE_DOF_FIRST=0' bash scripts/nvcc-check.sh
#
# Any CUDA toolkit will do, e.g. Debian bookworm's nvidia-cuda-toolkit (11.8; add "contrib non-free" to the
# apt sources). It installs a libcuda.so.1 stub: move it aside (ldconfig -p | grep libcuda), or the loader
# finds a driver without a GPU and the fake-driver tests skip. Its ptxas is older than the blob builder's
# (13.0): the counts are a proxy, to compare base with staged, not the manifest's figures (11.8 is the more
# pessimistic: gdn_chunk_grads and gdn_offset_walk_planes spill under it on sm_90, not under 13.0).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
command -v nvcc >/dev/null || { echo "nvcc-check: no nvcc on PATH" >&2; exit 2; }
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
bash "$here/staged-tree.sh" "$w/staged" >/dev/null || exit 1
staged=$(cd "$root/ptx/staging" && shopt -s nullglob && echo *.patch *.cu)
arch90=sm_90a
nvcc --list-gpu-code 2>/dev/null | grep -q sm_90a || arch90=sm_90
flags=(-O3 -std=c++17)
table() { # ptxas -v output -> "entry regs/spill_stores/spill_loads", sorted
	awk '/Compiling entry function/ { match($0, /'"'"'[^'"'"']+'"'"'/); e = substr($0, RSTART + 1, RLENGTH - 2) }
	     /bytes stack frame/ { ss = $5; sl = $9 }
	     /Used [0-9]+ registers/ { match($0, /Used [0-9]+/); printf "%s %s/%s/%s\n", e, substr($0, RSTART + 5, RLENGTH - 5), ss, sl }' | sort
}
build() { # src tag: the Hopper cubin ($w/tag.h) and the compute_80 PTX for sm_80 ($w/tag.p)
	cd "$1" || return 1
	nvcc -cubin -gencode=arch=compute_${arch90#sm_},code=$arch90 "${flags[@]}" -Xptxas -v -o "$w/$2.cubin" gdnkcp.cu >"$w/$2.h.log" 2>&1 &&
		nvcc -ptx -arch=compute_80 "${flags[@]}" -o "$w/$2.ptx" gdnkcp.cu >"$w/$2.p.log" 2>&1 &&
		ptxas -arch=sm_80 -v -o "$w/$2.p.cubin" "$w/$2.ptx" >>"$w/$2.p.log" 2>&1 ||
		{ echo "nvcc-check: $2 ($1) does not compile:"; grep -h error "$w/$2".*.log | head -20; return 1; }
	table <"$w/$2.h.log" >"$w/$2.h"
	table <"$w/$2.p.log" >"$w/$2.p"
	join "$w/$2.h" "$w/$2.p" >"$w/$2.tab"
}
build "$root/ptx/src" base >"$w/base.out" 2>&1 &
build "$w/staged/ptx/src" staged >"$w/staged.out" 2>&1 &
wait
cat "$w/base.out" "$w/staged.out"
[ -s "$w/base.tab" ] && [ -s "$w/staged.tab" ] || exit 1
echo "nvcc-check: $(nvcc --version | grep -o 'release [0-9.]*'); staged: ${staged:-nothing}"
printf '%-28s %16s %16s   %s\n' entry "$arch90 r/st/ld" "sm_80 r/st/ld" "base where it differs"
join -a1 "$w/staged.tab" "$w/base.tab" | awk '{ d = ""; if (NF < 5) d = "(new)"; else if ($2 != $4 || $3 != $5) d = $4 "  " $5
	printf "%-28s %16s %16s   %s\n", $1, $2, $3, d }'
# Global loads issued one round trip after another (scripts/ptx-serial-loads.py) in the staged compute_80 PTX
# and not in base's: a note, not a failure (the heuristic has false positives; read the source).
if [ -s "$w/base.ptx" ] && [ -s "$w/staged.ptx" ]; then
	for t in base staged; do # each entry's longest chain
		python3 "$here/ptx-serial-loads.py" "$w/$t.ptx" | awk '/ loads in a chain/ { sub(":", "", $1); if ($2 > m[$1]) m[$1] = $2 }
			END { for (e in m) print e, m[e] }' | sort >"$w/$t.serial"
	done
	more=$(join -a1 "$w/staged.serial" "$w/base.serial" | awk '$2 > ($3 == "" ? 0 : $3) { printf "%s %s -> %s; ", $1, ($3 == "" ? 0 : $3), $2 }')
	echo "nvcc-check: longer chains of serialized global loads in staged (ptx-serial-loads.py): ${more:-none}"
fi
# A walk's spill bytes (stores + loads, both targets) staged against base: more is a failure.
bad=$(join -a1 "$w/staged.tab" "$w/base.tab" | awk '$1 ~ /walk/ { split($2, h, "/"); split($3, p, "/"); s = h[2] + h[3] + p[2] + p[3]
	b = 0; if (NF >= 5) { split($4, h, "/"); split($5, p, "/"); b = h[2] + h[3] + p[2] + p[3] }
	if (s > b) print $1 " (" b " -> " s " bytes)" }')
status=0
if [ -n "$bad" ]; then
	echo "nvcc-check: staged walks that spill more than base: $bad" >&2
	status=1
fi
# With no variants on an nvcc that builds sm_90a, step 2 would repeat step 1.
files="gdn_walk_planes gdn_tape_planes"
[ -z "${WALK_VARIANTS:-}${TAPE_VARIANTS:-}" ] && [ $arch90 = sm_90a ] && files=
i=0
for f in $files; do
	[ $f = gdn_walk_planes ] && vs=${WALK_VARIANTS:--} || vs=${TAPE_VARIANTS:--}
	for v in $vs; do
		d=${v//,/ }
		[ "$v" = - ] && d=
		echo "== $f.cu $v"
		cd "$w/staged/ptx/src" || exit 1
		if nvcc -cubin -gencode=arch=compute_${arch90#sm_},code=$arch90 "${flags[@]}" -Xptxas -v $d -o "$w/v$i.cubin" $f.cu >"$w/v$i.log" 2>&1; then
			awk -f "$here/ptxas-walks.awk" "$w/v$i.log" | sed "s/^  /  $arch90 /"
		else
			echo "  $arch90: does not compile"; grep error "$w/v$i.log" | head -5; status=1
		fi
		if [ $arch90 = sm_90 ]; then
			if nvcc -ptx -arch=compute_90 "${flags[@]}" -D__CUDA_ARCH_FEAT_SM90_ALL $d -o "$w/v$i.ptx" $f.cu >"$w/f$i.log" 2>&1; then
				echo "  sm_90a front end: compiles ($(grep -c 'wgmma.mma_async' "$w/v$i.ptx") wgmma.mma_async)"
			else
				echo "  sm_90a front end: does not compile"; grep error "$w/f$i.log" | head -5; status=1
			fi
		fi
		i=$((i + 1))
	done
done
[ $status = 0 ] && echo "nvcc-check: ok (everything compiles; no staged walk spills more than base)"
exit $status
