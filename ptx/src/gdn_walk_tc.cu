// gdn_walk_tc.cu: the summary and state walks on the tensor cores (WMMA bf16 16x16x16, fp32
// accumulate), with the same arguments and launch grids as gdn_summary_walk / gdn_state_walk of
// gdn_fwd.cu, and dynamic shared memory walk_tc_smem(vh) = 1280*vh + 65552 bytes
// (147472 at vh 64, 229392 at vh 128).
//
// Precision: every product whose operands are not exact bf16 runs as three bf16 products of a
// hi/lo split, x = hi + lo with hi = bf16(x), lo = bf16(x - hi): a b ~ ah bh + ah bl + al bh, about
// 16 significant bits per operand, so the fp32 states stay within ~1e-5 of exact arithmetic.
//   V' = U - W S            (W, S split: 3 products of 64x128x vh)
//   S  = e^gl S + Kt^T V'   (Kt, V' split: 3 products of 128x64x vh)
// The state lives in accumulator fragments across chunks; it is staged through shared memory
// (fp32, then split) once per chunk, which is also where the state walk copies H out from.
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
typedef __nv_bfloat16 bf16;

__host__ __device__ constexpr int walk_tc_smem(int vh) { return 1280 * vh + 65536 + 16; }

__device__ __forceinline__ void split(float x, bf16* hi, bf16* lo) {
	const bf16 h = __float2bfloat16_rn(x);
	*hi = h;
	*lo = __float2bfloat16_rn(x - __bfloat162float(h));
}

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;

template <int VH>
struct TCWalk {
	static constexpr int kSTiles = (kD / 16) * (VH / 16);  // state tiles
	static constexpr int kSPer = kSTiles / kWarps;        // per warp
	static constexpr int kVTiles = (kC / 16) * (VH / 16);  // V' tiles
	static constexpr int kVPer = kVTiles / kWarps;
	float* scratch;  // [128][VH] fp32 state staging; its first 64*VH floats double as Vn [64][VH]
	bf16 *Sh, *Sl;   // [128][VH]
	bf16 *Wh, *Wl;   // [64][128], holding -W
	bf16 *Kh, *Kl;   // [64][128], Kt
	bf16 *Vh, *Vl;   // [64][VH]
	float* gl;       // gamma_last
	Acc s[kSPer];    // this warp's state tiles

	__device__ explicit TCWalk(char* smem) {
		scratch = reinterpret_cast<float*>(smem);
		Sh = reinterpret_cast<bf16*>(smem + 4 * kD * VH);
		Sl = Sh + kD * VH;
		Wh = Sl + kD * VH;
		Wl = Wh + kC * kD;
		Kh = Wl + kC * kD;
		Kl = Kh + kC * kD;
		Vh = Kl + kC * kD;
		Vl = Vh + kC * VH;
		gl = reinterpret_cast<float*>(Vl + kC * VH);
	}

	// Tile t of this warp's state: rows 16*(t / (VH/16)), cols 16*(t % (VH/16)).
	__device__ int stile(int j) const { return (threadIdx.x / 32) * kSPer + j; }

	// setS loads the state from scratch (fp32 [128][VH]) into the fragments.
	__device__ void setS() {
		#pragma unroll
		for (int j = 0; j < kSPer; ++j) {
			const int t = stile(j), r = t / (VH / 16), c = t % (VH / 16);
			wmma::load_matrix_sync(s[j], scratch + r * 16 * VH + c * 16, VH, wmma::mem_row_major);
		}
	}

	// stageS writes the fragments to scratch and splits them into Sh/Sl (ends synced).
	__device__ void stageS() {
		#pragma unroll
		for (int j = 0; j < kSPer; ++j) {
			const int t = stile(j), r = t / (VH / 16), c = t % (VH / 16);
			wmma::store_matrix_sync(scratch + r * 16 * VH + c * 16, s[j], VH, wmma::mem_row_major);
		}
		__syncthreads();
		for (int e = threadIdx.x; e < kD * VH; e += kThreads) split(scratch[e], &Sh[e], &Sl[e]);
		__syncthreads();
	}

	// load stages chunk rows: -W and Kt split, U columns [c0, c0+VH) into Vn (zero when u is null).
	__device__ void load(const float* w, const float* u, const float* kt, const float* gcum, int t0, int n,
	                     int h, int HV, int c0) {
		float* Vn = scratch;
		for (int e = threadIdx.x; e < kC * kD; e += kThreads) {
			const int i = e / kD, d = e % kD;
			const long long o = ((long long)(t0 + i) * HV + h) * kD + d;
			split(i < n ? -w[o] : 0.f, &Wh[e], &Wl[e]);
			split(i < n ? kt[o] : 0.f, &Kh[e], &Kl[e]);
		}
		for (int e = threadIdx.x; e < kC * VH; e += kThreads) {
			const int i = e / VH, cc = e % VH;
			Vn[e] = (u != nullptr && i < n) ? u[((long long)(t0 + i) * HV + h) * kD + c0 + cc] : 0.f;
		}
		if (threadIdx.x == 0) *gl = gcum[(long long)(t0 + n - 1) * HV + h];
		__syncthreads();
	}

	// A warp's V' tiles share one row block (rb = tile / (VH/16)), and so do its state tiles: the A
	// fragments are loaded once per k step and reused across the warp's tiles.
	static_assert((kVPer <= VH / 16) && ((VH / 16) % kVPer == 0), "a warp's V' tiles must share a row block");
	static_assert((kSPer <= VH / 16) && ((VH / 16) % kSPer == 0), "a warp's state tiles must share a row block");

