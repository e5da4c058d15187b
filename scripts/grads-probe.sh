#!/usr/bin/env bash
# grads-probe.sh: on the GPU machine, time gdn_chunk_grads_mma5 and gdn_chunk_grads_mma6 by themselves
# (ptx/devtest/grads_probe.cu) at each GDNKCP_GRADS_PROBE level of ptx/devtest/grads-probe.patch (applied to a
# copy of ptx/src in /tmp): 0 the kernels as they are, 1 D and H copied by cp.async as if written ready to use
# (<D, H> left out), 3 neither loaded (the bound). NC chunks (default 512: 32,768 tokens). Prints one line per
# level and kernel. (The patch of 5143ee5 had a level 2, V' and dV' by cp.async: what gdn_chunk_grads_mma6 now
# does. Measured then, on mma5: 7.510 / 6.988 / 6.207 / 5.674 ms for levels 0-3.) Where the patch no longer
# applies, only level 0 runs.
set -u
cd "$(dirname "$0")/.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
W=/tmp/grads-probe
rm -rf "$W" && mkdir -p "$W/src"
cp ptx/src/* "$W/src/" || exit 1
LEVELS=${LEVELS:-0 1 3}
if ! patch -s -p3 -d "$W/src" --dry-run < ptx/devtest/grads-probe.patch >/dev/null 2>&1; then
	echo "grads-probe: the patch does not apply to these sources: level 0 only"
	LEVELS=0
else
	patch -s -p3 -d "$W/src" < ptx/devtest/grads-probe.patch || exit 1
fi
for lv in $LEVELS; do
	( "$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -DGDNKCP_GRADS_PROBE=$lv -I "$W/src" \
		-o "$W/probe_$lv" ptx/devtest/grads_probe.cu > "$W/build_$lv.log" 2>&1; echo $? > "$W/rc_$lv" ) &
done
wait
for lv in $LEVELS; do
	echo "== level $lv: build rc $(cat "$W/rc_$lv"); $(grep -A1 'gdn_chunk_grads_mma5' "$W/build_$lv.log" | grep -oE 'Used [0-9]+ registers|[0-9]+ bytes spill stores' | tr '\n' ' ')"
	[ "$(cat "$W/rc_$lv")" = 0 ] || { tail -5 "$W/build_$lv.log"; continue; }
	"$W/probe_$lv" "${NC:-512}" "L$lv" 2>&1 | tail -3
done
