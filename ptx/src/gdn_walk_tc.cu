// gdn_walk_tc.cu: the summary and state walks on the tensor cores (WMMA bf16 16x16x16, fp32
// accumulate), with the same arguments and launch grids as gdn_summary_walk / gdn_state_walk of
// gdn_fwd.cu, and dynamic shared memory walk_tc_smem(vh) = 768*(vh+8) + 256*(vh+4) + 77840 bytes
// (150544 at vh 64, 216080 at vh 128).
//
// Precision: every product whose operands are not exact bf16 runs as three bf16 products of a
// hi/lo split, x = hi + lo with hi = bf16(x), lo = bf16(x - hi): a b ~ ah bh + ah bl + al bh, about
// 16 significant bits per operand, so the fp32 states stay within ~1e-5 of exact arithmetic.
//   V' = U - W S            (W, S split: 3 products of 64x128x vh)
//   S  = e^gl S + Kt^T V'   (Kt, V' split: 3 products of 128x64x vh)
// The state lives in accumulator fragments across chunks; once per chunk each warp stages its tiles
// through a 16x16 fp32 scratch of its own, splits them into the bf16 operand copies and (state walk)
// writes H out. Every bf16 operand array has its rows padded by 8 elements (16 bytes) and the fp32
// V' array by 4, so the 8 rows a fragment load reads fall in different banks.
//
// Determinism: every 16x16 output tile runs the same instruction sequence (k ascending, passes
// hi*hi, hi*lo, lo*hi) whichever warp and whichever vh computes it, so vh 64 and vh 128 give
// identical bits. No atomics.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

namespace gdnkcp {
namespace walktc {

using namespace nvcuda;
constexpr int kD = 128, kC = 64, kThreads = 256, kWarps = kThreads / 32;
constexpr int kLW = kD + 8;  // padded row of the bf16 W and Kt copies
typedef __nv_bfloat16 bf16;

__host__ __device__ constexpr int walk_tc_smem(int vh) {
	return 768 * (vh + 8) + 256 * (vh + 4) + 4 * kC * kLW * 2 + kWarps * 256 * 4 + 16;
}

__device__ __forceinline__ void split(float x, bf16* hi, bf16* lo) {
	const bf16 h = __float2bfloat16_rn(x);
	*hi = h;
	*lo = __float2bfloat16_rn(x - __bfloat162float(h));
}

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;

template <int VH>
struct TCWalk {
	static constexpr int kLS = VH + 8;  // padded bf16 row of S and V' copies
	static constexpr int kLV = VH + 4;  // padded fp32 row of V'
	static constexpr int kSTiles = (kD / 16) * (VH / 16);  // state tiles
	static constexpr int kSPer = kSTiles / kWarps;        // per warp
	static constexpr int kVTiles = (kC / 16) * (VH / 16);  // V' tiles
	static constexpr int kVPer = kVTiles / kWarps;
	static_assert((kVPer <= VH / 16) && ((VH / 16) % kVPer == 0), "a warp's V' tiles must share a row block");
	static_assert((kSPer <= VH / 16) && ((VH / 16) % kSPer == 0), "a warp's state tiles must share a row block");
	bf16 *Sh, *Sl;  // [128][kLS]
	bf16 *Wh, *Wl;  // [64][kLW], holding -W
	bf16 *Kh, *Kl;  // [64][kLW], Kt
	bf16 *Vh, *Vl;  // [64][kLS]
	float* Vn;      // [64][kLV]: U, then V'
	float* ws;      // [16][16] this warp's staging
	float* gl;      // gamma_last
	Acc s[kSPer];   // this warp's state tiles: row block rb, column blocks cb .. cb+kSPer-1
	int rb, cb;

	__device__ explicit TCWalk(char* smem) {
		Sh = reinterpret_cast<bf16*>(smem);
		Sl = Sh + kD * kLS;
		Wh = Sl + kD * kLS;
		Wl = Wh + kC * kLW;
		Kh = Wl + kC * kLW;
		Kl = Kh + kC * kLW;
		Vh = Kl + kC * kLW;
		Vl = Vh + kC * kLS;
		Vn = reinterpret_cast<float*>(Vl + kC * kLS);
		ws = Vn + kC * kLV + (threadIdx.x / 32) * 256;
		gl = Vn + kC * kLV + kWarps * 256;
		const int t0 = (threadIdx.x / 32) * kSPer;
		rb = t0 / (VH / 16);
		cb = t0 % (VH / 16);
	}

