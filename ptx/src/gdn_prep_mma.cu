// gdn_prep_mma.cu (checked on the CPU emulator and on the H200; docs/perf-notes.md has its times): the
// forward chunk prep on mma.sync m16n8k16 (bf16 in, fp32 accumulate), v4 of the prep. Same arguments,
// grid and outputs as gdn_prep_fwd of gdn_fwd.cu:
//   gdn_prep_mma   grid (NC, HV), 256 threads, dynamic shared memory kPrepMMASmem = 100096
// Per (chunk, value head): gamma = in-chunk cumsum of g; L_ij = beta_i (k_i . k_j) e^(gamma_i - gamma_j)
// for j < i; A = (I + L)^-1; W = A diag(beta e^gamma) K; U = A diag(beta) V; Kt = diag(e^(gamma_last -
// gamma)) K; gcum, w, u, kt fp32, and where wp / wk are given the walk planes of -W (a value head: P5's warps
// store them from their W accumulators) and of K^T (a QK head, by its first value head's CTA, from KF in P1)
// (walk_planes.cuh; w may then be null). Rows past a short chunk's end are
// neither read nor written (the planes' are written as zero). kt may be
// null: then Kt is not computed nor stored, and gcum, w and u are the same bits (the v5 forward, whose
// walks gdn_summary_walk_mma16 / gdn_state_walk_mma16 rebuild Kt from kn and gcum with this expression). The block
// index is read linearly with the head fastest (c = lin / HV, h = lin % HV, lin = blockIdx.y * NC +
// blockIdx.x): the HV / HQK value heads that read the same k rows run back to back and find them in L2.
//
// ---- The data flow: five block barriers ----------------------------------------------------------------
//   P0  cp.async: the chunk's fp32 k rows into KF (group 1), its bf16 v rows into VS with 16-byte units
//       XOR-swizzled by row % 8 (group 2; rows >= n zeroed by plain stores; a v that is not 16-byte
//       aligned, or a v_stride not a multiple of 8, takes plain loads instead). Warp 0 loads the 64 g at
//       once and lane 0 sums them in token order (gdn_prep_fwd's bits); warps 2-3 read beta. barrier 1
//   P1  wait for group 1; each thread converts the k units it copied to bf16 hi/lo (KH, KL, swizzled,
//       zeros from row n on) and writes Kt = e^(gl - gamma) k from the same fp32 registers
//       (gdn_prep_fwd's bits; skipped when kt is null); gcum; coef = beta e^gamma.          barrier 2
//   P2  L = K K^T on the 10 16x16 blocks on and below the diagonal (warp w: blocks w, w + 8) as
//       KH KH^T + KH KL^T + KL KH^T, k ascending (ldmatrix, not transposed, of the row-major k rows gives
//       both the A fragments and the B = K^T fragments); masked and scaled by beta_i e^(gamma_i -
//       gamma_j) into LS (fp32 [64][68], over KF, which is dead).                           barrier 3
//   P3  the four diagonal blocks D_b = (I + L_bb)^-1 by forward substitution in fp32 on the CUDA cores
//       (warp b, lane c < 16 holds column c in registers: 120 dependent fma), into AI (fp32 [64][68]).
//                                                                                           barrier 4
//   P4  the blocks below the diagonal, warp j < 3 walking block column j down (rows i = j+1 .. 3), warps
//       3-5 computing the terms that need no block of their own column (prep_p4, v5.28):
//         X^T    = sum_{k=j}^{i-1} A_kj^T L_ik^T      (mma, hi/lo, fragments read from fp32 AI / LS)
//         A_ij^T = X^T (-D_i^T)                       (mma, hi/lo; X^T's accumulator tiles are the A
//                                                      fragments, split in registers)
//       i.e. A_ij = -D_i sum_k L_ik A_kj, the block form of forward substitution. Block (i, j) needs
//       only L, D_i and the blocks A_kj of its own column, which the same warp wrote (or, for warp 4's
//       A_10, wrote before named barrier 3), and each lane reads back exactly the elements the same lane
//       index wrote (the C layout of A_ij^T is the A layout in which row i + 1 reads it): no block
//       barrier between rows. Then every thread waits for group 2 (v).
//                                                                                           barrier 5
//   P5  W and U (prep_p5): warp w both products for columns 32 (w % 4) .. +31 and the row blocks {0, 3}
//       (w < 4) or {1, 2} (5 block-steps each). Its A operands, A diag(coef) for W and A diag(beta) for U,
//       are built in registers from fp32 AI and split hi/lo; B = K (hi, lo) or V (exact bf16) by
//       ldmatrix.trans of the swizzled stages. W = Ah Kh + Ah Kl + Al Kh, U = Ah V + Al V, per 16-wide k
//       step, k ascending; the accumulators go straight to global memory (rows < n, 8-byte stores), and
//       -W's planes from the W accumulators (8-byte stores in whole sectors). (Tried and measured slower on
//       the H200, 2026-12-03: warps 0-3 W and warps 4-7 U, 64 columns each, the same bits; P3
//       right-looking, no change. docs/mma-kernels.md, "Landed (2026-12-03, tenth session)".)
// No atomics; every element is one fixed instruction sequence: bitwise reproducible.
// LS and AI keep rows of kLA = 68 words' budget but in lrow order (8-row blocks, rows 0, 1, 4, 5, 2, 3, 6, 7
// with spare 16-byte units between them, see lrow): the 8-byte pair accesses of rows g (P2's L stores, P4's
// B fragments, P5's A loads) are conflict-free (2-way with plain 68-word rows, 4 banks apart), the
// transposed scalars of rows 2t (+1) (P4's A fragments and A stores) stay conflict-free.
//
// ---- Precision --------------------------------------------------------------------------------------
// hi + lo keeps ~16 bits (|x - hi - lo| <= 2^-16 |x|); a three-product term is off by ~3 * 2^-16 |a||b|,
// random in sign. Measured on the emulator (TestMMAPrepOnCPU, normwise relative error against gdnref.Prep
// in float64 fed the same fp32 kn, g, beta and bf16 v; chunks of 1..64 rows): W 4.8e-6, U 2.3e-6, Kt
// 4.8e-7 and gcum 1.1e-7 (both bitwise equal to gdn_prep_fwd's). What each split buys, W's error without
// it: K's lo in K K^T (L from bf16 k) 2.1e-4; the inverse's block products on hi only 4.8e-5; K's lo in
// W 1.7e-3; A's lo in W 1.8e-3 (in U 1.5e-3). v is exact bf16 and is not split. Every split is needed
// for the ~1e-5 that the walks' inputs must keep (their own error is ~5e-6).
//
// ---- Cost per CTA (chunk x head) and at 32K tokens (512 chunks x 48 heads = 24576 CTAs), predicted for
// an H200 (132 SMs, ~1 PFLOP/s dense bf16 ~ 1 m16n8k16 per clock per SM, ~4 TB/s, ~1.8 GHz) ---------------
// mma.sync: K K^T 10 blocks x 8 k x 2 n x 3 = 480; inverse 10 k-blocks x 2 x 3 + 6 x 2 x 3 = 96; W 8 warps
// x 5 x 4 x 3 = 480; U 8 x 5 x 4 x 2 = 320: 1376 mma = 5.6 MFLOP a CTA, ~2.8x the math itself (K K^T
// lower blocks, W and U with the triangular A: ~2.0 MFLOP). At 32K: 1.4e11 FLOP, ~0.23 ms at mma.sync's
// ~60% of the dense peak.
// Global bytes a CTA: k 32 KB + v 16 KB + g, beta 0.5 KB read; w, u, kt 96 KB + gcum written: ~145 KB,
// 3.6 GB at 32K; with k read from L2 for two of every three value heads (16 QK heads), ~3.0 GB reach
// HBM: ~0.72 ms at ~4.2 TB/s. Two thirds of it are the fp32 w, u, kt stores the ABI keeps. With kt null
// (v5 forward without a backward): 32 KB less a CTA, 0.8 GB less at 32K, ~2.2 GB to HBM, ~0.53 ms floor.
// Shared memory a CTA: cp.async 48 KB, the conversion 64 KB, L's ldmatrix 160 KB (10 blocks x 8 x 4 x
// 512 B) and 16 KB of L stores, W/U's ldmatrix 120 KB (8 warps x 5 x 6 x 512 B) and fp32 A fragments
// with their scales ~80 KB, P3/P4 ~20 KB: ~510 KB, ~4k clocks at 128 B/clock, 0.41 ms at 32K (186 CTAs
// an SM).
// Barriers: 5 __syncthreads and 1 __syncwarp (v3: 13, its blocked solve
// in fp32 on the CUDA cores).
// Latency of one CTA: chunk tables ~0.5 us, the copies ~1-1.5 us, gamma's 64 adds, P2's chains of 24
// dependent mma (two blocks for warps 0-1), P3's 120 fma, P4's three rows, P5's 15-deep chains: ~4 us,
// serial. HBM: the SM's share of ~4.2 TB/s is ~32 KB/us, so one CTA's ~122 KB of HBM traffic (k from
// L2 for two of three heads) take ~3.8 us and a round of two CTAs ~7.7 us, more than either CTA's ~4 us
// of serial latency: with two CTAs an SM (100 KB shared memory each, __launch_bounds__(256, 2): <= 128
// registers, estimate ~100) one's serial phases hide under the other's copies and stores. 24576 CTAs /
// 264 slots = 93 rounds of ~8-10 us: predicted ~0.9-1.1 ms at 32K tokens (v3: 4.4 ms), bound by HBM
// (0.72 ms floor; tensor cores 0.23 ms and shared memory 0.41 ms behind). bf16 w/u/kt outputs (a change
// of the ABI) would cut the bytes by ~40%.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gdn_fwd.cu"
#include "mma.cuh"
#include "walk_planes.cuh"

