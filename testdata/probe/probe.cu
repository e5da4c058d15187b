#include <cuda_bf16.h>
struct Pair { int a; float b; long long c; };
extern "C" __global__ void probe_axpy(const float* __restrict__ x, float* __restrict__ y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void probe_mixed(const __nv_bfloat16* x, float* y, Pair p, unsigned long long n, char flag, double d) {
  __shared__ float s[256];
  int i = threadIdx.x;
  s[i] = (i < n) ? __bfloat162float(x[i]) * p.b + p.a + (float)p.c + flag + (float)d : 0.f;
  __syncthreads();
  if (i < n) y[i] = s[255 - i];
}