	// initS sets the state: from global fp32 rows of 128 (src, columns c0.. of this CTA), or to the
	// identity's columns [c0, c0+VH) when src is null and identity is set, or to zero.
	__device__ void initS(const float* src, bool identity, int c0) {
		const int lane = threadIdx.x % 32;
#pragma unroll
		for (int j = 0; j < kSPer; ++j) {
			if (src != nullptr) {
				wmma::load_matrix_sync(s[j], src + rb * 16 * kD + c0 + (cb + j) * 16, kD, wmma::mem_row_major);
			} else if (identity && rb * 16 == c0 + (cb + j) * 16) {
				for (int e = lane; e < 256; e += 32) ws[e] = (e / 16 == e % 16) ? 1.f : 0.f;
				__syncwarp();
				wmma::load_matrix_sync(s[j], ws, 16, wmma::mem_row_major);
				__syncwarp();
			} else {
				wmma::fill_fragment(s[j], 0.f);
			}
		}
	}

	// stageS splits the state into Sh/Sl and, when out is set, writes it to out (fp32 rows of 128,
	// columns c0..); ends synced.
	__device__ void stageS(float* out, int c0) {
		const int lane = threadIdx.x % 32;
#pragma unroll
		for (int j = 0; j < kSPer; ++j) {
			wmma::store_matrix_sync(ws, s[j], 16, wmma::mem_row_major);
			__syncwarp();
#pragma unroll
			for (int x = 0; x < 8; ++x) {
				const int e = lane * 8 + x, row = rb * 16 + e / 16, col = (cb + j) * 16 + e % 16;
				const float val = ws[e];
				split(val, &Sh[row * kLS + col], &Sl[row * kLS + col]);
				if (out != nullptr) out[row * kD + c0 + col] = val;
			}
			__syncwarp();
		}
		__syncthreads();
	}

	// load stages chunk rows: -W and Kt split, U columns [c0, c0+VH) into Vn (zero when u is null).
	// Every thread issues all its 16-byte loads before it converts and stores any of them, so the
	// chunk's global reads overlap instead of waiting one after another.
	__device__ void load(const float* w, const float* u, const float* kt, const float* gcum, int t0, int n,
	                     int h, int HV, int c0) {
		constexpr int kRow4 = kD / 4;                // float4 per 128-wide row
		constexpr int kPer = kC * kRow4 / kThreads;  // 8 float4 of W (and of Kt) per thread
		constexpr int kU4 = VH / 4;                  // float4 per U tile row
		constexpr int kUPer = kC * kU4 / kThreads;   // 4 or 8 float4 of U per thread
		const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
		float4 wr[kPer], kr[kPer], ur[kUPer];
#pragma unroll
		for (int x = 0; x < kPer; ++x) {
			const int f = threadIdx.x + x * kThreads, i = f / kRow4, d4 = f % kRow4;
			const long long o = ((long long)(t0 + i) * HV + h) * kRow4 + d4;
			wr[x] = i < n ? reinterpret_cast<const float4*>(w)[o] : zero;
			kr[x] = i < n ? reinterpret_cast<const float4*>(kt)[o] : zero;
		}
#pragma unroll
		for (int x = 0; x < kUPer; ++x) {
			const int f = threadIdx.x + x * kThreads, i = f / kU4, d4 = f % kU4;
			ur[x] = (u != nullptr && i < n)
			            ? reinterpret_cast<const float4*>(u)[((long long)(t0 + i) * HV + h) * kRow4 + c0 / 4 + d4]
			            : zero;
		}
#pragma unroll
		for (int x = 0; x < kPer; ++x) {
			const int f = threadIdx.x + x * kThreads, e = (f / kRow4) * kLW + 4 * (f % kRow4);
			split(-wr[x].x, &Wh[e], &Wl[e]);
			split(-wr[x].y, &Wh[e + 1], &Wl[e + 1]);
			split(-wr[x].z, &Wh[e + 2], &Wl[e + 2]);
			split(-wr[x].w, &Wh[e + 3], &Wl[e + 3]);
			split(kr[x].x, &Kh[e], &Kl[e]);
			split(kr[x].y, &Kh[e + 1], &Kl[e + 1]);
			split(kr[x].z, &Kh[e + 2], &Kl[e + 2]);
			split(kr[x].w, &Kh[e + 3], &Kl[e + 3]);
		}
#pragma unroll
		for (int x = 0; x < kUPer; ++x) {
			const int f = threadIdx.x + x * kThreads;
			*reinterpret_cast<float4*>(Vn + (f / kU4) * kLV + 4 * (f % kU4)) = ur[x];
		}
		if (threadIdx.x == 0) *gl = gcum[(long long)(t0 + n - 1) * HV + h];
		__syncthreads();
	}