namespace gdnkcp {
namespace prepmma {

using tc::bf16;
constexpr int kD = fwd::kD, kC = fwd::kC, kThreads = fwd::kThreads;
constexpr int kLA = kC + 4;  // fp32 row budget of LS and AI (64 data words + 4 spare; rows laid out by lrow)
static_assert(kThreads == 256 && kD == 128 && kC == 64, "the fragment bookkeeping below assumes these");

// Shared memory: KF fp32 [64][128] (later LS fp32 [64][68]) | AI fp32 [64][68] | KH, KL, VS bf16
// [64][128] swizzled | gam, bet, coef fp32 [64].
constexpr int kPrepMMASmem = 4 * kC * kD + 4 * kC * kLA + 3 * 2 * kC * kD + 3 * 4 * kC;
static_assert(kPrepMMASmem == 100096, "kcp's prepMMASmem mirrors this");

// swz: the element offset of (row, col) in a swizzled [64][128] bf16 array: the 16-byte unit col / 8
// of a row is stored at unit (col / 8) ^ (row % 8).
__device__ __forceinline__ int swz(int row, int col) { return row * kD + (((col >> 3) ^ (row & 7)) << 3) + (col & 7); }

struct alignas(8) U32x2 {
	unsigned x, y;
};

// lrow: the word offset of row m of LS / AI ([64] rows of 64 fp32 in 8-row blocks of 8 kLA words, the
// budget of plain rows of kLA words). In a block, row m % 8 sits at position q (m's bits 1 and 2 swapped: rows
// 0, 1, 4, 5, 2, 3, 6, 7 in memory order) after 2 ((q + 1) / 2) spare 16-byte units: rows 0..7 start at bank
// units 0, 2, 4, 6, 2, 4, 6, 0 (mod 8; plain rows of 68 words: 0, 1, 2, ..., 7, rows 4 banks apart). So rows
// g = 0..3 (4..7) start 8 banks apart (a half-warp's 8-byte pairs of rows g, columns 2t, 2t + 1: 1 wavefront,
// plain rows 2) and so do rows 0, 2, 4, 6 and 1, 3, 5, 7 (a warp's scalars of rows 2t (+1), columns g: 1, as
// plain rows). Columns stay contiguous; rows 16-byte aligned (gdn_chunk_grads_mma.cu's rowo<kLA> with the
// chunk-gradient swizzle patch).
__device__ __forceinline__ int lrow(int m) {
	const int q = (m & 1) | ((m >> 1) & 2) | ((m << 1) & 4);
	return (m >> 3) * (8 * kLA) + 64 * q + 8 * ((q + 1) >> 1);
}
static_assert(64 * 7 + 8 * 4 + 64 == 8 * kLA, "lrow: an 8-row block fills exactly 8 kLA words");

// frag_at loads the A fragment (16 x 16) whose element (m, k) is T[row r0 + k][column c0 + m] of an lrow
// tile (fp32; transposed, scalar loads) and splits it: hi[0..3], lo[0..3] in the m16n8k16 A layout
// (g = lane / 4, t = lane % 4).
__device__ __forceinline__ void frag_at(const float* T, int r0, int c0, int g, int t, unsigned hi[4], unsigned lo[4]) {
#pragma unroll
	for (int r = 0; r < 4; ++r) {
		const int m = g + 8 * (r & 1), k = 2 * t + 8 * (r >> 1);
		tc::split_bf16x2(T[lrow(r0 + k) + c0 + m], T[lrow(r0 + k + 1) + c0 + m], hi[r], lo[r]);
	}
}

// frag_bn loads the B fragment (16 x 8) whose element (k, n) is sign * T[row r0 + n][column c0 + k] of an
// lrow tile (B = tile^T; the pair k, k + 1 one 8-byte load) and splits it.
__device__ __forceinline__ void frag_bn(const float* T, int r0, int c0, float sign, int g, int t, unsigned hi[2],
                                        unsigned lo[2]) {
#pragma unroll
	for (int r = 0; r < 2; ++r) {
		const int k = 2 * t + 8 * r;
		const float2 x = *reinterpret_cast<const float2*>(T + lrow(r0 + g) + c0 + k);
		tc::split_bf16x2(sign * x.x, sign * x.y, hi[r], lo[r]);
	}
}

// mma3: d += ah bh + ah bl + al bh (in that order).
__device__ __forceinline__ void mma3(float d[4], const unsigned ah[4], const unsigned al[4], const unsigned bh[2],
                                     const unsigned bl[2]) {
	tc::mma_bf16_16816(d, ah, bh, d);
	tc::mma_bf16_16816(d, ah, bl, d);
	tc::mma_bf16_16816(d, al, bh, d);
}

// The prep's smem regions (see the header's data flow).
struct PrepSmem {
	float *KF, *LS, *AI;
	bf16 *KH, *KL, *VS;
	float *gam, *bet, *coef;
};

__device__ __forceinline__ PrepSmem prep_smem(float* smem) {
	PrepSmem S;
	S.KF = smem;                // [64][128] fp32 k as copied
	S.LS = smem;                // [64][kLA] fp32 L (over KF, once converted), rows at lrow
	S.AI = S.KF + kC * kD;      // [64][kLA] fp32 (I + L)^-1, blocks on and below the diagonal, rows at lrow
	S.KH = reinterpret_cast<bf16*>(S.AI + kC * kLA);
	S.KL = S.KH + kC * kD;
	S.VS = S.KL + kC * kD;
	S.gam = reinterpret_cast<float*>(S.VS + kC * kD);
	S.bet = S.gam + kC;
	S.coef = S.bet + kC;
	return S;
}

// P0, k: the cp.async copies of the chunk's fp32 k rows into KF (no commit).
__device__ __forceinline__ void prep_copy_k(const PrepSmem& S, const float* kn, int t0, int n, int qh, int HQK, int tid) {
#pragma unroll
	for (int x = 0; x < 8; ++x) {  // k: 2048 units of 4 floats, 8 a thread
		const int f = tid + kThreads * x, i = f / 32, d4 = 4 * (f % 32);
		if (i < n) tc::cp_async16(S.KF + i * kD + d4, kn + ((long long)(t0 + i) * HQK + qh) * kD + d4);
	}
}

// P0 of gdn_prep_mma_gn, k: the chunk's rows normalised here from the bf16 k (row stride k_stride; QK
// head qh at qh 128) into KF, fp32, the values gdn_l2norm_fwd writes to kn (fwd::l2norm_lane): warp w takes
// rows w, w + 8, .., all eight rows' loads first; rows from n on are not written (as prep_copy_k). Stores
// are plain shared stores: the caller's next __syncthreads publishes them. Where kn_out is given (a forward
// kept for a backward), the normalised rows < n also go there and their rstd to k_rstd ([T, HQK], lane 0):
// the values and places gdn_l2norm_fwd writes, so that the forward needs no l2norm kernel for k.
__device__ __forceinline__ void prep_norm_k(const PrepSmem& S, const bf16* k, int k_stride, int l2norm, int t0, int n,
                                            int qh, int tid, float* kn_out = nullptr, float* k_rstd = nullptr,
                                            int HQK = 0) {
	const int lane = tid % 32, warp = tid / 32;
	const bool vec = fwd::rows_vec8(k, k_stride);
	float x[8][4];
#pragma unroll
	for (int r = 0; r < 8; ++r)
		fwd::load_row4(k + (long long)(t0 + min(warp + 8 * r, n - 1)) * k_stride + qh * kD, lane, vec, x[r]);
#pragma unroll
	for (int r = 0; r < 8; ++r) {
		const int i = warp + 8 * r;
		const float rstd = fwd::l2norm_lane(x[r], l2norm);  // every lane of the warp: its shuffles
		if (i < n) {
			const float4 y = make_float4(x[r][0], x[r][1], x[r][2], x[r][3]);
			*reinterpret_cast<float4*>(S.KF + i * kD + 4 * lane) = y;
			const long long row = (long long)(t0 + i) * HQK + qh;
			if (kn_out != nullptr) *reinterpret_cast<float4*>(kn_out + row * kD + 4 * lane) = y;
			if (k_rstd != nullptr && lane == 0) k_rstd[row] = rstd;
		}
	}
}

// GDNKCP_PREP_ZFILL: prep_stage_head's v copies (16-byte aligned rows, vfast) zero-fill the rows from n on by
// cp.async's src-size (tc::cp_async16_zfill) where a branch between the copy and a 16-byte zero store (0) took
// ~20 instructions, and the later heads of a grouped CTA (prep_head_g) put no zero store before a cp.async
// into the same VS bytes (the hazard ptxas orders with dummy shared loads; mma.cuh).
#ifndef GDNKCP_PREP_ZFILL
#define GDNKCP_PREP_ZFILL 1
#endif

// P0, value head h: its bf16 v rows into VS (one commit group), beta, and gamma (warp 0 loads the 64 g at
// once, lane 0 sums them in token order: gdn_prep_fwd's bits).
__device__ __forceinline__ void prep_stage_head(const PrepSmem& S, const bf16* v, int v_stride, const float* g,
                                                const float* beta, int t0, int n, int h, int HV, int tid, bool gb = true) {
	const int lane = tid % 32, warp = tid / 32;
	const bool vfast = (reinterpret_cast<unsigned long long>(v) % 16 == 0) && (v_stride % 8 == 0);
#pragma unroll
	for (int x = 0; x < 4; ++x) {  // v: 1024 units of 8 bf16, 4 a thread
		const int f = tid + kThreads * x, i = f / 16, d8 = 8 * (f % 16);
		bf16* dst = S.VS + swz(i, d8);
		const bf16* src = v + (long long)(t0 + i) * v_stride + h * kD + d8;
		if (GDNKCP_PREP_ZFILL && vfast) {  // the rows from n on: zeros by the copy itself, from row 0's address
			tc::cp_async16_zfill(dst, i < n ? src : v + (long long)t0 * v_stride + h * kD + d8, i < n);
		} else if (i >= n) {
			*reinterpret_cast<float4*>(dst) = make_float4(0.f, 0.f, 0.f, 0.f);
		} else if (vfast) {
			tc::cp_async16(dst, src);
		} else {
#pragma unroll
			for (int e = 0; e < 8; ++e) dst[e] = src[e];
		}
	}
	tc::cp_async_commit();
	if (!gb) return;  // gamma and beta staged already (prep_stage_gb)
	if (tid >= kC && tid < 2 * kC) S.bet[tid - kC] = tid - kC < n ? beta[(long long)(t0 + tid - kC) * HV + h] : 0.f;
	if (warp == 0) {
#pragma unroll
		for (int x = 0; x < 2; ++x) {
			const int i = lane + 32 * x;
			S.gam[i] = i < n ? g[(long long)(t0 + i) * HV + h] : 0.f;
		}
		__syncwarp();
		if (lane == 0) {
			float s = 0.f;
#pragma unroll
			for (int i = 0; i < kC; ++i) {
				s += S.gam[i];  // + 0 past n leaves s as it is
				S.gam[i] = s;
			}
		}
	}
}

// prep_stage_gb: gamma (the in-chunk cumsum of g, lane 0 of warp w summing in token order: prep_stage_head's
// bits) and beta of the G value heads h0 .. h0 + G - 1 (G <= 8, one warp a head) into GAM[w][64], BET[w][64],
// at once for a CTA that runs them in turn (prep_heads_g): the later heads then wait neither for g's loads nor
// for the 64-add chain at their barrier 1. Plain shared stores: the caller's next __syncthreads publishes them.
__device__ __forceinline__ void prep_stage_gb(float* GAM, float* BET, const float* g, const float* beta, int t0, int n,
                                              int h0, int G, int HV, int tid) {
	const int lane = tid % 32, warp = tid / 32;
	const bool gw = warp < G;
	// Every load (beta: G x 64 values, two rounds of the CTA at G <= 8; gamma: two a lane of warp w < G) is issued
	// before the first store, so that they take one round trip, not one each in turn.
	float bv[2], gv[2];
#pragma unroll
	for (int u = 0; u < 2; ++u) {
		const int f = tid + kThreads * u, hw = f / kC, i = f % kC;
		bv[u] = f < G * kC && i < n ? beta[(long long)(t0 + i) * HV + h0 + hw] : 0.f;
	}
#pragma unroll
	for (int x = 0; x < 2; ++x) {
		const int i = lane + 32 * x;
		gv[x] = gw && i < n ? g[(long long)(t0 + i) * HV + h0 + warp] : 0.f;
	}
#pragma unroll
	for (int u = 0; u < 2; ++u)
		if (tid + kThreads * u < G * kC) BET[tid + kThreads * u] = bv[u];
	if (gw) {
		float* gam = GAM + warp * kC;
#pragma unroll
		for (int x = 0; x < 2; ++x) gam[lane + 32 * x] = gv[x];
		__syncwarp();
		if (lane == 0) {
			float s = 0.f;
#pragma unroll
			for (int i = 0; i < kC; ++i) {
				s += gam[i];  // + 0 past n leaves s as it is
				gam[i] = s;
			}
		}
	}
}

// prep_kt4: Kt of value head h at token row i, keys d4 .. d4 + 3: e^(gamma_last - gamma_i) k (one rounded
// product each: the expression the v5 walks rebuild Kt with).
__device__ __forceinline__ void prep_kt4(const PrepSmem& S, float* kt, float glast, float4 k4, int t0, int i, int d4,
                                         int h, int HV) {
	const float e = expf(glast - S.gam[i]);
	*reinterpret_cast<float4*>(kt + ((long long)(t0 + i) * HV + h) * kD + d4) =
	    make_float4(k4.x * e, k4.y * e, k4.z * e, k4.w * e);
}

// prep_k_planes: the K^T planes of the chunk's QK head (walk_planes.cuh) into wkc from KF's fp32 k (every
// copy of it landed and visible: after a barrier), by all 256 threads: unit (key kk = item % 128, tokens
// 8b .. 8b + 7, b = item / 128) of items tid + 256 x, a warp's 32 keys of one block reading one row of KF
// at a time (conflict-free); zero from token n on.
__device__ __forceinline__ void prep_k_planes(const PrepSmem& S, unsigned char* wkc, int n, int tid) {
#pragma unroll
	for (int x = 0; x < 4; ++x) {
		const int item = tid + kThreads * x, kk = item % kD, b = item / kD;
		float v[8];
#pragma unroll
		for (int j = 0; j < 8; ++j) v[j] = 8 * b + j < n ? S.KF[(8 * b + j) * kD + kk] : 0.f;
		walkplanes::store_t8(wkc, kk, b, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
	}
}

// P1: KF's fp32 k to bf16 hi / lo in KH, KL (swizzled, zeros from row n on) and, where kt is given, Kt of
// value head h = e^(gamma_last - gamma) k from the same fp32 values. With gams (the grouped prep's first
// head, every head's gamma staged: prep_stage_gb), Kt of the heads h .. h + heads - 1 from those values,
// head j's gamma at gams + 64 j: prep_kt4's expression on the same fp32 values, so each head's Kt is the
// bits it would get from its own pass, without reading kn again.
__device__ __forceinline__ void prep_convert_k(const PrepSmem& S, float* kt, int t0, int n, int h, int HV, int tid,
                                               int heads = 1, const float* gams = nullptr) {
	const float glast = S.gam[n - 1];
#pragma unroll
	for (int x = 0; x < 8; ++x) {
		const int f = tid + kThreads * x, i = f / 32, d4 = 4 * (f % 32);
		float4 k4 = make_float4(0.f, 0.f, 0.f, 0.f);
		if (i < n) {
			k4 = *reinterpret_cast<const float4*>(S.KF + i * kD + d4);
			if (kt != nullptr && gams == nullptr) prep_kt4(S, kt, glast, k4, t0, i, d4, h, HV);  // null: the walks rebuild Kt
			if (kt != nullptr && gams != nullptr) {
#pragma unroll 1
				for (int j = 0; j < heads; ++j) {
					const float e = expf(gams[j * kC + n - 1] - gams[j * kC + i]);
					*reinterpret_cast<float4*>(kt + ((long long)(t0 + i) * HV + h + j) * kD + d4) =
					    make_float4(k4.x * e, k4.y * e, k4.z * e, k4.w * e);
				}
			}
		}
		U32x2 hi, lo;
		tc::split_bf16x2(k4.x, k4.y, hi.x, lo.x);
		tc::split_bf16x2(k4.z, k4.w, hi.y, lo.y);
		*reinterpret_cast<U32x2*>(S.KH + swz(i, d4)) = hi;
		*reinterpret_cast<U32x2*>(S.KL + swz(i, d4)) = lo;
	}
}

// P1, coef = beta e^gamma and the gcum rows of value head h.
__device__ __forceinline__ void prep_coef_gcum(const PrepSmem& S, float* gcum, int t0, int n, int h, int HV, int tid) {
	if (tid < kC) S.coef[tid] = tid < n ? S.bet[tid] * expf(S.gam[tid]) : 0.f;
	if (tid < n) gcum[(long long)(t0 + tid) * HV + h] = S.gam[tid];
}

// prep_block: block b's row bi and column bj <= bi (the 10 blocks on and below the diagonal, row-major).
__device__ __forceinline__ void prep_block(int b, int& bi, int& bj) {
	bi = b < 1 ? 0 : b < 3 ? 1 : b < 6 ? 2 : 3;
	bj = b - bi * (bi + 1) / 2;
}

// P2, block b: bi, bj (prep_block) and the raw K K^T (three products, k ascending).
__device__ __forceinline__ void prep_kk_block(const PrepSmem& S, int b, int lane, int& bi, int& bj, float acc[2][4]) {
	prep_block(b, bi, bj);
#pragma unroll
	for (int nt = 0; nt < 2; ++nt)
#pragma unroll
		for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
#pragma unroll
	for (int kk = 0; kk < kD / 16; ++kk) {
		unsigned ah[4], al[4], bh[4], bl[4];
		const int ra = 16 * bi + lane % 8 + 8 * ((lane / 8) % 2), ca = 16 * kk + 8 * (lane / 16);
		tc::ldmatrix_x4(ah, S.KH + swz(ra, ca));
		tc::ldmatrix_x4(al, S.KL + swz(ra, ca));
		const int rb = 16 * bj + lane % 8 + 8 * (lane / 16), cb = 16 * kk + 8 * ((lane / 8) % 2);
		tc::ldmatrix_x4(bh, S.KH + swz(rb, cb));
		tc::ldmatrix_x4(bl, S.KL + swz(rb, cb));
#pragma unroll
		for (int nt = 0; nt < 2; ++nt) mma3(acc[nt], ah, al, bh + 2 * nt, bl + 2 * nt);
	}
}

// P2, block (bi, bj) of L from its raw K K^T: masked (j < i < n) and scaled by beta_i e^(gamma_i - gamma_j)
// with the value head's beta and gamma, into LS.
__device__ __forceinline__ void prep_l_store(const PrepSmem& S, int bi, int bj, const float acc[2][4], int lane, int n) {
	const int gq = lane / 4, tq = lane % 4;
#pragma unroll
	for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
		for (int hr = 0; hr < 2; ++hr) {  // elements r = 2 hr, 2 hr + 1: columns j, j + 1, one 8-byte store
			const int i = 16 * bi + gq + 8 * hr, j = 16 * bj + 8 * nt + 2 * tq, j1 = j + 1;
			const float l0 = (j < i && i < n) ? S.bet[i] * acc[nt][2 * hr] * expf(S.gam[i] - S.gam[j]) : 0.f;
			const float l1 = (j1 < i && i < n) ? S.bet[i] * acc[nt][2 * hr + 1] * expf(S.gam[i] - S.gam[j1]) : 0.f;
			*reinterpret_cast<float2*>(S.LS + lrow(i) + j) = make_float2(l0, l1);
		}
	}
}

// P3: the diagonal blocks (I + L_bb)^-1, column c a lane: x_i = [i == c] - sum_{j<i} L_ij x_j, each sum
// an fma chain from zero over j ascending (left-looking, row by row).
__device__ __forceinline__ void prep_p3(const PrepSmem& S, int warp, int lane) {
	if (warp < 4 && lane < 16) {
		const int o = 16 * warp;
		// the block's rows: lrow(o + i) = 2 warp 8 kLA + lrow(i), lrow(i) a constant once i is unrolled
		const float* Lo = S.LS + 2 * warp * (8 * kLA) + o;
		float* Ao = S.AI + 2 * warp * (8 * kLA) + o;
		float xcol[16];
#pragma unroll
		for (int i = 0; i < 16; ++i) {
			float s = 0.f;
#pragma unroll
			for (int j = 0; j < 16; ++j)  // (j < i as a test: with it as the bound xcol went to local memory)
				if (j < i) s = fmaf(Lo[lrow(i) + j], xcol[j], s);
			xcol[i] = (i == lane ? 1.f : 0.f) - s;
			Ao[lrow(i) + lane] = xcol[i];
		}
	}
}

// P4: A_ij = -D_i X_ij, X_ij = sum_{k=j}^{i-1} L_ik A_kj (k ascending, one accumulator X^T a block), for the
// six blocks below the diagonal. Block column j's blocks depend on each other down the column (A_30 on A_20
// on A_10), so column 0 is the phase's critical path: walked by one warp it took 6 terms and 3 products with
// -D_i in sequence while five warps waited at barrier 5 (ncu, 2026-12-03: 13% of the prep's stall samples
// behind that barrier). Here the terms that do not wait for the column's own blocks run on helper warps
// and hand the partial X^T over through shared memory (exact fp32, the accumulator as it was: the same
// mma.sync sequence on the same values, so the same bits):
//   warp 0: A_10; X_20 from warp 3's partial + L_21 A_10; A_20; X_30 from warp 4's partial + L_32 A_20; A_30
//   warp 1: A_21; X_31 from warp 5's partial + L_32 A_21; A_31
//   warp 2: A_32
//   warp 3: X_20's L_20 A_00                     -> named barrier 1 -> warp 0
//   warp 4: X_30's L_30 A_00, then (named barrier 3: warp 0 stored A_10) + L_31 A_10 -> barrier 2 -> warp 0
//   warp 5: X_31's L_31 A_11                     -> named barrier 4 -> warp 1
// Column 0's chain: 3 terms and 3 products (it was 6 and 3), column 1's 2 and 2. A warp reads back the
// blocks A_kj it stored itself, or (warp 4's A_10) after a named barrier with their writer; lanes read
// exactly the elements the same lane index wrote (the C layout of A_kj^T is the A layout of its next read).
// The partials: PX (over KF past LS, dead in P4), [3 partials][8 values][32 lanes] fp32.
constexpr int kP4Partials = 3;
static_assert(kC * kLA + kP4Partials * 8 * 32 <= kC * kD, "P4's partials fit in KF past LS");

// p4_term: xt += L_ik A_kj (X^T's two n tiles: m = column in block j, n = row in block i).
__device__ __forceinline__ void p4_term(const PrepSmem& S, int bi, int bj, int bk, int gq, int tq, float xt[2][4]) {
	unsigned ah[4], al[4];
	frag_at(S.AI, 16 * bk, 16 * bj, gq, tq, ah, al);  // (m, k) = A_kj[k][m]
#pragma unroll
	for (int nt = 0; nt < 2; ++nt) {
		unsigned bh[2], bl[2];  // (k, n) = L_ik[n][k]
		frag_bn(S.LS, 16 * bi + 8 * nt, 16 * bk, 1.f, gq, tq, bh, bl);
		mma3(xt[nt], ah, al, bh, bl);
	}
}

// p4_finish: A_ij = -D_i X_ij from X^T's accumulator tiles (split as the A fragment), stored into AI.
__device__ __forceinline__ void p4_finish(const PrepSmem& S, int bi, int bj, int gq, int tq, const float xt[2][4]) {
	unsigned ah[4], al[4];  // X^T's accumulator tiles as the A fragment
#pragma unroll
	for (int r = 0; r < 4; ++r) tc::split_bf16x2(xt[r >> 1][2 * (r & 1)], xt[r >> 1][2 * (r & 1) + 1], ah[r], al[r]);
	float res[2][4] = {};
#pragma unroll
	for (int nt = 0; nt < 2; ++nt) {
		unsigned bh[2], bl[2];  // (k, n) = -D_i[n][k]
		frag_bn(S.AI, 16 * bi + 8 * nt, 16 * bi, -1.f, gq, tq, bh, bl);
		mma3(res[nt], ah, al, bh, bl);
	}
#pragma unroll
	for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
		for (int r = 0; r < 4; ++r) {
			const int m = gq + 8 * (r >> 1), nn = 8 * nt + 2 * tq + (r & 1);
			S.AI[lrow(16 * bi + nn) + 16 * bj + m] = res[nt][r];
		}
	}
}

// p4_put / p4_get: partial p of X^T, lane-fastest (conflict-free 4-byte accesses).
__device__ __forceinline__ void p4_put(float* PX, int p, int lane, const float xt[2][4]) {
#pragma unroll
	for (int v = 0; v < 8; ++v) PX[(8 * p + v) * 32 + lane] = xt[v >> 2][v & 3];
}
__device__ __forceinline__ void p4_get(const float* PX, int p, int lane, float xt[2][4]) {
#pragma unroll
	for (int v = 0; v < 8; ++v) xt[v >> 2][v & 3] = PX[(8 * p + v) * 32 + lane];
}

__device__ __forceinline__ void prep_p4(const PrepSmem& S, int warp, int gq, int tq) {
	float* PX = S.KF + kC * kLA;  // past LS
	const int lane = 4 * gq + tq;
	float xt[2][4] = {};
	if (warp == 0) {
		p4_term(S, 1, 0, 0, gq, tq, xt);
		p4_finish(S, 1, 0, gq, tq, xt);
		tc::bar_arrive(3, 64);  // A_10 stored: warp 4 may read it
		tc::bar_sync(1, 64);    // warp 3's X_20 partial
		p4_get(PX, 0, lane, xt);
		p4_term(S, 2, 0, 1, gq, tq, xt);
		p4_finish(S, 2, 0, gq, tq, xt);
		tc::bar_sync(2, 64);  // warp 4's X_30 partial
		p4_get(PX, 1, lane, xt);
		p4_term(S, 3, 0, 2, gq, tq, xt);
		p4_finish(S, 3, 0, gq, tq, xt);
	} else if (warp == 1) {
		p4_term(S, 2, 1, 1, gq, tq, xt);
		p4_finish(S, 2, 1, gq, tq, xt);
		tc::bar_sync(4, 64);  // warp 5's X_31 partial
		p4_get(PX, 2, lane, xt);
		p4_term(S, 3, 1, 2, gq, tq, xt);
		p4_finish(S, 3, 1, gq, tq, xt);
	} else if (warp == 2) {
		p4_term(S, 3, 2, 2, gq, tq, xt);
		p4_finish(S, 3, 2, gq, tq, xt);
	} else if (warp == 3) {
		p4_term(S, 2, 0, 0, gq, tq, xt);
		p4_put(PX, 0, lane, xt);
		tc::bar_arrive(1, 64);
	} else if (warp == 4) {
		p4_term(S, 3, 0, 0, gq, tq, xt);
		tc::bar_sync(3, 64);  // warp 0 stored A_10
		p4_term(S, 3, 0, 1, gq, tq, xt);
		p4_put(PX, 1, lane, xt);
		tc::bar_arrive(2, 64);
	} else if (warp == 5) {
		p4_term(S, 3, 1, 1, gq, tq, xt);
		p4_put(PX, 2, lane, xt);
		tc::bar_arrive(4, 64);
	}
}

// P5: W = A diag(coef) K, U = A diag(beta) V of value head h, stored (rows < n; w may be null), and, where
// wpc (this chunk and head's 64 KB of walk planes) is given, -W as its bf16 hi / lo planes (walk_planes.cuh:
// every row, zero from row n on), straight from the W accumulators, 8 bytes a lane in whole 32-byte sectors
// (walkplanes::store_neg_w_pair16). Measured on the H200 (32K core): staged in shared memory and copied out
// after a barrier, the prep took 1.333 ms, stored directly 1.254 (2026-12-03); 4-byte stores of each 8-key
// tile straight to global memory (half sectors) had taken it 1.11 -> 1.67 ms (2026-12-02).
__device__ __forceinline__ void prep_p5(const PrepSmem& S, float* w, float* u, unsigned char* wpc, int t0, int n, int h,
                                        int HV, int warp, int lane) {
	const int gq = lane / 4, tq = lane % 4;
	const int n0 = 32 * (warp % 4);
#pragma unroll
	for (int pass = 0; pass < 2; ++pass) {
		const int mi = warp < 4 ? (pass ? 3 : 0) : (pass ? 2 : 1);
		float aw[4][4] = {}, au[4][4] = {};
		for (int kk = 0; kk <= mi; ++kk) {
			unsigned wh[4], wl[4], uh[4], ul[4];
#pragma unroll
			for (int r = 0; r < 4; ++r) {
				const int m = 16 * mi + gq + 8 * (r & 1), k = 16 * kk + 2 * tq + 8 * (r >> 1);
				const float2 a = *reinterpret_cast<const float2*>(S.AI + lrow(m) + k);
				const float a0 = a.x, a1 = a.y;
				tc::split_bf16x2(a0 * S.coef[k], a1 * S.coef[k + 1], wh[r], wl[r]);
				tc::split_bf16x2(a0 * S.bet[k], a1 * S.bet[k + 1], uh[r], ul[r]);
			}
#pragma unroll
			for (int np = 0; np < 2; ++np) {
				const int rr = 16 * kk + lane % 8 + 8 * ((lane / 8) % 2), cc = n0 + 16 * np + 8 * (lane / 16);
				unsigned kh[4], kl[4], vv[4];
				tc::ldmatrix_x4_trans(kh, S.KH + swz(rr, cc));
				tc::ldmatrix_x4_trans(kl, S.KL + swz(rr, cc));
				tc::ldmatrix_x4_trans(vv, S.VS + swz(rr, cc));
#pragma unroll
				for (int h2 = 0; h2 < 2; ++h2) {
					const int nt = 2 * np + h2;
					mma3(aw[nt], wh, wl, kh + 2 * h2, kl + 2 * h2);
					tc::mma_bf16_16816(au[nt], uh, vv + 2 * h2, au[nt]);
					tc::mma_bf16_16816(au[nt], ul, vv + 2 * h2, au[nt]);
				}
			}
		}
#pragma unroll
		for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
			for (int hr = 0; hr < 2; ++hr) {
				const int i = 16 * mi + gq + 8 * hr, d = n0 + 8 * nt + 2 * tq;
				if (i < n) {
					const long long o = ((long long)(t0 + i) * HV + h) * kD + d;
					if (w != nullptr) *reinterpret_cast<float2*>(w + o) = make_float2(aw[nt][2 * hr], aw[nt][2 * hr + 1]);
					*reinterpret_cast<float2*>(u + o) = make_float2(au[nt][2 * hr], au[nt][2 * hr + 1]);
				}
			}
		}
		if (wpc != nullptr) {  // warp-uniform: every lane takes part in the shuffles
#pragma unroll
			for (int hr = 0; hr < 2; ++hr) {
				const int i = 16 * mi + gq + 8 * hr;
				const bool in = i < n;
#pragma unroll
				for (int p = 0; p < 2; ++p)
					walkplanes::store_neg_w_pair16(wpc, i, n0 + 16 * p, tq, in ? aw[2 * p][2 * hr] : 0.f,
					                               in ? aw[2 * p][2 * hr + 1] : 0.f, in ? aw[2 * p + 1][2 * hr] : 0.f,
					                               in ? aw[2 * p + 1][2 * hr + 1] : 0.f);
			}
		}
	}
}

