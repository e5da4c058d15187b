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
// for every thread of the block, __syncwarp() and the shuffles for every lane
// of the warp; a barrier that can never be released (some threads at
// __syncthreads while others have exited or wait elsewhere) is reported as
// divergence and ends the process. The schedule is fixed, so a run is
// deterministic.
//
// Dynamic shared memory: every `extern __shared__ float smem[]` of a kernel
// namespace is one static array (EMU_DYNAMIC_SMEM) of the device's largest
// opt-in size; before each block it is filled with the NaN pattern
// kSmemFill, so a kernel that reads shared memory it never wrote computes
// NaN, and after each block the part beyond the launch's dynamic size must
// still hold the pattern (a write past it is reported).
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
  unsigned long long blocks = 0, syncthreads = 0, warp_syncs = 0;
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
  alignas(128) thread_local float name[emu::kMaxDynamicSmem / sizeof(float)]; \
  static emu::SmemRegistrar name##_emu_registrar(name, sizeof(name))