	// vprime computes V' = U - W S into Vn (fp32) and Vh/Vl (ends synced). Needs Sh/Sl staged.
	// A warp's V' tiles share one row block, so the A fragments are loaded once per k step.
	__device__ void vprime() {
		wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> ah, al;
		wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> bh, bl;
		Acc acc[kVPer];
		const int t0 = (threadIdx.x / 32) * kVPer, r = t0 / (VH / 16), c = t0 % (VH / 16);
#pragma unroll
		for (int j = 0; j < kVPer; ++j)
			wmma::load_matrix_sync(acc[j], Vn + r * 16 * kLV + (c + j) * 16, kLV, wmma::mem_row_major);
#pragma unroll 1
		for (int k = 0; k < kD / 16; ++k) {
			wmma::load_matrix_sync(ah, Wh + r * 16 * kLW + k * 16, kLW);
			wmma::load_matrix_sync(al, Wl + r * 16 * kLW + k * 16, kLW);
#pragma unroll
			for (int j = 0; j < kVPer; ++j) {
				wmma::load_matrix_sync(bh, Sh + k * 16 * kLS + (c + j) * 16, kLS);
				wmma::load_matrix_sync(bl, Sl + k * 16 * kLS + (c + j) * 16, kLS);
				wmma::mma_sync(acc[j], ah, bh, acc[j]);
				wmma::mma_sync(acc[j], ah, bl, acc[j]);
				wmma::mma_sync(acc[j], al, bh, acc[j]);
			}
		}
		__syncthreads();  // every warp has read Vn (as U) before it is overwritten
#pragma unroll
		for (int j = 0; j < kVPer; ++j)
			wmma::store_matrix_sync(Vn + r * 16 * kLV + (c + j) * 16, acc[j], kLV, wmma::mem_row_major);
		__syncthreads();
		for (int e = threadIdx.x; e < kC * VH; e += kThreads) {
			const int i = e / VH, cc = e % VH;
			split(Vn[i * kLV + cc], &Vh[i * kLS + cc], &Vl[i * kLS + cc]);
		}
		__syncthreads();
	}