extern "C" __global__ void __launch_bounds__(kThreads, 2)
gdn_prep_mma(const float* __restrict__ kn, const bf16* __restrict__ v, int v_stride,
             const float* __restrict__ g, const float* __restrict__ beta,
             const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
             float* __restrict__ gcum, float* __restrict__ w, float* __restrict__ u,
             float* __restrict__ kt, bf16* __restrict__ wp, bf16* __restrict__ wk, int HQK, int HV) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	const PrepSmem S = prep_smem(smem);
	// (chunk, head) from the linear block index with the head fastest: the HV / HQK value heads that
	// read the same k rows run back to back, so k comes from L2 for all but the first.
	const int lin = blockIdx.y * gridDim.x + blockIdx.x;
	const int c = lin / HV, h = lin % HV, tid = threadIdx.x;
	const int lane = tid % 32, warp = tid / 32, gq = lane / 4, tq = lane % 4;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int qh = h / (HV / HQK);

	// ---- P0: copies, gamma, beta ----
	prep_copy_k(S, kn, t0, n, qh, HQK, tid);
	tc::cp_async_commit();
	prep_stage_head(S, v, v_stride, g, beta, t0, n, h, HV, tid);
	__syncthreads();  // barrier 1: gam, bet

	// ---- P1: convert k, Kt, gcum, coef ----
	tc::cp_async_wait<1>();  // this thread's k units (group 1) have landed
	prep_convert_k(S, kt, t0, n, h, HV, tid);
	prep_coef_gcum(S, gcum, t0, n, h, HV, tid);
	if (wk != nullptr && h % (HV / HQK) == 0) {  // the QK head's K^T planes, by its first value head's CTA
		__syncthreads();  // every k copy landed
		prep_k_planes(S, reinterpret_cast<unsigned char*>(wk) + ((long long)c * HQK + qh) * walkplanes::kKBytes, n, tid);
	}
	__syncthreads();  // barrier 2: KH, KL, coef; KF is dead

	// ---- P2: L = K K^T, blocks on and below the diagonal ----
	for (int b = warp; b < 10; b += 8) {
		int bi, bj;
		float acc[2][4];
		prep_kk_block(S, b, lane, bi, bj, acc);
		prep_l_store(S, bi, bj, acc, lane, n);
	}
	__syncthreads();  // barrier 3: LS

	unsigned char* wpc = wp != nullptr ? reinterpret_cast<unsigned char*>(wp) + ((long long)c * HV + h) * walkplanes::kWBytes : nullptr;
	prep_p3(S, warp, lane);  // ---- P3: the diagonal blocks (I + L_bb)^-1 ----
	__syncthreads();          // barrier 4: the diagonal blocks of AI
	prep_p4(S, warp, gq, tq);  // ---- P4: the blocks below the diagonal ----
	tc::cp_async_wait<0>();    // this thread's v units (group 2)
	__syncthreads();           // barrier 5: AI complete, VS
	prep_p5(S, w, u, wpc, t0, n, h, HV, warp, lane);  // ---- P5: W, U, -W's planes ----
}

