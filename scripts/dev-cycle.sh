#!/usr/bin/env bash
# One device call for kernel work: build the blobs from ptx/src, point the run at them with
# GDNKCP_BLOB_DIR (no re-embedding), run the kcp GPU tests matching $1 and, with BENCH=1, the bench,
# and bring the blobs back as $OUT/blobs.tar.gz (gzip: the blobs pass 16 MiB; install here with scripts/blobs-local.sh install).
# Here first: scripts/gpu.sh build && scripts/gpu.sh pack (.gpu/pack.tgz: kcp, kcp.test, ptxgen, gzipped,
# since the binaries embed ~17 MB of blobs and what travels is limited to 64 MiB).
# There: run(command="bash scripts/dev-cycle.sh 'TensorCore'", carry=[".gpu/pack.tgz"])
# To time a candidate against the committed blobs in the same call: scripts/ab-bench.sh (A/B, alternating).
# Env: BENCH=1 runs `kcp bench` (KERNELS: the sets, comma-separated, of fp32, tc, mma; default tc; BENCH_DOCS,
# BENCH_MODES, BENCH_REPS, BENCH_TIMEOUT: see below); COMM=1 also runs .gpu/comm.test's GPU tests;
# SANITIZE=1 runs compute-sanitizer (racecheck, then memcheck) over a small `kcp run` of each KERNELS set
# (module stage, B1 and B3, 3 ranks on one GPU, heads 1/2, documents shorter than, equal to and longer than a
# chunk; each run bounded by SANITIZE_TIMEOUT seconds, default 150; SANITIZE_TOOLS, SANITIZE_MODES narrow it, SANITIZE_ARGS adds kcp run flags);
# NCU=1 profiles one launch of each kernel matching NCU_KERNELS (default _mma) in a 32K-token core+bwd bench
# of the last KERNELS set (SpeedOfLight, WarpStateStats, LaunchStats and tensor-pipe, issue and
# shared-memory metrics) into $OUT/ncu-raw.csv and prints per launch scripts/ncu-table.py's summary with the top stall reasons (needs hardware counters: Firecracker yes, gVisor no);
# NOBUILD=1 skips ptxgen and runs on the blobs embedded in the carried binaries (a second call after
# `scripts/blobs-local.sh install` and a rebuild of .gpu). Test regex NONE runs no kcp test.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
if [ -f .gpu/pack.tgz ]; then
	tar -C .gpu -xzf .gpu/pack.tgz || { echo "dev-cycle: .gpu/pack.tgz does not unpack" >&2; exit 1; }
fi
blobs=/tmp/gdnkcp-blobs
if [ "${NOBUILD:-0}" = 1 ]; then
	# The binaries' embedded blobs (install the last build's blobs.tar.gz and rebuild .gpu first).
	blobs=ptx/blobs
	echo "NOBUILD: the embedded blobs (ptx/blobs as carried)"
else
	rm -rf "$blobs" && mkdir -p "$blobs"
	t0=$(date +%s)
	.gpu/ptxgen -src ptx/src -out "$blobs" >"$out/ptxgen.log" 2>&1 || { tail -30 "$out/ptxgen.log"; exit 1; }
	echo "ptxgen: $(( $(date +%s) - t0 )) s"
fi
# Registers, spills and shared memory per entry (sm_90a), and any spill on any target.
python3 - "$blobs/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for b in m["blobs"]:
    for e in b["entries"]:
        r = e.get("resources") or {}
        if b["target"] == "sm_90a":
            print(f'  {e["name"]:24s} regs {r.get("registers")} spills {r.get("spill_stores")}/{r.get("spill_loads")} stack {r.get("stack_frame")}')
        elif r.get("spill_stores") or r.get("spill_loads"):
            print(f'  SPILL {b["target"]} {e["name"]}: {r.get("spill_stores")}/{r.get("spill_loads")}')
PY
if [ "${NOBUILD:-0}" != 1 ]; then
	tar -C "$blobs" -czf "$out/blobs.tar.gz" .
	export GDNKCP_BLOB_DIR=$blobs
