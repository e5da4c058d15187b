// Stand-in for cuda_bf16.h used only by TestDevtestSyntax (see cuda_runtime.h beside it).
#pragma once
#include "cuda_runtime.h"
struct __nv_bfloat16 { unsigned short x; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
typedef __nv_bfloat16 nv_bfloat16;
__nv_bfloat16 __float2bfloat16_rn(float); __nv_bfloat16 __float2bfloat16(float); float __bfloat162float(__nv_bfloat16);
unsigned short __bfloat16_as_ushort(__nv_bfloat16); __nv_bfloat16 __ushort_as_bfloat16(unsigned short);
float2 __bfloat1622float2(__nv_bfloat162); __nv_bfloat162 __floats2bfloat162_rn(float, float); __nv_bfloat162 __float22bfloat162_rn(float2);
