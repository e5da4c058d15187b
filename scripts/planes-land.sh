#!/usr/bin/env bash
# planes-land.sh: on the GPU machine, one call that lands the plane walks when ptxas spills in them:
#   1. scripts/planes-variants.sh: registers and spills of gdn_state_walk_planes / gdn_summary_walk_planes
#      for each variant of their compile-time knobs (sm_90a, ptxas of this machine);
#   2. when the default variant spills, the first spill-free variant of VARIANTS' order becomes B: a copy of
#      ptx/src in .gpu/src-b whose #define defaults of gdn_walk_planes.cu are that variant's flags (the same
#      edit must then be made here before B's blobs are installed: it prints the variant's name and flags);
#   3. scripts/land-check.sh with ALT_SRC = that tree (WALK=0 by default).
# There: run(command="bash scripts/planes-land.sh", carry=[".gpu/pack.tgz"]) after scripts/land-prep.sh here.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?}
[ -f .gpu/pack.tgz ] && tar -C .gpu -xzf .gpu/pack.tgz
VARIANTS=${VARIANTS:-"default= xor0=-DGDNKCP_WP_XOR_ADDR=0 unroll1=-DGDNKCP_WP_OUT_UNROLL=1 u0=-DGDNKCP_WP_U_LATE=0 v0=-DGDNKCP_WP_STAGE_V=0 h0=-DGDNKCP_WP_STAGE_H=0 none=-DGDNKCP_WP_STAGE_H=0,-DGDNKCP_WP_STAGE_V=0"}
export VARIANTS
echo "== planes-variants"
bash scripts/planes-variants.sh | tee "$out/planes-variants.txt"
pick=
for v in $VARIANTS; do
	name=${v%%=*}
	# spill-free: both kernels report 0 / 0 spills and the compile succeeded.
	n=$(grep -E "^$name " "$out/planes-variants.txt" | grep -cE ' / 0 / 0 \(rc 0\)$')
	if [ "$n" = 2 ]; then pick=$v; break; fi
done
if [ -z "$pick" ]; then
	echo "planes-land: every variant spills; nothing to land" >&2
	exit 1
fi
alt=ptx/src
if [ "${pick%%=*}" != default ]; then
	rm -rf .gpu/src-b && cp -r ptx/src .gpu/src-b
	IFS=, read -r -a flags <<< "${pick#*=}"
	for f in "${flags[@]}"; do
		kv=${f#-D}
		sed -i "s/^#define ${kv%%=*} .*/#define ${kv%%=*} ${kv#*=}/" .gpu/src-b/gdn_walk_planes.cu
	done
	alt=.gpu/src-b
fi
echo "planes-land: B = variant ${pick%%=*} (${pick#*=}) from $alt"
diff -r ptx/src "$alt" | head -20
WALK=${WALK:-0} ALT_SRC=$alt bash scripts/land-check.sh
