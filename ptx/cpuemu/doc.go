// Package cpuemu holds only tests: it compiles the fp32 kernels of ptx/src as
// ordinary C++ with the host compiler (g++ or clang++, -O2
// -ffp-contract=off) against stand-in CUDA headers in testdata, runs them on
// a block-synchronous CPU emulator, and compares the results with the float64
// references of internal/convref and internal/gdnref. GPU time is scarce;
// this shows the kernels' indexing, tables, barriers, shuffles, shared memory
// layout and arithmetic correct on any machine first.
//
// The emulator (testdata/emu.h, emu.cpp) runs a grid one block at a time.
// The block's threads are fibers (on x86-64 a switch of the callee-saved
// registers and the stack pointer, elsewhere ucontext, whose swapcontext
// costs two system calls a switch and made emulation ~8 times slower) that
// run one after another until each reaches a barrier: __syncthreads() waits for the whole block,
// __syncwarp() and the shuffles (__shfl_xor_sync and friends, through a
// per-warp slot array) for the warp. A barrier that can never complete (some
// threads exited or wait elsewhere) is reported as divergence. Threads run in
// ascending order in even blocks and descending order in odd ones, so a
// missing barrier shows whichever way the hazard points; a warp's barriers
// release as soon as its lanes reach them, so each warp runs ahead to its
// next __syncthreads before the next warp starts (a stage refilled while
// another warp still reads it shows). threadIdx, blockIdx,
// blockDim and gridDim are set before a fiber resumes. The dynamic shared
// memory (`extern __shared__ float smem[]`) is filled with a NaN pattern
// before each block, so reading what was never written shows up as NaN, and
// a write beyond the launch's dynamic size (or a request above the device's
// 227 KB) is an error. Block-scope __shared__ arrays are shared by the
// block's fibers but not refilled between blocks. Math is the host's libm
// (expf, fmaf, sqrtf), which may differ from the GPU's in the last ulp.
//
// The tensor-core path: ptx/src/mma.cuh wraps mma.sync m16n8k16 bf16 (fp32
// accumulate), ldmatrix.x4 (.trans) and cp.async (16 bytes, commit/wait
// groups); under the macro GDNKCP_CPU_EMULATOR, which the stand-in
// cuda_runtime.h defines, the wrappers call the emulator. mma and ldmatrix are
// warp collectives: each lane deposits its fragment registers (or its row
// address) in the warp's exchange, the warp meets, each lane computes its own
// result from the whole A and B (or reads its elements of the four 8x8
// matrices), and the warp meets again before the exchange is reused. A
// partial warp, lanes at different collectives, or a misaligned address is
// an error. The products of bf16 values are exact in fp32 and are added to C
// in fp32 in k order; the tensor core adds in its own order and precision, so
// GPU and emulator agree to a tolerance, not bit for bit. cp.async copies at
// once by default, so a missing cp_async_wait cannot show; the runner's
// environment variable EMU_CP_ASYNC=deferred makes each copy fill its
// destination with NaN at issue and land when a wait retires its group (or
// its thread exits), so a read before the wait computes NaN. What only the
// GPU shows: timing, bank conflicts, and the tensor core's own rounding.
//
// The wgmma path (ptx/src/wgmma.cuh, sm_90a on the GPU) runs here only in
// runners that define GDNKCP_EMU_WGMMA before including the kernels:
// wgmma.mma_async m64nNk16 with A from registers is a warp collective (a
// warp's 16 rows of D need only its own lanes' registers and B), B is read
// through the descriptor (the 128-byte-swizzled K-major layout; other modes
// are errors) from the dynamic shared memory, which __cvta_generic_to_shared
// maps to 1024-aligned offsets. EMU_WGMMA=deferred holds each result back
// until the wgmma.wait_group that retires its commit group (D reads NaN
// before it; wait_group n retires all but the newest n groups) and fails if shared memory
// under an in-flight wgmma changed; a thread that exits with a wgmma pending
// is an error.
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
//   - TestTensorCoreOnCPU: the wrappers of ptx/src/mma.cuh on the test
//     kernels of testdata/mma_kernels.cpp (not kernels of the runtime): every
//     lane's registers from ldmatrix (both ways), from fragments built by the
//     PTX ISA's m16n8k16 layout, and from mma results, against that layout
//     written out independently in the test; a 64x64x128 bf16 GEMM by 8 warps
//     (ldmatrix fragments, cp.async double-buffered stages) against float64,
//     with cp.async immediate and deferred; fp32 A times bf16 B as hi + lo
//     (two mma) against float64, and far more accurate than plain bf16; a
//     read before its cp.async wait caught by the deferred mode (and, as
//     documented, not by the immediate one); a stage refilled without the
//     __syncthreads after its compute caught in both modes; lanes at
//     different collectives, a partial warp and a misaligned cp.async
//     reported.
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
//   - TestMMAWalksOnCPU: the tensor-core walks of
//     ptx/src/gdn_walk_mma.cu (mma.sync with hi/lo splits, cp.async
//     double buffering) against gdnref, at vh 64 and 128 (bitwise equal), in
//     both cp.async modes; it skips while that file is absent.
//   - TestMMABackwardWalksOnCPU: the tensor-core backward walks of
//     ptx/src/gdn_bwalk_mma.cu (offset and tape walk: mma.sync with
//     hi/lo splits, cp.async stages) on the cases of
//     TestBackwardKernelsOnCPU against gdnref fed the kernels' own fp32
//     inputs, at vh 64 and 128 (bitwise equal), every output poisoned first,
//     cp.async immediate and deferred; it registers runner_bwalk_mma and
//     skips unless the tensor-core walks and ptx/src/gdn_bwd.cu are there.
//   - TestMMAPrepOnCPU: the tensor-core chunk prep of
//     ptx/src/gdn_prep_mma.cu (mma.sync with hi/lo splits, (I + L)^-1 in
//     16x16 blocks, cp.async stages) beside the fp32 gdn_prep_fwd on chunks
//     of 1, 3, 8, 40, 63 and 64 rows, each followed by tokens no chunk owns
//     (NaN inputs, poisoned outputs: neither read nor written), HQK 1 / HV 2
//     and HQK 2 / HV 4, cp.async immediate and deferred, a v that is not
//     16-byte aligned; gcum and Kt bitwise equal to gdn_prep_fwd's, gcum, W,
//     U, Kt within 1.5e-5 of gdnref.Prep fed the same fp32 inputs; it
//     registers runner_prep_mma and skips while that file is absent.
//   - TestMMAOutputOnCPU: the tensor-core output of
//     ptx/src/gdn_output_mma.cu (mma.sync with hi/lo splits, cp.async
//     stages split in place) against gdnref.Output fed the same fp32 qn, kn,
//     gamma, V' and chunk states: the entry with cp.async deferred (bf16,
//     every element within one bf16 ulp), an fp32-output probe of the same
//     body with cp.async immediate (5.7e-6 normwise), the entry bit for bit
//     the probe's bf16, the output poisoned first and fully written; it
//     registers runner_output_mma and skips while that file is absent.
//   - TestMMADvLocalOnCPU: the tensor-core dV'_local of
//     ptx/src/gdn_dvlocal_mma.cu beside the fp32 gdn_dvlocal_bwd on
//     chunks of 1..64 rows, each followed by tokens no chunk owns (NaN
//     inputs, poisoned outputs), HQK 1 / HV 2 and HQK 2 / HV 4, cp.async
//     immediate and deferred, against the formula in float64 from the same
//     inputs (3e-5 normwise, no element beyond 3e-4 of the rms); it
//     registers runner_dvlocal_mma.
//   - TestMMAChunkGradsOnCPU: the tensor-core chunk gradients of
//     ptx/src/gdn_chunk_grads_mma.cu beside the fp32 gdn_chunk_grads on
//     the same buffers, chunks of 1..64 rows with owner-less gap tokens,
//     padded v / dv strides, grouped heads, both cp.async modes, against
//     gdnref.ChunkGrads fed the same fp32 / bf16 inputs (dq, dk, dv, dg,
//     dbeta within 3e-5 normwise, no element beyond 3e-4 of the rms); it
//     registers runner_grads_mma.
//   - TestMMA16OnCPU: the v5 hand-over (gdn_state_walk_mma16 beside
//     gdn_state_walk_mma, then gdn_output_mma16 on its bf16 H^T and V'^T):
//     the walk's fp32 outputs bitwise gdn_state_walk_mma's at both widths,
//     its bf16 copies bitwise the rounding of the fp32 ones, null outputs
//     untouched, the output's rows written and gap rows untouched, its
//     error against gdnref within the budget; it registers runner_mma16.
//   - TestWGMMAOnCPU: the emulated wgmma itself (emu_wgmma_gemm of
//     testdata/mma_kernels.cpp calls it directly): D = A B and C + A B at
//     N 64 and 128 against float64, at issue and deferred; the errors it
//     reports (another swizzle mode, lanes that disagree, a thread exiting
//     with a wgmma pending, B rewritten in flight) and D reading NaN before
//     the wait. Its layouts are the test's own reading of the ISA; the
//     GPU-verified state walk passing on it (below) ties them to hardware.
//   - TestWGMMAStateWalkOnCPU: the sm_90a body of gdn_state_walk_mma16
//     (ptx/src/gdn_walk_wgmma.cu) on the emulated wgmma (runner_mma16_wg):
//     wgmma reported by the runner, every output written, the fp32 ones
//     within 2e-5 of gdn_state_walk_mma's, the bf16 copies bitwise the
//     rounding of its own fp32 ones, both widths bitwise equal, one case with
//     copies and wgmma deferred. It skips where the sources' wgmma.cuh does
//     not route to the emulator (GDNKCP_EMU_WGMMA; ptx/src has it since
//     2026-12-01).
//   - TestWGMMABackwardWalksOnCPU: TestMMABackwardWalksOnCPU's cases and
//     checks on runner_bwalk_mma_wg, where gdn_tape_walk_mma and
//     gdn_offset_walk_mma run their sm_90a bodies (gdn_bwalk_wgmma.cu) on
//     the emulated wgmma; wgmma reported for every backward walk launch;
//     skips like TestWGMMAStateWalkOnCPU. The parked vh 64 form with the
//     conversion beside the products
//     (ptx/staging/parked/gdn_bwalk_wgmma-split.patch: named barriers
//     with bar.arrive between the warpgroups; measured slower) runs here
//     once applied to ptx/src.
//   - TestMMA5ChunkGradsOnCPU: the grouped chunk gradients of
//     ptx/src/gdn_chunk_grads_mma5.cu (one CTA per chunk and QK head, dq
//     and dk summed over its value heads and put through the l2norm backward
//     in the kernel) beside gdn_chunk_grads + gdn_qk_bwd on the same buffers,
//     against gdnref.ChunkGrads summed and pushed through the l2norm backward
//     in float64; three value heads per QK head, both cp.async modes, l2norm
//     on and off (rstd NaN then: never read); it registers runner_grads_mma5.
//     Where the source runs wg:: products, gdn_chunk_grads_mma8's launches
//     run again on runner_grads_mma5_wg (the products on the emulated
//     wgmma, deferred to their wait_group in the deferred case), which must
//     give the same bits.
//   - TestTapeFormerOnCPU: the tape walk's dV'_local former
//     (ptx/staging/tape_dvl_former.patch; skipped until it is applied):
//     gdn_dvlocal_form's dvl against gdn_dvlocal_bwd's (dvlMMATol), its
//     gap rows untouched; gdn_tape_walk_planes_hf (vh 64, the former on the
//     copying warpgroup a chunk ahead) bit for bit gdn_tape_walk_planes_w128_h
//     on that dvl, alone and split between the two entries, in both
//     runners, cp.async and wgmma deferred in one case; its D, dV' and start
//     adjoints within tapeHiTol of float64.
//   - TestDevtestSyntax: every program of ptx/devtest (the timing skeletons
//     and device checks that scripts/*.sh build with nvcc on the GPU
//     machine) parsed and type-checked by the host compiler with
//     -fsyntax-only, as nvcc's sm_90a pass sees it (wgmma's inline PTX
//     included), against the stand-in headers of testdata/syntax, kernel
//     launches rewritten as calls; and a deliberately broken program
//     rejected. It catches in CI what a session without a GPU machine
//     would otherwise learn on its next device call; nvcc's own rules,
//     ptxas and run time stay the GPU's.
//   - TestKernelSyntax: the blobs' translation unit (gdnkcp.cu) the same
//     way for sm_90a, sm_100a and compute_80, so the inline PTX branches
//     that the emulator never compiles (wgmma, stmatrix, mma.sync) meet a
//     compiler before a blob rebuild on the GPU machine.
//
// The TestMMA* tests are the tensor-core kernels' emulator proofs from
// before their first GPU run; docs/mma-kernels.md has their design,
// precision and the GPU measurements.
//
// Every test skips when no C++ compiler is installed. The environment variable
// CPUEMU_SRC points the build at another kernel directory than ptx/src (to
// try a candidate file before it lands).
package cpuemu
