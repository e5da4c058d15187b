// emu.h: a block-synchronous CPU emulator for the CUDA kernels of ptx/src,
// compiled as plain C++ against the stand-in headers here (cuda_runtime.h,
// cuda_bf16.h). Only for the CPU emulation test (ptx/cpuemu).
//
// launch runs a grid one block at a time, blocks in order (x fastest). A
// block's threads are fibers (ucontext) on one OS thread, all started before
// any runs: each runs until it reaches a barrier or ends, one after the other
// (ascending thread order in even blocks, descending in odd ones, so that a
// missing barrier shows whichever way the hazard points), then the barrier is
// released and the round repeats. __syncthreads() waits
// for every thread of the block, a named barrier (bar.sync id, count: tc::bar_sync
// of mma.cuh) for count threads at that id (threads that bar.arrive there,
// named_arrive, count toward it without waiting; an arriving thread goes on only
// in the next round, after the threads its arrival released, so a producer that
// arrives before it writes is seen; counts must agree, and an arrival beyond the
// count of a phase still open is an error), __syncwarp() and the shuffles (and the
// tensor-core instructions below) for every lane of the warp. A warp's
// barrier is released as soon as all its lanes reach it, so each warp runs
// ahead to its next __syncthreads (or its end) before the next warp starts:
// the warps are as far apart as the block's barriers let them be. A barrier
// that can never be released (some threads at __syncthreads while others
// have exited or wait elsewhere) is reported as divergence and ends the
// process. The schedule is fixed, so a run is deterministic.
//
// Dynamic shared memory: every `extern __shared__ float smem[]` of a kernel
// namespace is one static array (EMU_DYNAMIC_SMEM) of the device's largest
// opt-in size; before each block it is filled with the NaN pattern
// kSmemFill, so a kernel that reads shared memory it never wrote computes
// NaN, and after each block the part beyond the launch's dynamic size must
// still hold the pattern (a write past it is reported).
//
// The tensor-core path of ptx/src/mma.cuh (declared in the stand-in
// cuda_runtime.h, which defines GDNKCP_CPU_EMULATOR):
//   mma_bf16_16816  every lane deposits its A and B fragment registers in its
//                   warp's exchange slots and meets the others; each lane then
//                   rebuilds A (16x16) and B (16x8) by the fragment layout of
//                   the PTX ISA (written out in mma.cuh) and computes its own
//                   four D elements: products of bf16 values (exact in fp32)
//                   added in fp32 to C in k order 0..15; a second meeting
//                   before the slots are reused. The tensor core adds in
//                   another order and precision: GPU and emulator agree to a
//                   tolerance, not bit for bit.
//   ldmatrix_x4     every lane deposits its row address (16-byte aligned, or
//                   an error); after the meeting each lane reads its elements
//                   of the four 8x8 matrices (transposed with .trans).
//                   Both are checked to be executed by a full warp of 32 lanes,
//                   all at the same instruction (a lane at another warp
//                   collective, a shuffle or __syncwarp, is an error).
//   cp_async16      16 bytes, both addresses 16-byte aligned (or an error).
//   cp_async16_zfill  the same with cp.async's src-size operand: 16 (full: the
//                   source's bytes) or 0 (16 zero bytes; the source, which must
//                   still be a valid address, is not read).
//                   By default the copy happens at once and commit/wait do
//                   nothing, which cannot show a missing wait. With the
//                   environment variable EMU_CP_ASYNC=deferred a copy reads its
//                   source at issue but fills its destination with kSmemFill
//                   (NaN); commit closes the thread's group and
//                   cp_async_wait(n) lands the groups older than the newest n,
//                   as cp.async.wait_group does. A read before the wait, or a
//                   stage overwritten while another thread still reads it,
//                   computes NaN. Copies still pending when a thread exits
//                   land then. __syncthreads() does not wait for them (nor
//                   does it on the GPU).
//
// The wgmma path of ptx/src/wgmma.cuh (sm_90a on the GPU; here only in
// runners that define GDNKCP_EMU_WGMMA before including the kernels):
//   wgmma_rs        wgmma.mma_async m64nNk16 f32.bf16.bf16 with A from
//                   registers: warp-collective like mma_bf16_16816 (a warp's
//                   16 rows of D depend only on its own lanes' A registers and
//                   on B, so the four warps of a warpgroup need not meet).
//                   Every lane deposits its A registers, the descriptor, N and
//                   scale-d (all lanes must agree on the last three); each lane
//                   rebuilds A (16x16) and reads B (16 x N) from shared memory
//                   through the descriptor: start address, stride byte offset
//                   (8-row groups along N), the 128-byte swizzle (the only
//                   mode emulated: byte address bits 4-6 XOR bits 7-9, rows of
//                   128 bytes, K-major) and base offset 0, then computes its
//                   own D elements (the mma.sync D layout per n8 tile) as
//                   mma_bf16_16816 does: exact products added in k order to D
//                   (or to zero with scale-d 0).
//                   With EMU_WGMMA=deferred the result is held back: D reads NaN
//                   until wgmma_wait (a chained wgmma on the same D continues
//                   from the held value), and the wait re-reads B and fails if
//                   shared memory under an in-flight wgmma changed. Otherwise D
//                   is written at issue. wgmma_commit closes a group of the
//                   wgmmas issued since the last; wgmma_wait(n) retires every
//                   group but the newest n (0: everything issued); wgmma_fence
//                   does nothing; a thread that exits with a wgmma pending is
//                   an error.
//   cvta_shared     __cvta_generic_to_shared: the byte offset of p in the
//                   registered dynamic shared memory (kernels of a launch must
//                   use one array); the array is 1024-aligned, so offsets have
//                   the alignment that the swizzle needs on the GPU.
//   stmatrix_x4     stmatrix.sync.aligned.m8n8.x4.shared.b16 (sm_90): every
//                   lane deposits its row address (16-byte aligned, or an
//                   error) and its four registers; after the meeting each lane
//                   stores its own elements of the four 8x8 matrices (row
//                   lane / 4, columns 2 (lane % 4), + 1) at the addresses lanes
//                   8 m + lane / 4 gave, all before any lane leaves. Checked
//                   like ldmatrix_x4 (a full warp, the same instruction).
#pragma once
#include <functional>
#include <string>

