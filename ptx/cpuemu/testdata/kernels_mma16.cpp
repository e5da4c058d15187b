// kernels_mma16.cpp: kernels_fwd.cpp (the fp32 l2norm and prep make the walks' inputs; gdn_poison_u32)
// plus the staged walks of ptx/src/gdn_walk_mma.cu (the v4 gdn_state_walk_mma and
// gdn_summary_walk_mma reading kt; the v5 gdn_state_walk_mma16 with bf16 outputs and
// gdn_summary_walk_mma16, both rebuilding Kt from kn and gcum; the plane walks of gdn_walk_planes.cu
// with walk_planes_ref.h's test_walk_planes making their planes) and the staged bf16-input output
// gdn_output_mma16 (and its grouped form gdn_output_mma16g) of ptx/src/gdn_output_mma.cu, for TestMMA16OnCPU (mma16_test.go), with two
// test-only entries:
//   gdn_state_walk_mma16_drop   gdn_state_walk_mma16 with the outputs named by the bits of `drop`
//                               passed as null (1 h_out, 2 vnew, 4 h16, 8 vnew16): the runner has
//                               no null pointer argument;
//   gdn_output_mma16_probe      gdn_output_mma16's body with fp32 output (O before its bf16 rounding).
// The staged files include ../src/gdn_fwd.cu and ../src/mma.cuh themselves: they build against ptx/src,
// never CPUEMU_SRC.
#include "kernels_fwd.cpp"

#include "gdn_output_mma.cu"
#include "gdn_walk_mma.cu"
#include "gdn_walk_planes.cu"
#include "walk_planes_ref.h"

// No second EMU_DYNAMIC_SMEM: the entries declare `extern __shared__ float smem[]` in extern "C"
// functions, which gives it C language linkage: it is kernels_fwd.cpp's gdnkcp::fwd::smem.

namespace gdnkcp {
namespace walkmma {

extern "C" __global__ void gdn_state_walk_mma16_drop(
    const float* __restrict__ w, const float* __restrict__ u, const float* __restrict__ kn,
    const float* __restrict__ gcum, const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
    const int* __restrict__ seg_chunk0, const int* __restrict__ seg_nchunk, const float* __restrict__ start,
    float* __restrict__ h_out, float* __restrict__ vnew, float* __restrict__ final_state,
    __nv_bfloat16* __restrict__ h16, __nv_bfloat16* __restrict__ vnew16, int HQK, int HV, int vh, int drop) {
	gdn_state_walk_mma16(w, u, kn, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start,
	                     (drop & 1) ? nullptr : h_out, (drop & 2) ? nullptr : vnew, final_state,
	                     (drop & 4) ? nullptr : h16, (drop & 8) ? nullptr : vnew16, HQK, HV, vh);
}

}  // namespace walkmma

namespace outmma {

extern "C" __global__ void gdn_output_mma16_probe(const float* __restrict__ qn, const float* __restrict__ kn,
                                                  const float* __restrict__ gcum,
                                                  const __nv_bfloat16* __restrict__ vnew16,
                                                  const __nv_bfloat16* __restrict__ h16,
                                                  const int* __restrict__ chunk_tok0,
                                                  const int* __restrict__ chunk_len, float* __restrict__ o32, int HQK,
                                                  int HV, float scale) {
	extern __shared__ float smem[];
	output_mma16(smem, qn, kn, gcum, vnew16, h16, chunk_tok0, chunk_len, o32, HQK, HV, scale);
}

}  // namespace outmma

namespace wgtest {

// test_wg_trans_b: one warpgroup computes D = A B (A [64][128], B [128][N] bf16 row-major, N 64 or 128) with
// ptx/src/wgmma.cuh's products twice: dk with B K-major (mma_m64nNk16_rs, desc_sw128: 64-key blocks of N
// rows) and dt with B MN-major (mma_m64nNk16_rs_t, desc_sw128_mn: 64-column blocks of 128 k rows, 16384
// bytes apart), both [64][N] fp32 row-major; dynamic shared memory 2 128 N 2 bytes (+ alignment).
extern "C" __global__ void test_wg_trans_b(const __nv_bfloat16* A, const __nv_bfloat16* B, float* dk, float* dt, int N) {
	extern __shared__ float smem[];
	const unsigned s0 = static_cast<unsigned>(__cvta_generic_to_shared(smem));
	unsigned char* bk = reinterpret_cast<unsigned char*>(smem) + ((1024u - (s0 & 1023u)) & 1023u);
	unsigned char* bt = bk + 128 * N * 2;
	for (int e = threadIdx.x; e < 128 * N; e += blockDim.x) {
		const int k = e / N, n = e % N;
		const __nv_bfloat16 v = B[k * N + n];
		*reinterpret_cast<__nv_bfloat16*>(bk + (k / 64) * N * 128 + n * 128 + ((((k % 64) / 8) ^ (n % 8)) << 4) + 2 * (k % 8)) = v;
		*reinterpret_cast<__nv_bfloat16*>(bt + (n / 64) * 16384 + k * 128 + ((((n % 64) / 8) ^ (k % 8)) << 4) + 2 * (n % 8)) = v;
	}
	wg::fence_proxy_async();
	__syncthreads();
	const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, t = lane % 4;
	float d1[64], d2[64];
	float(&k64)[32] = *reinterpret_cast<float(*)[32]>(d1);
	float(&t64)[32] = *reinterpret_cast<float(*)[32]>(d2);
	wg::fence();
	for (int s = 0; s < 8; ++s) {
		unsigned a[4];
		for (int r = 0; r < 4; ++r) {
			const int row = 16 * w + g + 8 * (r % 2), col = 16 * s + 2 * t + 8 * (r / 2);
			a[r] = static_cast<unsigned>(__bfloat16_as_ushort(A[row * 128 + col])) |
			       (static_cast<unsigned>(__bfloat16_as_ushort(A[row * 128 + col + 1])) << 16);
		}
		const unsigned long long dK = wg::desc_sw128(bk + (s / 4) * N * 128 + (s % 4) * 32);
		const unsigned long long dT = wg::desc_sw128_mn(bt + 2048 * s, 16384);
		if (N == 64) {
			wg::mma_m64n64k16_rs(k64, a, dK, s == 0 ? 0 : 1);
			wg::mma_m64n64k16_rs_t(t64, a, dT, 16384, s == 0 ? 0 : 1);
		} else {
			wg::mma_m64n128k16_rs(d1, a, dK, s == 0 ? 0 : 1);
			wg::mma_m64n128k16_rs_t(d2, a, dT, 16384, s == 0 ? 0 : 1);
		}
		wg::commit();
		wg::wait<0>();  // a[] is rewritten next step (and the emulator takes wait 0 only)
	}
	for (int i = 0; i < N / 2; ++i) {
		const int row = 16 * w + g + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * t + i % 2;
		dk[row * N + col] = d1[i];
		dt[row * N + col] = d2[i];
	}
}

}  // namespace wgtest
}  // namespace gdnkcp

