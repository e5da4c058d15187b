// gdn_chunk_tc.cu: the chunk-parallel forward kernels on the tensor cores (WMMA bf16 16x16x16,
// fp32 accumulate), with the arguments and grids of gdn_prep_fwd and gdn_output_fwd (gdn_fwd.cu):
//   gdn_prep_tc    grid (NC, HV), 256 threads, dynamic shared memory kPrepTCSmem  = 103936
//   gdn_output_tc  grid (NC, HV), 256 threads, dynamic shared memory kOutputTCSmem = 163072
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
constexpr int kLD = kD + 8, kLC = kC + 8;  // padded bf16 rows: fragment loads hit 8 different banks
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
constexpr int kPrepTCSmem = 2 * 2 * kC * kLD + 4 * 2 * kC * kC + 2 * 2 * kC * kLC + 2 * kC * kLD + 4 * 2 * kC;

// One block an SM at most (its shared memory allows no more): the bound lets ptxas use the
// registers that frees, which the Blackwell targets otherwise spill at 64.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
gdn_prep_tc(const float* __restrict__ kn, const bf16* __restrict__ v, int v_stride,
            const float* __restrict__ g, const float* __restrict__ beta,
            const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
            float* __restrict__ gcum, float* __restrict__ w, float* __restrict__ u,
            float* __restrict__ kt, int HQK, int HV) {
	extern __shared__ __align__(128) char ctc_smem[];
	char* smem = ctc_smem;
	bf16* Kh = reinterpret_cast<bf16*>(smem);
	bf16* Kl = Kh + kC * kLD;
	float* L = reinterpret_cast<float*>(Kl + kC * kLD);
	float* A = L + kC * kC;
	float* stage = L;  // [64][128] once L and A are consumed
	bf16* Abh = reinterpret_cast<bf16*>(A + kC * kC);
	bf16* Abl = Abh + kC * kLC;
	bf16* Vs = Abl + kC * kLC;
	float* gam = reinterpret_cast<float*>(Vs + kC * kLD);
	float* bet = gam + kC;
	const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, warp = tid / 32;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int qh = h / (HV / HQK);
	{  // k rows (fp32) and v rows (bf16): all of a thread's 16-byte loads first, then the stores.
		constexpr int kPer = kC * kD / 4 / kThreads;  // 8 float4 of k per thread
		const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
		float4 kr[kPer];
		uint2 vr[kPer];  // 4 bf16
#pragma unroll
		for (int x = 0; x < kPer; ++x) {
			const int f = tid + x * kThreads, i = f / 32, d4 = f % 32;
			kr[x] = i < n ? reinterpret_cast<const float4*>(kn + ((long long)(t0 + i) * HQK + qh) * kD)[d4] : zero;
			vr[x] = i < n ? *reinterpret_cast<const uint2*>(v + (long long)(t0 + i) * v_stride + h * kD + 4 * d4)
			              : make_uint2(0u, 0u);
		}
#pragma unroll
		for (int x = 0; x < kPer; ++x) {
			const int f = tid + x * kThreads, e = (f / 32) * kLD + 4 * (f % 32);
			split(kr[x].x, &Kh[e], &Kl[e]);
			split(kr[x].y, &Kh[e + 1], &Kl[e + 1]);
			split(kr[x].z, &Kh[e + 2], &Kl[e + 2]);
			split(kr[x].w, &Kh[e + 3], &Kl[e + 3]);
			*reinterpret_cast<uint2*>(Vs + e) = vr[x];
		}
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
			wmma::load_matrix_sync(ah, Kh + r * 16 * kLD + k * 16, kLD);
			wmma::load_matrix_sync(al, Kl + r * 16 * kLD + k * 16, kLD);
#pragma unroll
			for (int j = 0; j < 2; ++j) {
				const int cc = (warp % 2) * 2 + j;
				wmma::load_matrix_sync(bh, Kh + cc * 16 * kLD + k * 16, kLD);  // K^T: column-major view of K
				wmma::load_matrix_sync(bl, Kl + cc * 16 * kLD + k * 16, kLD);
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
	// (I + L)^-1 in 16x16 blocks. The diagonal blocks first, one column a thread:
	//   T_bb[i][c] = -sum_{j=c}^{i-1} L[i][j] T[j][c]   (j ascending)
	// then the blocks below, by distance lev = i - j = 1, 2, 3:
	//   X = sum_{k=j}^{i-1} L_ik T_kj   (rows k ascending),   T_ij = -T_ii X   (m ascending)
	// which keeps every fma chain short (16 to 48 terms) instead of one 2,016-term chain.
	float* X = reinterpret_cast<float*>(Abh);  // [3][16][16] scratch; Ab is written after
	if (tid < kC) {
		const int col = tid, b = col / 16;
		for (int i = 0; i < b * 16; ++i) A[i * kC + col] = 0.f;
		for (int i = b * 16; i < b * 16 + 16; ++i) {
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
	for (int lev = 1; lev < 4; ++lev) {
		const int nb = 4 - lev;
		for (int e = tid; e < nb * 256; e += kThreads) {
			const int j = e / 256, i = j + lev, row = i * 16 + (e % 256) / 16, col = j * 16 + e % 16;
			float s = 0.f;
			for (int k = j * 16; k < i * 16; ++k) s = fmaf(L[row * kC + k], A[k * kC + col], s);
			X[e] = s;
		}
		__syncthreads();
		for (int e = tid; e < nb * 256; e += kThreads) {
			const int j = e / 256, i = j + lev, r = (e % 256) / 16, cc = e % 16;
			const int row = i * 16 + r;
			float s = 0.f;
			for (int m = 0; m < 16; ++m) s = fmaf(A[row * kC + i * 16 + m], X[j * 256 + m * 16 + cc], s);
			A[row * kC + j * 16 + cc] = -s;
		}
		__syncthreads();
	}
	// Ab = A diag(beta), split; K rows scaled by e^gamma, split; Kt = k e^(gamma_last - gamma).
	const float glast = gam[n - 1];
	for (int e = tid; e < kC * kC; e += kThreads) {
		const int i = e / kC, j = e % kC;
		split(A[e] * bet[j], &Abh[i * kLC + j], &Abl[i * kLC + j]);
	}
	for (int e = tid; e < kC * kD; e += kThreads) {
		const int i = e / kD, d = e % kD;
		const float x = i < n ? kn[((long long)(t0 + i) * HQK + qh) * kD + d] : 0.f;
		split(x * expf(gam[i]), &Kh[i * kLD + d], &Kl[i * kLD + d]);
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
			wmma::load_matrix_sync(ah, Abh + r * 16 * kLC + k * 16, kLC);
			wmma::load_matrix_sync(al, Abl + r * 16 * kLC + k * 16, kLC);
#pragma unroll
			for (int j = 0; j < 4; ++j) {
				const int cc = (warp % 2) * 4 + j;
				if (pass == 0) {
					wmma::load_matrix_sync(bh, Kh + k * 16 * kLD + cc * 16, kLD);
					wmma::load_matrix_sync(bl, Kl + k * 16 * kLD + cc * 16, kLD);
					wmma::mma_sync(acc[j], ah, bh, acc[j]);
					wmma::mma_sync(acc[j], ah, bl, acc[j]);
					wmma::mma_sync(acc[j], al, bh, acc[j]);
				} else {
					wmma::load_matrix_sync(bh, Vs + k * 16 * kLD + cc * 16, kLD);  // v is exact bf16
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
constexpr int kOutputTCSmem = 2 * 4 * kC * kLD + 2 * kD * kLD + 4 * kC * kC + 2 * kC * kLC + 4 * kC * kD + 4 * kC;

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_output_tc(const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ gcum,
              const float* __restrict__ vnew, const float* __restrict__ h_state,
              const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
              bf16* __restrict__ o, int HQK, int HV, float scale) {
	extern __shared__ __align__(128) char ctc_smem[];
	char* smem = ctc_smem;
	bf16* Qb = reinterpret_cast<bf16*>(smem);
	bf16* Qg = Qb + kC * kLD;
	bf16* Kb = Qg + kC * kLD;
	bf16* Vb = Kb + kC * kLD;
	bf16* Hb = Vb + kC * kLD;
	float* P = reinterpret_cast<float*>(Hb + kD * kLD);
	bf16* Pb = reinterpret_cast<bf16*>(P + kC * kC);
	float* stage = reinterpret_cast<float*>(Pb + kC * kLC);
	float* gam = stage + kC * kD;
	const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, warp = tid / 32;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int qh = h / (HV / HQK);
	if (tid < kC) gam[tid] = tid < n ? gcum[(long long)(t0 + tid) * HV + h] : 0.f;
	__syncthreads();
	{  // q, k, V' rows and H: all of a thread's 16-byte loads first, then the conversions.
		constexpr int kPer = kC * kD / 4 / kThreads;  // 8 float4 per 64x128 matrix per thread
		constexpr int kHPer = kD * kD / 4 / kThreads; // 16 float4 of H per thread
		const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
		float4 qr[kPer], kr[kPer], vr[kPer];
		const float4* hc = reinterpret_cast<const float4*>(h_state + ((long long)c * HV + h) * kD * kD);
#pragma unroll
		for (int x = 0; x < kPer; ++x) {
			const int f = tid + x * kThreads, i = f / 32, d4 = f % 32;
			const long long a = ((long long)(t0 + i) * HQK + qh) * (kD / 4) + d4;
			qr[x] = i < n ? reinterpret_cast<const float4*>(qn)[a] : zero;
			kr[x] = i < n ? reinterpret_cast<const float4*>(kn)[a] : zero;
			vr[x] = i < n ? reinterpret_cast<const float4*>(vnew)[((long long)(t0 + i) * HV + h) * (kD / 4) + d4] : zero;
		}
#pragma unroll
		for (int x = 0; x < kPer; ++x) {
			const int f = tid + x * kThreads, e = (f / 32) * kLD + 4 * (f % 32);
			const float eg = expf(gam[f / 32]);
			const float q[4] = {qr[x].x, qr[x].y, qr[x].z, qr[x].w};
			const float k[4] = {kr[x].x, kr[x].y, kr[x].z, kr[x].w};
			const float vv[4] = {vr[x].x, vr[x].y, vr[x].z, vr[x].w};
#pragma unroll
			for (int y = 0; y < 4; ++y) {
				Qb[e + y] = __float2bfloat16_rn(q[y]);
				Qg[e + y] = __float2bfloat16_rn(q[y] * eg);
				Kb[e + y] = __float2bfloat16_rn(k[y]);
				Vb[e + y] = __float2bfloat16_rn(vv[y]);
			}
		}
		float4 hr[kHPer];  // H in a second batch, to bound the registers
#pragma unroll
		for (int x = 0; x < kHPer; ++x) hr[x] = hc[tid + x * kThreads];
#pragma unroll
		for (int x = 0; x < kHPer; ++x) {
			const int f = tid + x * kThreads, e = (f / 32) * kLD + 4 * (f % 32);
			Hb[e] = __float2bfloat16_rn(hr[x].x);
			Hb[e + 1] = __float2bfloat16_rn(hr[x].y);
			Hb[e + 2] = __float2bfloat16_rn(hr[x].z);
			Hb[e + 3] = __float2bfloat16_rn(hr[x].w);
		}
	}
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
			wmma::load_matrix_sync(a, Qb + r * 16 * kLD + k * 16, kLD);
#pragma unroll
			for (int j = 0; j < 2; ++j) {
				wmma::load_matrix_sync(b, Kb + ((warp % 2) * 2 + j) * 16 * kLD + k * 16, kLD);
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
		Pb[i * kLC + j] = __float2bfloat16_rn((j <= i && i < n) ? P[e] * expf(gam[i] - gam[j]) : 0.f);
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
			wmma::load_matrix_sync(a, Qg + r * 16 * kLD + k * 16, kLD);
#pragma unroll
			for (int j = 0; j < 4; ++j) {
				wmma::load_matrix_sync(b, Hb + k * 16 * kLD + ((warp % 2) * 4 + j) * 16, kLD);
				wmma::mma_sync(acc[j], a, b, acc[j]);
			}
		}
#pragma unroll 1
		for (int k = 0; k < kC / 16; ++k) {
			wmma::load_matrix_sync(a, Pb + r * 16 * kLC + k * 16, kLC);
#pragma unroll
			for (int j = 0; j < 4; ++j) {
				wmma::load_matrix_sync(b, Vb + k * 16 * kLD + ((warp % 2) * 4 + j) * 16, kLD);
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
