// gdn_bwd.cu: the chunked Gated DeltaNet backward over one rank's buffer (DESIGN.md §3 steps 5-8,
// docs/gpu-backward.md), first version: fp32 arithmetic on the CUDA cores.
//
// As in gdn_fwd.cu, every intermediate is fp32 and every reduction runs in one fixed sequential
// order per output element, so the results are bitwise reproducible; an element's value never
// depends on the grid or on which thread computes it; no atomics. The walks (offset, tape) give
// identical bits at vh 64 and vh 128: every column of D and dV' is computed from that column alone
// by the same sequence of operations at both widths. Products are written as explicit fmaf chains
// (no a*b+c the compiler could contract one way on the GPU and another way elsewhere).
//
// Shapes (K = V = 128, chunk C = 64), tables and buffers as in gdn_fwd.cu: a rank holds Tr tokens in
// NS segments and NC chunks; int32 chunk_tok0[NC], chunk_len[NC] (1..64), seg_chunk0[NS],
// seg_nchunk[NS], seg_start[NS], seg_len[NS], tok_seg[Tr]. Value head h reads QK head
// qh = h / (HV / HQK). From the forward: qn, kn fp32 [Tr, HQK, 128] (normalised q, k), q_rstd,
// k_rstd fp32 [Tr, HQK], gcum fp32 [Tr, HV] (gamma), w, kt, vnew fp32 [Tr, HV, 128], h fp32
// [NC, HV, 128, 128] (state at each chunk's start, K x V row-major), beta fp32 [Tr, HV], v bf16 rows
// of stride v_stride. dout (dO) is bf16 [Tr, HV, 128]. Rows past a short chunk's end are neither
// read nor written.
//
// Entries (block 256 threads for all; dynamic shared memory in bytes):
//   gdn_dvlocal_bwd      grid (NC, HV)                        kDvlSmem  = 82688
//   gdn_offset_walk      grid (2*128/vh, nlist, HV)           bwd_walk_smem(vh)
//   gdn_tape_walk        grid (128/vh, NS, HV)                bwd_walk_smem(vh)
//   gdn_chunk_grads      grid (NC, HV)                        kGradSmem = 186368
//   gdn_qk_bwd           grid ceil(T*HQK*2 / 8)               0
//   gdn_conv1d_silu_bwd  grid (NC, ceil(C/256))               0
//   gdn_dw_reduce        grid ceil(n/256)                     0
//   gdn_add_rows         grid (ndst, ceil(C/256))             0
//   gdn_f32_to_bf16      any grid (grid-stride)               0
// bwd_walk_smem(vh) = 4 * (128*vh + 2*64*vh + 64*128 + 2*64) = 98816 (vh 64) or 164352 (vh 128).
// The reverse compose between the two walks is gdn_compose_fwd itself (gdn_fwd.cu).
//
// ABI (parameters in order; fp32 unless said otherwise):
//   gdn_dvlocal_bwd(qn, kn, gcum, dout bf16, chunk_tok0, chunk_len, dvl, int HQK, int HV, float scale)
//     dvl [Tr, HV, 128]:  dvl_j = scale * sum_{i=j..n-1} (q_i . k_j) e^(gamma_i - gamma_j) dO_i.
//   gdn_offset_walk(w, kt, qn, gcum, dvl, dout bf16, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk,
//                   list, out_pt, out_r, int HQK, int HV, int vh, float scale)
//     blockIdx.x < 128/vh: columns [c0, c0+vh) of R (from D = 0); else the same columns of Pᵀ (from
//     the identity's columns, no dO/dvl terms). Chunks of segment list[blockIdx.y] in reverse:
//       dV' = dvl + Kt D;  D <- e^(gamma_last) D + scale Qgᵀ dO - Wᵀ dV'   (Qg_i = q_i e^(gamma_i))
//     out_pt, out_r: [nlist, HV, 128, 128].
//   gdn_tape_walk(w, kt, qn, gcum, dvl, dout bf16, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk,
//                 dend, d_chunk, dvnew, dstart, int HQK, int HV, int vh, float scale)
//     From D = dend[seg], chunks in reverse: d_chunk[c] = D (adjoint at the chunk's end), then dV'
//     (written to dvnew [Tr, HV, 128]) and the D update above; dstart[seg] = D at the end.
//     dend, dstart [NS, HV, 128, 128]; d_chunk [NC, HV, 128, 128].
//   gdn_chunk_grads(qn, kn, v bf16, int v_stride, gcum, beta, h, vnew, d_chunk, dvnew, dout bf16,
//                   chunk_tok0, chunk_len, dqv, dkv, dv, int dv_stride, dg, dbeta, int HQK, int HV,
//                   float scale)
//     dqv, dkv [Tr, HV, 128] (w.r.t. the normalised q, k, per value head); dv at
//     dv + t*dv_stride + h*128; dg (reverse in-chunk cumsum of dgamma), dbeta [Tr, HV].
//   gdn_qk_bwd(dqv, dkv, qn, kn, q_rstd, k_rstd, dq, dk, int dq_stride, int T, int HQK, int HV,
//              int l2norm)
//     dq[t*dq_stride + qh*128 + d] (dk alike) = l2norm backward of the sum over the QK head's value
//     heads (ascending).
//   gdn_conv1d_silu_bwd(x bf16, conv_w bf16, halo bf16, seg_start, seg_len, tok_seg, chunk_tok0,
//                       chunk_len, dy, dx, dhalo, dw_part, int T, int C, int NS, int NC)
//     dy, dx [T, C]; dhalo [NS, 3, C]; dw_part [NC, C, 4].
//   gdn_dw_reduce(dw_part, int NC, int n, dw)             dw[e] = sum_c dw_part[c*n + e]
//   gdn_add_rows(dst, int dst_stride, src, int src_stride, dst_row int*, off int*, src_row int*,
//                int ndst, int C)                         dst[dst_row[d]] += src[src_row[x]], x in order
//   gdn_f32_to_bf16(src, dst bf16, u64 n)                 round to nearest even
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gdn_fwd.cu"