	// vprime computes V' = U - W S into Vn (fp32) and Vh/Vl (ends synced). Needs Sh/Sl staged.
	__device__ void vprime() {
		float* Vn = scratch;
		wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> ah, al;
		wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> bh, bl;
		Acc acc[kVPer];
		const int t0 = (threadIdx.x / 32) * kVPer, r = t0 / (VH / 16), cb = t0 % (VH / 16);
#pragma unroll
		for (int j = 0; j < kVPer; ++j)
			wmma::load_matrix_sync(acc[j], Vn + r * 16 * VH + (cb + j) * 16, VH, wmma::mem_row_major);
#pragma unroll 1
		for (int k = 0; k < kD / 16; ++k) {
			wmma::load_matrix_sync(ah, Wh + r * 16 * kD + k * 16, kD);
			wmma::load_matrix_sync(al, Wl + r * 16 * kD + k * 16, kD);
#pragma unroll
			for (int j = 0; j < kVPer; ++j) {
				wmma::load_matrix_sync(bh, Sh + k * 16 * VH + (cb + j) * 16, VH);
				wmma::load_matrix_sync(bl, Sl + k * 16 * VH + (cb + j) * 16, VH);
				wmma::mma_sync(acc[j], ah, bh, acc[j]);
				wmma::mma_sync(acc[j], ah, bl, acc[j]);
				wmma::mma_sync(acc[j], al, bh, acc[j]);
			}
		}
		__syncthreads();  // every warp has read Vn (as U) before it is overwritten
#pragma unroll
		for (int j = 0; j < kVPer; ++j)
			wmma::store_matrix_sync(Vn + r * 16 * VH + (cb + j) * 16, acc[j], VH, wmma::mem_row_major);
		__syncthreads();
		for (int e = threadIdx.x; e < kC * VH; e += kThreads) split(Vn[e], &Vh[e], &Vl[e]);
		__syncthreads();
	}

	// update runs S = e^gl S + Kt^T V' on the fragments (reads Kh/Kl, Vh/Vl).
	__device__ void update() {
		const float decay = expf(*gl);
		wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> ah, al;
		wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> bh, bl;
		const int t0 = stile(0), r = t0 / (VH / 16), cb = t0 % (VH / 16);
#pragma unroll
		for (int j = 0; j < kSPer; ++j) {
#pragma unroll
			for (int x = 0; x < s[j].num_elements; ++x) s[j].x[x] *= decay;
		}
#pragma unroll 1
		for (int i = 0; i < kC / 16; ++i) {
			// A = Kt^T: element (m, i) at Kt[i][m], i.e. column-major with ld 128.
			wmma::load_matrix_sync(ah, Kh + i * 16 * kD + r * 16, kD);
			wmma::load_matrix_sync(al, Kl + i * 16 * kD + r * 16, kD);
#pragma unroll
			for (int j = 0; j < kSPer; ++j) {
				wmma::load_matrix_sync(bh, Vh + i * 16 * VH + (cb + j) * 16, VH);
				wmma::load_matrix_sync(bl, Vl + i * 16 * VH + (cb + j) * 16, VH);
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
	char* smem = wtc_smem;
	TCWalk<VH> wk(smem);
	const int tiles = kD / VH;
	const bool isP = blockIdx.x >= tiles;
	const int c0 = (isP ? blockIdx.x - tiles : blockIdx.x) * VH;
	const int li = blockIdx.y, h = blockIdx.z, seg = list[li];
	for (int e = threadIdx.x; e < kD * VH; e += kThreads) {
		const int k = e / VH, cc = e % VH;
		wk.scratch[e] = (isP && k == c0 + cc) ? 1.f : 0.f;
	}
	__syncthreads();
	wk.setS();
	__syncthreads();
	const int ch0 = seg_chunk0[seg], nch = seg_nchunk[seg];
	for (int c = ch0; c < ch0 + nch; ++c) {
		wk.stageS();
		wk.load(w, isP ? nullptr : u, kt, gcum, chunk_tok0[c], chunk_len[c], h, HV, c0);
		wk.vprime();
		wk.update();
	}
	wk.stageS();
	float* out = (isP ? out_p : out_q) + ((long long)li * HV + h) * kD * kD;
	for (int e = threadIdx.x; e < kD * VH; e += kThreads) out[(e / VH) * kD + c0 + e % VH] = wk.scratch[e];
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
	char* smem = wtc_smem;
	TCWalk<VH> wk(smem);
	const int c0 = blockIdx.x * VH, seg = blockIdx.y, h = blockIdx.z;
	const float* s0 = start + ((long long)seg * HV + h) * kD * kD;
	for (int e = threadIdx.x; e < kD * VH; e += kThreads) wk.scratch[e] = s0[(e / VH) * kD + c0 + e % VH];
	__syncthreads();
	wk.setS();
	__syncthreads();
	const int ch0 = seg_chunk0[seg], nch = seg_nchunk[seg];
	for (int c = ch0; c < ch0 + nch; ++c) {
		const int n = chunk_len[c], t0 = chunk_tok0[c];
		wk.stageS();
		float* hc = h_out + ((long long)c * HV + h) * kD * kD;
		for (int e = threadIdx.x; e < kD * VH; e += kThreads) hc[(e / VH) * kD + c0 + e % VH] = wk.scratch[e];
		__syncthreads();  // scratch is about to hold U
		wk.load(w, u, kt, gcum, t0, n, h, HV, c0);
		wk.vprime();
		for (int e = threadIdx.x; e < n * VH; e += kThreads)
			vnew[((long long)(t0 + e / VH) * HV + h) * kD + c0 + e % VH] = wk.scratch[e];
		wk.update();
	}
	wk.stageS();
	float* fs = final_state + ((long long)seg * HV + h) * kD * kD;
	for (int e = threadIdx.x; e < kD * VH; e += kThreads) fs[(e / VH) * kD + c0 + e % VH] = wk.scratch[e];
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
