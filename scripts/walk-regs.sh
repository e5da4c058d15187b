#!/usr/bin/env bash
# walk-regs.sh (device run): ptxas's registers and spills of the plane walks' entries for -D variants,
# compiling only the walk sources (seconds, not a blob build). SRC: the source directory (default ptx/src,
# relative to the repository); ARCH (default sm_90a); WALK_VARIANTS: -D flags for gdn_walk_planes.cu;
# TAPE_VARIANTS: -D flags for gdn_tape_planes.cu (one compile each, all at once). "-" means no flag; flags
# joined by commas go on one compile.
#   run(command="SRC=.gpu/src-t WALK_VARIANTS='-DGDNKCP_WP_META_AHEAD=0 -DGDNKCP_WP_META_AHEAD=1' bash scripts/walk-regs.sh",
#       carry=[".gpu/src-t"])
set -uo pipefail
awk=$(cd "$(dirname "$0")" && pwd)/ptxas-walks.awk
cd "$(dirname "$0")/.." && cd "${SRC:-ptx/src}" || exit 1
export PATH=/usr/local/cuda/bin:$PATH
arch=${ARCH:-sm_90a}
w=$(mktemp -d)
i=0
jobs=()
for f in gdn_walk_planes gdn_tape_planes; do
	[ $f = gdn_walk_planes ] && vs=${WALK_VARIANTS:--} || vs=${TAPE_VARIANTS:--}
	for v in $vs; do
		d=${v//,/ }  # comma-joined flags: one compile with all of them
		[ "$v" = - ] && d=
		nvcc -cubin -gencode=arch=compute_${arch#sm_},code=$arch -O3 -std=c++17 -Xptxas -v $d -o "$w/$i.cubin" $f.cu >"$w/$i.log" 2>&1 &
		jobs+=("$i $f $v")
		i=$((i + 1))
	done
done
wait
for j in "${jobs[@]}"; do
	set -- $j
	echo "== $arch $2.cu $3"
	grep -q error "$w/$1.log" && grep error "$w/$1.log" | head -5
	awk -f "$awk" "$w/$1.log"
	# ptxas serialises a function's wgmmas (a wait after each) where it cannot keep their registers apart
	# ("Potential Performance Loss: wgmma.mma_async instructions are serialized ..."): a walk that says so has
	# lost its overlap whatever its registers.
	grep -i 'performance loss' "$w/$1.log" | sed 's/^/  ptxas: /' | sort -u | head -5
done
