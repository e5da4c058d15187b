#!/usr/bin/env bash
# overlap-probe.sh (device run): kcp's BenchmarkGPUWalkOutputOverlap (kcp/gpu_overlap_bench_test.go) at 32,768
# tokens in one document and at 120,908 tokens in three: the state walk alone, the output alone, and the two
# launched together on two streams (walk first, then output first), CUDA-event medians of BENCHTIME runs
# (default 20x). It answers whether running the output behind the walk on the SMs the walk leaves idle saves
# time (docs/mma-kernels.md, "Design, not built ... consumers behind the walks").
# Here: scripts/gpu.sh build && scripts/gpu.sh pack kcp.test
# There: run(command="bash scripts/overlap-probe.sh", carry=[".gpu/pack.tgz"])
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .gpu/pack.tgz ] && tar -C .gpu -xzf .gpu/pack.tgz
for docs in 32768 40000,45000,35908; do
	echo "== docs $docs"
	(cd kcp && GDNKCP_OVERLAP_DOCS=$docs timeout "${PROBE_TIMEOUT:-240}" ../.gpu/kcp.test -test.run '^$' \
		-test.bench WalkOutputOverlap -test.benchtime "${BENCHTIME:-20x}" -test.v 2>&1 |
		grep -E 'Benchmark|ms|tokens|FAIL|differs|SKIP|panic|ok')
done