namespace gdnkcp {
namespace bwd {

using fwd::kC;
using fwd::kD;
using fwd::kThreads;
using fwd::ld_bf16;

constexpr int kP = kD + 1;   // padded row of a [rows][128] tile: rows read across lanes hit distinct banks
constexpr int kCP = kC + 1;  // padded row of a [64][64] tile read the same way
constexpr int kWarps = kThreads / 32;

// warp_sum adds x over the 32 lanes by a fixed butterfly; every lane gets the same bits (a + b and
// b + a round alike). All 32 lanes must call it.
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
	for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
	return x;
}

// ---- dV'_local ----------------------------------------------------------------------------------
// Per (chunk, value head): P_ij = (q_i . k_j) e^(gamma_i - gamma_j) for j <= i (as gdn_output_fwd
// builds it), then dvl_j = scale * sum_{i=j..n-1} P_ij dO_i (i ascending).
// Per (chunk, head): ~1.06 MFLOP (P and P^T dO, 2*128*n(n+1)/2 each); reads 64 KiB of q, k, 16 KiB
// of dO and 256 B of gamma; writes 32 KiB.
constexpr int kDvlSmem = 4 * (2 * kC * kP + kC * kC + kC);
static_assert(kDvlSmem == 82688, "kDvlSmem: keep the header, docs and kcp/gpu_bwd_abi.go in step");

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_dvlocal_bwd(const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ gcum,
                const __nv_bfloat16* __restrict__ dout, const int* __restrict__ chunk_tok0,
                const int* __restrict__ chunk_len, float* __restrict__ dvl, int HQK, int HV, float scale) {
	extern __shared__ float smem[];
	float* Qs = smem;          // [64][kP]: q, then dO
	float* Ks = Qs + kC * kP;  // [64][kP]
	float* P = Ks + kC * kP;   // [64][64]
	float* gam = P + kC * kC;  // [64]
	const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int qh = h / (HV / HQK);
	for (int e = tid; e < n * kD; e += kThreads) {
		const int i = e / kD, d = e % kD;
		const long long o = ((long long)(t0 + i) * HQK + qh) * kD + d;
		Qs[i * kP + d] = qn[o];
		Ks[i * kP + d] = kn[o];
	}
	if (tid < n) gam[tid] = gcum[(long long)(t0 + tid) * HV + h];
	__syncthreads();
	// P, rows i < n (a warp shares i: q broadcast, k rows on distinct banks).
	for (int e = tid; e < n * kC; e += kThreads) {
		const int i = e / kC, j = e % kC;
		float val = 0.f;
		if (j <= i) {
			float dot = 0.f;
			for (int d = 0; d < kD; ++d) dot = fmaf(Qs[i * kP + d], Ks[j * kP + d], dot);
			val = dot * expf(gam[i] - gam[j]);
		}
		P[e] = val;
	}
	__syncthreads();
	for (int e = tid; e < n * kD; e += kThreads) {
		const int i = e / kD, d = e % kD;
		Qs[i * kP + d] = ld_bf16(dout + ((long long)(t0 + i) * HV + h) * kD + d);
	}
	__syncthreads();
	for (int e = tid; e < n * kD; e += kThreads) {
		const int j = e / kD, d = e % kD;
		float s = 0.f;
		for (int i = j; i < n; ++i) s = fmaf(P[i * kC + j], Qs[i * kP + d], s);
		dvl[((long long)(t0 + j) * HV + h) * kD + d] = scale * s;
	}
}

// ---- the backward walks -------------------------------------------------------------------------
// One CTA walks one segment's chunks in reverse for one value head over vh columns of the adjoint D
// (128 x vh). Per chunk, with the chunk's Kt, W and q staged one after the other in one [64][128]
// slot (so vh 64 fits two CTAs an SM):
//   dV'[i][c] = dvl[i][c] + sum_k Kt[i][k] D[k][c]                      (k ascending; 0 for Pᵀ)
//   D[k][c]   = e^(gamma_last) D[k][c] - sum_i W[i][k] dV'[i][c]         (fmaf chain, i ascending)
//   D[k][c]  += sum_i (scale e^(gamma_i) q[i][k]) dO[i][c]              (same chain on; not for Pᵀ)
// Every element is one sequential chain in this order, the same for any vh.
// Per chunk and CTA (vh columns): R / tape 3*2*64*128*vh flops (6.3 MFLOP a chunk and head), Pᵀ
// 2*2*64*128*vh; reads 96 KiB (Kt, W, q) + 64*vh*6 B (dvl, dO) per CTA; the tape walk also writes
// 64*vh*4 B of dV' and 128*vh*4 B of D.
__host__ __device__ constexpr int bwd_walk_smem(int vh) { return 4 * (kD * vh + 2 * kC * vh + kC * kD + 2 * kC); }
static_assert(bwd_walk_smem(64) == 98816 && bwd_walk_smem(128) == 164352,
              "bwd_walk_smem: keep the header, docs and kcp/gpu_bwd_abi.go in step");

template <int VH>
struct BWalk {
	float* D;   // [128][VH] the adjoint columns
	float* dV;  // [64][VH]  dvl, then dV'
	float* dO;  // [64][VH]  dO columns, fp32
	float* M;   // [64][128] Kt, then W, then scale e^gamma q
	float* sc;  // [64]      scale e^(gamma_i)
	float* gl;  // [64]      gl[0] = gamma_last

	__device__ explicit BWalk(float* smem)
	    : D(smem), dV(D + kD * VH), dO(dV + kC * VH), M(dO + kC * VH), sc(M + kC * kD), gl(sc + kC) {}

