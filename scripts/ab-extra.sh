#!/usr/bin/env bash
# ab-extra.sh: after scripts/land-check.sh or scripts/walk-variants.sh in the same device call, a third blob
# set C: ptx/src as it stands there with the compile-time defaults of C_DEFS replaced (space-separated
# MACRO=VALUE, each a `#define MACRO VALUE` default in some ptx/src file), built with .gpu/ptxgen and timed
# with kcp bench like A and B (DOCS, default 32768; core and core + bwd; medians of REPS, default 5), so
# that one call separates staged changes that share a blob build (e.g. a walk change from a prep change).
# C's blobs come back as $OUT/blobs-c.tar.gz.
#   run(command="bash scripts/walk-variants.sh ...; C_DEFS='GDNKCP_PREP_P5_SPLIT=0' bash scripts/ab-extra.sh", ...)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?}
export PATH=/usr/local/cuda/bin:$PATH
[ -x .gpu/ptxgen ] || tar -C .gpu -xzf .gpu/pack.tgz
src=/tmp/gdnkcp-src-c c=/tmp/gdnkcp-blobs-c
rm -rf "$src" "$c" && cp -r ptx/src "$src" && mkdir -p "$c"
for d in ${C_DEFS:?C_DEFS: MACRO=VALUE ...}; do
	m=${d%%=*} v=${d#*=}
	f=$(grep -l "^#define $m " "$src"/*) || { echo "ab-extra: no '#define $m' default in ptx/src" >&2; exit 2; }
	sed -i "s/^#define $m .*/#define $m $v/" $f
done
echo "== C: ptx/src with ${C_DEFS}"
.gpu/ptxgen -src "$src" -out "$c" >/tmp/ptxgen-c.log 2>&1 || { tail -20 /tmp/ptxgen-c.log; exit 1; }
tar -C "$c" -czf "$out/blobs-c.tar.gz" .
GDNKCP_BLOB_DIR=$c timeout ${BENCH_TIMEOUT:-240} .gpu/kcp bench --docs "${DOCS:-32768}" --kernels v5 --modes core,core+bwd \
	--reps "${REPS:-5}" --warmup 2 2>/dev/null | grep -E 'median|prep|walk|output|grads|dv local' | sed 's/^/C /'
