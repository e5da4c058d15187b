#!/usr/bin/env bash
# Rebuild every kernel blob with nvcc, on the GPU machine (CUDA toolkit, no Go).
# Step 2 of 3 (ptx/README.md):
#   1. here:  scripts/blobs-local.sh prepare            # builds .gpu/ptxgen and .gpu/ptxcheck
#   2. there: run(command="bash scripts/blobs-remote.sh", carry=[".gpu/ptxgen", ".gpu/ptxcheck"])
#   3. here:  scripts/blobs-local.sh install FILES_AT/blobs.tar.gz
#
# Runs from the repository root of the carried working tree. Writes to $OUT:
#   blobs.tar.gz  the blobs and manifest.json (what `install` takes)
#   ptxgen.log    nvcc commands, ptxas resources, the cross-check
#   ptxcheck.log  ptxcheck on the new blobs, offline and with --gpu
#   blobs-elf.txt cuobjdump -elf of every new cubin (to compare with blobcheck)
# Only a few files of at most 16 MiB may come back, hence the compressed tar.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?OUT must name the folder whose files come back}
export PATH=/usr/local/cuda/bin:$PATH
if [ ! -x .gpu/ptxgen ]; then
	echo "blobs-remote: no .gpu/ptxgen: run scripts/blobs-local.sh prepare here first and carry .gpu/ptxgen" >&2
	exit 2
fi
build="$out/blobs-build"
rm -rf "$build"
mkdir -p "$build"

nvcc=$(command -v nvcc || true)
.gpu/ptxgen -src ptx/src -out "$build" ${nvcc:+-nvcc "$nvcc"} >"$out/ptxgen.log" 2>&1
rc=$?
tail -n 40 "$out/ptxgen.log"

if [ "$rc" -eq 0 ] && [ -x .gpu/ptxcheck ]; then
	{
		echo "== ptxcheck -v $build"
		.gpu/ptxcheck -v "$build"
		echo "rc=$?"
		echo "== ptxcheck --gpu -v $build"
		.gpu/ptxcheck --gpu -v "$build"
		echo "rc=$?"
	} >"$out/ptxcheck.log" 2>&1
	cat "$out/ptxcheck.log"
	grep -q '^rc=[^0]' "$out/ptxcheck.log" && rc=3
fi

if command -v cuobjdump >/dev/null; then
	for f in "$build"/*.cubin; do
		[ -f "$f" ] || continue
		echo "== $(basename "$f")"
		cuobjdump -elf "$f"
	done >"$out/blobs-elf.txt" 2>&1
fi

tar -C "$build" -czf "$out/blobs.tar.gz" . && rm -rf "$build"
echo "blobs-remote: rc=$rc; $(tar -tzf "$out/blobs.tar.gz" | grep -vc '/$') files in blobs.tar.gz"
exit "$rc"
