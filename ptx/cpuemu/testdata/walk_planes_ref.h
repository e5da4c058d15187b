// walk_planes_ref.h: test_walk_planes, a test-only kernel that writes the walk planes of
// ptx/src/walk_planes.cuh from fp32 W and kn (-W's split as the v5 walks' converters form it, K^T's from the
// normalised k, zero past a chunk's end), one (chunk, value head) a block, K^T by the first value head of
// each QK head: grid (NC, HV), any block size, no shared memory. The prep's planes
// (TestMMAPrepOnCPU) and the plane walks' inputs (TestPlaneWalksOnCPU) are held to it.
#pragma once

#include "walk_planes.cuh"

namespace gdnkcp {
namespace planesref {

extern "C" __global__ void test_walk_planes(const float* __restrict__ w, const float* __restrict__ kn,
                                            const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
                                            __nv_bfloat16* __restrict__ wp, __nv_bfloat16* __restrict__ wk, int HQK,
                                            int HV) {
	const int c = blockIdx.x, h = blockIdx.y, t0 = chunk_tok0[c], n = chunk_len[c], qh = h / (HV / HQK);
	unsigned char* wpc = reinterpret_cast<unsigned char*>(wp) + ((long long)c * HV + h) * walkplanes::kWBytes;
	for (int f = threadIdx.x; f < 64 * 64; f += blockDim.x) {
		const int i = f / 64, d = 2 * (f % 64);
		const float* row = w + ((long long)(t0 + i) * HV + h) * 128;
		walkplanes::store_neg_w2(wpc, i, d, i < n ? row[d] : 0.f, i < n ? row[d + 1] : 0.f);
	}
	if (h % (HV / HQK) != 0) return;  // K^T: once a QK head
	unsigned char* wkc = reinterpret_cast<unsigned char*>(wk) + ((long long)c * HQK + qh) * walkplanes::kKBytes;
	for (int f = threadIdx.x; f < 128 * 8; f += blockDim.x) {
		const int kk = f % 128, b = f / 128;
		float x[8];
		for (int j = 0; j < 8; ++j) {
			const int i = 8 * b + j;
			x[j] = i < n ? kn[((long long)(t0 + i) * HQK + qh) * 128 + kk] : 0.f;
		}
		walkplanes::store_t8(wkc, kk, b, x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]);
	}
}

}  // namespace planesref
}  // namespace gdnkcp
