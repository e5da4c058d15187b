// Stand-in for the CUDA runtime header: just enough for the host C++
// compiler to build ptx/src as ordinary C++, one thread at a time. Only for
// the CPU emulation test (ptx/cpuemu); never used by nvcc.
#pragma once
#include <math.h>
#include <stddef.h>
#include <string.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)

struct uint4 {
  unsigned x, y, z, w;
};
struct dim3 {
  unsigned x, y, z;
};
extern dim3 gridDim, blockDim, blockIdx, threadIdx;

// A misaligned vector load is an error on the GPU: make it one here too.
inline uint4 __ldg(const uint4* p) {
  if (reinterpret_cast<unsigned long long>(p) & 15) __builtin_trap();
  return *p;
}
inline unsigned short __ldg(const unsigned short* p) { return *p; }
inline int __ldg(const int* p) { return *p; }
inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline int min(int a, int b) { return a < b ? a : b; }
