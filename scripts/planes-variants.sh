#!/usr/bin/env bash
# planes-variants.sh: on the GPU machine, compile the plane walks (ptx/src/gdn_walk_planes.cu) for sm_90a once
# per variant of its compile-time knobs and print ptxas's registers and spills of gdn_state_walk_planes and
# gdn_summary_walk_planes (TestEmbeddedWalksDoNotSpill allows none). Seconds a variant, all in parallel.
# VARIANTS: space-separated NAME=FLAG,FLAG... (default: the measured defaults and the knobs one at a time).
# Pick a spill-free variant, set its defaults in gdn_walk_planes.cu, then build and time it
# (scripts/land-check.sh) and run the suite on its blobs (scripts/land-suite.sh).
set -u
cd "$(dirname "$0")/.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
W=/tmp/planes-variants
mkdir -p "$W"
VARIANTS=${VARIANTS:-"default= xor0=-DGDNKCP_WP_XOR_ADDR=0 h0=-DGDNKCP_WP_STAGE_H=0 v0=-DGDNKCP_WP_STAGE_V=0 u0=-DGDNKCP_WP_U_LATE=0 unroll1=-DGDNKCP_WP_OUT_UNROLL=1 none=-DGDNKCP_WP_STAGE_H=0,-DGDNKCP_WP_STAGE_V=0"}
echo '#include "gdn_walk_planes.cu"' > "$W/tu.cu"
for v in $VARIANTS; do
	name=${v%%=*}
	IFS=, read -r -a extra <<< "${v#*=}"
	( "$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -I ptx/src "${extra[@]}" -cubin \
		-o "$W/$name.cubin" "$W/tu.cu" > "$W/$name.log" 2>&1; echo $? > "$W/$name.rc" ) &
done
wait
printf '%-12s %-28s %s\n' variant kernel 'registers / spill stores / spill loads'
for v in $VARIANTS; do
	name=${v%%=*}
	for k in gdn_state_walk_planes gdn_summary_walk_planes; do
		line=$(grep -A4 "entry function '$k'" "$W/$name.log" | tr '\n' ' ')
		regs=$(echo "$line" | grep -oE 'Used [0-9]+ registers' | grep -oE '[0-9]+')
		st=$(echo "$line" | grep -oE '[0-9]+ bytes spill stores' | grep -oE '^[0-9]+')
		ld=$(echo "$line" | grep -oE '[0-9]+ bytes spill loads' | grep -oE '^[0-9]+')
		printf '%-12s %-28s %s / %s / %s (rc %s)\n' "$name" "$k" "${regs:-?}" "${st:-?}" "${ld:-?}" "$(cat "$W/$name.rc")"
	done
done
