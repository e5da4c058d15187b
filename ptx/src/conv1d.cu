// conv1d.cu: depthwise causal conv1d (width 4) + SiLU forward over the
// segments of a rank's buffer (DESIGN.md §3).
//
//   x         bf16 [T, C]         the rank's tokens, channels innermost
//   w         bf16 [C, 4]         per-channel taps, tap 0 multiplies the oldest token
//   halo      bf16 [nseg, 3, C]   the 3 tokens before each segment in its document,
//                                 oldest first; zeros when the segment starts its document
//   seg_start int  [nseg]         local start of each segment
//   seg_len   int  [nseg]         length of each segment
//   tok_seg   int  [T]            the segment of each local token
//   y         bf16 [T, C]         output; must not overlap x or halo
//
//   y[t][c] = silu(sum_{i=0..3} w[c][i] * x'[t-3+i][c]),  silu(a) = a / (1 + exp(-a))
//
// where x'[p] is x[p] inside t's segment and the segment's halo row before it:
// nothing is mixed across segments. The four products are accumulated in
// fp32 by fused multiply-adds in tap order (0, 1, 2, 3), SiLU is computed in
// fp32 with IEEE division and the accurate expf, and the result is rounded
// to bf16 (nearest even). No atomics; every output is written by exactly one
// thread, so results are bitwise reproducible for any launch shape.
//
// Launch: block of at most kConvMaxThreads (256) threads, any grid (a
// grid-stride loop covers all work). A thread handles kConvTokensPerThread
// (16) consecutive tokens of 8 channels (16-byte loads and stores) when
// C % 8 == 0 and x, w, halo and y are 16-byte aligned, else of 1 channel.
// Work items = ceil(C / lanes) * ceil(T / 16); a grid of
// ceil(items / 256) blocks of 256 threads gives one item per thread.
//
// Tokens whose tok_seg is out of range, or that lie outside their segment,
// are skipped and their outputs left as they were (the host validates the
// tables; a poisoned output shows the skip).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace gdnkcp {
namespace conv1d {

constexpr int kWidth = 4;              // taps
constexpr int kHalo = kWidth - 1;      // tokens before a segment that it reads
constexpr int kTokensPerThread = 16;   // consecutive tokens one thread walks
constexpr int kMaxThreads = 256;       // launch bound
static_assert(kWidth == 4, "the kernel's tap loop is written for width 4");

// bf16 <-> fp32. Widening is exact (the bf16 bits are the top half of the
// float); narrowing rounds to nearest even like cvt.rn.bf16.f32.
__device__ __forceinline__ float bf16_lo(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ unsigned bf16_bits(float f) {
  return static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(f)));
}
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  return bf16_bits(lo) | (bf16_bits(hi) << 16);
}

__device__ __forceinline__ float silu(float a) { return a / (1.0f + expf(-a)); }

// Lanes<V> loads and stores V consecutive bf16 channels as floats.
template <int V>
struct Lanes;

template <>
struct Lanes<8> {
  // p must be 16-byte aligned.
  static __device__ __forceinline__ void load(const __nv_bfloat16* p, float (&f)[8]) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
    f[0] = bf16_lo(u.x);
    f[1] = bf16_hi(u.x);
    f[2] = bf16_lo(u.y);
    f[3] = bf16_hi(u.y);
    f[4] = bf16_lo(u.z);
    f[5] = bf16_hi(u.z);
    f[6] = bf16_lo(u.w);
    f[7] = bf16_hi(u.w);
  }
  static __device__ __forceinline__ void store(__nv_bfloat16* p, const float (&f)[8]) {
    uint4 u;
    u.x = pack_bf16x2(f[0], f[1]);
    u.y = pack_bf16x2(f[2], f[3]);
    u.z = pack_bf16x2(f[4], f[5]);
    u.w = pack_bf16x2(f[6], f[7]);
    *reinterpret_cast<uint4*>(p) = u;
  }
};

template <>
struct Lanes<1> {
  static __device__ __forceinline__ void load(const __nv_bfloat16* p, float (&f)[1]) {
    f[0] = bf16_lo(static_cast<unsigned>(__ldg(reinterpret_cast<const unsigned short*>(p))));
  }
  static __device__ __forceinline__ void store(__nv_bfloat16* p, const float (&f)[1]) {
    *reinterpret_cast<unsigned short*>(p) = static_cast<unsigned short>(bf16_bits(f[0]));
  }
};

