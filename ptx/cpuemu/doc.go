// Package cpuemu holds only tests: it compiles the fp32 kernels of ptx/src as
// ordinary C++ with the host compiler (g++ or clang++, -O2
// -ffp-contract=off) against stand-in CUDA headers in testdata, runs them on
// a block-synchronous CPU emulator, and compares the results with the float64
// references of internal/convref and internal/gdnref. GPU time is scarce;
// this shows the kernels' indexing, tables, barriers, shuffles, shared memory
// layout and arithmetic correct on any machine first.
//
// The emulator (testdata/emu.h, emu.cpp) runs a grid one block at a time.
// The block's threads are fibers (ucontext) that run one after another until
// each reaches a barrier: __syncthreads() waits for the whole block,
// __syncwarp() and the shuffles (__shfl_xor_sync and friends, through a
// per-warp slot array) for the warp. A barrier that can never complete (some
// threads exited or wait elsewhere) is reported as divergence. Threads run in
// ascending order in even blocks and descending order in odd ones, so a
// missing barrier shows whichever way the hazard points. threadIdx, blockIdx,
// blockDim and gridDim are set before a fiber resumes. The dynamic shared
// memory (`extern __shared__ float smem[]`) is filled with a NaN pattern
// before each block, so reading what was never written shows up as NaN, and
// a write beyond the launch's dynamic size (or a request above the device's
// 227 KB) is an error. Block-scope __shared__ arrays are shared by the
// block's fibers but not refilled between blocks. Math is the host's libm
// (expf, fmaf, sqrtf), which may differ from the GPU's in the last ulp.
//
// testdata/runner.cpp executes a job that the Go test writes: buffers
// (loaded from files, each between two NaN-filled guard zones checked after
// every launch, so an out-of-bounds write fails the run), then launches by
// kernel name, grid, block and dynamic shared memory (a byte count or the
// source's own constant, e.g. kPrepSmem or bwd_walk_smem(64)), then the
// buffers to save. Each kernel is registered with its C++ signature and a
// launch's arguments are checked against it in number and kind, so a job
// written to the documented ABI fails where the source disagrees.
//
// The tests:
//
//   - TestEmulator: the emulator itself (barriers, shuffles, shared memory,
//     and the errors it must report) on the kernels of testdata/selftest.cpp.
//   - TestConvKernelOnCPU: gdn_conv1d_silu_fwd and gdn_poison_u32
//     (testdata/harness.cpp) against internal/convref.
//   - TestForwardKernelsOnCPU: the forward of gdn_fwd.cu (l2norm, prep,
//     summary walk, compose, state walk, output) on buffers of several
//     segments, each kernel against gdnref fed the very inputs it read, and the
//     outputs end to end against the float64 forward; every output poisoned
//     first and checked fully written; vh 64 and 128 walks bitwise equal.
//   - TestBackwardKernelsOnCPU, TestConvBackwardOnCPU, TestAddRowsOnCPU,
//     TestF32ToBF16OnCPU: the backward of gdn_bwd.cu to the contract of
//     docs/gpu-backward.md in the same way, plus the end-to-end gradients
//     against gdnref's token-by-token backward. They skip while
//     ptx/src/gdn_bwd.cu does not exist.
//
// Every test skips when no C++ compiler is installed. The environment variable
// CPUEMU_SRC points the build at another kernel directory than ptx/src (to
// try a candidate file before it lands).
package cpuemu
