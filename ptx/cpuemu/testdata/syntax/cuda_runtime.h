// Stand-in for the CUDA runtime header used only by TestDevtestSyntax (devtest_syntax_test.go): declarations
// enough for the host C++ compiler to parse and type-check the programs of ptx/devtest with -fsyntax-only, the
// sm_90a branches of ptx/src (wgmma, inline PTX) included. Nothing here runs; nvcc never sees it. A devtest
// program that needs another runtime call or intrinsic adds its declaration here.
#pragma once
#include <stddef.h>
#include <math.h>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__
#define __constant__
#define __align__(n) __attribute__((aligned(n)))
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct int2 { int x, y; };
struct int4 { int x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct ushort2 { unsigned short x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
struct dim3 { unsigned x = 1, y = 1, z = 1; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
extern dim3 gridDim, blockDim, blockIdx, threadIdx;
void __syncthreads();
void __syncwarp(unsigned m = 0xffffffffu);
int __syncthreads_or(int);
template <class T> T __shfl_xor_sync(unsigned, T, int, int = 32);
template <class T> T __shfl_sync(unsigned, T, int, int = 32);
template <class T> T __shfl_down_sync(unsigned, T, int, int = 32);
template <class T> T __shfl_up_sync(unsigned, T, int, int = 32);
float __expf(float); float __logf(float); float __fdividef(float, float); float __frcp_rn(float);
float __uint_as_float(unsigned); unsigned __float_as_uint(float); int __float_as_int(float); float __int_as_float(int);
size_t __cvta_generic_to_shared(const void*); size_t __cvta_generic_to_global(const void*);
unsigned __ballot_sync(unsigned, int); int __popc(unsigned); int __ffs(int); int __clz(int);
long long clock64(); unsigned __smid();
float rsqrtf(float); float __saturatef(float);
template <class T> T __ldg(const T*);
enum cudaError_t { cudaSuccess = 0 };
typedef cudaError_t cudaError;
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize, cudaFuncAttributePreferredSharedMemoryCarveout };
enum cudaDeviceAttr { cudaDevAttrClockRate, cudaDevAttrMultiProcessorCount, cudaDevAttrMaxSharedMemoryPerBlockOptin };
struct cudaFuncAttributes { int numRegs; size_t localSizeBytes, sharedSizeBytes; int maxThreadsPerBlock; };
struct CUevent_st; typedef CUevent_st* cudaEvent_t;
struct CUstream_st; typedef CUstream_st* cudaStream_t;
struct cudaDeviceProp { char name[256]; int multiProcessorCount, major, minor, clockRate; size_t sharedMemPerBlockOptin; };
const char* cudaGetErrorString(cudaError_t);
cudaError_t cudaGetLastError(); cudaError_t cudaPeekAtLastError();
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMalloc(void**, size_t);
template <class T> cudaError_t cudaMalloc(T** p, size_t n) { return cudaMalloc((void**)p, n); }
cudaError_t cudaFree(void*);
cudaError_t cudaMemcpy(void*, const void*, size_t, cudaMemcpyKind);
cudaError_t cudaMemset(void*, int, size_t);
template <class T> cudaError_t cudaMemcpyToSymbol(const T&, const void*, size_t, size_t = 0, cudaMemcpyKind = cudaMemcpyHostToDevice);
cudaError_t cudaEventCreate(cudaEvent_t*); cudaError_t cudaEventDestroy(cudaEvent_t);
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t = 0); cudaError_t cudaEventSynchronize(cudaEvent_t);
cudaError_t cudaEventElapsedTime(float*, cudaEvent_t, cudaEvent_t);
cudaError_t cudaDeviceGetAttribute(int*, cudaDeviceAttr, int);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp*, int);
template <class K> cudaError_t cudaFuncSetAttribute(K, cudaFuncAttribute, int);
template <class K> cudaError_t cudaFuncGetAttributes(cudaFuncAttributes*, K);
template <class K> cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int*, K, int, size_t);
cudaError_t cudaStreamCreate(cudaStream_t*); cudaError_t cudaStreamDestroy(cudaStream_t); cudaError_t cudaStreamSynchronize(cudaStream_t);
float __fmul_rn(float, float); float __fadd_rn(float, float); float __fsub_rn(float, float); float __fmaf_rn(float, float, float);
float __fdiv_rn(float, float); float __frsqrt_rn(float); float __fsqrt_rn(float);
[[noreturn]] void __trap();
int min(int, int); int max(int, int); unsigned min(unsigned, unsigned); unsigned max(unsigned, unsigned);
long long min(long long, long long); long long max(long long, long long);
float fminf(float, float); float fmaxf(float, float);
enum cudaLaunchAttributeID { cudaLaunchAttributeClusterDimension = 4 };
union cudaLaunchAttributeValue { struct { unsigned x, y, z; } clusterDim; int pad[16]; };
struct cudaLaunchAttribute { cudaLaunchAttributeID id; cudaLaunchAttributeValue val; };
struct cudaLaunchConfig_t { dim3 gridDim, blockDim; size_t dynamicSmemBytes; cudaStream_t stream; cudaLaunchAttribute* attrs; unsigned numAttrs; };
template <class K, class... A> cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t*, K, A...);
template <class K> cudaError_t cudaOccupancyMaxActiveClusters(int*, K, const cudaLaunchConfig_t*);
