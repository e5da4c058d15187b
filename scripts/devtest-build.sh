#!/usr/bin/env bash
# devtest-build.sh: sourced by the scripts that build and run one ptx/devtest program on the GPU machine
# (scripts/v6-skel.sh, walk-skel.sh, wgmma-t-check.sh). devtest_build NAME [PATTERN [LINES]]: nvcc (NVCC,
# default /usr/local/cuda/bin/nvcc) builds ptx/devtest/NAME.cu for sm_90a with ptxas -v into /tmp/NAME/NAME
# (the log in /tmp/NAME/build.log), prints "== build: rc N" and the log's lines matching PATTERN (default
# errors, warnings, ptxas' C7xxx notes, registers and spills; at most LINES, default 30), sets BIN to the
# binary and returns nvcc's status. Run from the repository root.
devtest_build() {
	local name=$1 pattern=${2:-'error|warning|C7[0-9]+|registers|spill'} lines=${3:-30}
	local w=/tmp/$name
	mkdir -p "$w"
	"${NVCC:-/usr/local/cuda/bin/nvcc}" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o "$w/$name" \
		"ptx/devtest/$name.cu" >"$w/build.log" 2>&1
	local rc=$?
	echo "== build: rc $rc"
	grep -E "$pattern" "$w/build.log" | head -"$lines"
	BIN=$w/$name
	return "$rc"
}
