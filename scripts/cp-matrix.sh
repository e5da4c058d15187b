#!/usr/bin/env bash
# One device call on a host with N GPUs for the CP matrix of the multi-GPU issues (kcp sweep):
#  (1) bitwise: P1-P5 scaled to 8192 tokens x layouts C/Z/D x rules A/B x modes B1/B3, one run each, at CP N:
#      the reference on GPU 0 through the loopback, then on N GPUs in one process (NCCL) and in N processes
#      (kcp launch), each --compare'd with the reference; one line per comparison;
#  (2) timings: the full-size packs under kcp launch --nproc N, 3 timed runs after 1 warm-up: the table
#      (if stopped early, the configurations done, from rank 0's progress lines);
#  (3) the fault test at N ranks: the last rank's process kills itself in the tape walk; launch's lines and
#      the elapsed seconds.
# Every step is bounded by timeout; DEADLINE seconds (default 540) after the start the steps left print
# "not run", and steps (1) and (2) leave RESERVE seconds (default 100) for step (3). Logs and JSON go to $OUT.
# It builds nothing: here first `scripts/gpu.sh build` (or CGO_ENABLED=0 go build -o .gpu/kcp ./tools/kcp),
# with the committed blobs embedded; there:
#   run(command="bash scripts/cp-matrix.sh", carry=[".gpu"], kind="nvidia-h200-x4")
# $1: N (default: the GPUs nvidia-smi lists). Env: DEADLINE, RESERVE, BITWISE_PACKS, TIMING_PACKS, TIMING_REPS,
# REF (a kcp sweep --json from an earlier step (1) of the same CP and packs: used as the reference instead
# of running it again), TIMING_WARMUP (default 1), TIMING_LAYOUTS (default C,Z,D), STEPS (the steps to run, default "1 2 3"; the
# others print "skipped"), RPG (ranks a GPU, default 1: CP = N x RPG; above 1, step (1) runs the reference and
# the one-process run with --ranks-per-gpu RPG through the in-process loopback, step (2) times the packs in
# that one process (the ranks of a GPU share it, so the times are not one-rank-a-GPU times), and step (3),
# which needs one rank a process, is skipped), KERNELS (every sweep's --kernels, default auto: v5 on the H200),
# KCP (the kcp binary, default .gpu/kcp).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/cp-matrix}
mkdir -p "$out"
start=$(date +%s)
deadline=${DEADLINE:-540}
reserve=${RESERVE:-100}
export NCCL_NVLS_ENABLE=0
K=${KCP:-.gpu/kcp}
kern=(--kernels "${KERNELS:-auto}")
if [ ! -x "$K" ]; then
	echo "cp-matrix.sh: $K is missing: build it here (scripts/gpu.sh build) and carry .gpu"
	exit 2
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
N=${1:-$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)}
if ! [ "$N" -ge 1 ] 2>/dev/null; then
	echo "cp-matrix.sh: no GPU count (got '$N')"
	exit 2
