// Stand-in for the CUDA runtime header: just enough for the host C++
// compiler to build the fp32 kernels of ptx/src as ordinary C++ and run them
// on the block-synchronous emulator of emu.h (one block at a time, every
// thread a fiber). Only for the CPU emulation test (ptx/cpuemu); never used by
// nvcc.
//
//   threadIdx, blockIdx, blockDim, gridDim  globals that the emulator sets
//                                           before it resumes a fiber
//   __syncthreads(), __syncwarp()          switch through the block's / warp's fibers
//   __shfl_xor_sync and friends            exchange through a per-warp slot array
//   __shared__                             thread_local: a block-scope __shared__
//                                          array is one static array for all fibers;
//                                          `extern __shared__ float smem[]` names the
//                                          dynamic shared memory that the harness
//                                          defines in the kernel's namespace
//                                          (EMU_DYNAMIC_SMEM) and that the emulator
//                                          fills with a NaN pattern before each block
//   emu::mma_bf16_16816, emu::ldmatrix_x4,  the warp-collective tensor-core instructions and
//   emu::cp_async16 / _zfill / _commit /    cp.async that ptx/src/mma.cuh calls when
//   _wait                                  GDNKCP_CPU_EMULATOR is defined (this header defines it)
// Math comes from <math.h> (expf, fmaf, sqrtf: the host's libm, which may
// differ from the GPU's in the last ulp); the test builds with
// -ffp-contract=off so that the compiler fuses nothing on its own.
#pragma once
// Kernel sources test this to take the emulator's path where they would use inline PTX (mma.cuh).
#ifndef GDNKCP_CPU_EMULATOR
#define GDNKCP_CPU_EMULATOR 1
#endif
#include <math.h>
#include <stddef.h>
#include <string.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ thread_local
#define __align__(n) __attribute__((aligned(n)))

struct uint2 {
  unsigned x, y;
};
struct uint4 {
  unsigned x, y, z, w;
};
struct int4 {
  int x, y, z, w;
};
struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct dim3 {
  unsigned x, y, z;
};
extern dim3 gridDim, blockDim, blockIdx, threadIdx;

namespace emu {
// Defined in emu.cpp (out of line, so that the compiler reloads memory and
// the index globals after every switch).
void block_barrier();
void warp_barrier(unsigned mask);
void named_barrier(unsigned id, unsigned count);
void named_arrive(unsigned id, unsigned count);
unsigned* warp_slots();  // this fiber's warp's 32 exchange slots
unsigned lane_id();      // this fiber's lane (linear thread index % 32)

// The tensor-core path of ptx/src/mma.cuh (emu.cpp; see emu.h for the semantics). Warp-collective:
// every lane of a full warp must call the same one together.
void mma_bf16_16816(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]);
void ldmatrix_x4(unsigned r[4], const void* smem_row_ptr, bool trans);
// cp.async of 16 bytes and its groups (per thread).
void cp_async16(void* smem, const void* gmem);
void cp_async16_zfill(void* smem, const void* gmem, bool full);  // src-size 16 (full) or 0 (zeros)
void cp_async_commit();
void cp_async_wait(int n);

// The Hopper wgmma path of ptx/src/wgmma.cuh, built only where a runner defines GDNKCP_EMU_WGMMA (emu.h).
void wgmma_rs(float* d, int n, const unsigned a[4], unsigned long long desc, int scale_d);
void wgmma_rs_t(float* d, int n, const unsigned a[4], unsigned long long desc, int scale_d);  // B MN-major
void wgmma_fence();
void wgmma_commit();
void wgmma_wait(int n);
unsigned long long cvta_shared(const void* p);
void stmatrix_x4(void* smem_row_ptr, const unsigned r[4]);  // stmatrix.sync.aligned.m8n8.x4 (sm_90)

template <typename T>
inline unsigned to_bits(T v) {
  static_assert(sizeof(T) == 4, "the emulated shuffles move 32-bit values");
  unsigned u;
  memcpy(&u, &v, 4);
  return u;
}
template <typename T>
inline T from_bits(unsigned u) {
  T v;
  memcpy(&v, &u, 4);
  return v;
}
// shuffle: every lane of the warp publishes v, meets the others, reads lane
// src(lane), and meets them again before the slots can be reused.
template <typename T, typename F>
inline T shuffle(unsigned mask, T v, F src) {
  unsigned* slot = warp_slots();
  const unsigned lane = lane_id();
  slot[lane] = to_bits(v);
  warp_barrier(mask);
  const unsigned s = src(lane);
  const unsigned r = slot[s < 32 ? s : lane];
  warp_barrier(mask);
  return from_bits<T>(r);
}
}  // namespace emu

inline void __syncthreads() { emu::block_barrier(); }
inline void __trap() { __builtin_trap(); }
// The shared-window address of p: its byte offset in the registered dynamic shared memory (emu.h).
inline unsigned long long __cvta_generic_to_shared(const void* p) { return emu::cvta_shared(p); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::warp_barrier(mask); }
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return emu::shuffle(mask, v, [&](unsigned l) {
    const unsigned s = l ^ static_cast<unsigned>(lane_mask);
    return (s / width == l / width) ? s : l;  // outside the segment: own value
  });
}
template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  return emu::shuffle(mask, v, [&](unsigned l) { return (l / width) * width + static_cast<unsigned>(src_lane) % width; });
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return emu::shuffle(mask, v, [&](unsigned l) { return (l % width) + delta < static_cast<unsigned>(width) ? l + delta : l; });
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return emu::shuffle(mask, v, [&](unsigned l) { return (l % width) >= delta ? l - delta : l; });
}

// A misaligned vector load is an error on the GPU: make it one here too.
inline uint4 __ldg(const uint4* p) {
  if (reinterpret_cast<unsigned long long>(p) & 15) __builtin_trap();
  return *p;
}
inline float4 __ldg(const float4* p) {
  if (reinterpret_cast<unsigned long long>(p) & 15) __builtin_trap();
  return *p;
}
inline unsigned short __ldg(const unsigned short* p) { return *p; }
inline int __ldg(const int* p) { return *p; }
inline unsigned __ldg(const unsigned* p) { return *p; }
inline float __ldg(const float* p) { return *p; }
inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}
inline int __float_as_int(float f) {
  int u;
  memcpy(&u, &f, 4);
  return u;
}
inline float __int_as_float(int u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
// The IEEE-rounded intrinsics; rsqrtf is approximate on the GPU (exact here).
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
