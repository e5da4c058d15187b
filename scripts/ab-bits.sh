#!/usr/bin/env bash
# ab-bits.sh (device run): whether two blob sets give the same bits. Runs `kcp run --backend gpu --dump` on
# the same seeded inputs with blob set A and with blob set B, for each configuration of CONFIGS, and compares
# every .npy file of the two dumps byte for byte (outputs and every gradient; meta.json, which holds times,
# is left out). For kernel changes that claim "the same bits" (a different order of work, not of arithmetic).
#   A: blob directory (default ptx/blobs, the committed blobs); B: blob directory (default
#      /tmp/gdnkcp-blobs-b, where scripts/ab-bench.sh and land-check.sh build ptx/src's);
#   CONFIGS: ';'-separated kcp run argument lists (default: core b1 and b3 and module b1, two ranks,
#      documents that span both and one shorter than a chunk, plus one rank at 32,768 tokens core b3).
# Prints one line a configuration ("same bits: N files" or the files that differ) and exits 1 if any differs.
# There: run(command="bash scripts/land-check.sh ...; bash scripts/ab-bits.sh", carry=[".gpu/pack.tgz"])
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .gpu/pack.tgz ] && [ ! -x .gpu/kcp ] && tar -C .gpu -xzf .gpu/pack.tgz
a=${A:-ptx/blobs} b=${B:-/tmp/gdnkcp-blobs-b}
for d in "$a" "$b"; do
	[ -f "$d/manifest.json" ] || { echo "ab-bits: $d has no manifest.json" >&2; exit 2; }
done
configs=${CONFIGS:-"--stage core --mode b1 --cp 2 --docs 5000,40,3000;--stage core --mode b3 --cp 2 --docs 5000,40,3000;--stage module --mode b1 --cp 2 --docs 5000,40,3000;--stage core --mode b3 --cp 1 --docs 32768"}
work=/tmp/ab-bits
fail=0
IFS=';' read -r -a list <<<"$configs"
for cfg in "${list[@]}"; do
	rm -rf "$work" && mkdir -p "$work/a" "$work/b"
	for s in a b; do
		dir=$a
		[ $s = b ] && dir=$b
		# shellcheck disable=SC2086
		if ! GDNKCP_BLOB_DIR=$dir timeout "${RUN_TIMEOUT:-240}" .gpu/kcp run --backend gpu --check=false --no-progress \
			--seed "${SEED:-7}" $cfg --dump "$work/$s" >"$work/$s.log" 2>&1; then
			echo "ab-bits: [$cfg] kcp run on $s ($dir) failed:"
			tail -5 "$work/$s.log"
			fail=1
			continue 2
		fi
	done
	n=0 diff=()
	for f in "$work"/a/*.npy; do
		n=$((n + 1))
		cmp -s "$f" "$work/b/$(basename "$f")" || diff+=("$(basename "$f")")
	done
	nb=$(find "$work/b" -name '*.npy' | wc -l)
	if [ "$n" -eq 0 ] || [ "$n" -ne "$nb" ]; then
		echo "ab-bits: [$cfg] A dumped $n .npy files, B $nb"
		fail=1
	elif [ ${#diff[@]} -gt 0 ]; then
		echo "ab-bits: [$cfg] ${#diff[@]} of $n files differ: ${diff[*]}"
		fail=1
	else
		echo "ab-bits: [$cfg] same bits: $n files"
	fi
done
exit $fail