fi
devices=$(seq -s, 0 $((N - 1)))
rpg=${RPG:-1}
steps=" ${STEPS:-1 2 3} "
CP=$((N * rpg))
if [ "$rpg" -gt 1 ]; then steps=${steps//3/}; fi
want() { [[ "$steps" == *" $1 "* ]] || { echo "step ($1): skipped (STEPS='${STEPS:-1 2 3}', RPG=$rpg)"; return 1; }; }
echo "cp-matrix.sh: N=$N GPUs (devices $devices), $rpg rank(s) a GPU: CP $CP; deadline ${deadline}s, logs in $out"

# budget WANT [KEEP]: the seconds a step may take: WANT, or less when the deadline (minus KEEP seconds kept
# for later steps) is nearer; 0 when under 20 s would be left.
budget() {
	local left=$((deadline - ($(date +%s) - start) - ${2:-0}))
	if [ "$left" -lt 20 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
# verdict NAME JSON RC SECONDS: one line from a kcp sweep --json output, and its failures.
verdict() {
	python3 - "$@" <<'PY'
import json, sys
name, path, rc, secs = sys.argv[1:5]
try:
    j = json.load(open(path))
except Exception as e:
    print(f"{name:40s} rc={rc} after {secs} s: no JSON ({type(e).__name__}); see {path} and its .err")
    sys.exit(0)
s = j["summary"]
yn = {True: "yes", False: "NO", None: "-"}
line = (f"{name:40s} rc={rc} after {secs} s: {s['rows']} rows, {j['comm']} on devices {j['rank_devices']}, "
        f"rules A=B bitwise {yn[s['bitwise_rules']]}, launches differ in {s['launches_differ']} rows")
if j.get("compare"):
    line += f"; vs reference: {s['ref_equal']} equal, {s['ref_differ']} DIFFER, {s['ref_not_compared']} not compared"
print(line)
for f in s.get("failures") or []:
    print("    FAILED:", f)
PY
}
elapsed() { echo $(($(date +%s) - $1)); }

echo "== (1) bitwise: P1-P5 at 8192 tokens, CP $CP, layouts C/Z/D x rules A/B x modes B1/B3, one run each"
if want 1; then
bw=(--json --packs "${BITWISE_PACKS:-P1@8192,P2@8192,P3@8192,P4@8192,P5@8192}" --reps 1 --warmup 0 "${kern[@]}")
ref="$out/ref.json"
b=$(budget 150 "$reserve")
if [ -n "${REF:-}" ]; then
	cp "$REF" "$ref"
	verdict "reference: $REF" "$ref" 0 0
elif [ "$b" -eq 0 ]; then
	echo "reference (GPU 0, loopback): not run"
else
	s=$(date +%s)
	timeout -k 10 "$b" "$K" sweep "${bw[@]}" --devices 0 --comm loopback --cp "$CP" >"$ref" 2>"$out/ref.json.err"
	rc=$?
	verdict "reference: CP $CP on GPU 0, loopback" "$ref" $rc "$(elapsed "$s")"
fi
if ! python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$ref" 2>/dev/null; then
	echo "$N GPUs, 1 process vs reference: not run (no reference)"
	echo "$N processes (kcp launch) vs reference: not run (no reference)"
else
	runs=" ${RUNS:-nccl launch} "
	b=$(budget 150 "$reserve")
	if [[ "$runs" != *" nccl "* ]]; then
		echo "$N GPUs x $rpg, 1 process vs reference: skipped (RUNS='${RUNS:-}')"
	elif [ "$b" -eq 0 ]; then
		echo "$N GPUs, 1 process vs reference: not run"
	else
		s=$(date +%s)
		timeout -k 10 "$b" "$K" sweep "${bw[@]}" --devices "$devices" --ranks-per-gpu "$rpg" --cp "$CP" --compare "$ref" \
			>"$out/nccl.json" 2>"$out/nccl.json.err"
		rc=$?
		verdict "$N GPUs x $rpg, 1 process vs reference" "$out/nccl.json" $rc "$(elapsed "$s")"
		tail -3 "$out/nccl.json.err"
	fi
	b=$(budget 180 "$reserve")
	if [ "$rpg" -gt 1 ]; then
		echo "$N processes (kcp launch) vs reference: skipped (one rank a process needs RPG=1)"
	elif [[ "$runs" != *" launch "* ]]; then
		echo "$N processes (kcp launch) vs reference: skipped (RUNS='${RUNS:-}')"
	elif [ "$b" -eq 0 ]; then
		echo "$N processes (kcp launch) vs reference: not run"
	else
		s=$(date +%s)
		timeout -k 10 "$b" "$K" launch --nproc "$N" --timeout "$((b - 15))s" -- sweep "${bw[@]}" --compare "$ref" \
			>"$out/launch.txt" 2>"$out/launch.err"
		rc=$?
		sed -n 's/^\[rank 0\] //p' "$out/launch.txt" >"$out/launch.json"
		verdict "$N processes (kcp launch) vs reference" "$out/launch.json" $rc "$(elapsed "$s")"
		grep -h "rank .: done" "$out/launch.txt" | tr '\n' ' '
		echo
		grep -hE "kcp launch|error" "$out/launch.err" | head -6
	fi
fi
fi

tw=(--packs "${TIMING_PACKS:-P1,P2,P3,P4,P5}" --layouts "${TIMING_LAYOUTS:-C,Z,D}" --reps "${TIMING_REPS:-3}"
	--warmup "${TIMING_WARMUP:-1}" "${kern[@]}")
if [ "$rpg" -gt 1 ]; then
	echo "== (2) timings: full-size packs, one process, $N GPU(s) x $rpg ranks (loopback), ${TIMING_REPS:-3} timed runs after ${TIMING_WARMUP:-1} warm-up(s)"
else
	echo "== (2) timings: full-size packs, kcp launch --nproc $N, ${TIMING_REPS:-3} timed runs after ${TIMING_WARMUP:-1} warm-up(s)"
fi
b=$(budget 600 "$reserve")
if ! want 2; then
	:
elif [ "$b" -eq 0 ]; then
	echo "timings: not run"
elif [ "$rpg" -gt 1 ]; then
	s=$(date +%s)
	timeout -k 10 "$b" "$K" sweep "${tw[@]}" --devices "$devices" --ranks-per-gpu "$rpg" --cp "$CP" --json \
		>"$out/timings.json" 2>"$out/timings.err"
	rc=$?
	"$K" sweep --show "$out/timings.json" 2>/dev/null || tail -5 "$out/timings.err"
	echo "timings: rc=$rc after $(elapsed "$s") s (bound ${b}s)"
else
	s=$(date +%s)
	timeout -k 10 "$b" "$K" launch --nproc "$N" --timeout "$((b - 15))s" -- sweep "${tw[@]}" >"$out/timings.txt" 2>"$out/timings.err"
	rc=$?
	sed -n 's/^\[rank 0\] //p' "$out/timings.txt"
	echo "timings: rc=$rc after $(elapsed "$s") s (bound ${b}s)"
	if [ "$rc" -ne 0 ]; then
		echo "configurations done (rank 0's progress lines):"
		sed -n 's/^\[rank 0\] kcp sweep: /  /p' "$out/timings.err"
		grep -hE "kcp launch|error" "$out/timings.err" | head -6
	fi
fi

echo "== (3) fault test at $N ranks: rank $((N - 1))'s process kills itself in the tape walk"
b=$(budget 150)
if ! want 3; then
	:
elif [ "$b" -eq 0 ]; then
	echo "fault test: not run"
else
	s=$(date +%s)
	timeout -k 10 "$b" "$K" launch --nproc "$N" --timeout 120s -- run --no-progress --check=false --pack P1@8192 --mode b1 \
		--timeout 30s --fault-kill "$((N - 1)):tape walk" >"$out/fault.txt" 2>&1
	rc=$?
	echo "fault test: rc=$rc after $(elapsed "$s") s (bound ${b}s)"
	grep -E "kcp launch|error|fault-kill" "$out/fault.txt" | head -$((N + 6))
fi
echo "cp-matrix.sh: $(elapsed "$start") s"
