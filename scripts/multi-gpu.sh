#!/usr/bin/env bash
# One device call on a host with two GPUs (kind nvidia-h200-x2) for the multi-GPU work: blobs from
# ptx/src, the kcp GPU tests matching $1, then `kcp run` across the GPUs in one process (NCCL) and in
# two (kcp launch), CP 4 and 8 with several ranks a GPU, all compared by per-rank digests with the
# same plan on one GPU through the loopback; the fault tests; and, last, the exchange share of B1 and
# B3 at CP 2 for the full-size packs named in $PACKS (default "P1 P4").
# Here first: scripts/gpu.sh build (or .gpu/kcp.test, .gpu/kcp, .gpu/ptxgen, .gpu/ptxcheck).
# There: run(command="bash scripts/multi-gpu.sh 'GPUMulti'", carry=[".gpu"], kind="nvidia-h200-x2")
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?}
start=$(date +%s)
export NCCL_NVLS_ENABLE=0
K=.gpu/kcp
nvidia-smi --query-gpu=index,name --format=csv,noheader
TEST_TIMEOUT=${TEST_TIMEOUT:-240} LOGLINES=${LOGLINES:-10} bash scripts/dev-cycle.sh "${1:-GPUMulti}"
export GDNKCP_BLOB_DIR=/tmp/gdnkcp-blobs
small=(--no-progress --json --check=false --pack P1@4096 --layout D)

# json FILE: the JSON object of a `kcp run --json` (from launch: lines "[rank i] ..." of rank $2).
digests() { python3 - "$@" <<'PY'
import json, sys, re
path, rank = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
txt = open(path).read()
if rank is not None:
    txt = "\n".join(l.split("] ", 1)[1] for l in txt.splitlines() if l.startswith(f"[rank {rank}] "))
try:
    j = json.loads(txt)
except Exception as e:
    print("unreadable", path, e); sys.exit(0)
g = j["gpu"]
print(json.dumps({"comm": g["comm"], "rank_devices": g["rank_devices"], "digests": g["digests"], "slowest_ms": round(g["slowest_ms"], 3)}))
PY
}
same() { # same NAME A B: the digests of A and B (files holding the line digests printed) agree
	python3 - "$@" <<'PY'
import json, sys
name, a, b = sys.argv[1:4]
da, db = json.loads(open(a).read())["digests"], json.loads(open(b).read())["digests"]
ok = da == db
print(f"{name:40s} {'BITWISE EQUAL' if ok else 'DIFFERENT'} ({len(da)} ranks)")
PY
}
merge() { # merge OUT FILES...: union of the digests of several one-rank runs
	python3 - "$@" <<'PY'
import json, sys
d = {}
for f in sys.argv[2:]:
    try: d.update(json.loads(open(f).read())["digests"])
    except Exception as e: print("merge:", f, e)
open(sys.argv[1], "w").write(json.dumps({"digests": d}))
PY
}
echo "== bitwise: CP 2 on two GPUs vs one GPU"
for stage in core module; do for m in b1 b3; do
	t=$stage-$m
	timeout 120 $K run "${small[@]}" --stage $stage --mode $m --cp 2 >"$out/nccl-$t.json" 2>"$out/nccl-$t.err"; digests "$out/nccl-$t.json" >"$out/d-nccl-$t"
	timeout 120 $K run "${small[@]}" --stage $stage --mode $m --cp 2 --devices 0 >"$out/one-$t.json" 2>"$out/one-$t.err"; digests "$out/one-$t.json" >"$out/d-one-$t"
	timeout 150 $K launch --nproc 2 --timeout 140s -- run "${small[@]}" --stage $stage --mode $m >"$out/launch-$t.txt" 2>"$out/launch-$t.err"
	for r in 0 1; do digests "$out/launch-$t.txt" $r >"$out/d-launch-$t-$r"; done
	merge "$out/d-launch-$t" "$out/d-launch-$t-0" "$out/d-launch-$t-1"
	same "$t nccl 1 process vs 1 GPU" "$out/d-nccl-$t" "$out/d-one-$t"
	same "$t nccl 2 processes vs 1 GPU" "$out/d-launch-$t" "$out/d-one-$t"
