#!/usr/bin/env bash
# There (device run): compile gdnkcp.cu of SRC (default ptx/src, relative to the repository) for one cubin target once per -D variant, concurrently, and
# print the walk entries' registers and spills per variant: for choosing a register-allocation knob
# without a full blob build. VARIANTS: space-separated, one -D flag each (one compile each); ARCH: sm_100a.
#   run(command="ARCH=sm_100a VARIANTS='-DGDNKCP_WALK_PG128=1 -DGDNKCP_WALK_PG128=2' bash scripts/spill-variants.sh")
set -uo pipefail
awk=$(cd "$(dirname "$0")" && pwd)/ptxas-walks.awk
cd "$(dirname "$0")/.." && cd "${SRC:-ptx/src}"
export PATH=/usr/local/cuda/bin:$PATH
arch=${ARCH:-sm_100a}
i=0
for v in ${VARIANTS:-''}; do
	nvcc -cubin -gencode=arch=compute_${arch#sm_},code=$arch -O3 -std=c++17 -Xptxas -v $v -o /tmp/sv$i.cubin gdnkcp.cu >/tmp/sv$i.log 2>&1 &
	i=$((i + 1))
done
wait
i=0
for v in ${VARIANTS:-''}; do
	echo "== $arch $v"
	awk -f "$awk" /tmp/sv$i.log
	i=$((i + 1))
done
