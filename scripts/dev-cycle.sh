#!/usr/bin/env bash
# One device call for kernel work: build the blobs from ptx/src, point the run at them with
# GDNKCP_BLOB_DIR (no re-embedding), run the GPU tests matching $1 and the bench, and bring the
# blobs back as $OUT/blobs.tar (install here with scripts/blobs-local.sh install).
# Here first: scripts/gpu.sh build (or at least .gpu/kcp.test, .gpu/kcp, .gpu/ptxgen, .gpu/ptxcheck).
# There: run(command="bash scripts/dev-cycle.sh 'TensorCore'", carry=[".gpu"])
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?}
export PATH=/usr/local/cuda/bin:$PATH
blobs=/tmp/gdnkcp-blobs
rm -rf "$blobs" && mkdir -p "$blobs"
.gpu/ptxgen -src ptx/src -out "$blobs" >"$out/ptxgen.log" 2>&1 || { tail -30 "$out/ptxgen.log"; exit 1; }
grep -E "entry|sm_90a " "$out/ptxgen.log" | paste - - | awk "{print \$3, \$6, \$7, \$9, \$10}"
tar -C "$blobs" -cf "$out/blobs.tar" .
export GDNKCP_BLOB_DIR=$blobs
(cd kcp && ../.gpu/kcp.test -test.run "${1:-GPU}" -test.v -test.timeout 400s >"$out/kcp-gpu.log" 2>&1)
echo "tests rc=$?"; grep -E "^(--- |FAIL|ok)" "$out/kcp-gpu.log"; grep -E "gpu_test.go:[0-9]+: .*(out|states)" "$out/kcp-gpu.log" | head -4
.gpu/kcp bench --kernels ${KERNELS:-tc} --reps 10 --warmup 2 2>/dev/null
