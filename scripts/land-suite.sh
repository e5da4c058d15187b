#!/usr/bin/env bash
# land-suite.sh: one device call that builds the blobs of ptx/src and runs every GPU test binary on them
# (through GDNKCP_BLOB_DIR, so nothing is re-embedded), for a landing whose A/B timing is already done
# (scripts/land-check.sh). Here first:
#   scripts/gpu.sh build && scripts/gpu.sh pack kcp.test tools_kcp.test loader.test archdetect.test \
#       archdetect-cgo.test ptxgen ptxcheck kcp
# (ptx.test stays out: its TestEmbeddedBlobsMatchSources compares the embedded blobs with ptx/src, which
# differ until the blobs are installed; run it here after `scripts/blobs-local.sh install`.)
# There: run(command="bash scripts/land-suite.sh", carry=[".gpu/pack.tgz"]).
# The blobs come back first, as $OUT/blobs.tar.gz, so a suite cut short by the call's limit still lands them.
# ptxcheck --gpu runs on the new blobs first (gpu.sh remote's own run of it checks the embedded ones).
# Env: SUITE_TIMEOUT (seconds for the whole suite, default 470), RUN (a -test.run filter, default all).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
tar -C .gpu -xzf .gpu/pack.tgz || { echo "land-suite: .gpu/pack.tgz does not unpack" >&2; exit 1; }
blobs=/tmp/gdnkcp-blobs
rm -rf "$blobs" && mkdir -p "$blobs"
t0=$(date +%s)
.gpu/ptxgen -src ptx/src -out "$blobs" >"$out/ptxgen.log" 2>&1 || { tail -30 "$out/ptxgen.log"; exit 1; }
tar -C "$blobs" -czf "$out/blobs.tar.gz" .
echo "ptxgen: $(( $(date +%s) - t0 )) s; $(tail -1 "$out/ptxgen.log")"
.gpu/ptxcheck --gpu "$blobs" >"$out/ptxcheck-new.log" 2>&1
echo "ptxcheck --gpu (new blobs) rc=$? $(tail -1 "$out/ptxcheck-new.log")"
GDNKCP_BLOB_DIR=$blobs timeout "${SUITE_TIMEOUT:-470}" bash scripts/gpu.sh remote "${RUN:-.}"
echo "suite rc=$?"