// ==== gdn_prep_mma_g: gdn_prep_mma a QK head at a time ==================================================
//   gdn_prep_mma_g   grid (NC, HQK), 256 threads, kPrepMMAGSmem = 114432 bytes (two CTAs an SM)
// gdn_prep_mma's arguments and outputs, bit for bit, with one CTA a (chunk, QK head) running the G = HV / HQK
// value heads that read the same k rows, in ascending order (lin = blockIdx.y gridDim.x + blockIdx.x,
// c = lin / HQK, qh = lin % HQK). Why: k's copy and its hi / lo split (P1) and the raw K K^T (P2's 480 of
// 1376 mma.sync) do not depend on the value head. Here they happen once; the raw K K^T blocks are kept in
// RAW (each lane its own 8 values a block, lane-fastest) and each head scales and masks them with its own
// beta and gamma (prep_l_store), then runs P3-P5 as gdn_prep_mma (the same helpers: the same bits). Kt
// (where kt is given) of every head is formed in the first head's P1 from KF, with each head's gamma staged
// (prep_stage_gb: G <= kMaxGB); past kMaxGB heads a later head's Kt is formed from kn read again from
// global memory (KF holds L by then). The same fp32 values and expression either way. (Measured on the H200,
// 2026-12-02, with every later head reading kn again: 1.347 -> 1.412 ms against gdn_prep_mma with Kt, so
// kcp ran gdn_prep_mma wherever Kt is written.) Per head: one __syncthreads more (the previous head's LS,
// AI, VS, gamma, beta and coef free) before its v copy.
// Predicted (not measured): per later head 896 mma.sync instead of 1376 and no k staging: 1.28 ms at 32K ->
// ~1.0-1.1 ms; the v copy of each head is exposed inside the CTA (the SM's second CTA hides it, as today).
// kMaxGB: the value heads a QK head whose gamma and beta prep_heads_g stages at once (prep_stage_gb; more
// than that: a head at a time, as gdn_prep_mma).
constexpr int kMaxGB = 8;
static_assert(kMaxGB * kC <= 2 * kThreads, "prep_stage_gb loads beta in two rounds of the CTA");
// + RAW: 10 blocks x 32 lanes x 8 values; + GAM, BET: kMaxGB heads x 64 tokens each
constexpr int kPrepMMAGSmem = kPrepMMASmem + 4 * 10 * 32 * 8 + 2 * 4 * kMaxGB * kC;
static_assert(kPrepMMAGSmem == 114432, "kPrepMMAGSmem: kcp's prepMMAGSmem mirrors this");
static_assert(2 * (kPrepMMAGSmem + 1024) <= 233472, "two CTAs an SM");