namespace {
emu::Registrar mma16_kernels(
    {
        EMU_KERNEL(gdnkcp::walkmma, gdn_state_walk_mma),
        EMU_KERNEL(gdnkcp::walkmma, gdn_state_walk_mma16),
        EMU_KERNEL(gdnkcp::walkmma, gdn_state_walk_mma16_drop),
        EMU_KERNEL(gdnkcp::walkmma, gdn_summary_walk_mma),
        EMU_KERNEL(gdnkcp::walkmma, gdn_summary_walk_mma16),
        EMU_KERNEL(gdnkcp::outmma, gdn_output_mma16),
        EMU_KERNEL(gdnkcp::outmma, gdn_output_mma16g),
        EMU_KERNEL(gdnkcp::outmma, gdn_output_mma16gn),
        EMU_KERNEL(gdnkcp::outmma, gdn_output_mma16gnk),
        EMU_KERNEL(gdnkcp::outmma, gdn_output_mma16_probe),
        EMU_KERNEL(gdnkcp::walkp, gdn_state_walk_planes),
        EMU_KERNEL(gdnkcp::walkp, gdn_summary_walk_planes),
        EMU_KERNEL(gdnkcp::planesref, test_walk_planes),
        EMU_KERNEL(gdnkcp::wgtest, test_wg_trans_b),
    },
    {
        {"walk_mma_smem(64)", gdnkcp::walkmma::walk_mma_smem(64)},
        {"walk_mma_smem(128)", gdnkcp::walkmma::walk_mma_smem(128)},
        {"kOutputMMA16Smem", gdnkcp::outmma::kOutputMMA16Smem},
        {"walk_planes_smem(64)", gdnkcp::walkp::walk_planes_smem(64)},
        {"walk_planes_smem(128)", gdnkcp::walkp::walk_planes_smem(128)},
        {"wgTransBSmem", 2 * 128 * 128 * 2 + 1024},
    });
}  // namespace
