// util.cu: small helper entries used by tests and by the host runtime.
#pragma once

#include <cuda_runtime.h>

// gdn_poison_u32 writes v to p[0..n): tests fill outputs with a pattern
// before a launch so that anything a kernel fails to write shows up.
// Any grid and block shape works (grid-stride loop).
extern "C" __global__ void gdn_poison_u32(unsigned* __restrict__ p, unsigned long long n, unsigned v) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    p[i] = v;
  }
}