// prep_head_g: one value head h of gdn_prep_mma_g, from its v copy to its W and U (every thread of the CTA
// calls it: it holds the barriers). first: the CTA's first head, which converts k (copied by the caller,
// commit group 1) and computes the raw K K^T into RAW; later heads read RAW. Not inlined: inlined into the
// head loop, ptxas (11.8) kept every phase's addresses live across it and spilled ~240 bytes.
// kraw: gdn_prep_mma_gn's bf16 k (row stride k_stride, normalised with l2norm as prep_norm_k), whose first
// head normalises the rows into KF under its v copy; null: gdn_prep_mma_g, whose caller copied kn into KF.
// gam, bet: this head's gamma and beta as prep_stage_gb staged them; null: staged here (prep_stage_head).
__device__ __noinline__ void prep_head_g(float* smem, const float* kn, const bf16* v, int v_stride, const float* g,
                                         const float* beta, float* gcum, float* w, float* u, float* kt,
                                         unsigned char* wpc, unsigned char* wkc, int t0, int n, int qh, int HQK, int h,
                                         int HV, bool first, const bf16* kraw, int k_stride, int l2norm, float* gam,
                                         float* bet, int kt_heads, float* kn_out, float* k_rstd) {
	PrepSmem S = prep_smem(smem);
	float* RAW = S.coef + kC;  // [10 blocks][8 values][32 lanes]
	if (gam != nullptr) S.gam = gam, S.bet = bet;
	const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, gq = lane / 4, tq = lane % 4;
	prep_stage_head(S, v, v_stride, g, beta, t0, n, h, HV, tid, gam == nullptr);  // v: a commit group of its own
	if (first && kraw != nullptr) prep_norm_k(S, kraw, k_stride, l2norm, t0, n, qh, tid, kn_out, k_rstd, HQK);
	__syncthreads();  // barrier 1: gam, bet (and gdn_prep_mma_gn's KF)
	if (first) {
		tc::cp_async_wait<1>();  // this thread's k units have landed
		// With every head's gamma staged (gam: prep_stage_gb's rows, this first head's at their start), Kt of
		// all kt_heads heads now, from KF; else this head's only, and each later head reads kn again.
		prep_convert_k(S, kt, t0, n, h, HV, tid, kt_heads, gam);
	} else if (kt != nullptr && gam == nullptr) {
		const float glast = S.gam[n - 1];
#pragma unroll
		for (int x = 0; x < 8; ++x) {
			const int f = tid + kThreads * x, i = f / 32, d4 = 4 * (f % 32);
			if (i < n) {
				const float4 k4 = *reinterpret_cast<const float4*>(kn + ((long long)(t0 + i) * HQK + qh) * kD + d4);
				prep_kt4(S, kt, glast, k4, t0, i, d4, h, HV);
			}
		}
	}
	prep_coef_gcum(S, gcum, t0, n, h, HV, tid);
	if (first && wkc != nullptr) {  // the QK head's K^T planes, once
		__syncthreads();  // every k copy landed
		prep_k_planes(S, wkc, n, tid);
	}
	__syncthreads();  // barrier 2: KH, KL (first head), coef; KF / LS free
	for (int b = warp; b < 10; b += 8) {
		int bi, bj;
		float acc[2][4];
		float* raw = RAW + b * 8 * 32 + lane;  // value (nt, e) at raw[32 (4 nt + e)]
		if (first) {
			prep_kk_block(S, b, lane, bi, bj, acc);
#pragma unroll
			for (int nt = 0; nt < 2; ++nt)
#pragma unroll
				for (int e = 0; e < 4; ++e) raw[32 * (4 * nt + e)] = acc[nt][e];
		} else {
			prep_block(b, bi, bj);
#pragma unroll
			for (int nt = 0; nt < 2; ++nt)
#pragma unroll
				for (int e = 0; e < 4; ++e) acc[nt][e] = raw[32 * (4 * nt + e)];
		}
		prep_l_store(S, bi, bj, acc, lane, n);
	}
	__syncthreads();  // barrier 3: LS
	prep_p3(S, warp, lane);
	__syncthreads();  // barrier 4
	prep_p4(S, warp, gq, tq);
	tc::cp_async_wait<0>();  // this thread's v units
	__syncthreads();         // barrier 5: AI complete, VS
	prep_p5(S, w, u, wpc, t0, n, h, HV, warp, lane);
}