template <int V>
__device__ __forceinline__ void conv_silu_rows(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                               const __nv_bfloat16* __restrict__ halo, const int* __restrict__ seg_start,
                                               const int* __restrict__ seg_len, const int* __restrict__ tok_seg,
                                               __nv_bfloat16* __restrict__ y, int T, int C, int nseg) {
  const int groups = C / V;  // channel groups of V lanes
  const long long runs = (static_cast<long long>(T) + kTokensPerThread - 1) / kTokensPerThread;
  const long long items = static_cast<long long>(groups) * runs;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const size_t row = static_cast<size_t>(C);

  for (long long item = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; item < items; item += stride) {
    // Consecutive threads take consecutive channel groups of the same tokens,
    // so a warp reads and writes contiguous bytes of each row.
    const int g = static_cast<int>(item % groups);
    const int run = static_cast<int>(item / groups);
    const int c0 = g * V;

    // Taps: w[c0 + lane][tap], read as kWidth chunks of V contiguous values.
    float wk[kWidth][V];
    {
      float all[kWidth * V];
#pragma unroll
      for (int k = 0; k < kWidth; ++k) {
        float chunk[V];
        Lanes<V>::load(w + static_cast<size_t>(c0) * kWidth + k * V, chunk);
#pragma unroll
        for (int m = 0; m < V; ++m) all[k * V + m] = chunk[m];
      }
#pragma unroll
      for (int lane = 0; lane < V; ++lane) {
#pragma unroll
        for (int tap = 0; tap < kWidth; ++tap) wk[tap][lane] = all[lane * kWidth + tap];
      }
    }

    // win[r] holds the inputs at segment positions j-3+r for the next token.
    float win[kHalo][V];
    int win_seg = -1;  // the segment win belongs to; -1 when it must be (re)loaded

    const int t_begin = run * kTokensPerThread;
    const int t_end = min(t_begin + kTokensPerThread, T);
    for (int t = t_begin; t < t_end; ++t) {
      const int s = __ldg(tok_seg + t);
      if (s < 0 || s >= nseg) {
        win_seg = -1;
        continue;
      }
      const int start = __ldg(seg_start + s);
      const int j = t - start;  // position inside the segment
      if (start < 0 || j < 0 || j >= __ldg(seg_len + s)) {
        win_seg = -1;
        continue;
      }
      if (win_seg != s) {
#pragma unroll
        for (int r = 0; r < kHalo; ++r) {
          const int q = j - kHalo + r;
          const __nv_bfloat16* src =
              q >= 0 ? x + static_cast<size_t>(start + q) * row + c0
                     : halo + (static_cast<size_t>(s) * kHalo + static_cast<size_t>(q + kHalo)) * row + c0;
          Lanes<V>::load(src, win[r]);
        }
        win_seg = s;
      }

      float cur[V];
      Lanes<V>::load(x + static_cast<size_t>(t) * row + c0, cur);
      float out[V];
#pragma unroll
      for (int v = 0; v < V; ++v) {
        float acc = 0.0f;
        acc = fmaf(wk[0][v], win[0][v], acc);
        acc = fmaf(wk[1][v], win[1][v], acc);
        acc = fmaf(wk[2][v], win[2][v], acc);
        acc = fmaf(wk[3][v], cur[v], acc);
        out[v] = silu(acc);
      }
      Lanes<V>::store(y + static_cast<size_t>(t) * row + c0, out);

#pragma unroll
      for (int v = 0; v < V; ++v) {
        win[0][v] = win[1][v];
        win[1][v] = win[2][v];
        win[2][v] = cur[v];
      }
    }
  }
}

}  // namespace conv1d
}  // namespace gdnkcp

extern "C" __global__ void __launch_bounds__(gdnkcp::conv1d::kMaxThreads)
    gdn_conv1d_silu_fwd(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                        const __nv_bfloat16* __restrict__ halo, const int* __restrict__ seg_start,
                        const int* __restrict__ seg_len, const int* __restrict__ tok_seg, __nv_bfloat16* __restrict__ y,
                        int T, int C, int nseg) {
  if (T <= 0 || C <= 0) return;
  const unsigned long long addr_bits =
      reinterpret_cast<unsigned long long>(x) | reinterpret_cast<unsigned long long>(w) |
      reinterpret_cast<unsigned long long>(halo) | reinterpret_cast<unsigned long long>(y);
  if (C % 8 == 0 && (addr_bits & 15ull) == 0) {
    gdnkcp::conv1d::conv_silu_rows<8>(x, w, halo, seg_start, seg_len, tok_seg, y, T, C, nseg);
  } else {
    gdnkcp::conv1d::conv_silu_rows<1>(x, w, halo, seg_start, seg_len, tok_seg, y, T, C, nseg);
  }
}
