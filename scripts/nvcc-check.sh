#!/usr/bin/env bash
# Compiles the kernels as the next blob build will see them (ptx/src of the working tree, with whatever waits
# in ptx/staging landed by scripts/land-v4.sh first; both in a scratch copy of the working tree; with nothing
# staged, ptx/src as it is) with whatever nvcc is on this machine, and prints
# registers, spills and stack per entry for a Hopper cubin (sm_90a, or sm_90 where nvcc predates 12.0) and for
# the portable path (compute_80 PTX assembled by ptxas for sm_80). No GPU needed; the blobs are not touched.
#
#   scripts/nvcc-check.sh            # exit 1 on a compile error or on a spill in a walk kernel
#
# Any CUDA toolkit will do, e.g. Debian's nvidia-cuda-toolkit (11.8, non-free): its ptxas is older than the
# blob builder's (13.0), so the counts are a proxy, not the manifest's figures (on 2026-12-01 11.8 was the more
# pessimistic of the two: it also showed gdn_chunk_grads spilling 12 bytes, which 13.0 does not).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
command -v nvcc >/dev/null || { echo "nvcc-check: no nvcc on PATH" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The working tree as it stands (tracked and untracked files, not ignored ones; tracked files deleted from
# the tree are left out), with anything staged landed in the copy.
(cd "$root" && git ls-files -co --exclude-standard -z |
	while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done | xargs -0 cp --parents -t "$work")
if compgen -G "$work/ptx/staging/*.cu" >/dev/null || compgen -G "$work/ptx/staging/*.patch" >/dev/null; then
	(cd "$work" && git init -q && git add -A && git -c user.name=x -c user.email=x commit -qm snapshot &&
		bash scripts/land-v4.sh >/dev/null)
	echo "nvcc-check: landed ptx/staging in the scratch copy: $(cd "$root/ptx/staging" && shopt -s nullglob && echo *.cu *.patch)"
else
	echo "nvcc-check: nothing staged in ptx/staging: compiling ptx/src as it is"
fi
arch90=sm_90a
nvcc --list-gpu-code 2>/dev/null | grep -q sm_90a || arch90=sm_90
table() { # ptxas -v output -> "entry regs spill_stores spill_loads stack"
	awk '/Compiling entry function/ { match($0, /'"'"'[^'"'"']+'"'"'/); e = substr($0, RSTART + 1, RLENGTH - 2) }
	     /bytes stack frame/ { st = $1; ss = $5; sl = $9 }
	     /Used [0-9]+ registers/ { match($0, /Used [0-9]+/); printf "%s %s %s %s %s\n", e, substr($0, RSTART + 5, RLENGTH - 5), ss, sl, st }'
}
cd "$work/ptx/src"
if ! nvcc -cubin -gencode=arch=compute_${arch90#sm_},code=$arch90 -O3 -std=c++17 -Xptxas -v -o "$work/h.cubin" gdnkcp.cu \
	>"$work/h.log" 2>&1; then
	grep -E "error" "$work/h.log" >&2 || cat "$work/h.log" >&2
	exit 1
fi
table <"$work/h.log" | sort >"$work/h.tab"
if ! nvcc -ptx -arch=compute_80 -O3 -std=c++17 -o "$work/p.ptx" gdnkcp.cu >"$work/p.log" 2>&1 ||
	! ptxas -arch=sm_80 -v -o "$work/p.cubin" "$work/p.ptx" >>"$work/p.log" 2>&1; then
	grep -E "error" "$work/p.log" >&2 || cat "$work/p.log" >&2
	exit 1
fi
table <"$work/p.log" | sort >"$work/p.tab"
echo "nvcc-check: $(nvcc --version | grep -o 'release [0-9.]*'), $arch90 cubin and compute_80 PTX (ptxas sm_80)"
printf '%-24s %14s %14s\n' entry "$arch90 r/st/ld" "sm_80 r/st/ld"
join "$work/h.tab" "$work/p.tab" | awk '{ printf "%-24s %14s %14s\n", $1, $2 "/" $3 "/" $4, $6 "/" $7 "/" $8 }'
bad=$(join "$work/h.tab" "$work/p.tab" | awk '$1 ~ /walk/ && ($3 + $4 + $7 + $8 > 0) { print $1 }')
if [ -n "$bad" ]; then
	echo "nvcc-check: walk kernels that spill: $bad" >&2
	exit 1
fi
echo "nvcc-check: ok (no walk kernel spills)"
