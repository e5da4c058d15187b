// gdn_fwd.cu: the chunked Gated DeltaNet forward over one rank's buffer
// (DESIGN.md §2-§3), first version: fp32 arithmetic on the CUDA cores.
//
// Every intermediate is fp32 and every reduction runs in one fixed sequential
// order per output element, so the results are bitwise reproducible, and the
// two walk widths (vh = 64: two CTAs per segment and head, vh = 128: one)
// give identical bits: an element's value never depends on which CTA or
// thread computes it. No atomics.
//
// Shapes (K = V = 128, chunk 64). A rank holds Tr tokens cut into NS
// segments and NC chunks (chunks counted from each segment's start; the last
// chunk of a segment may be short). Host tables, int32:
//   chunk_tok0[NC], chunk_len[NC]   first local token and length (1..64) of a chunk
//   seg_chunk0[NS], seg_nchunk[NS]  first chunk and chunk count of a segment
// Tensors: q, k bf16 rows of HQK*128 (row stride q_stride / k_stride
// elements, so the module can read them out of the conv output); v bf16 rows
// of HV*128 (stride v_stride); g, beta fp32 [Tr, HV]. Value head h reads
// QK head h / (HV / HQK).
//
// Launches (block 256 threads for all; dynamic shared memory in bytes):
//   gdn_l2norm_fwd     grid ceil(Tr*HQK*2 / 8)                      0
//   gdn_prep_fwd       grid (NC, HV)                                kPrepSmem   = 50176
//   gdn_summary_walk   grid (2*128/vh, nlist, HV)                   walk_smem(vh)
//   gdn_compose_fwd    grid (2, NS, HV)                             kComposeSmem = 65536
//   gdn_state_walk     grid (128/vh, NS, HV)                        walk_smem(vh)
//   gdn_output_fwd     grid (NC, HV)                                kOutputSmem = 147712
// walk_smem(vh) = 4 * (128*vh + 64*vh + 2*64*128 + 64) = 114944 (vh 64) or 164096 (vh 128).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace gdnkcp {
namespace fwd {

constexpr int kD = 128;        // head dim K = V
constexpr int kC = 64;         // chunk size
constexpr int kThreads = 256;  // block size of every kernel here
constexpr float kL2Eps = 1e-6f;

__device__ __forceinline__ float ld_bf16(const __nv_bfloat16* p) { return __bfloat162float(*p); }

// ---- l2norm of q and k ------------------------------------------------------------------------
// l2norm_lane: lane's part of one warp's 128-wide row, x[i] = the row's element 4 lane + i as loaded
// (load_row4: bf16 to fp32), times the row's rstd = 1 / sqrt(sum x^2 + 1e-6) (each lane's four squares by
// fmaf in i order, then the xor butterfly 16, 8, 4, 2, 1; 1 with l2norm = 0), which it returns. Every lane
// of the warp calls it. gdn_l2norm_fwd and the kernels that normalise their own q / k rows (gdn_prep_mma_gn,
// gdn_output_mma16gn) share it, so their normalised rows are the same bits.
// load_row4: x[i] = row[4 lane + i] (bf16 to fp32, exact), one 8-byte load where vec (the row 8-byte
// aligned), else four 2-byte loads: the same values.
__device__ __forceinline__ void load_row4(const __nv_bfloat16* row, int lane, bool vec, float x[4]) {
	if (vec) {
		const uint2 u = *reinterpret_cast<const uint2*>(row + 4 * lane);
		x[0] = __uint_as_float(u.x << 16);
		x[1] = __uint_as_float(u.x & 0xffff0000u);
		x[2] = __uint_as_float(u.y << 16);
		x[3] = __uint_as_float(u.y & 0xffff0000u);
	} else {
#pragma unroll
		for (int i = 0; i < 4; ++i) x[i] = __bfloat162float(row[4 * lane + i]);
	}
}

// rows_vec8: whether every row at base + r stride (elements) is 8-byte aligned (load_row4's vector path).
__device__ __forceinline__ bool rows_vec8(const __nv_bfloat16* base, long long stride) {
	return ((reinterpret_cast<unsigned long long>(base) | (unsigned long long)(2 * stride)) & 7) == 0;
}

__device__ __forceinline__ float l2norm_lane(float x[4], int l2norm) {
	float ss = 0.f;
#pragma unroll
	for (int i = 0; i < 4; ++i) ss = fmaf(x[i], x[i], ss);
#pragma unroll
	for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
	const float rstd = l2norm ? 1.0f / sqrtf(ss + kL2Eps) : 1.0f;
#pragma unroll
	for (int i = 0; i < 4; ++i) x[i] = x[i] * rstd;
	return rstd;
}

// One warp per (token, QK head, q|k) row of 128: x / sqrt(sum x^2 + 1e-6), written fp32; rstd
// (the inverse norm) is kept for the backward. With l2norm = 0 the rows are copied and rstd = 1.
extern "C" __global__ void __launch_bounds__(kThreads)
gdn_l2norm_fwd(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
               int q_stride, int k_stride, float* __restrict__ qn, float* __restrict__ kn,
               float* __restrict__ q_rstd, float* __restrict__ k_rstd, int T, int HQK, int l2norm) {
	const long long warp = ((long long)blockIdx.x * kThreads + threadIdx.x) >> 5;
	const int lane = threadIdx.x & 31;
	const long long rows = (long long)T * HQK;
	if (warp >= 2 * rows) return;
	const bool isk = warp >= rows;
	const long long r = isk ? warp - rows : warp;
	const int t = (int)(r / HQK), hh = (int)(r % HQK);
	const __nv_bfloat16* src = (isk ? k + (long long)t * k_stride : q + (long long)t * q_stride) + hh * kD;
	float x[4];
	load_row4(src, lane, rows_vec8(isk ? k : q, isk ? k_stride : q_stride), x);
	const float rstd = l2norm_lane(x, l2norm);
	float* dst = (isk ? kn : qn) + r * kD;
	*reinterpret_cast<float4*>(dst + 4 * lane) = make_float4(x[0], x[1], x[2], x[3]);
	if (lane == 0) (isk ? k_rstd : q_rstd)[r] = rstd;
}

// ---- chunk prep --------------------------------------------------------------------------------
// Per (chunk, value head): gamma = in-chunk cumsum of g; L_ij = beta_i (k_i . k_j) e^(gamma_i -
// gamma_j) for j < i; A = (I + L)^-1 by forward substitution; W = A diag(beta e^gamma) K,
// U = A diag(beta) V, Kt = diag(e^(gamma_last - gamma)) K. Rows past a short chunk's end are
// neither read nor written.
constexpr int kPrepSmem = 4 * (kC * kD + kC * kC + 4 * kC);

// chunk_inverse builds A = (I + L)^-1 of one chunk of n rows into A [64][64] (row-major, stride 64):
// L_ij = bet_i (k_i . k_j) e^(gam_i - gam_j) for j < i < n, zeros elsewhere; then forward
// substitution row by row, inv_i = e_i - sum_{j<i} L_ij inv_j (j ascending); then the unit diagonal
// (of all 64 rows). Ks holds the chunk's k rows with row stride ldk (the stride changes no
// arithmetic), bet and gam its beta and gamma; row is a scratch of 64. Rows >= n of A are e_i.
// gdn_prep_fwd and gdn_chunk_grads (gdn_bwd.cu) both build A here, so the backward's A has the
// forward's bits. Every thread of the block calls it, after a __syncthreads() that publishes Ks,
// bet and gam; it ends without one, so the caller synchronises before reading A.
__device__ __forceinline__ void chunk_inverse(const float* Ks, int ldk, const float* bet, const float* gam,
                                              float* A, float* row, int n) {
	const int tid = threadIdx.x;
	// L (strictly lower), zeros elsewhere.
	for (int e = tid; e < kC * kC; e += kThreads) {
		const int i = e / kC, j = e % kC;
		float val = 0.f;
		if (j < i && i < n) {
			float dot = 0.f;
			for (int d = 0; d < kD; ++d) dot = fmaf(Ks[i * ldk + d], Ks[j * ldk + d], dot);
			val = bet[i] * dot * expf(gam[i] - gam[j]);
		}
		A[e] = val;
	}
	__syncthreads();
	// Forward substitution, row by row: inv_i = e_i - sum_{j<i} L_ij inv_j (j ascending).
	for (int i = 1; i < n; ++i) {
		if (tid < i) {
			float s = 0.f;
			for (int j = tid; j < i; ++j) s = fmaf(A[i * kC + j], j == tid ? 1.f : A[j * kC + tid], s);
			row[tid] = -s;
		}
		__syncthreads();
		if (tid < i) A[i * kC + tid] = row[tid];
		__syncthreads();
	}
	for (int i = tid; i < kC; i += kThreads) A[i * kC + i] = 1.f;  // unit diagonal
}

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_prep_fwd(const float* __restrict__ kn, const __nv_bfloat16* __restrict__ v, int v_stride,
             const float* __restrict__ g, const float* __restrict__ beta,
             const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
             float* __restrict__ gcum, float* __restrict__ w, float* __restrict__ u,
             float* __restrict__ kt, int HQK, int HV) {
	extern __shared__ float smem[];
	float* Ks = smem;                // [64][128]: k, later v
	float* A = Ks + kC * kD;         // [64][64]: L, then (I + L)^-1 in place
	float* row = A + kC * kC;        // [64] one row of the inverse being built
	float* gam = row + kC;           // [64]
	float* bet = gam + kC;           // [64]
	float* coef = bet + kC;          // [64]
	const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int qh = h / (HV / HQK);
	for (int e = tid; e < kC * kD; e += kThreads) {
		const int i = e / kD, d = e % kD;
		Ks[e] = i < n ? kn[((long long)(t0 + i) * HQK + qh) * kD + d] : 0.f;
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
	chunk_inverse(Ks, kD, bet, gam, A, row, n);
	const float glast = gam[n - 1];
	if (tid < kC) coef[tid] = tid < n ? bet[tid] * expf(gam[tid]) : 0.f;
	__syncthreads();
	// Kt and W: thread -> column d = tid % 128, rows i = tid / 128, +2, ...
	const int d = tid % kD;
	for (int i = tid / kD; i < n; i += kThreads / kD) {
		const long long o = ((long long)(t0 + i) * HV + h) * kD + d;
		kt[o] = Ks[i * kD + d] * expf(glast - gam[i]);
		float s = 0.f;
		for (int j = 0; j <= i; ++j) s = fmaf(A[i * kC + j] * coef[j], Ks[j * kD + d], s);
		w[o] = s;
	}
	__syncthreads();
	for (int e = tid; e < kC * kD; e += kThreads) {
		const int i = e / kD, dd = e % kD;
		Ks[e] = i < n ? ld_bf16(v + (long long)(t0 + i) * v_stride + h * kD + dd) : 0.f;
	}
	__syncthreads();
	for (int i = tid / kD; i < n; i += kThreads / kD) {
		float s = 0.f;
		for (int j = 0; j <= i; ++j) s = fmaf(A[i * kC + j] * bet[j], Ks[j * kD + d], s);
		u[((long long)(t0 + i) * HV + h) * kD + d] = s;
	}
	if (tid < n) gcum[(long long)(t0 + tid) * HV + h] = gam[tid];
}

// ---- the walks -----------------------------------------------------------------------------------
// One CTA walks one segment's chunks for one value head over vh columns of the state S (128 x vh):
//   V' = U - W S;   S <- e^(gamma_last) S + Kt^T V'
// Each element of V' and S is one sequential fma chain (k or i ascending), the same for any vh.
__host__ __device__ constexpr int walk_smem(int vh) { return 4 * (kD * vh + kC * vh + 2 * kC * kD + kC); }

template <int VH>
struct Walk {
	float* S;   // [128][VH]
	float* Vn;  // [64][VH]
	float* W;   // [64][128]
	float* Kt;  // [64][128]
	float* gl;  // [64]: gamma of the chunk (only [n-1] is read)

	__device__ explicit Walk(float* smem)
	    : S(smem), Vn(S + kD * VH), W(Vn + kC * VH), Kt(W + kC * kD), gl(Kt + kC * kD) {}

	// load stages chunk c's W, Kt and (when u != nullptr) columns [c0, c0+VH) of U.
	__device__ void load(const float* w, const float* u, const float* kt, const float* gcum, int t0, int n,
	                     int h, int HV, int c0) {
		for (int e = threadIdx.x; e < kC * kD; e += kThreads) {
			const int i = e / kD, d = e % kD;
			const long long o = ((long long)(t0 + i) * HV + h) * kD + d;
			W[e] = i < n ? w[o] : 0.f;
			Kt[e] = i < n ? kt[o] : 0.f;
		}
		for (int e = threadIdx.x; e < kC * VH; e += kThreads) {
			const int i = e / VH, cc = e % VH;
			Vn[e] = (u != nullptr && i < n) ? u[((long long)(t0 + i) * HV + h) * kD + c0 + cc] : 0.f;
		}
		if (threadIdx.x == 0) gl[0] = gcum[(long long)(t0 + n - 1) * HV + h];
		__syncthreads();
	}

	// step runs V' = U - W S then S <- e^(gamma_last) S + Kt^T V' on the staged chunk.
	__device__ void step(int n) {
		for (int e = threadIdx.x; e < kC * VH; e += kThreads) {
			const int i = e / VH, cc = e % VH;
			if (i < n) {
				float s = 0.f;
				for (int k = 0; k < kD; ++k) s = fmaf(W[i * kD + k], S[k * VH + cc], s);
				Vn[e] = Vn[e] - s;
			}
		}
		__syncthreads();
		const float decay = expf(gl[0]);
		for (int e = threadIdx.x; e < kD * VH; e += kThreads) {
			const int k = e / VH, cc = e % VH;
			float s = decay * S[e];
			for (int i = 0; i < n; ++i) s = fmaf(Kt[i * kD + k], Vn[i * VH + cc], s);
			S[e] = s;
		}
		__syncthreads();
	}
};

// Summary walk over a walk list: grid.x < 128/vh are Q tiles (S from zero, with U), the rest P
// tiles (S from the identity's columns, U = 0). out_p, out_q: [nlist, HV, 128, 128].
template <int VH>
__device__ void summary_walk(const float* w, const float* u, const float* kt, const float* gcum,
                             const int* chunk_tok0, const int* chunk_len, const int* seg_chunk0,
                             const int* seg_nchunk, const int* list, float* out_p, float* out_q, int HV) {
	extern __shared__ float smem[];
	Walk<VH> wk(smem);
	const int tiles = kD / VH;
	const bool isP = blockIdx.x >= tiles;
	const int c0 = (isP ? blockIdx.x - tiles : blockIdx.x) * VH;
	const int li = blockIdx.y, h = blockIdx.z;
	const int seg = list[li];
	for (int e = threadIdx.x; e < kD * VH; e += kThreads) {
		const int k = e / VH, cc = e % VH;
		wk.S[e] = (isP && k == c0 + cc) ? 1.f : 0.f;
	}
	__syncthreads();
	const int ch0 = seg_chunk0[seg], nch = seg_nchunk[seg];
	for (int c = ch0; c < ch0 + nch; ++c) {
		const int n = chunk_len[c];
		wk.load(w, isP ? nullptr : u, kt, gcum, chunk_tok0[c], n, h, HV, c0);
		wk.step(n);
	}
	float* out = (isP ? out_p : out_q) + ((long long)li * HV + h) * kD * kD;
	for (int e = threadIdx.x; e < kD * VH; e += kThreads) {
		const int k = e / VH, cc = e % VH;
		out[k * kD + c0 + cc] = wk.S[e];
	}
}

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_summary_walk(const float* __restrict__ w, const float* __restrict__ u, const float* __restrict__ kt,
                 const float* __restrict__ gcum, const int* __restrict__ chunk_tok0,
                 const int* __restrict__ chunk_len, const int* __restrict__ seg_chunk0,
                 const int* __restrict__ seg_nchunk, const int* __restrict__ list,
                 float* __restrict__ out_p, float* __restrict__ out_q, int HV, int vh) {
	if (vh == 64)
		summary_walk<64>(w, u, kt, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list, out_p, out_q, HV);
	else
		summary_walk<128>(w, u, kt, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list, out_p, out_q, HV);
}

// State walk: every segment from its true start state (start: [NS, HV, 128, 128]); writes the
// state at each chunk's start (h_out: [NC, HV, 128, 128]), V' rows ([Tr, HV, 128]) and the final
// state (final_state: [NS, HV, 128, 128]).
template <int VH>
__device__ void state_walk(const float* w, const float* u, const float* kt, const float* gcum,
                           const int* chunk_tok0, const int* chunk_len, const int* seg_chunk0,
                           const int* seg_nchunk, const float* start, float* h_out, float* vnew,
                           float* final_state, int HV) {
	extern __shared__ float smem[];
	Walk<VH> wk(smem);
	const int c0 = blockIdx.x * VH, seg = blockIdx.y, h = blockIdx.z;
	const float* s0 = start + ((long long)seg * HV + h) * kD * kD;
	for (int e = threadIdx.x; e < kD * VH; e += kThreads) {
		const int k = e / VH, cc = e % VH;
		wk.S[e] = s0[k * kD + c0 + cc];
	}
	__syncthreads();
	const int ch0 = seg_chunk0[seg], nch = seg_nchunk[seg];
	for (int c = ch0; c < ch0 + nch; ++c) {
		const int n = chunk_len[c], t0 = chunk_tok0[c];
		float* hc = h_out + ((long long)c * HV + h) * kD * kD;
		for (int e = threadIdx.x; e < kD * VH; e += kThreads) {
			const int k = e / VH, cc = e % VH;
			hc[k * kD + c0 + cc] = wk.S[e];
		}
		wk.load(w, u, kt, gcum, t0, n, h, HV, c0);
		// V' = U - W S, written out before the state moves on.
		for (int e = threadIdx.x; e < kC * VH; e += kThreads) {
			const int i = e / VH, cc = e % VH;
			if (i < n) {
				float s = 0.f;
				for (int k = 0; k < kD; ++k) s = fmaf(wk.W[i * kD + k], wk.S[k * VH + cc], s);
				const float val = wk.Vn[e] - s;
				wk.Vn[e] = val;
				vnew[((long long)(t0 + i) * HV + h) * kD + c0 + cc] = val;
			}
		}
		__syncthreads();
		const float decay = expf(wk.gl[0]);
		for (int e = threadIdx.x; e < kD * VH; e += kThreads) {
			const int k = e / VH, cc = e % VH;
			float s = decay * wk.S[e];
			for (int i = 0; i < n; ++i) s = fmaf(wk.Kt[i * kD + k], wk.Vn[i * VH + cc], s);
			wk.S[e] = s;
		}
		__syncthreads();
	}
	float* fs = final_state + ((long long)seg * HV + h) * kD * kD;
	for (int e = threadIdx.x; e < kD * VH; e += kThreads) {
		const int k = e / VH, cc = e % VH;
		fs[k * kD + c0 + cc] = wk.S[e];
	}
}

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_state_walk(const float* __restrict__ w, const float* __restrict__ u, const float* __restrict__ kt,
               const float* __restrict__ gcum, const int* __restrict__ chunk_tok0,
               const int* __restrict__ chunk_len, const int* __restrict__ seg_chunk0,
               const int* __restrict__ seg_nchunk, const float* __restrict__ start,
               float* __restrict__ h_out, float* __restrict__ vnew, float* __restrict__ final_state,
               int HV, int vh) {
	if (vh == 64)
		state_walk<64>(w, u, kt, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start, h_out, vnew, final_state, HV);
	else
		state_walk<128>(w, u, kt, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start, h_out, vnew, final_state, HV);
}

// ---- compose --------------------------------------------------------------------------------------
// Each local segment's true start state: S = 0, then S <- P_j S + Q_j for the summaries j of the
// segments before it in its document, in chain order (comp_idx[comp_off[s] .. comp_off[s+1]) index
// all_p/all_q: [nall, HV, 128, 128]). An empty list gives zero. Grid (2, NS, HV): 64 columns a CTA.
constexpr int kComposeSmem = 4 * 2 * kD * 64;

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_compose_fwd(const float* __restrict__ all_p, const float* __restrict__ all_q,
                const int* __restrict__ comp_off, const int* __restrict__ comp_idx,
                float* __restrict__ start, int HV) {
	extern __shared__ float smem[];
	float* S = smem;          // [128][64]
	float* S2 = S + kD * 64;  // [128][64]
	const int c0 = blockIdx.x * 64, seg = blockIdx.y, h = blockIdx.z;
	for (int e = threadIdx.x; e < kD * 64; e += kThreads) S[e] = 0.f;
	__syncthreads();
	for (int x = comp_off[seg]; x < comp_off[seg + 1]; ++x) {
		const long long base = ((long long)comp_idx[x] * HV + h) * kD * kD;
		const float* P = all_p + base;
		const float* Q = all_q + base;
		for (int e = threadIdx.x; e < kD * 64; e += kThreads) {
			const int k = e / 64, cc = e % 64;
			float s = 0.f;
			for (int m = 0; m < kD; ++m) s = fmaf(P[k * kD + m], S[m * 64 + cc], s);
			S2[e] = s + Q[k * kD + c0 + cc];
		}
		__syncthreads();
		for (int e = threadIdx.x; e < kD * 64; e += kThreads) S[e] = S2[e];
		__syncthreads();
	}
	float* out = start + ((long long)seg * HV + h) * kD * kD;
	for (int e = threadIdx.x; e < kD * 64; e += kThreads) {
		const int k = e / 64, cc = e % 64;
		out[k * kD + c0 + cc] = S[e];
	}
}

// ---- output ---------------------------------------------------------------------------------------
// Per (chunk, value head): O = scale ((Q e^gamma) H + (Q K^T e^(gamma_i - gamma_j), j <= i) V'),
// with q, k the l2-normalised rows and H the state at the chunk's start; written bf16 [Tr, HV, 128].
constexpr int kOutputSmem = 4 * (kC * kD + kC * kD + kC * kC + kD * kD + kC);

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_output_fwd(const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ gcum,
               const float* __restrict__ vnew, const float* __restrict__ h_state,
               const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
               __nv_bfloat16* __restrict__ o, int HQK, int HV, float scale) {
	extern __shared__ float smem[];
	float* Qs = smem;             // [64][128]
	float* KV = Qs + kC * kD;     // [64][128]: k, then V'
	float* P = KV + kC * kD;      // [64][64]
	float* H = P + kC * kC;       // [128][128]
	float* gam = H + kD * kD;     // [64]
	const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int qh = h / (HV / HQK);
	if (tid < kC) gam[tid] = tid < n ? gcum[(long long)(t0 + tid) * HV + h] : 0.f;
	for (int e = tid; e < kC * kD; e += kThreads) {
		const int i = e / kD, d = e % kD;
		const long long o2 = ((long long)(t0 + i) * HQK + qh) * kD + d;
		Qs[e] = i < n ? qn[o2] : 0.f;
		KV[e] = i < n ? kn[o2] : 0.f;
	}
	const float* hc = h_state + ((long long)c * HV + h) * kD * kD;
	for (int e = tid; e < kD * kD; e += kThreads) H[e] = hc[e];
	__syncthreads();
	for (int e = tid; e < kC * kC; e += kThreads) {
		const int i = e / kC, j = e % kC;
		float val = 0.f;
		if (j <= i && i < n) {
			float dot = 0.f;
			for (int d = 0; d < kD; ++d) dot = fmaf(Qs[i * kD + d], KV[j * kD + d], dot);
			val = dot * expf(gam[i] - gam[j]);
		}
		P[e] = val;
	}
	__syncthreads();
	for (int e = tid; e < kC * kD; e += kThreads) {
		const int i = e / kD, d = e % kD;
		KV[e] = i < n ? vnew[((long long)(t0 + i) * HV + h) * kD + d] : 0.f;
	}
	__syncthreads();
	for (int e = tid; e < kC * kD; e += kThreads) {
		const int i = e / kD, d = e % kD;
		if (i >= n) continue;
		float inter = 0.f;
		for (int k = 0; k < kD; ++k) inter = fmaf(Qs[i * kD + k], H[k * kD + d], inter);
		float intra = 0.f;
		for (int j = 0; j <= i; ++j) intra = fmaf(P[i * kC + j], KV[j * kD + d], intra);
		const float val = scale * fmaf(expf(gam[i]), inter, intra);
		o[((long long)(t0 + i) * HV + h) * kD + d] = __float2bfloat16_rn(val);
	}
}

}  // namespace fwd
}  // namespace gdnkcp