fi
t0=$(date +%s)
(cd kcp && ../.gpu/kcp.test -test.run "${1:-GPU}" -test.v -test.timeout ${TEST_TIMEOUT:-400}s >"$out/kcp-gpu.log" 2>&1)
echo "kcp tests rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "^(--- |FAIL|ok|panic)" "$out/kcp-gpu.log" | grep -v "^    ---" | head -40
grep -E "^\s+--- FAIL" "$out/kcp-gpu.log" | head -20
grep -E "gpu_(backward_)?test.go:[0-9]+: " "$out/kcp-gpu.log" | head -${LOGLINES:-30}
if [ "${COMM:-0}" = 1 ] && [ -x .gpu/comm.test ]; then
	(cd comm && ../.gpu/comm.test -test.run GPU -test.v -test.timeout 200s >"$out/comm-gpu.log" 2>&1)
	echo "comm tests rc=$?"; grep -E "^(--- |FAIL|ok)" "$out/comm-gpu.log"
fi
if [ "${BENCH:-0}" = 1 ]; then
	# BENCH_DOCS: document sets separated by spaces (each comma-separated: one bench each);
	# BENCH_MODES: the bench's --modes; BENCH_ARGS: more bench flags (e.g. --force-vh 64). Each bench is
	# bounded by BENCH_TIMEOUT seconds (default 240).
	for docs in ${BENCH_DOCS:-32768}; do
		timeout ${BENCH_TIMEOUT:-240} .gpu/kcp bench --docs "$docs" --kernels ${KERNELS:-tc} --modes ${BENCH_MODES:-core} \
			--reps ${BENCH_REPS:-10} --warmup 2 ${BENCH_ARGS:-} 2>/dev/null || echo "bench --docs $docs: rc=$?"
	done
fi
if [ "${SANITIZE:-0}" = 1 ]; then
	for ks in ${KERNELS//,/ }; do
		for tool in ${SANITIZE_TOOLS:-racecheck memcheck}; do
			for mode in ${SANITIZE_MODES:-b1 b3}; do
				t0=$(date +%s)
				timeout ${SANITIZE_TIMEOUT:-150} compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 20 \
					.gpu/kcp run --backend gpu --kernels "$ks" --docs 1,63,64,65,130,7 --cp 3 --layout Z --stage module --hqk 1 --hv 2 \
					--mode $mode --no-progress ${SANITIZE_ARGS:-} >"$out/sanitize-$ks-$tool-$mode.log" 2>&1
				rc=$?
				echo "compute-sanitizer $tool $ks $mode: rc=$rc ($(( $(date +%s) - t0 )) s) $(grep -E "ERROR SUMMARY|relative error" "$out/sanitize-$ks-$tool-$mode.log" | tr '\n' ' ' | cut -c1-160)"
			done
		done
	done
fi
if [ "${NCU:-0}" = 1 ]; then
	ks=${KERNELS##*,}
	t0=$(date +%s)
	metrics=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed
	timeout ${NCU_TIMEOUT:-240} ncu --clock-control none --kernel-name "regex:${NCU_KERNELS:-_mma}" --launch-count ${NCU_COUNT:-8} \
		--section SpeedOfLight --section WarpStateStats --section LaunchStats --metrics "$metrics" -f -o /tmp/gdnkcp-ncu \
		.gpu/kcp bench --docs ${NCU_DOCS:-32768} --kernels "$ks" --modes ${NCU_MODES:-core+bwd} --reps 1 --warmup 0 >"$out/ncu.log" 2>&1
	echo "ncu ($ks): rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "==(PROF|ERROR|WARNING)==" "$out/ncu.log" | head -5
	ncu -i /tmp/gdnkcp-ncu.ncu-rep --page raw --csv >"$out/ncu-raw.csv" 2>/dev/null
	python3 scripts/ncu-table.py <"$out/ncu-raw.csv"
fi