// prep_heads_g: the G = HV / HQK value heads of QK head qh in chunk c, in ascending order (prep_head_g's
// arguments; wp, wk the whole planes or null).
__device__ __forceinline__ void prep_heads_g(float* smem, const float* kn, const bf16* v, int v_stride, const float* g,
                                             const float* beta, float* gcum, float* w, float* u, float* kt, bf16* wp,
                                             bf16* wk, int c, int t0, int n, int qh, int HQK, int HV, const bf16* kraw,
                                             int k_stride, int l2norm, float* kn_out = nullptr, float* k_rstd = nullptr) {
	const int G = HV / HQK, h0 = qh * G;
	float* GAM = prep_smem(smem).coef + kC + 10 * 32 * 8;  // after RAW: [kMaxGB][64] gamma, then beta
	float* BET = GAM + kMaxGB * kC;
	const bool gb = G <= kMaxGB;
	if (gb) prep_stage_gb(GAM, BET, g, beta, t0, n, h0, G, HV, threadIdx.x);  // published by the first barrier 1
#pragma unroll 1
	for (int h = h0; h < h0 + G; ++h) {
		if (h > h0) __syncthreads();  // every warp done with the previous head's LS, AI, VS, gamma, beta, coef
		unsigned char* wpc =
		    wp != nullptr ? reinterpret_cast<unsigned char*>(wp) + ((long long)c * HV + h) * walkplanes::kWBytes : nullptr;
		unsigned char* wkc =
		    wk != nullptr ? reinterpret_cast<unsigned char*>(wk) + ((long long)c * HQK + qh) * walkplanes::kKBytes : nullptr;
		prep_head_g(smem, kn, v, v_stride, g, beta, gcum, w, u, kt, wpc, wkc, t0, n, qh, HQK, h, HV, h == h0, kraw,
		            k_stride, l2norm, gb ? GAM + (h - h0) * kC : nullptr, gb ? BET + (h - h0) * kC : nullptr, G, kn_out,
		            k_rstd);
	}
}