done; done
head -c 300 "$out/d-nccl-module-b1"; echo; tail -3 "$out/nccl-module-b1.err"; tail -3 "$out/launch-module-b1.err"
echo "== bitwise: CP 4 and 8, ranks per GPU 2 and 4, vs one GPU"
for cp in 4 8; do for m in b1 b3; do
	t=module-$m-cp$cp
	timeout 120 $K run "${small[@]}" --mode $m --ranks-per-gpu $((cp / 2)) >"$out/multi-$t.json" 2>&1; digests "$out/multi-$t.json" >"$out/d-multi-$t"
	timeout 120 $K run "${small[@]}" --mode $m --cp $cp --devices 0 >"$out/one-$t.json" 2>&1; digests "$out/one-$t.json" >"$out/d-one-$t"
	same "$t loopback 2 GPUs vs 1 GPU" "$out/d-multi-$t" "$out/d-one-$t"
done; done
echo "== accuracy: default pack on both GPUs, B1 and B3, against the naive reference"
for m in b1 b3; do timeout 120 $K run --no-progress --mode $m 2>&1 | grep -E "relative error|gpu B|rank . total|ranks on devices"; done
echo "== faults"
s=$(date +%s); timeout 100 $K launch --nproc 2 --timeout 90s -- run --no-progress --check=false --pack P1@4096 --mode b1 --timeout 20s --fault-kill "1:tape walk" >"$out/fault-kill.txt" 2>&1
echo "killed mid-backward (2 processes): rc=$? after $(( $(date +%s) - s )) s"; grep -E "kcp launch|error" "$out/fault-kill.txt" | head -6
s=$(date +%s); timeout 100 $K run --no-progress --check=false --pack P1@4096 --mode b1 --cp 2 --timeout 20s --fault-error "1:prep" >"$out/fault-err.txt" 2>&1
echo "error mid-forward (1 process, NCCL): rc=$? after $(( $(date +%s) - s )) s"; head -4 "$out/fault-err.txt"
s=$(date +%s); timeout 100 $K launch --nproc 2 --timeout 90s -- run --no-progress --check=false --pack P1@4096 --mode b3 --timeout 20s --fault-error "0:chunk grads" >"$out/fault-err2.txt" 2>&1
echo "error mid-backward (2 processes): rc=$? after $(( $(date +%s) - s )) s"; grep -E "kcp launch|error" "$out/fault-err2.txt" | head -6
s=$(date +%s); RANK=0 WORLD_SIZE=3 LOCAL_RANK=0 LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 timeout 60 $K run --cp 2 --no-progress 2>&1 | tail -1
echo "WORLD_SIZE mismatch: after $(( $(date +%s) - s )) s"
s=$(date +%s); RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 NCCL_COMM_ID=127.0.0.1:9 timeout 60 $K run --no-progress --check=false --pack P1@4096 --timeout 15s 2>&1 | tail -2
echo "unreachable NCCL_COMM_ID: after $(( $(date +%s) - s )) s"
echo "== exchange share at CP 2 on two GPUs (full-size packs, module, fp32 backward, tc forward)"
for p in ${PACKS:-P1 P4}; do for m in b1 b3; do
	left=$(( ${DEADLINE:-480} - ($(date +%s) - start) ))
	if [ $left -lt 30 ]; then echo "$p $m: not run (the call's time is spent)"; continue; fi
	timeout $(( left < 110 ? left : 110 )) $K run --no-progress --check=false --check-finite=false --kernels tc --pack $p --cp 2 --mode $m --reps ${REPS:-1} --warmup 1 2>&1 | grep -E "^gpu B|rank . total|kcp: error" | sed "s/^/$p $m: /"
done; done
echo "multi-gpu.sh: $(( $(date +%s) - start )) s"