	// step moves D from chunk (t0, n)'s end to its start. withDO: the R / tape form (dvl, dO and q
	// terms), else the Pᵀ form. dvnew != nullptr: dV' rows are written there. Forced inline: as a
	// call (the offset walk's two forms) ptxas spilled around it on sm_90a.
	__device__ __forceinline__ void step(const float* w, const float* kt, const float* qn, const float* gcum, const float* dvl,
	                     const __nv_bfloat16* dout, float* dvnew, int t0, int n, int h, int HQK, int HV, int c0,
	                     float scale, bool withDO) {
		const int tid = threadIdx.x;
		const int qh = h / (HV / HQK);
		for (int e = tid; e < n * kD; e += kThreads) {
			const int i = e / kD, d = e % kD;
			M[e] = kt[((long long)(t0 + i) * HV + h) * kD + d];
		}
		if (withDO) {
			for (int e = tid; e < n * VH; e += kThreads) {
				const int i = e / VH, cc = e % VH;
				const long long o = ((long long)(t0 + i) * HV + h) * kD + c0 + cc;
				dV[e] = dvl[o];
				dO[e] = ld_bf16(dout + o);
			}
			if (tid < n) sc[tid] = scale * expf(gcum[(long long)(t0 + tid) * HV + h]);
		}
		if (tid == 0) gl[0] = gcum[(long long)(t0 + n - 1) * HV + h];
		__syncthreads();
		// dV' = dvl + Kt D (a warp shares i: Kt broadcast, D consecutive).
		for (int e = tid; e < n * VH; e += kThreads) {
			const int i = e / VH, cc = e % VH;
			float s = withDO ? dV[e] : 0.f;
			for (int k = 0; k < kD; ++k) s = fmaf(M[i * kD + k], D[k * VH + cc], s);
			dV[e] = s;
			if (dvnew != nullptr) dvnew[((long long)(t0 + i) * HV + h) * kD + c0 + cc] = s;
		}
		__syncthreads();
		for (int e = tid; e < n * kD; e += kThreads) {
			const int i = e / kD, d = e % kD;
			M[e] = w[((long long)(t0 + i) * HV + h) * kD + d];
		}
		__syncthreads();
		const float decay = expf(gl[0]);
		for (int e = tid; e < kD * VH; e += kThreads) {
			const int k = e / VH, cc = e % VH;
			float s = decay * D[e];
			for (int i = 0; i < n; ++i) s = fmaf(-M[i * kD + k], dV[i * VH + cc], s);
			D[e] = s;
		}
		__syncthreads();
		if (withDO) {
			for (int e = tid; e < n * kD; e += kThreads) {
				const int i = e / kD, d = e % kD;
				M[e] = qn[((long long)(t0 + i) * HQK + qh) * kD + d] * sc[i];
			}
			__syncthreads();
			for (int e = tid; e < kD * VH; e += kThreads) {
				const int k = e / VH, cc = e % VH;
				float s = D[e];
				for (int i = 0; i < n; ++i) s = fmaf(M[i * kD + k], dO[i * VH + cc], s);
				D[e] = s;
			}
			__syncthreads();
		}
	}
};

// Offset walk over a walk list: grid.x < 128/vh are R tiles (D from zero, with dvl and dO), the
// rest Pᵀ tiles (D from the identity's columns). out_pt, out_r: [nlist, HV, 128, 128].
template <int VH>
__device__ __forceinline__ void offset_walk(const float* w, const float* kt, const float* qn, const float* gcum, const float* dvl,
                            const __nv_bfloat16* dout, const int* chunk_tok0, const int* chunk_len,
                            const int* seg_chunk0, const int* seg_nchunk, const int* list, float* out_pt,
                            float* out_r, int HQK, int HV, float scale) {
	extern __shared__ float smem[];
	BWalk<VH> wk(smem);
	const int tiles = kD / VH;
	const bool isP = (int)blockIdx.x >= tiles;
	const int c0 = (isP ? (int)blockIdx.x - tiles : (int)blockIdx.x) * VH;
	const int li = blockIdx.y, h = blockIdx.z;
	const int seg = list[li];
	for (int e = threadIdx.x; e < kD * VH; e += kThreads) {
		const int k = e / VH, cc = e % VH;
		wk.D[e] = (isP && k == c0 + cc) ? 1.f : 0.f;
	}
	__syncthreads();
	const int ch0 = seg_chunk0[seg], nch = seg_nchunk[seg];
	for (int c = ch0 + nch - 1; c >= ch0; --c)
		wk.step(w, kt, qn, gcum, dvl, dout, nullptr, chunk_tok0[c], chunk_len[c], h, HQK, HV, c0, scale, !isP);
	float* out = (isP ? out_pt : out_r) + ((long long)li * HV + h) * kD * kD;
	for (int e = threadIdx.x; e < kD * VH; e += kThreads) {
		const int k = e / VH, cc = e % VH;
		out[k * kD + c0 + cc] = wk.D[e];
	}
}

// __launch_bounds__(kThreads, 1): under the bare (kThreads) ptxas held this kernel to 40-48 registers
// and spilled 40-48 bytes inside the chunk loop (13.0 on sm_90a: 48 registers, 40 bytes; 11.8 on
// sm_90: 40, 48); with a minimum of one CTA an SM, 11.8 takes 78 registers and spills nothing (the
// shared memory allows at most two CTAs an SM at vh 64 anyway). The arithmetic is the same fmaf chains,
// so the bits do not change.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
gdn_offset_walk(const float* __restrict__ w, const float* __restrict__ kt, const float* __restrict__ qn,
                const float* __restrict__ gcum, const float* __restrict__ dvl, const __nv_bfloat16* __restrict__ dout,
                const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
                const int* __restrict__ seg_chunk0, const int* __restrict__ seg_nchunk, const int* __restrict__ list,
                float* __restrict__ out_pt, float* __restrict__ out_r, int HQK, int HV, int vh, float scale) {
	if (vh == 64)
		offset_walk<64>(w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list, out_pt,
		                out_r, HQK, HV, scale);
	else
		offset_walk<128>(w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list, out_pt,
		                 out_r, HQK, HV, scale);
}

// Tape walk: every segment from its true terminal adjoint dend ([NS, HV, 128, 128]); per chunk (in
// reverse) it stores D at the chunk's end (d_chunk: [NC, HV, 128, 128]), then writes dV' ([Tr, HV,
// 128]) and moves D to the chunk's start; dstart ([NS, HV, 128, 128]) gets D at the segment's start.
template <int VH>
__device__ __forceinline__ void tape_walk(const float* w, const float* kt, const float* qn, const float* gcum, const float* dvl,
                          const __nv_bfloat16* dout, const int* chunk_tok0, const int* chunk_len,
                          const int* seg_chunk0, const int* seg_nchunk, const float* dend, float* d_chunk,
                          float* dvnew, float* dstart, int HQK, int HV, float scale) {
	extern __shared__ float smem[];
	BWalk<VH> wk(smem);
	const int c0 = blockIdx.x * VH, seg = blockIdx.y, h = blockIdx.z;
	const float* d0 = dend + ((long long)seg * HV + h) * kD * kD;
	for (int e = threadIdx.x; e < kD * VH; e += kThreads) {
		const int k = e / VH, cc = e % VH;
		wk.D[e] = d0[k * kD + c0 + cc];
	}
	__syncthreads();
	const int ch0 = seg_chunk0[seg], nch = seg_nchunk[seg];
	for (int c = ch0 + nch - 1; c >= ch0; --c) {
		float* dc = d_chunk + ((long long)c * HV + h) * kD * kD;
		for (int e = threadIdx.x; e < kD * VH; e += kThreads) {
			const int k = e / VH, cc = e % VH;
			dc[k * kD + c0 + cc] = wk.D[e];
		}
		wk.step(w, kt, qn, gcum, dvl, dout, dvnew, chunk_tok0[c], chunk_len[c], h, HQK, HV, c0, scale, true);
	}
	float* ds = dstart + ((long long)seg * HV + h) * kD * kD;
	for (int e = threadIdx.x; e < kD * VH; e += kThreads) {
		const int k = e / VH, cc = e % VH;
		ds[k * kD + c0 + cc] = wk.D[e];
	}
}

// __launch_bounds__(kThreads, 1), as gdn_offset_walk: ptxas 11.8 held the sm_80 build to 48 registers
// and spilled 40 bytes; with it, no spill on any target checked (scripts/nvcc-check.sh).
extern "C" __global__ void __launch_bounds__(kThreads, 1)
gdn_tape_walk(const float* __restrict__ w, const float* __restrict__ kt, const float* __restrict__ qn,
              const float* __restrict__ gcum, const float* __restrict__ dvl, const __nv_bfloat16* __restrict__ dout,
              const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
              const int* __restrict__ seg_chunk0, const int* __restrict__ seg_nchunk, const float* __restrict__ dend,
              float* __restrict__ d_chunk, float* __restrict__ dvnew, float* __restrict__ dstart, int HQK, int HV,
              int vh, float scale) {
	if (vh == 64)
		tape_walk<64>(w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, dend, d_chunk,
		              dvnew, dstart, HQK, HV, scale);
	else
		tape_walk<128>(w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, dend, d_chunk,
		               dvnew, dstart, HQK, HV, scale);
}

// ---- chunk-parallel gradients ---------------------------------------------------------------------
// Per (chunk, value head), gdnref.chunkGrads: with H the state at the chunk's start, D the adjoint at
// its end, dV' the tape walk's, gamma the in-chunk cumsum, eg = e^gamma, tail = e^(gamma_last -
// gamma), bg = beta eg, Γ_ij = e^(gamma_i - gamma_j) (j <= i) and A = (I + L)^-1 rebuilt by
// fwd::chunk_inverse (the forward's bits):
//   1. A; stage dO, V', q                                    (k stays staged throughout)
//   2. G1 = scale (dO V'ᵀ) ⊙ Γ (j <= i),  E = G1 ⊙ (Q Kᵀ)
//   3. dgamma_i += sum_j E_ij,  dgamma_j -= sum_i E_ij;  dq = G1 K,  dk = G1ᵀ Q
//   4. H, D by quarters of 32 rows: dQg = scale dO Hᵀ:  dq += eg dQg,  dgamma_i += dQg_i . Qg_i;
//      dKt = V' Dᵀ:  dk += tail dKt,  s_i = dKt_i . Kt_i,  dgamma_i -= s_i;  <D, H>;  dq is written
//   5. H whole, dV': dW = -dV' Hᵀ
//   6. v: XU = Aᵀ dV':  dv = beta XU,  dbeta_i += XU_i . v_i;
//         XW = Aᵀ dW:   dk += bg XW,  r_i = XW_i . k_i,  dbeta_i += eg_i r_i,  dgamma_i += bg_i r_i;
//         dA_ij = beta_j (dV'_i . v_j) + bg_j (dW_i . k_j) on the strict lower triangle (all dL needs)
//   7. M = Aᵀ dA;  dL = -M Aᵀ;  kk = K Kᵀ;  for j < i: F = dL Γ,  dKK = beta_i F,  E2 = dKK kk
//   8. dk += dKK K,  dk += dKKᵀ K (dk is written);  dgamma_i += sum_j E2_ij,  dgamma_j -= sum_i E2_ij,
//      dbeta_i += sum_j F_ij kk_ij
//   9. dgamma_last += sum_i s_i + e^(gamma_last) <D, H>;  dg = reverse in-chunk cumsum of dgamma.
// The products run on register tiles: thread (warp wp, lane) owns rows wp + 8r (r < 8) and columns
// lane + 32c of a [64][128] (c < 4) or [64][64] (c < 2) result, and accumulates each element in one
// fmaf chain over the contraction index ascending. dq and dk live in registers from step 3 on. Row
// dots are a lane-partial chain (columns lane, lane+32, ...) and a warp_sum; the per-row dgamma and
// dbeta terms are kept in shared memory and added up in one fixed order at the end.
// Per (chunk, head): ~17.5 MFLOP; reads 64 KiB of q, k, 16 KiB each of v and dO, 64 KiB of V' and
// dV', 64 KiB of D and 128 KiB of H (read twice: steps 4 and 5); writes 96 KiB (dq, dk, dv) and
// 512 B (dg, dbeta).
constexpr int kGradSmem = 4 * (4 * kC * kP + kC * kC + 2 * kC * kCP + 18 * kC);
static_assert(kGradSmem == 186368, "kGradSmem: keep the header, docs and kcp/gpu_bwd_abi.go in step");
static_assert(3 * kC * kP + 2 * kC * kCP >= kD * kP + 2 * kC * kP, "H [128][kP] must fit X3 and GE");

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_chunk_grads(const float* __restrict__ qn, const float* __restrict__ kn, const __nv_bfloat16* __restrict__ v,
                int v_stride, const float* __restrict__ gcum, const float* __restrict__ beta,
                const float* __restrict__ h_state, const float* __restrict__ vnew, const float* __restrict__ d_chunk,
                const float* __restrict__ dvnew, const __nv_bfloat16* __restrict__ dout,
                const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len, float* __restrict__ dqv,
                float* __restrict__ dkv, float* __restrict__ dv, int dv_stride, float* __restrict__ dg,
                float* __restrict__ dbeta, int HQK, int HV, float scale) {
	extern __shared__ float smem[];
	float* Kb = smem;               // [64][kP] k, all along
	float* A = Kb + kC * kP;        // [64][64] (I + L)^-1, all along
	float* X1 = A + kC * kC;        // [64][kP] dO; dW; A padded [64][kCP]
	float* X2 = X1 + kC * kP;       // [64][kP] V'; dV'; E2 [64][kCP]
	float* X3 = X2 + kC * kP;       // [64][kP] q; H rows 0..63 (H spans X3 and GE); v; F kk [64][kCP]
	float* GE = X3 + kC * kP;       // 2 x [64][kCP]: G1, E; H/D quarters; dA then dKK, M
	float* sv = GE + 2 * kC * kCP;  // per-row scalars
	float* bet = sv;
	float* gam = sv + kC;
	float* eg = sv + 2 * kC;
	float* tail = sv + 3 * kC;
	float* bg = sv + 4 * kC;
	float* row = sv + 5 * kC;   // scratch of chunk_inverse
	float* gt = sv + 6 * kC;    // [7][64] dgamma terms
	float* bt = sv + 13 * kC;   // [3][64] dbeta terms
	float* dgm = sv + 16 * kC;  // [64] dgamma
	float* red = sv + 17 * kC;  // [0, 8) warp partials of <D, H>; [8] the last row's extra term

	const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
	const int wp = tid >> 5, lane = tid & 31;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int qh = h / (HV / HQK);
	const float* hs = h_state + ((long long)c * HV + h) * kD * kD;
	const float* ds = d_chunk + ((long long)c * HV + h) * kD * kD;

	// 1. Stage k, q, dO, V' (rows >= n zero), beta, gamma; build A.
	for (int e = tid; e < kC * kD; e += kThreads) {
		const int i = e / kD, d = e % kD;
		const bool in = i < n;
		const long long oq = ((long long)(t0 + i) * HQK + qh) * kD + d;
		const long long ov = ((long long)(t0 + i) * HV + h) * kD + d;
		Kb[i * kP + d] = in ? kn[oq] : 0.f;
		X3[i * kP + d] = in ? qn[oq] : 0.f;
		X1[i * kP + d] = in ? ld_bf16(dout + ov) : 0.f;
		X2[i * kP + d] = in ? vnew[ov] : 0.f;
	}
	if (tid < kC) {
		bet[tid] = tid < n ? beta[(long long)(t0 + tid) * HV + h] : 0.f;
		gam[tid] = tid < n ? gcum[(long long)(t0 + tid) * HV + h] : 0.f;
	}
	__syncthreads();
	fwd::chunk_inverse(Kb, kP, bet, gam, A, row, n);
	const float glast = gam[n - 1];
	if (tid < kC) {
		const bool in = tid < n;
		const float e = expf(gam[tid]);
		eg[tid] = in ? e : 0.f;
		tail[tid] = in ? expf(glast - gam[tid]) : 0.f;
		bg[tid] = in ? bet[tid] * e : 0.f;
	}
	__syncthreads();

	// 2. G1 and E.
	{
		float* G = GE;
		float* Eb = GE + kC * kCP;
		float ga[8][2], qa[8][2];
#pragma unroll
		for (int r = 0; r < 8; ++r)
#pragma unroll
			for (int cc = 0; cc < 2; ++cc) ga[r][cc] = qa[r][cc] = 0.f;
		for (int d = 0; d < kD; ++d) {
			float bv[2], bk[2];
#pragma unroll
			for (int cc = 0; cc < 2; ++cc) {
				bv[cc] = X2[(lane + 32 * cc) * kP + d];
				bk[cc] = Kb[(lane + 32 * cc) * kP + d];
			}
#pragma unroll
			for (int r = 0; r < 8; ++r) {
				const float a1 = X1[(wp + 8 * r) * kP + d], a2 = X3[(wp + 8 * r) * kP + d];
#pragma unroll
				for (int cc = 0; cc < 2; ++cc) {
					ga[r][cc] = fmaf(a1, bv[cc], ga[r][cc]);
					qa[r][cc] = fmaf(a2, bk[cc], qa[r][cc]);
				}
			}
		}
#pragma unroll
		for (int r = 0; r < 8; ++r) {
			const int i = wp + 8 * r;
#pragma unroll
			for (int cc = 0; cc < 2; ++cc) {
				const int j = lane + 32 * cc;
				float g = 0.f, ev = 0.f;
				if (j <= i && i < n) {
					g = scale * ga[r][cc] * expf(gam[i] - gam[j]);
					ev = g * qa[r][cc];
				}
				G[i * kCP + j] = g;
				Eb[i * kCP + j] = ev;
			}
		}
	}
	__syncthreads();

	// 3. Sums of E; dq = G1 K, dk = G1ᵀ Q in registers.
	float DQ[8][4], DK[8][4];
#pragma unroll
	for (int r = 0; r < 8; ++r)
#pragma unroll
		for (int cc = 0; cc < 4; ++cc) DQ[r][cc] = DK[r][cc] = 0.f;
	{
		const float* G = GE;
		const float* Eb = GE + kC * kCP;
		if (tid < kC) {
			float s = 0.f;
			for (int j = 0; j <= tid; ++j) s += Eb[tid * kCP + j];
			gt[1 * kC + tid] = s;
		} else if (tid < 2 * kC) {
			const int j = tid - kC;
			float s = 0.f;
			for (int i = j; i < n; ++i) s += Eb[i * kCP + j];
			gt[2 * kC + j] = s;
		}
		for (int j = 0; j < n; ++j) {
			float bk[4], bq[4];
#pragma unroll
			for (int cc = 0; cc < 4; ++cc) {
				bk[cc] = Kb[j * kP + lane + 32 * cc];
				bq[cc] = X3[j * kP + lane + 32 * cc];
			}
#pragma unroll
			for (int r = 0; r < 8; ++r) {
				const float aq = G[(wp + 8 * r) * kCP + j], ak = G[j * kCP + wp + 8 * r];
#pragma unroll
				for (int cc = 0; cc < 4; ++cc) {
					DQ[r][cc] = fmaf(aq, bk[cc], DQ[r][cc]);
					DK[r][cc] = fmaf(ak, bq[cc], DK[r][cc]);
				}
			}
		}
	}
	__syncthreads();

	// 4. H and D by quarters (rows 32qq .. 32qq+31): dQg, dKt and <D, H>.
	{
		float* Hq = GE;           // [32][kP]
		float* Dq = GE + 32 * kP;  // [32][kP]
		float pe[8], ps[8];
#pragma unroll
		for (int r = 0; r < 8; ++r) pe[r] = ps[r] = 0.f;
		float dh = 0.f;
#pragma unroll
		for (int qq = 0; qq < 4; ++qq) {
			for (int e = tid; e < 32 * kD; e += kThreads) {
				const int kk = e / kD, vv = e % kD;
				Hq[kk * kP + vv] = hs[(32 * qq + kk) * kD + vv];
				Dq[kk * kP + vv] = ds[(32 * qq + kk) * kD + vv];
			}
			__syncthreads();
			for (int e = tid; e < 32 * kD; e += kThreads) {
				const int kk = e / kD, vv = e % kD;
				dh = fmaf(Dq[kk * kP + vv], Hq[kk * kP + vv], dh);
			}
			float s1[8], s2[8];
#pragma unroll
			for (int r = 0; r < 8; ++r) s1[r] = s2[r] = 0.f;
			for (int vv = 0; vv < kD; ++vv) {
				const float bh = Hq[lane * kP + vv], bd = Dq[lane * kP + vv];
#pragma unroll
				for (int r = 0; r < 8; ++r) {
					s1[r] = fmaf(X1[(wp + 8 * r) * kP + vv], bh, s1[r]);
					s2[r] = fmaf(X2[(wp + 8 * r) * kP + vv], bd, s2[r]);
				}
			}
			const int k = 32 * qq + lane;
#pragma unroll
			for (int r = 0; r < 8; ++r) {
				const int i = wp + 8 * r;
				const float dqg = scale * s1[r];
				DQ[r][qq] = fmaf(eg[i], dqg, DQ[r][qq]);
				pe[r] = fmaf(dqg, X3[i * kP + k], pe[r]);
				DK[r][qq] = fmaf(tail[i], s2[r], DK[r][qq]);
				ps[r] = fmaf(s2[r], Kb[i * kP + k], ps[r]);
			}
			__syncthreads();
		}
#pragma unroll
		for (int r = 0; r < 8; ++r) {
			const int i = wp + 8 * r;
			const float pq = warp_sum(pe[r]), pk = warp_sum(ps[r]);
			if (lane == 0) {
				gt[0 * kC + i] = eg[i] * pq;    // dQg_i . Qg_i
				gt[3 * kC + i] = tail[i] * pk;  // s_i = dKt_i . Kt_i
			}
		}
		dh = warp_sum(dh);
		if (lane == 0) red[wp] = dh;
#pragma unroll
		for (int r = 0; r < 8; ++r) {
			const int i = wp + 8 * r;
			if (i < n) {
#pragma unroll
				for (int cc = 0; cc < 4; ++cc) dqv[((long long)(t0 + i) * HV + h) * kD + lane + 32 * cc] = DQ[r][cc];
			}
		}
	}

	// 5. dW = -dV' Hᵀ with H whole ([128][kP] over X3 and GE), dV' in X2; dW into X1.
	{
		float* Hf = X3;
		for (int e = tid; e < kC * kD; e += kThreads) {
			const int i = e / kD, d = e % kD;
			X2[i * kP + d] = i < n ? dvnew[((long long)(t0 + i) * HV + h) * kD + d] : 0.f;
		}
		for (int e = tid; e < kD * kD; e += kThreads) {
			const int k = e / kD, vv = e % kD;
			Hf[k * kP + vv] = hs[e];
		}
		__syncthreads();
		float s[8][4];
#pragma unroll
		for (int r = 0; r < 8; ++r)
#pragma unroll
			for (int cc = 0; cc < 4; ++cc) s[r][cc] = 0.f;
		for (int vv = 0; vv < kD; ++vv) {
			float bh[4];
#pragma unroll
			for (int cc = 0; cc < 4; ++cc) bh[cc] = Hf[(lane + 32 * cc) * kP + vv];
#pragma unroll
			for (int r = 0; r < 8; ++r) {
				const float a = X2[(wp + 8 * r) * kP + vv];
#pragma unroll
				for (int cc = 0; cc < 4; ++cc) s[r][cc] = fmaf(a, bh[cc], s[r][cc]);
			}
		}
#pragma unroll
		for (int r = 0; r < 8; ++r)
#pragma unroll
			for (int cc = 0; cc < 4; ++cc) X1[(wp + 8 * r) * kP + lane + 32 * cc] = -s[r][cc];
	}
	__syncthreads();

	// 6. v; XU, XW, dA.
	for (int e = tid; e < kC * kD; e += kThreads) {
		const int i = e / kD, d = e % kD;
		X3[i * kP + d] = i < n ? ld_bf16(v + (long long)(t0 + i) * v_stride + h * kD + d) : 0.f;
	}
	__syncthreads();
	{
		// XU = Aᵀ dV' (output row j = wp + 8r): dv = beta XU, dbeta_j += XU_j . v_j.
		float x[8][4];
#pragma unroll
		for (int r = 0; r < 8; ++r)
#pragma unroll
			for (int cc = 0; cc < 4; ++cc) x[r][cc] = 0.f;
		for (int i = 0; i < n; ++i) {
			float b[4];
#pragma unroll
			for (int cc = 0; cc < 4; ++cc) b[cc] = X2[i * kP + lane + 32 * cc];
#pragma unroll
			for (int r = 0; r < 8; ++r) {
				const float a = A[i * kC + wp + 8 * r];
#pragma unroll
				for (int cc = 0; cc < 4; ++cc) x[r][cc] = fmaf(a, b[cc], x[r][cc]);
			}
		}
#pragma unroll
		for (int r = 0; r < 8; ++r) {
			const int j = wp + 8 * r;
			float pb = 0.f;
#pragma unroll
			for (int cc = 0; cc < 4; ++cc) {
				const int d = lane + 32 * cc;
				pb = fmaf(x[r][cc], X3[j * kP + d], pb);
				if (j < n) dv[(long long)(t0 + j) * dv_stride + h * kD + d] = bet[j] * x[r][cc];
			}
			pb = warp_sum(pb);
			if (lane == 0) bt[0 * kC + j] = pb;
		}
	}
	{
		// XW = Aᵀ dW: dk += bg XW; r_j = XW_j . k_j.
		float x[8][4];
#pragma unroll
		for (int r = 0; r < 8; ++r)
#pragma unroll
			for (int cc = 0; cc < 4; ++cc) x[r][cc] = 0.f;
		for (int i = 0; i < n; ++i) {
			float b[4];
#pragma unroll
			for (int cc = 0; cc < 4; ++cc) b[cc] = X1[i * kP + lane + 32 * cc];
#pragma unroll
			for (int r = 0; r < 8; ++r) {
				const float a = A[i * kC + wp + 8 * r];
#pragma unroll
				for (int cc = 0; cc < 4; ++cc) x[r][cc] = fmaf(a, b[cc], x[r][cc]);
			}
		}
#pragma unroll
		for (int r = 0; r < 8; ++r) {
			const int j = wp + 8 * r;
			float pr = 0.f;
#pragma unroll
			for (int cc = 0; cc < 4; ++cc) {
				DK[r][cc] = fmaf(bg[j], x[r][cc], DK[r][cc]);
				pr = fmaf(x[r][cc], Kb[j * kP + lane + 32 * cc], pr);
			}
			pr = warp_sum(pr);
			if (lane == 0) {
				bt[1 * kC + j] = eg[j] * pr;
				gt[4 * kC + j] = bg[j] * pr;
			}
		}
	}
	{
		// dA_ij = beta_j (dV'_i . v_j) + bg_j (dW_i . k_j) for j < i < n, else 0.
		float* dA = GE;
		float s1[8][2], s2[8][2];
#pragma unroll
		for (int r = 0; r < 8; ++r)
#pragma unroll
			for (int cc = 0; cc < 2; ++cc) s1[r][cc] = s2[r][cc] = 0.f;
		for (int d = 0; d < kD; ++d) {
			float bv[2], bk[2];
#pragma unroll
			for (int cc = 0; cc < 2; ++cc) {
				bv[cc] = X3[(lane + 32 * cc) * kP + d];
				bk[cc] = Kb[(lane + 32 * cc) * kP + d];
			}
#pragma unroll
			for (int r = 0; r < 8; ++r) {
				const float a1 = X2[(wp + 8 * r) * kP + d], a2 = X1[(wp + 8 * r) * kP + d];
#pragma unroll
				for (int cc = 0; cc < 2; ++cc) {
					s1[r][cc] = fmaf(a1, bv[cc], s1[r][cc]);
					s2[r][cc] = fmaf(a2, bk[cc], s2[r][cc]);
				}
			}
		}
#pragma unroll
		for (int r = 0; r < 8; ++r) {
			const int i = wp + 8 * r;
#pragma unroll
			for (int cc = 0; cc < 2; ++cc) {
				const int j = lane + 32 * cc;
				dA[i * kCP + j] = (j < i && i < n) ? fmaf(bet[j], s1[r][cc], bg[j] * s2[r][cc]) : 0.f;
			}
		}
	}
	__syncthreads();

	// 7. M = Aᵀ dA (A padded into X1 alongside), then dL = -M Aᵀ, kk, F, dKK, E2.
	{
		float* Ap = X1;
		float* Mb = GE + kC * kCP;
		const float* dA = GE;
		for (int e = tid; e < kC * kC; e += kThreads) Ap[(e / kC) * kCP + e % kC] = A[e];
		float m[8][2];
#pragma unroll
		for (int r = 0; r < 8; ++r)
#pragma unroll
			for (int cc = 0; cc < 2; ++cc) m[r][cc] = 0.f;
		for (int a = 0; a < n; ++a) {
			float b[2];
#pragma unroll
			for (int cc = 0; cc < 2; ++cc) b[cc] = dA[a * kCP + lane + 32 * cc];
#pragma unroll
			for (int r = 0; r < 8; ++r) {
				const float x = A[a * kC + wp + 8 * r];
#pragma unroll
				for (int cc = 0; cc < 2; ++cc) m[r][cc] = fmaf(x, b[cc], m[r][cc]);
			}
		}
#pragma unroll
		for (int r = 0; r < 8; ++r)
#pragma unroll
			for (int cc = 0; cc < 2; ++cc) Mb[(wp + 8 * r) * kCP + lane + 32 * cc] = m[r][cc];
	}
	__syncthreads();
	{
		const float* Ap = X1;
		const float* Mb = GE + kC * kCP;
		float* dKK = GE;  // over dA, read in full before the last barrier
		float* E2 = X2;
		float* FK = X3;
		float l[8][2], kk[8][2];
#pragma unroll
		for (int r = 0; r < 8; ++r)
#pragma unroll
			for (int cc = 0; cc < 2; ++cc) l[r][cc] = kk[r][cc] = 0.f;
		for (int b = 0; b < n; ++b) {
			float ba[2];
#pragma unroll
			for (int cc = 0; cc < 2; ++cc) ba[cc] = Ap[(lane + 32 * cc) * kCP + b];
#pragma unroll
			for (int r = 0; r < 8; ++r) {
				const float am = Mb[(wp + 8 * r) * kCP + b];
#pragma unroll
				for (int cc = 0; cc < 2; ++cc) l[r][cc] = fmaf(am, ba[cc], l[r][cc]);
			}
		}
		for (int d = 0; d < kD; ++d) {
			float bk[2];
#pragma unroll
			for (int cc = 0; cc < 2; ++cc) bk[cc] = Kb[(lane + 32 * cc) * kP + d];
#pragma unroll
			for (int r = 0; r < 8; ++r) {
				const float ak = Kb[(wp + 8 * r) * kP + d];
#pragma unroll
				for (int cc = 0; cc < 2; ++cc) kk[r][cc] = fmaf(ak, bk[cc], kk[r][cc]);
			}
		}
#pragma unroll
		for (int r = 0; r < 8; ++r) {
			const int i = wp + 8 * r;
#pragma unroll
			for (int cc = 0; cc < 2; ++cc) {
				const int j = lane + 32 * cc;
				float x = 0.f, e2 = 0.f, fk = 0.f;
				if (j < i && i < n) {
					const float f = -l[r][cc] * expf(gam[i] - gam[j]);  // F = dL Γ
					x = bet[i] * f;
					e2 = x * kk[r][cc];
					fk = f * kk[r][cc];
				}
				dKK[i * kCP + j] = x;
				E2[i * kCP + j] = e2;
				FK[i * kCP + j] = fk;
			}
		}
	}
	__syncthreads();

	// 8. dk += dKK K + dKKᵀ K, written; the sums of E2 and F kk.
	{
		const float* dKK = GE;
		const float* E2 = X2;
		const float* FK = X3;
		if (tid < kC) {
			float s = 0.f;
			for (int j = 0; j < tid; ++j) s += E2[tid * kCP + j];
			gt[5 * kC + tid] = s;
		} else if (tid < 2 * kC) {
			const int j = tid - kC;
			float s = 0.f;
			for (int i = j + 1; i < n; ++i) s += E2[i * kCP + j];
			gt[6 * kC + j] = s;
		} else if (tid < 3 * kC) {
			const int i = tid - 2 * kC;
			float s = 0.f;
			for (int j = 0; j < i; ++j) s += FK[i * kCP + j];
			bt[2 * kC + i] = s;
		}
#pragma unroll
		for (int pass = 0; pass < 2; ++pass) {
			float x[8][4];
#pragma unroll
			for (int r = 0; r < 8; ++r)
#pragma unroll
				for (int cc = 0; cc < 4; ++cc) x[r][cc] = 0.f;
			for (int j = 0; j < n; ++j) {
				float b[4];
#pragma unroll
				for (int cc = 0; cc < 4; ++cc) b[cc] = Kb[j * kP + lane + 32 * cc];
#pragma unroll
				for (int r = 0; r < 8; ++r) {
					const float a = pass == 0 ? dKK[(wp + 8 * r) * kCP + j] : dKK[j * kCP + wp + 8 * r];
#pragma unroll
					for (int cc = 0; cc < 4; ++cc) x[r][cc] = fmaf(a, b[cc], x[r][cc]);
				}
			}
#pragma unroll
			for (int r = 0; r < 8; ++r)
#pragma unroll
				for (int cc = 0; cc < 4; ++cc) DK[r][cc] += x[r][cc];
		}
#pragma unroll
		for (int r = 0; r < 8; ++r) {
			const int i = wp + 8 * r;
			if (i < n) {
#pragma unroll
				for (int cc = 0; cc < 4; ++cc) dkv[((long long)(t0 + i) * HV + h) * kD + lane + 32 * cc] = DK[r][cc];
			}
		}
	}
	__syncthreads();

	// 9. dgamma and dbeta per row in one fixed order; the last row's extra term; the reverse cumsum.
	if (tid < n) {
		float a = gt[tid];
		a += gt[1 * kC + tid];
		a -= gt[2 * kC + tid];
		a -= gt[3 * kC + tid];
		a += gt[4 * kC + tid];
		a += gt[5 * kC + tid];
		a -= gt[6 * kC + tid];
		dgm[tid] = a;
		dbeta[(long long)(t0 + tid) * HV + h] = (bt[tid] + bt[1 * kC + tid]) + bt[2 * kC + tid];
	}
	if (tid == kC) {
		float s = 0.f;
		for (int i = 0; i < n; ++i) s += gt[3 * kC + i];
		float dhs = 0.f;
		for (int w8 = 0; w8 < kWarps; ++w8) dhs += red[w8];
		red[8] = fmaf(expf(glast), dhs, s);  // sum_i s_i + e^(gamma_last) <D, H>
	}
	__syncthreads();
	if (tid == 0) {
		float acc = 0.f;
		for (int i = n - 1; i >= 0; --i) {
			float x = dgm[i];
			if (i == n - 1) x += red[8];
			acc += x;
			dg[(long long)(t0 + i) * HV + h] = acc;
		}
	}
}

// ---- q, k: sum over value heads and l2norm backward ------------------------------------------------
// One warp per (token, QK head, q|k) row of 128 (lane d = lane + 32i): dy = the HV/HQK value heads'
// rows of the QK head added in ascending order (from 0); with l2norm dx = (dy - y (y . dy)) rstd,
// the dot by a fixed butterfly (warp_sum), else dx = dy. Written at dq + t*dq_stride + qh*128
// (dk alike): core fp32 [Tr, HQK*128]; module the conv's dy (q at column 0, k at HQK*128, stride C).
// Per row: 128 (HV/HQK + 4) flops; reads 512 (HV/HQK + 1) + 4 B; writes 512 B.
extern "C" __global__ void __launch_bounds__(kThreads)
gdn_qk_bwd(const float* __restrict__ dqv, const float* __restrict__ dkv, const float* __restrict__ qn,
           const float* __restrict__ kn, const float* __restrict__ q_rstd, const float* __restrict__ k_rstd,
           float* __restrict__ dq, float* __restrict__ dk, int dq_stride, int T, int HQK, int HV, int l2norm) {
	const long long warp = ((long long)blockIdx.x * kThreads + threadIdx.x) >> 5;
	const int lane = threadIdx.x & 31;
	const long long rows = (long long)T * HQK;
	if (warp >= 2 * rows) return;  // whole warps
	const bool isk = warp >= rows;
	const long long r = isk ? warp - rows : warp;
	const long long t = r / HQK;
	const int qh = (int)(r % HQK);
	const int grp = HV / HQK;
	const float* src = isk ? dkv : dqv;
	float dy[4] = {0.f, 0.f, 0.f, 0.f};
	for (int j = 0; j < grp; ++j) {
		const float* p = src + (t * HV + (long long)qh * grp + j) * kD;
#pragma unroll
		for (int i = 0; i < 4; ++i) dy[i] += p[lane + 32 * i];
	}
	float out[4];
	if (l2norm) {
		const float* y = (isk ? kn : qn) + r * kD;
		const float rstd = (isk ? k_rstd : q_rstd)[r];
		float yv[4];
		float p = 0.f;
#pragma unroll
		for (int i = 0; i < 4; ++i) {
			yv[i] = y[lane + 32 * i];
			p = fmaf(yv[i], dy[i], p);
		}
		p = warp_sum(p);
#pragma unroll
		for (int i = 0; i < 4; ++i) out[i] = fmaf(-yv[i], p, dy[i]) * rstd;
	} else {
#pragma unroll
		for (int i = 0; i < 4; ++i) out[i] = dy[i];
	}
	float* dst = (isk ? dk : dq) + t * dq_stride + (long long)qh * kD;
#pragma unroll
	for (int i = 0; i < 4; ++i) dst[lane + 32 * i] = out[i];
}

// ---- conv1d + SiLU backward -------------------------------------------------------------------------
// One thread per (chunk, channel c), walking the chunk's segment positions p = p0 .. p0+n+2 in order:
// pre_p is recomputed exactly as the forward conv (fmaf chain over taps 0..3 from 0, x' = the halo
// before the segment's start), s = 1 / (1 + expf(-pre)), dpre_p = dy_p s (1 + pre (1 - s)) (the
// last factor one fmaf), for p < len (the positions past the chunk feed its dx only).
//   dx_p    = sum_{i=0..3, p+3-i < len} w_i dpre_{p+3-i}           (fmaf chain, i ascending)
//   dw_part = sum_{p in chunk, ascending} dpre_p x'_{p-3+i}          (fmaf chain per tap)
//   dhalo[seg][j] = sum_{i=0..j, j-i < len} w_i dpre_{j-i}  (j = 0..2; the segment's first chunk
//   writes all three rows)
// Per (chunk, channel): ~30 flops and one expf per position (n+3 positions); reads (n+3) * 6 B
// (x bf16, dy fp32) + 8 B of taps; writes n * 4 + 16 B (+ 12 B of dhalo).
__device__ __forceinline__ float conv_in(const __nv_bfloat16* x, const __nv_bfloat16* halo, int start, int seg,
                                         int q, int C, int c) {
	return q >= 0 ? ld_bf16(x + (long long)(start + q) * C + c) : ld_bf16(halo + ((long long)seg * 3 + (q + 3)) * C + c);
}

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_conv1d_silu_bwd(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ conv_w,
                    const __nv_bfloat16* __restrict__ halo, const int* __restrict__ seg_start,
                    const int* __restrict__ seg_len, const int* __restrict__ tok_seg,
                    const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
                    const float* __restrict__ dy, float* __restrict__ dx, float* __restrict__ dhalo,
                    float* __restrict__ dw_part, int T, int C, int NS, int NC) {
	const int ch = blockIdx.x;
	const int c = blockIdx.y * kThreads + threadIdx.x;
	if (ch >= NC || c >= C) return;
	const int t0 = chunk_tok0[ch], n = chunk_len[ch];
	if (t0 < 0 || n <= 0 || t0 + n > T) return;  // the host validates the tables
	const int seg = tok_seg[t0];
	if (seg < 0 || seg >= NS) return;
	const int start = seg_start[seg], len = seg_len[seg];
	const int p0 = t0 - start;
	if (p0 < 0 || p0 + n > len) return;
	const float w0 = ld_bf16(conv_w + (long long)c * 4 + 0), w1 = ld_bf16(conv_w + (long long)c * 4 + 1);
	const float w2 = ld_bf16(conv_w + (long long)c * 4 + 2), w3 = ld_bf16(conv_w + (long long)c * 4 + 3);
	// x'_{p-3}, x'_{p-2}, x'_{p-1} for the next p.
	float xm3 = conv_in(x, halo, start, seg, p0 - 3, C, c);
	float xm2 = conv_in(x, halo, start, seg, p0 - 2, C, c);
	float xm1 = conv_in(x, halo, start, seg, p0 - 1, C, c);
	float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;  // dpre_{p-3}, dpre_{p-2}, dpre_{p-1}, dpre_p
	float dw0 = 0.f, dw1 = 0.f, dw2 = 0.f, dw3 = 0.f;
	float h0 = 0.f, h1 = 0.f, h2 = 0.f;  // dpre_0, dpre_1, dpre_2 (first chunk)
	for (int p = p0; p < p0 + n + 3; ++p) {
		d0 = d1;
		d1 = d2;
		d2 = d3;
		float xc = 0.f, dp = 0.f;
		if (p < len) {
			xc = conv_in(x, halo, start, seg, p, C, c);
			float acc = 0.f;
			acc = fmaf(w0, xm3, acc);
			acc = fmaf(w1, xm2, acc);
			acc = fmaf(w2, xm1, acc);
			acc = fmaf(w3, xc, acc);
			const float s = 1.0f / (1.0f + expf(-acc));
			dp = dy[(long long)(start + p) * C + c] * s * fmaf(acc, 1.0f - s, 1.0f);
			if (p < p0 + n) {
				dw0 = fmaf(dp, xm3, dw0);
				dw1 = fmaf(dp, xm2, dw1);
				dw2 = fmaf(dp, xm1, dw2);
				dw3 = fmaf(dp, xc, dw3);
			}
			if (p == 0) h0 = dp;
			if (p == 1) h1 = dp;
			if (p == 2) h2 = dp;
		}
		d3 = dp;
		const int q = p - 3;  // dx_q needs dpre_q .. dpre_{q+3}
		if (q >= p0) {
			float acc = 0.f;
			if (p < len) acc = fmaf(w0, d3, acc);
			if (p - 1 < len) acc = fmaf(w1, d2, acc);
			if (p - 2 < len) acc = fmaf(w2, d1, acc);
			acc = fmaf(w3, d0, acc);  // q < len: q is in the chunk
			dx[(long long)(start + q) * C + c] = acc;
		}
		xm3 = xm2;
		xm2 = xm1;
		xm1 = xc;
	}
	float* dwp = dw_part + ((long long)ch * C + c) * 4;
	dwp[0] = dw0;
	dwp[1] = dw1;
	dwp[2] = dw2;
	dwp[3] = dw3;
	if (p0 == 0) {
		float* dh = dhalo + (long long)seg * 3 * C + c;
		float a0 = 0.f;
		a0 = fmaf(w0, h0, a0);  // j = 0: p = 0 (len >= 1)
		float a1 = 0.f;
		if (1 < len) a1 = fmaf(w0, h1, a1);
		a1 = fmaf(w1, h0, a1);
		float a2 = 0.f;
		if (2 < len) a2 = fmaf(w0, h2, a2);
		if (1 < len) a2 = fmaf(w1, h1, a2);
		a2 = fmaf(w2, h0, a2);
		dh[0] = a0;
		dh[(long long)C] = a1;
		dh[2 * (long long)C] = a2;
	}
}

// ---- small reductions and conversions -----------------------------------------------------------
// dw[e] = sum_{c=0..NC-1} dw_part[c*n + e] (c ascending, from 0), one thread an element. Per
// element: NC adds; reads 4 NC B, writes 4 B.
extern "C" __global__ void __launch_bounds__(kThreads)
gdn_dw_reduce(const float* __restrict__ dw_part, int NC, int n, float* __restrict__ dw) {
	const int e = blockIdx.x * kThreads + threadIdx.x;
	if (e >= n) return;
	float s = 0.f;
	for (int c = 0; c < NC; ++c) s += dw_part[(long long)c * n + e];
	dw[e] = s;
}

// For destination d (blockIdx.x) and column col: dst[dst_row[d]][col] += src[src_row[x]][col] for
// x = off[d] .. off[d+1]-1 in order, one running fp32 sum from dst's value. Rows have strides
// dst_stride, src_stride (elements). Per destination element: off[d+1]-off[d] adds.
extern "C" __global__ void __launch_bounds__(kThreads)
gdn_add_rows(float* __restrict__ dst, int dst_stride, const float* __restrict__ src, int src_stride,
             const int* __restrict__ dst_row, const int* __restrict__ off, const int* __restrict__ src_row, int ndst,
             int C) {
	const int d = blockIdx.x;
	const int col = blockIdx.y * kThreads + threadIdx.x;
	if (d >= ndst || col >= C) return;
	float* p = dst + (long long)dst_row[d] * dst_stride + col;
	float acc = *p;
	for (int x = off[d]; x < off[d + 1]; ++x) acc += src[(long long)src_row[x] * src_stride + col];
	*p = acc;
}

// bf16_bits is bf16(x) rounded to nearest even, as its 16 bits.
__device__ __forceinline__ unsigned long long bf16_bits(float x) {
	return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

// dst[i] = bf16(src[i]) rounded to nearest even (NaN -> canonical 0x7fff), any grid (grid-stride). With src
// 16-byte and dst 8-byte aligned (every cuMemAlloc buffer) it moves four elements a thread and step: one
// 16-byte load, one 8-byte store (the scalar loop took 0.71 ms for dq, dk, dv at 32K tokens, ~2.8 TB/s);
// the last n % 4 elements, or all of them when misaligned, go one at a time. The same rounding either way.
extern "C" __global__ void __launch_bounds__(kThreads)
gdn_f32_to_bf16(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst, unsigned long long n) {
	const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
	const unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
	const bool vec = ((reinterpret_cast<unsigned long long>(src) & 15) | (reinterpret_cast<unsigned long long>(dst) & 7)) == 0;
	const unsigned long long nq = vec ? n / 4 : 0;
	for (unsigned long long q = tid; q < nq; q += stride) {
		const float4 f = reinterpret_cast<const float4*>(src)[q];
		reinterpret_cast<unsigned long long*>(dst)[q] =
		    bf16_bits(f.x) | bf16_bits(f.y) << 16 | bf16_bits(f.z) << 32 | bf16_bits(f.w) << 48;
	}
	for (unsigned long long i = 4 * nq + tid; i < n; i += stride) dst[i] = __float2bfloat16_rn(src[i]);
}

}  // namespace bwd
}  // namespace gdnkcp
