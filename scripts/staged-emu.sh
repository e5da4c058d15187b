#!/usr/bin/env bash
# staged-emu.sh: the CPU emulator tests on the tree as the next blob build will see it (scripts/staged-tree.sh:
# a scratch copy of the working tree with every ptx/staging patch applied), then `go test ./ptx/cpuemu` there.
# The working tree is not touched.
#
#   scripts/staged-emu.sh [go test flags...]    # default: -run 'WGMMA|MMA16|MMABackward|MMA5|Folded|TapeFormer|KernelSyntax'
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bash "$(dirname "$0")/staged-tree.sh" "$work"
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-run 'WGMMA|MMA16|MMABackward|MMA5|Folded|TapeFormer|KernelSyntax')
cd "$work"
go test ./ptx/cpuemu -count=1 "${args[@]}"