extern "C" __global__ void __launch_bounds__(kThreads, 2)
gdn_prep_mma_g(const float* __restrict__ kn, const bf16* __restrict__ v, int v_stride,
               const float* __restrict__ g, const float* __restrict__ beta,
               const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
               float* __restrict__ gcum, float* __restrict__ w, float* __restrict__ u,
               float* __restrict__ kt, bf16* __restrict__ wp, bf16* __restrict__ wk, int HQK, int HV) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	const int lin = blockIdx.y * gridDim.x + blockIdx.x;
	const int c = lin / HQK, qh = lin % HQK;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	prep_copy_k(prep_smem(smem), kn, t0, n, qh, HQK, threadIdx.x);
	tc::cp_async_commit();  // group 1: k
	prep_heads_g(smem, kn, v, v_stride, g, beta, gcum, w, u, kt, wp, wk, c, t0, n, qh, HQK, HV, nullptr, 0, 0);
}

// ==== gdn_prep_mma_gn, gdn_prep_mma_gnk: gdn_prep_mma_g on the raw bf16 k, normalised in the kernel ========
//   gdn_prep_mma_gn    grid (NC, HQK)   kPrepMMAGSmem (two CTAs an SM)
//   gdn_prep_mma_gnk   grid (NC, HQK)   kPrepMMAGSmem (two CTAs an SM)
// gdn_prep_mma_g whose first head normalises the chunk's k rows itself (prep_norm_k: fwd::l2norm_lane,
// gdn_l2norm_fwd's arithmetic) from the bf16 k (k_stride elements a token; l2norm 0: the rows as they are),
// instead of copying the fp32 kn that gdn_l2norm_fwd wrote: the same KF values, so gcum, w, u, kt and the
// walk planes are gdn_prep_mma_g's bits. With gdn_output_mma16gn / _gnk (which do the same for q) the
// forward skips gdn_l2norm_fwd (its 0.8 GB of reads and fp32 writes at 32K tokens) and reads half the bytes
// of k here.
// gdn_prep_mma_gn is the forward alone: no Kt (no backward reads it); besides gcum and the planes only k's
// rstd (k_rstd, [T, HQK], gdn_l2norm_fwd's values: the plane walks' (2) reads k's rows and rstd). Its own entry,
// with the null pointers as constants, so that its code carries nothing of the kept form's (measured on
// the H200, 2026-12-03: the one entry with kt, kn_out, k_rstd as runtime arguments took the forward
// alone's prep 1.24 -> 1.28 ms at 32K).
extern "C" __global__ void __launch_bounds__(kThreads, 2)
gdn_prep_mma_gn(const bf16* __restrict__ k, int k_stride, int l2norm, const bf16* __restrict__ v, int v_stride,
                const float* __restrict__ g, const float* __restrict__ beta, const int* __restrict__ chunk_tok0,
                const int* __restrict__ chunk_len, float* __restrict__ gcum, float* __restrict__ w,
                float* __restrict__ u, bf16* __restrict__ wp, bf16* __restrict__ wk, int HQK, int HV,
                float* __restrict__ k_rstd) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	const int lin = blockIdx.y * gridDim.x + blockIdx.x;
	const int c = lin / HQK, qh = lin % HQK;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	prep_heads_g(smem, nullptr, v, v_stride, g, beta, gcum, w, u, nullptr, wp, wk, c, t0, n, qh, HQK, HV, k, k_stride,
	             l2norm, nullptr, k_rstd);
}

