#!/usr/bin/env bash
# v6-skel.sh: on the GPU machine, build and run ptx/devtest/grads_v6_skel.cu, the timing and register skeleton
# of docs/grads-v6.md's option B (milestone 1): ptxas' registers and spills for the kernel at
# __launch_bounds__(256, 2) and (256, 1), and its CUDA-event median at 32K (24,576 CTAs) for each.
# Also B with the 3-CTA cluster reduction of DQ and DK over DSMEM (variants 4, 5), and ncu's throughputs and
# stall reasons for NCU_VARIANTS (default "0 4").
# There: run(command="bash scripts/v6-skel.sh"). Prints the build's errors (if any), ptxas' lines and the table.
set -u
cd "$(dirname "$0")/.."
. scripts/devtest-build.sh
devtest_build grads_v6_skel || exit $?
W=$(dirname "$BIN")
"$BIN" || exit $?
# ncu on the variants named by NCU_VARIANTS (main's numbers; default 0 = B at bounds 2, 4 = B with the cluster
# reduction): one launch each after two warm-ups; the throughputs and the stall reasons (warps stalled per
# issued instruction, the largest first). NCU_VARIANTS= skips it.
for v in ${NCU_VARIANTS-0 4}; do
	timeout 120 /usr/local/cuda/bin/ncu --clock-control none -k regex:grads_v6_skel --launch-skip 2 --launch-count 1 \
		--metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
		"$BIN" "$v" >"$W/ncu-$v.log" 2>&1
	echo "== ncu, variant $v: rc $?"
	grep -E '^ +(gpu__time|dram__|sm__|smsp__issue)' "$W/ncu-$v.log" | awk '{print "  " $1, $NF}'
	grep -E 'smsp__average_warps_issue_stalled' "$W/ncu-$v.log" | awk '{print $NF, $1}' | sort -gr | head -8 |
		sed -E 's/smsp__average_warps_issue_stalled_(.*)_per_issue_active.ratio/\1/; s/^/  /'
	grep -E '==ERROR==|==WARNING==' "$W/ncu-$v.log" | head -3
done
