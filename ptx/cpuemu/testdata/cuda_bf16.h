// Stand-in for cuda_bf16.h (see cuda_runtime.h here): round to nearest even,
// NaN to 0x7fff, as cvt.rn.bf16.f32 does; widening is exact.
#pragma once
#include "cuda_runtime.h"

struct __nv_bfloat16 {
  unsigned short x;
};
inline unsigned short __bfloat16_as_ushort(const __nv_bfloat16 h) { return h.x; }
inline __nv_bfloat16 __ushort_as_bfloat16(const unsigned short u) {
  __nv_bfloat16 r;
  r.x = u;
  return r;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  __nv_bfloat16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.x = 0x7fff;
    return r;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  r.x = static_cast<unsigned short>(u >> 16);
  return r;
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(const __nv_bfloat16 h) {
  const unsigned u = static_cast<unsigned>(h.x) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
