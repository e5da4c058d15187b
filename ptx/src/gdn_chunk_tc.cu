// gdn_chunk_tc.cu: the chunk-parallel forward kernels on the tensor cores (WMMA bf16 16x16x16,
// fp32 accumulate), with the arguments and grids of gdn_prep_fwd and gdn_output_fwd (gdn_fwd.cu):
//   gdn_prep_tc    grid (NC, HV), 256 threads, dynamic shared memory kPrepTCSmem  = 98816
//   gdn_output_tc  grid (NC, HV), 256 threads, dynamic shared memory kOutputTCSmem = 155904
//
// Prep feeds the fp32 states, so its products keep ~16 bits per operand: operands that are not
// exact bf16 are split hi/lo (x = hi + lo) and multiplied as hi*hi + hi*lo + lo*hi; v is exact
// bf16 and needs no split. (I + L)^-1 is solved on the CUDA cores in fp32, one column a thread.
// The output only has to be good to bf16, so its three products take single bf16 operands.
// Every element is computed by one fixed instruction sequence: bitwise reproducible, no atomics.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

namespace gdnkcp {
namespace chunktc {

using namespace nvcuda;
constexpr int kD = 128, kC = 64, kThreads = 256;
typedef __nv_bfloat16 bf16;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragB;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBT;

__device__ __forceinline__ void split(float x, bf16* hi, bf16* lo) {
	const bf16 h = __float2bfloat16_rn(x);
	*hi = h;
	*lo = __float2bfloat16_rn(x - __bfloat162float(h));
}

// ---- prep ------------------------------------------------------------------------------------------
// smem: Kh, Kl bf16 [64][128] (k, later e^gamma k) | L, A fp32 [64][64] each (later the fp32 output
// stage [64][128]) | Abh, Abl bf16 [64][64] | Vs bf16 [64][128] | gam, bet fp32 [64]
constexpr int kPrepTCSmem = 2 * 2 * kC * kD + 4 * 2 * kC * kC + 2 * 2 * kC * kC + 2 * kC * kD + 4 * 2 * kC;

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_prep_tc(const float* __restrict__ kn, const bf16* __restrict__ v, int v_stride,
            const float* __restrict__ g, const float* __restrict__ beta,
            const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
            float* __restrict__ gcum, float* __restrict__ w, float* __restrict__ u,
            float* __restrict__ kt, int HQK, int HV) {
	extern __shared__ __align__(128) char ctc_smem[];
	char* smem = ctc_smem;
	bf16* Kh = reinterpret_cast<bf16*>(smem);
	bf16* Kl = Kh + kC * kD;
	float* L = reinterpret_cast<float*>(Kl + kC * kD);
	float* A = L + kC * kC;
	float* stage = L;  // [64][128] once L and A are consumed
	bf16* Abh = reinterpret_cast<bf16*>(A + kC * kC);
	bf16* Abl = Abh + kC * kC;
	bf16* Vs = Abl + kC * kC;
	float* gam = reinterpret_cast<float*>(Vs + kC * kD);
	float* bet = gam + kC;
	const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, warp = tid / 32;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int qh = h / (HV / HQK);
	for (int e = tid; e < kC * kD; e += kThreads) {
		const int i = e / kD, d = e % kD;
		split(i < n ? kn[((long long)(t0 + i) * HQK + qh) * kD + d] : 0.f, &Kh[e], &Kl[e]);
		Vs[e] = i < n ? v[(long long)(t0 + i) * v_stride + h * kD + d] : __float2bfloat16_rn(0.f);
	}
	if (tid < kC) bet[tid] = tid < n ? beta[(long long)(t0 + tid) * HV + h] : 0.f;
	if (tid == 0) {
		float s = 0.f;
		for (int i = 0; i < kC; ++i) {
			if (i < n) s += g[(long long)(t0 + i) * HV + h];
			gam[i] = s;
		}
	}
	__syncthreads();
	// K K^T: 16 tiles of 16x16, two a warp (same row block).
	{
		FragA ah, al;
		FragBT bh, bl;
		Acc acc[2];
		const int r = warp / 2;
#pragma unroll
		for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[j], 0.f);
#pragma unroll 1
		for (int k = 0; k < kD / 16; ++k) {
			wmma::load_matrix_sync(ah, Kh + r * 16 * kD + k * 16, kD);
			wmma::load_matrix_sync(al, Kl + r * 16 * kD + k * 16, kD);
#pragma unroll
			for (int j = 0; j < 2; ++j) {
				const int cc = (warp % 2) * 2 + j;
				wmma::load_matrix_sync(bh, Kh + cc * 16 * kD + k * 16, kD);  // K^T: column-major view of K
				wmma::load_matrix_sync(bl, Kl + cc * 16 * kD + k * 16, kD);
				wmma::mma_sync(acc[j], ah, bh, acc[j]);
				wmma::mma_sync(acc[j], ah, bl, acc[j]);
				wmma::mma_sync(acc[j], al, bh, acc[j]);
			}
		}
#pragma unroll
		for (int j = 0; j < 2; ++j)
			wmma::store_matrix_sync(L + r * 16 * kC + ((warp % 2) * 2 + j) * 16, acc[j], kC, wmma::mem_row_major);
	}
	__syncthreads();
	for (int e = tid; e < kC * kC; e += kThreads) {
		const int i = e / kC, j = e % kC;
		L[e] = (j < i && i < n) ? bet[i] * L[e] * expf(gam[i] - gam[j]) : 0.f;
	}
	__syncthreads();
	// (I + L)^-1, column c by thread c: A[i][c] = -sum_{j=c}^{i-1} L[i][j] A[j][c] (j ascending).
	if (tid < kC) {
		const int col = tid;
		for (int i = 0; i < kC; ++i) {
			float val = i == col ? 1.f : 0.f;
			if (i > col) {
				float s = 0.f;
				for (int j = col; j < i; ++j) s = fmaf(L[i * kC + j], A[j * kC + col], s);
				val = -s;
			}
			A[i * kC + col] = val;
		}
	}
	__syncthreads();
	// Ab = A diag(beta), split; K rows scaled by e^gamma, split; Kt = k e^(gamma_last - gamma).
	const float glast = gam[n - 1];
	for (int e = tid; e < kC * kC; e += kThreads) split(A[e] * bet[e % kC], &Abh[e], &Abl[e]);
	for (int e = tid; e < kC * kD; e += kThreads) {
		const int i = e / kD, d = e % kD;
		const float x = i < n ? kn[((long long)(t0 + i) * HQK + qh) * kD + d] : 0.f;
		split(x * expf(gam[i]), &Kh[e], &Kl[e]);
		if (i < n) kt[((long long)(t0 + i) * HV + h) * kD + d] = x * expf(glast - gam[i]);
	}
	__syncthreads();
	// W = Ab (e^gamma K) and U = Ab V: 32 output tiles each, four a warp (same row block).
	for (int pass = 0; pass < 2; ++pass) {
		FragA ah, al;
		FragB bh, bl;
		Acc acc[4];
		const int r = warp / 2;
#pragma unroll
		for (int j = 0; j < 4; ++j) wmma::fill_fragment(acc[j], 0.f);
#pragma unroll 1
		for (int k = 0; k < kC / 16; ++k) {
			wmma::load_matrix_sync(ah, Abh + r * 16 * kC + k * 16, kC);
			wmma::load_matrix_sync(al, Abl + r * 16 * kC + k * 16, kC);
#pragma unroll
			for (int j = 0; j < 4; ++j) {
				const int cc = (warp % 2) * 4 + j;
				if (pass == 0) {
					wmma::load_matrix_sync(bh, Kh + k * 16 * kD + cc * 16, kD);
					wmma::load_matrix_sync(bl, Kl + k * 16 * kD + cc * 16, kD);
					wmma::mma_sync(acc[j], ah, bh, acc[j]);
					wmma::mma_sync(acc[j], ah, bl, acc[j]);
					wmma::mma_sync(acc[j], al, bh, acc[j]);
				} else {
					wmma::load_matrix_sync(bh, Vs + k * 16 * kD + cc * 16, kD);  // v is exact bf16
					wmma::mma_sync(acc[j], ah, bh, acc[j]);
					wmma::mma_sync(acc[j], al, bh, acc[j]);
				}
			}
		}
#pragma unroll
		for (int j = 0; j < 4; ++j)
			wmma::store_matrix_sync(stage + r * 16 * kD + ((warp % 2) * 4 + j) * 16, acc[j], kD, wmma::mem_row_major);
		__syncthreads();
		float* dst = pass == 0 ? w : u;
		for (int e = tid; e < n * kD; e += kThreads)
			dst[((long long)(t0 + e / kD) * HV + h) * kD + e % kD] = stage[e];
		__syncthreads();
	}
	if (tid < n) gcum[(long long)(t0 + tid) * HV + h] = gam[tid];
}

// ---- output ------------------------------------------------------------------------------------------
// smem: Qb, Qg, Kb, Vb bf16 [64][128] | Hb bf16 [128][128] | P fp32 [64][64] | Pb bf16 [64][64] |
// stage fp32 [64][128] | gam fp32 [64]
constexpr int kOutputTCSmem = 2 * 4 * kC * kD + 2 * kD * kD + 4 * kC * kC + 2 * kC * kC + 4 * kC * kD + 4 * kC;

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_output_tc(const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ gcum,
              const float* __restrict__ vnew, const float* __restrict__ h_state,
              const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
              bf16* __restrict__ o, int HQK, int HV, float scale) {
	extern __shared__ __align__(128) char ctc_smem[];
	char* smem = ctc_smem;
	bf16* Qb = reinterpret_cast<bf16*>(smem);
	bf16* Qg = Qb + kC * kD;
	bf16* Kb = Qg + kC * kD;
	bf16* Vb = Kb + kC * kD;
	bf16* Hb = Vb + kC * kD;
	float* P = reinterpret_cast<float*>(Hb + kD * kD);
	bf16* Pb = reinterpret_cast<bf16*>(P + kC * kC);
	float* stage = reinterpret_cast<float*>(Pb + kC * kC);
	float* gam = stage + kC * kD;
	const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, warp = tid / 32;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int qh = h / (HV / HQK);
	if (tid < kC) gam[tid] = tid < n ? gcum[(long long)(t0 + tid) * HV + h] : 0.f;
	__syncthreads();
	for (int e = tid; e < kC * kD; e += kThreads) {
		const int i = e / kD, d = e % kD;
		const long long a = ((long long)(t0 + i) * HQK + qh) * kD + d;
		const float q = i < n ? qn[a] : 0.f;
		Qb[e] = __float2bfloat16_rn(q);
		Qg[e] = __float2bfloat16_rn(q * expf(gam[i]));
		Kb[e] = __float2bfloat16_rn(i < n ? kn[a] : 0.f);
		Vb[e] = __float2bfloat16_rn(i < n ? vnew[((long long)(t0 + i) * HV + h) * kD + d] : 0.f);
	}
	const float* hc = h_state + ((long long)c * HV + h) * kD * kD;
	for (int e = tid; e < kD * kD; e += kThreads) Hb[e] = __float2bfloat16_rn(hc[e]);
	__syncthreads();
	{  // P = Q K^T (16 tiles, two a warp)
		FragA a;
		FragBT b;
		Acc acc[2];
		const int r = warp / 2;
#pragma unroll
		for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[j], 0.f);
#pragma unroll 1
		for (int k = 0; k < kD / 16; ++k) {
			wmma::load_matrix_sync(a, Qb + r * 16 * kD + k * 16, kD);
#pragma unroll
			for (int j = 0; j < 2; ++j) {
				wmma::load_matrix_sync(b, Kb + ((warp % 2) * 2 + j) * 16 * kD + k * 16, kD);
				wmma::mma_sync(acc[j], a, b, acc[j]);
			}
		}
#pragma unroll
		for (int j = 0; j < 2; ++j)
			wmma::store_matrix_sync(P + r * 16 * kC + ((warp % 2) * 2 + j) * 16, acc[j], kC, wmma::mem_row_major);
	}
	__syncthreads();
	for (int e = tid; e < kC * kC; e += kThreads) {
		const int i = e / kC, j = e % kC;
		Pb[e] = __float2bfloat16_rn((j <= i && i < n) ? P[e] * expf(gam[i] - gam[j]) : 0.f);
	}
	__syncthreads();
	{  // O = (Q e^gamma) H + P V' (32 tiles, four a warp)
		FragA a;
		FragB b;
		Acc acc[4];
		const int r = warp / 2;
#pragma unroll
		for (int j = 0; j < 4; ++j) wmma::fill_fragment(acc[j], 0.f);
#pragma unroll 1
		for (int k = 0; k < kD / 16; ++k) {
			wmma::load_matrix_sync(a, Qg + r * 16 * kD + k * 16, kD);
#pragma unroll
			for (int j = 0; j < 4; ++j) {
				wmma::load_matrix_sync(b, Hb + k * 16 * kD + ((warp % 2) * 4 + j) * 16, kD);
				wmma::mma_sync(acc[j], a, b, acc[j]);
			}
		}
#pragma unroll 1
		for (int k = 0; k < kC / 16; ++k) {
			wmma::load_matrix_sync(a, Pb + r * 16 * kC + k * 16, kC);
#pragma unroll
			for (int j = 0; j < 4; ++j) {
				wmma::load_matrix_sync(b, Vb + k * 16 * kD + ((warp % 2) * 4 + j) * 16, kD);
				wmma::mma_sync(acc[j], a, b, acc[j]);
			}
		}
#pragma unroll
		for (int j = 0; j < 4; ++j)
			wmma::store_matrix_sync(stage + r * 16 * kD + ((warp % 2) * 4 + j) * 16, acc[j], kD, wmma::mem_row_major);
	}
	__syncthreads();
	for (int e = tid; e < n * kD; e += kThreads)
		o[((long long)(t0 + e / kD) * HV + h) * kD + e % kD] = __float2bfloat16_rn(scale * stage[e]);
}

}  // namespace chunktc
}  // namespace gdnkcp
