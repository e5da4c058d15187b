#!/usr/bin/env bash
# ncu-ab.sh: scripts/ncu-source.sh on the embedded blobs (A) and on each blob tarball of BLOBS, one after the
# other, and each one's summary (samples by reason, instruction mix) side by side: where a variant's extra
# time goes (which stall reason grew). Each set's files (its SASS csv for scripts/ncu-phases.py, the log, the
# summary) come back as one $OUT/NAME.tgz. There (device run, carry .gpu/pack.tgz and the tarballs):
#   run(command="BLOBS='s2=.gpu/blobs-s2.tar.gz' KERNEL=chunk_grads_mma8 bash scripts/ncu-ab.sh --docs 32768
#   --kernels v5 --modes core+bwd", carry=[".gpu/pack.tgz", ".gpu/blobs-s2.tar.gz"])
# The tarballs are what scripts/knob-sweep.sh brings back (blobs-NAME.tar.gz). The working tree, pack and
# tarballs must stay under the device's 64 MiB: carry a pack of kcp alone (cd .gpu && tar czf pack.tgz kcp).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?}
[ -f .gpu/pack.tgz ] && tar -C .gpu -xzf .gpu/pack.tgz && mv .gpu/pack.tgz .gpu/pack.tgz.done
summ() { grep -E "^(by reason|executed warp|ncu rc)" "$1"; }
mkdir -p "$out/A"
# pack: each set's files as one tarball ($out/NAME.tgz: the device returns at most 8 files)
pack() { tar -C "$out" -czf "$out/$1.tgz" "$1" && rm -rf "${out:?}/$1"; }
OUT=$out/A LINES_OUT=8 bash scripts/ncu-source.sh "$@" >"$out/A/summary.txt" 2>&1
echo "== A"; summ "$out/A/summary.txt"; pack A
for v in ${BLOBS:-}; do
	name=${v%%=*} tgz=${v#*=}
	d=/tmp/ncu-ab-$name && rm -rf "$d" && mkdir -p "$d" && tar -C "$d" -xzf "$tgz"
	dir=$(dirname "$(find "$d" -name manifest.json | head -1)")
	mkdir -p "$out/$name"
	GDNKCP_BLOB_DIR=$dir OUT=$out/$name LINES_OUT=8 bash scripts/ncu-source.sh "$@" >"$out/$name/summary.txt" 2>&1
	echo "== $name ($dir)"; summ "$out/$name/summary.txt"; pack "$name"
done