#include "cuda_runtime.h"

namespace emu {

// The dynamic shared memory a block may ask for: 227 KB, the opt-in limit of
// an sm_90 / sm_100 device (H100, H200, B200).
constexpr size_t kMaxDynamicSmem = 232448;
// What fresh shared memory holds: a quiet NaN with a payload of its own.
constexpr unsigned kSmemFill = 0x7fedcba9u;

// register_smem adds a dynamic shared memory array (see EMU_DYNAMIC_SMEM).
void register_smem(void* p, size_t bytes);
struct SmemRegistrar {
  SmemRegistrar(void* p, size_t bytes) { register_smem(p, bytes); }
};

// Counters of one launch.
struct Stats {
  unsigned long long blocks = 0, syncthreads = 0, warp_syncs = 0, named_syncs = 0;
  unsigned long long mmas = 0, ldmatrix = 0, cp_async = 0;  // per warp, per warp, per thread
  unsigned long long wgmmas = 0;                            // per warp
};

// fail reports an error of the emulated launch (with the current launch's
// label, block and thread) and ends the process with status 3.
[[noreturn]] void fail(const std::string& what);

// launch runs kernel (a call of the kernel with bound arguments) on grid x
// block threads with smem bytes of dynamic shared memory. label names the
// launch in error reports.
Stats launch(const std::string& label, dim3 grid, dim3 block, size_t smem, const std::function<void()>& kernel);

}  // namespace emu

// EMU_DYNAMIC_SMEM(smem) defines the `extern __shared__ float smem[]` that the
// kernels of the enclosing namespace declare, and registers it.
#define EMU_DYNAMIC_SMEM(name)                                                  \
  alignas(1024) thread_local float name[emu::kMaxDynamicSmem / sizeof(float)]; \
  static emu::SmemRegistrar name##_emu_registrar(name, sizeof(name))