	// update runs S = e^gl S + Kt^T V' on the fragments (reads Kh/Kl, Vh/Vl).
	__device__ void update() {
		const float decay = expf(*gl);
		wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> ah, al;
		wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> bh, bl;
#pragma unroll
		for (int j = 0; j < kSPer; ++j) {
#pragma unroll
			for (int x = 0; x < s[j].num_elements; ++x) s[j].x[x] *= decay;
		}
#pragma unroll 1
		for (int i = 0; i < kC / 16; ++i) {
			// A = Kt^T: element (m, i) at Kt[i][m], i.e. column-major with ld kLW.
			wmma::load_matrix_sync(ah, Kh + i * 16 * kLW + rb * 16, kLW);
			wmma::load_matrix_sync(al, Kl + i * 16 * kLW + rb * 16, kLW);
#pragma unroll
			for (int j = 0; j < kSPer; ++j) {
				wmma::load_matrix_sync(bh, Vh + i * 16 * kLS + (cb + j) * 16, kLS);
				wmma::load_matrix_sync(bl, Vl + i * 16 * kLS + (cb + j) * 16, kLS);
				wmma::mma_sync(s[j], ah, bh, s[j]);
				wmma::mma_sync(s[j], ah, bl, s[j]);
				wmma::mma_sync(s[j], al, bh, s[j]);
			}
		}
		__syncthreads();
	}
};

template <int VH>
__device__ void summary_walk_tc(const float* w, const float* u, const float* kt, const float* gcum,
                                const int* chunk_tok0, const int* chunk_len, const int* seg_chunk0,
                                const int* seg_nchunk, const int* list, float* out_p, float* out_q, int HV) {
	extern __shared__ __align__(128) char wtc_smem[];
	TCWalk<VH> wk(wtc_smem);
	const int tiles = kD / VH;
	const bool isP = blockIdx.x >= tiles;
	const int c0 = (isP ? blockIdx.x - tiles : blockIdx.x) * VH;
	const int li = blockIdx.y, h = blockIdx.z, seg = list[li];
	wk.initS(nullptr, isP, c0);
	const int ch0 = seg_chunk0[seg], nch = seg_nchunk[seg];
	for (int c = ch0; c < ch0 + nch; ++c) {
		wk.stageS(nullptr, c0);
		wk.load(w, isP ? nullptr : u, kt, gcum, chunk_tok0[c], chunk_len[c], h, HV, c0);
		wk.vprime();
		wk.update();
	}
	wk.stageS((isP ? out_p : out_q) + ((long long)li * HV + h) * kD * kD, c0);
}

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_summary_walk_tc(const float* __restrict__ w, const float* __restrict__ u, const float* __restrict__ kt,
                    const float* __restrict__ gcum, const int* __restrict__ chunk_tok0,
                    const int* __restrict__ chunk_len, const int* __restrict__ seg_chunk0,
                    const int* __restrict__ seg_nchunk, const int* __restrict__ list,
                    float* __restrict__ out_p, float* __restrict__ out_q, int HV, int vh) {
	if (vh == 64)
		summary_walk_tc<64>(w, u, kt, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list, out_p, out_q, HV);
	else
		summary_walk_tc<128>(w, u, kt, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list, out_p, out_q, HV);
}

template <int VH>
__device__ void state_walk_tc(const float* w, const float* u, const float* kt, const float* gcum,
                              const int* chunk_tok0, const int* chunk_len, const int* seg_chunk0,
                              const int* seg_nchunk, const float* start, float* h_out, float* vnew,
                              float* final_state, int HV) {
	extern __shared__ __align__(128) char wtc_smem[];
	TCWalk<VH> wk(wtc_smem);
	const int c0 = blockIdx.x * VH, seg = blockIdx.y, h = blockIdx.z;
	wk.initS(start + ((long long)seg * HV + h) * kD * kD, false, c0);
	const int ch0 = seg_chunk0[seg], nch = seg_nchunk[seg];
	for (int c = ch0; c < ch0 + nch; ++c) {
		const int n = chunk_len[c], t0 = chunk_tok0[c];
		wk.stageS(h_out + ((long long)c * HV + h) * kD * kD, c0);
		wk.load(w, u, kt, gcum, t0, n, h, HV, c0);
		wk.vprime();
		for (int e = threadIdx.x; e < n * VH; e += kThreads)
			vnew[((long long)(t0 + e / VH) * HV + h) * kD + c0 + e % VH] = wk.Vn[(e / VH) * TCWalk<VH>::kLV + e % VH];
		wk.update();
	}
	wk.stageS(final_state + ((long long)seg * HV + h) * kD * kD, c0);
}

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_state_walk_tc(const float* __restrict__ w, const float* __restrict__ u, const float* __restrict__ kt,
                  const float* __restrict__ gcum, const int* __restrict__ chunk_tok0,
                  const int* __restrict__ chunk_len, const int* __restrict__ seg_chunk0,
                  const int* __restrict__ seg_nchunk, const float* __restrict__ start,
                  float* __restrict__ h_out, float* __restrict__ vnew, float* __restrict__ final_state,
                  int HV, int vh) {
	if (vh == 64)
		state_walk_tc<64>(w, u, kt, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start, h_out, vnew, final_state, HV);
	else
		state_walk_tc<128>(w, u, kt, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start, h_out, vnew, final_state, HV);
}

}  // namespace walktc
}  // namespace gdnkcp
