// selftest.cpp: small kernels that check the emulator itself (emu_test.go's
// TestEmulator): barriers (named ones too), shuffles, static and dynamic shared memory, and
// the errors it must report (divergent barriers, shared memory written past
// the launch's size, global writes out of bounds, reads of unwritten shared
// memory).
#include <cuda_runtime.h>

#include "mma.cuh"
#include "registry.h"

namespace emu_selftest {

EMU_DYNAMIC_SMEM(smem);

// block_sum: out[block] = tree sum of in[block*256 .. +256) through dynamic
// shared memory, halving with a __syncthreads per level.
extern "C" __global__ void emu_block_sum(const float* in, float* out) {
  extern __shared__ float smem[];
  const int t = threadIdx.x;
  smem[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) smem[t] = smem[t] + smem[t + s];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = smem[0];
}

// shuffles: per thread, the lane read by xor 5, down 3, up 7 and idx 9, as
// the source lane's value lane*10 + warp.
extern "C" __global__ void emu_shuffles(int* out) {
  const int t = threadIdx.x, lane = t & 31, v = lane * 10 + t / 32;
  int* o = out + (blockIdx.x * blockDim.x + t) * 4;
  o[0] = __shfl_xor_sync(0xffffffffu, v, 5);
  o[1] = __shfl_down_sync(0xffffffffu, v, 3);
  o[2] = __shfl_up_sync(0xffffffffu, v, 7);
  o[3] = __shfl_sync(0xffffffffu, v, 9);
}

// static_shared: a block-scope __shared__ array is one array for the block:
// out[t] = what thread n-1-t wrote.
extern "C" __global__ void emu_static_shared(float* out) {
  __shared__ float red[1024];
  const int t = threadIdx.x, n = blockDim.x;
  red[t] = static_cast<float>(blockIdx.x * 1000 + t);
  __syncthreads();
  out[blockIdx.x * n + t] = red[n - 1 - t];
}

// missing_sync: reads a neighbour's shared memory with no barrier between
// the write and the read (a bug): some threads see the fresh-memory NaN.
extern "C" __global__ void emu_missing_sync(float* out) {
  extern __shared__ float smem[];
  const int t = threadIdx.x, n = blockDim.x;
  smem[t] = static_cast<float>(t);
  out[blockIdx.x * n + t] = smem[(t + 1) % n];
}

// divergent_sync: the first warp leaves before a __syncthreads (a bug).
extern "C" __global__ void emu_divergent_sync(float* out) {
  if (threadIdx.x < 32) return;
  __syncthreads();
  out[threadIdx.x] = 1.f;
}

// named_pair: warps w and w + 4 of a 256-thread block are pairs; each warp posts lane*10 + warp to
// shared memory and reads its partner's after the pair's named barrier (tc::bar_sync(1 + w % 4, 64)),
// or, with sync = 0, without it (a bug: the warp that runs first reads unwritten shared memory).
extern "C" __global__ void emu_named_pair(float* out, int sync) {
  extern __shared__ float smem[];
  const int t = threadIdx.x, w = t / 32, lane = t % 32;
  smem[t] = static_cast<float>(lane * 10 + w);
  if (sync) gdnkcp::tc::bar_sync(1 + w % 4, 64);
  out[blockIdx.x * blockDim.x + t] = smem[((w + 4) % 8) * 32 + lane];
}

// arrive_pair: warps 0-3 post their slot and arrive at named barrier 1 (bar.arrive, 256 threads), warps
// 4-7 sync there and read the slot of thread t - 128; with write_first 0 the producers arrive before they
// write (a bug the descending block order shows).
extern "C" __global__ void emu_arrive_pair(float* out, int write_first) {
  extern __shared__ float smem[];
  const int t = threadIdx.x;
  if (t < 128) {
    if (write_first) smem[t] = static_cast<float>(t + 1000 * blockIdx.x);
    emu::named_arrive(1, 256);
    if (!write_first) smem[t] = static_cast<float>(t + 1000 * blockIdx.x);
    out[blockIdx.x * blockDim.x + t] = 0.f;
    return;
  }
  gdnkcp::tc::bar_sync(1, 256);
  out[blockIdx.x * blockDim.x + t] = smem[t - 128];
}

// arrive_count_mismatch: the producers arrive for 256 threads, the consumers sync for 192 (a bug).
extern "C" __global__ void emu_arrive_count_mismatch(float* out) {
  if (threadIdx.x < 128)
    emu::named_arrive(1, 256);
  else
    gdnkcp::tc::bar_sync(1, 192);
  out[threadIdx.x] = 1.f;
}

// named_count_mismatch: the two warps at named barrier 1 name different thread counts (a bug).
extern "C" __global__ void emu_named_count_mismatch(float* out) {
  if (threadIdx.x >= 64) return;
  gdnkcp::tc::bar_sync(1, threadIdx.x < 32 ? 64 : 96);
  out[threadIdx.x] = 1.f;
}

// named_short: one warp waits at a named barrier for 64 threads that never come (a bug).
extern "C" __global__ void emu_named_short(float* out) {
  if (threadIdx.x >= 32) return;
  gdnkcp::tc::bar_sync(2, 64);
  out[threadIdx.x] = 1.f;
}

// smem_overflow: writes one float past n bytes of dynamic shared memory.
extern "C" __global__ void emu_smem_overflow(int n) {
  extern __shared__ float smem[];
  if (threadIdx.x == 0) smem[n / 4] = 0.f;
}

// oob_write: writes p[n], one element past an n-element buffer.
extern "C" __global__ void emu_oob_write(float* p, int n) {
  if (threadIdx.x == 0) p[n] = 0.f;
}

}  // namespace emu_selftest

namespace {
emu::Registrar selftest_kernels(
    {
        EMU_KERNEL(emu_selftest, emu_block_sum),
        EMU_KERNEL(emu_selftest, emu_shuffles),
        EMU_KERNEL(emu_selftest, emu_static_shared),
        EMU_KERNEL(emu_selftest, emu_missing_sync),
        EMU_KERNEL(emu_selftest, emu_divergent_sync),
        EMU_KERNEL(emu_selftest, emu_smem_overflow),
        EMU_KERNEL(emu_selftest, emu_oob_write),
        EMU_KERNEL(emu_selftest, emu_named_pair),
        EMU_KERNEL(emu_selftest, emu_named_count_mismatch),
        EMU_KERNEL(emu_selftest, emu_named_short),
        EMU_KERNEL(emu_selftest, emu_arrive_pair),
        EMU_KERNEL(emu_selftest, emu_arrive_count_mismatch),
    },
    {});
}  // namespace