// gdn_prep_mma_gnk is the forward kept for a backward: gdn_prep_mma_gn's arguments but k_rstd, then kt (Kt, as
// gdn_prep_mma_g writes it), kn_out and k_rstd (the normalised rows and their rstd, where gdn_l2norm_fwd
// writes kn and k_rstd). Each may be null. A later head past kMaxGB reads its k rows for Kt from kn_out,
// which this CTA's first head wrote (visible to every thread of the CTA after the head barriers): Kt there
// needs it, and the kernel traps without it.
extern "C" __global__ void __launch_bounds__(kThreads, 2)
gdn_prep_mma_gnk(const bf16* __restrict__ k, int k_stride, int l2norm, const bf16* __restrict__ v, int v_stride,
                 const float* __restrict__ g, const float* __restrict__ beta, const int* __restrict__ chunk_tok0,
                 const int* __restrict__ chunk_len, float* __restrict__ gcum, float* __restrict__ w,
                 float* __restrict__ u, bf16* __restrict__ wp, bf16* __restrict__ wk, int HQK, int HV, float* kt,
                 float* kn_out, float* __restrict__ k_rstd) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	const int lin = blockIdx.y * gridDim.x + blockIdx.x;
	const int c = lin / HQK, qh = lin % HQK;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	if (kt != nullptr && kn_out == nullptr && HV / HQK > kMaxGB) __trap();
	prep_heads_g(smem, kn_out, v, v_stride, g, beta, gcum, w, u, kt, wp, wk, c, t0, n, qh, HQK, HV, k, k_stride, l2norm,
	             kn_out, k_rstd);
}

}  // namespace prepmma
}  // namespace gdnkcp
