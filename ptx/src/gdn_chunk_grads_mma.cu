// gdn_chunk_grads_mma.cu (checked on the CPU emulator and on the H200; docs/perf-notes.md has its times): the
// backward's chunk gradients on mma.sync m16n8k16 (bf16 in, fp32 accumulate, hi/lo splits), first
// tensor-core version of gdn_chunk_grads (gdn_bwd.cu, docs/gpu-backward.md item 5). Same arguments, grid and
// outputs:
//   gdn_chunk_grads_mma   grid (NC, HV), block 256, kGradMMASmem = 227136 bytes (one CTA an SM)
// Per (chunk, value head), gdnref.chunkGrads: dqv, dkv fp32 [Tr, HV, 128] (w.r.t. the normalised q, k),
// dv fp32 at dv + t*dv_stride + h*128, dg (reverse in-chunk cumsum of dgamma), dbeta fp32 [Tr, HV]. Rows
// past a short chunk's end are neither read nor written. No atomics; every sum has one fixed order.
//
// ---- The data flow -----------------------------------------------------------------------------------
// Every matrix operand lives in shared memory as fp32 (132 words a row for 128-wide tiles, 68 for 64-wide
// ones, laid out by rowo below) or, when exact in bf16 (dO, v), as bf16 pairs (row stride 68 words). A warp
// builds its mma fragments straight from these with plain loads (a row-major pair one 8-byte load) and
// splits fp32 in registers (x = hi + lo, hi = rn(x), lo = rn(x - hi)); a transposed operand is the same
// load with rows and columns swapped, so every product below is one generic loop (gemm).
// Bank conflicts (32 banks of 4 bytes; a warp's 8-byte loads in two half-warp phases): with plain rows of
// 132 / 68 words (4 banks apart) the row-major pair loads (rows g, columns 2t, 2t + 1) were 2-way; the
// fp32 tiles that fragments are built from now keep each 8-row block's 8 P words but place its rows 0..7 at
// bank units 0, 2, 4, 6, 2, 4, 6, 0 (rowo), which makes those pair loads and the transposed scalar loads
// (rows 2t (+1), columns g) conflict-free, and keeps cp.async units, float4 reads and contiguous row reads
// conflict-free. E, F kk and E2 (read only by the per-thread row / column sums) keep plain rows: for the
// row sums (lane = row) plain rows give 4-way, rowo 8-way. The bf16 tiles (68 words: rows 4 banks apart,
// 32-bit fragment loads conflict-free) are unchanged. Addresses only: every output keeps its bits.
// Warp w owns rows 16 rt .. 16 rt + 15 (rt = w % 4) and columns 64 ch .. (ch = w / 4) of a 64 x 128 result
// (8 accumulator tiles), or columns 32 ch .. of a 64 x 64 one (4 tiles; warps whose tile lies wholly above
// the diagonal skip the mma of a strictly/causally lower result and store its zeros). dq and dk stay in accumulator registers from phase 1 to their store.
//   S1  cp.async K, Q, V' (fp32) and dO (bf16) rows < n, zeros past n; beta, gamma.          barrier 1
//   1a  K K^T, S = Q K^T (3 products each), dP = dO V'^T (dO exact: 2 products); kk to KK, L = beta_i kk
//       e^(gamma_i - gamma_j) (j < i < n) to LS, G1 = scale dP Γ (j <= i < n) to G1S, E = G1 ⊙ S to ES. barrier 2
//   1b  dq = G1 K (k steps <= rt), dk = G1^T Q (k steps >= rt); the four diagonal blocks of (I + L)^-1 by
//       forward substitution in fp32 (warps 0-3, a column a lane, as gdn_prep_mma); E's row / column sums.
//                                                                                             barrier 3
//   1c  the blocks below the diagonal, A_ij = -D_i sum_k L_ik A_kj, on mma by warps 0-2 (as gdn_prep_mma).
//                                                                                             barrier 4
//   S2  cp.async D (128 x 128) over the dead G1S / ES / LS; <D, H> from each thread's own D units and H
//       read from global memory (a fixed chain a thread, then warp butterflies).                barrier 5
//       (barrier 5 publishes every thread's landed D units to the other warps before dKt reads them:
//       the first draft lacked it, and dk read D before other threads' copies had landed, NaN on the emulator)
//       dKt = V' D^T: dk += tail dKt, the row dots dKt_i . k_i.                                 barrier 6
//   S3  cp.async H over D, dV' over V'.                                                         barrier 7
//       dQg = dO H^T (2 products) and dW = -dV' H^T (3) on the same B fragments: dq += e^gamma scale dQg,
//       dq stored, the row dots scale dQg_i . q_i.                                              barrier 8
//       dW stored over Q; v (bf16 pairs) over H.                                                barrier 9
//   S4  XU = A^T dV', XW = A^T dW (k steps >= rt: A is lower triangular): dv = beta XU stored, dk += bg XW,
//       row dots XU_j . v_j and XW_j . k_j; T1 = dV' v^T (v exact: 2 products), T2 = dW K^T:
//       dA_ij = beta_j T1 + bg_j T2 (j < i < n) to DAS.                                        barrier 10
//   S5  M = A^T dA to MS.                                                                      barrier 11
//       dL = -M A^T (k steps < 2 ch + 2); F = dL Γ, dKK = beta_i F (over dW), E2 = dKK ⊙ kk (over v),
//       F ⊙ kk (over dA), j < i < n.                                                           barrier 12
//   S6  dk += dKK K + dKK^T K, dk stored; the sums of E2 and F kk; the per-row terms.           barrier 13
//       dgamma, dbeta in gdn_chunk_grads' order; the last row's extra term.                     barrier 14
//       dg = reverse cumsum (thread 0).
//
// ---- Precision ------------------------------------------------------------------------------------------
// Every fp32 x fp32 product runs as ah bh + ah bl + al bh (each term off by <= ~3 2^-16 |a||b|, random
// in sign); dO and v are exact bf16 and enter as one part (dO x fp32: 2 products; fp32 x v: 2). A is built
// as in gdn_prep_mma (K K^T split, the diagonal blocks in fp32, the off-diagonal block products split);
// gdn_prep_mma measured W 4.8e-6 from it against 6.5e-8 from fwd::chunk_inverse, i.e. A within a few 1e-6 of
// float64, the class of every other product here. Measured on the emulator (TestMMAChunkGradsOnCPU, normwise
// against gdnref.chunkGrads in float64 fed the same fp32 / bf16 inputs, worst of its two cases; worst element
// over the rms; the fp32 gdn_chunk_grads on the same buffers in brackets):
//   dq 4.25e-6 (max/rms 5.2e-5) [2.2e-7]   dk 4.91e-6 (4.9e-5) [2.4e-7]   dv 2.54e-6 (2.7e-5) [1.4e-7]
//   dg 4.68e-6 (2.5e-5) [4.8e-7]           dbeta 2.70e-6 (1.0e-5) [1.6e-7]
// (the test's bounds: 3e-5 normwise, 3e-4 of the rms an element). A dropped lo part costs 1e-3-ish: dQg
// without H's lo, dq 1.07e-3; every generic gemm without the al bh term, dq 1.3e-3; the 1c block products
// L_ik A_kj as hi hi only, dk 3.4e-5 (the inverse matters least, as in gdn_prep_mma); all far above the
// 1e-4 budget bwdTol gives the backward's kernels, or (the last) just above the test's 3e-5.
//
// ---- Cost per CTA (n = 64) and at 32K tokens (512 chunks x 48 heads = 24576 CTAs), predicted for an H200
// (132 SMs, ~1.8 GHz, ~1 PFLOP/s dense bf16 ~ 1 m16n8k16 a clock an SM, ~4.0 TB/s) ---------------------------
// Math (gdnref's products, triangles counted as computed): ~17.5 MFLOP (gdn_chunk_grads' count).
// mma.sync issued: 1a 1536, dq / dk 960, the inverse ~100, dKt 1536, dQg / dW 2560, XU / XW 960, T1 / T2
// 960, M / dL 430, dKK K / dKK^T K 960: ~10000 m16n8k16 = 41 MFLOP, ~5.5 us a CTA at one a clock (~9 us at
// mma.sync's ~60%), 1.0e12 FLOP at 32K: ~1.0 ms of tensor time.
// Global bytes a CTA: q, k 64 KB (one in three value heads from HBM, the rest L2), V', dV' 64 KB, dO, v
// 32 KB, D 64 KB, H 64 KB staged + 64 KB read again for <D, H> (L2); writes dq, dk, dv 96 KB: ~290 KB of
// HBM traffic, 7.1 GB at 32K: the HBM floor ~1.8 ms at ~4.0 TB/s.
// Shared memory a CTA: ~2.1 MB of fragment loads (fp32 scalars: ~5 KB a warp a k step of a 64 x 128
// product) + ~0.4 MB of cp.async landing and stores: ~2.5 MB, ~20k clocks at 128 B/clock (~11 us).
// Issue: the in-register splits (~5 instructions an fp32 element, ~500k elements) and the fragment
// loads are ~100k warp instructions besides ~10k mma.sync: ~30k clocks over 4 schedulers, ~17 us.
// With one CTA an SM (227 KB), the five load phases (S1, S2, S3, v: ~290 KB a CTA) are exposed: ~6-8 us
// at an SM's ~100 GB/s from L2 / HBM while the other SMs compute. Predicted ~23-27 us a CTA, 186 rounds:
// ~4.5 ms at 32K tokens (3.5-6 ms; gdn_chunk_grads 40.5 ms), bound by instruction issue (the splits) and
// shared memory, 2.5x the HBM floor. Next steps, not done here: pre-split swizzled bf16 hi/lo stages read
// by ldmatrix (as gdn_output_mma: half the fragment bytes, no repeated splits: ~2x) and cp.async of the
// next phase's operand under the current compute.
// Registers (estimate): dq, dk 64 + two 8-tile accumulators 64 + fragments ~20 + addresses ~30: ~180 under
// __launch_bounds__(256, 1) (255 allowed), no spill expected. Measured (nvcc 11.8, -O3 -std=c++17): sm_90
// cubin 240 registers, compute_80 PTX through ptxas -arch=sm_80 243 registers; both 0 bytes stack frame,
// 0 spill stores / loads (sm_90a and Blackwell targets not built: 11.8 lacks them). 240 x 256 threads fits
// the SM's 64K registers once: one CTA an SM, as the shared memory already decides. With the rowo layout
// (lane row offsets spelled as one term each: rowo(i0) = 16 rt kP + rowo(g), rowo(2t + 1) = rowo(2t) + P + 4):
// sm_90 cubin 232 registers (236 before), compute_80 PTX through ptxas -arch=sm_80 230 (236), no spill. (Spelled
// rowo(i0) / rowo(r) directly, the v5 kernel spilled 4-20 bytes on sm_80, and a diagonal-inverse loop bound of
// i kept xcol in a 64-byte local array: hence the j < 16, if (j < i) loop and the spelled offsets.)
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gdn_fwd.cu"
#include "mma.cuh"

namespace gdnkcp {
namespace gradmma {

using tc::bf16;
constexpr int kD = fwd::kD, kC = fwd::kC, kThreads = fwd::kThreads;
static_assert(kThreads == 256 && kD == 128 && kC == 64, "the fragment bookkeeping below assumes these");

constexpr int kP = kD + 4;        // fp32 row budget of a [64|128][128] tile (528 bytes; rowo keeps rows 16-byte aligned)
constexpr int kQ = kC + 4;        // fp32 row budget of a [64][64] tile
constexpr int kW = kD / 2 + 4;    // 32-bit words of a bf16 [64][128] row (272 bytes)
constexpr int kTP = kC * kP;      // floats of a [64][kP] tile
constexpr int kTQ = kC * kQ;      // floats of a [64][kQ] tile
constexpr int kTW = kC * kW;      // words of a bf16 [64][kW] tile
constexpr int kBig = kD * kP;     // floats of a [128][kP] tile
constexpr int kScal = 23 * kC + 16;
static_assert(kTW == kTQ, "v (bf16 pairs) and E2 share one slot");

// KF | QF (q; dW; dKK) | VF (V'; dV') | DOB (dO bf16) | BIG (G1, E, L; D; H; v, dA, M; E2, F kk) | AF | KKF | scalars.
constexpr int kGradMMASmem = 4 * (3 * kTP + kTW + kBig + 2 * kTQ + kScal);
static_assert(kGradMMASmem == 227136, "kGradMMASmem: keep the header and the README in step");
static_assert(kGradMMASmem <= 232448, "above the opt-in limit");

// rowo: the word offset of row m in a tile of row pitch P (kP or kQ) laid out in 8-row blocks: a block
// keeps its 8 P words (8 rows of W = P - 4 data words + 32 spare words, the old padded rows' budget), but
// row m % 8 sits at position q (m's bits 1 and 2 swapped: rows 0, 1, 4, 5, 2, 3, 6, 7 in memory order) plus
// 2 ((q + 1) / 2) 16-byte units of gap: rows 0..7 start at bank units 0, 2, 4, 6, 2, 4, 6, 0 (mod 8). Rows
// g = 0..3 (and 4..7) thus start 2 units apart (a half-warp's 8-byte pair loads of rows g, columns 2t, 2t + 1
// fill the 32 banks), and so do rows 0, 2, 4, 6 and rows 1, 3, 5, 7 (a warp's scalar loads of rows 2t (+1),
// columns g fill them). rowo(2t + 1) = rowo(2t) + P + 4 (the transposed pair one register, as before);
// columns stay contiguous (cp.async units, float2 / float4 pairs); rowo(8 a + m) = 8 a P + rowo(m): a pointer
// moved by a multiple of 8 rows (m P) and by any column count stays valid.
template <int P>
__device__ __forceinline__ int rowo(int m) {
	const int q = (m & 1) | ((m >> 1) & 2) | ((m << 1) & 4);
	return (m >> 3) * (8 * P) + 4 * (q * ((P - 4) / 4) + 2 * ((q + 1) >> 1));
}

__device__ __forceinline__ float2 ld2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ void st2(float* p, float x0, float x1) { *reinterpret_cast<float2*>(p) = make_float2(x0, x1); }

// frag_a: the A fragment (16 x 16) of a rowo<P> tile, split (S) or plain bf16: element (m, k) at
// p[rowo(m) + k] (T false: row-major, the pair k, k + 1 one 8-byte load) or p[rowo(k) + m] (T: transposed).
template <bool S, int P, bool T>
__device__ __forceinline__ void frag_a(const float* p, int g, int t, unsigned hi[4], unsigned lo[4]) {
#pragma unroll
	for (int r = 0; r < 4; ++r) {
		const int m = g + 8 * (r & 1), k = 2 * t + 8 * (r >> 1);
		float x0, x1;
		if (T) {  // rows k, k + 1 (k even): rowo(k) = rowo(2t) + 8 (r >> 1) P, rowo(k + 1) = rowo(k) + P + 4
			const int o = rowo<P>(2 * t) + 8 * (r >> 1) * P + m;
			x0 = p[o];
			x1 = p[o + P + 4];
		} else {  // row m = g + 8 (r & 1)
			const float2 x = ld2(p + rowo<P>(g) + 8 * (r & 1) * P + k);
			x0 = x.x;
			x1 = x.y;
		}
		if (S)
			tc::split_bf16x2(x0, x1, hi[r], lo[r]);
		else
			hi[r] = tc::pack_bf16x2(x0, x1);
	}
}

// frag_b: the B fragment (16 x 8) of a rowo<P> tile, split: element (k, n) is sign p[rowo(n) + k] (T false:
// B = tile^T, the pair k, k + 1 one 8-byte load) or sign p[rowo(k) + n] (T).
template <int P, bool T>
__device__ __forceinline__ void frag_b(const float* p, int g, int t, unsigned hi[2], unsigned lo[2], float sign = 1.f) {
#pragma unroll
	for (int r = 0; r < 2; ++r) {
		const int k = 2 * t + 8 * r;
		float x0, x1;
		if (T) {  // rows k, k + 1 as in frag_a
			const int o = rowo<P>(2 * t) + 8 * r * P + g;
			x0 = p[o];
			x1 = p[o + P + 4];
		} else {
			const float2 x = ld2(p + rowo<P>(g) + k);
			x0 = x.x;
			x1 = x.y;
		}
		tc::split_bf16x2(sign * x0, sign * x1, hi[r], lo[r]);
	}
}

// copy_dout: cp.async of value head h's dO rows < n (bf16, [T][HV][128]) into DOB ([64][kW] words: 16 units of 8
// bf16 a row, thread tid taking the units tid + 256 x, x = 0..3), zeros stored directly from row n on (not
// committed).
__device__ __forceinline__ void copy_dout(unsigned* DOB, const __nv_bfloat16* __restrict__ dout, int t0, int n, int h, int HV,
                                          int tid) {
#pragma unroll
	for (int x = 0; x < 4; ++x) {
		const int u = tid + kThreads * x, r = u >> 4, cu = u & 15;
		unsigned* d = DOB + r * kW + 4 * cu;
		if (r < n) {
			tc::cp_async16(d, dout + ((long long)(t0 + r) * HV + h) * kD + 8 * cu);
		} else {
#pragma unroll
			for (int e = 0; e < 4; ++e) d[e] = 0u;
		}
	}
}

// frag_a_bf: the A fragment of a bf16 tile of 32-bit words (row stride ld words), element (m, k) at
// bf16 k of row m: one word a register.
__device__ __forceinline__ void frag_a_bf(const unsigned* p, int ld, int g, int t, unsigned a[4]) {
#pragma unroll
	for (int r = 0; r < 4; ++r) a[r] = p[(g + 8 * (r & 1)) * ld + t + 4 * (r >> 1)];
}

// frag_bt_bf: the B fragment whose element (k, n) is bf16 k of row n of a bf16 tile (B = tile^T).
__device__ __forceinline__ void frag_bt_bf(const unsigned* p, int ld, int g, int t, unsigned b[2]) {
#pragma unroll
	for (int r = 0; r < 2; ++r) b[r] = p[g * ld + t + 4 * r];
}

// mma_t: acc += ah bh (+ ah bl when SB) (+ al bh when SA), in that order.
template <bool SA, bool SB>
__device__ __forceinline__ void mma_t(float acc[4], const unsigned ah[4], const unsigned al[4], const unsigned bh[2],
                                     const unsigned bl[2]) {
	tc::mma_bf16_16816(acc, ah, bh, acc);
	if (SB) tc::mma_bf16_16816(acc, ah, bl, acc);
	if (SA) tc::mma_bf16_16816(acc, al, bh, acc);
}

// gemm: acc[NT] += A B over the k steps k0 .. k1 - 1 (16 each), both fp32 rowo tiles and split: A (m, k)
// at a[rowo<AP>(m) + k] (AT: a[rowo<AP>(k) + m]; a at the warp's first row / column), B (k, n) at
// b[rowo<BP>(n) + k] (BT: b[rowo<BP>(k) + n]; b at its first column / row). LO false: one product of the
// hi halves only (the lo halves are never formed: dead code).
template <int NT, int AP, bool AT, int BP, bool BT, bool LO = true>
__device__ __forceinline__ void gemm(float (*acc)[4], const float* a, const float* b, int k0, int k1, int g, int t) {
	for (int kk = k0; kk < k1; ++kk) {
		unsigned ah[4], al[4];
		frag_a<true, AP, AT>(a + (AT ? 16 * kk * AP : 16 * kk), g, t, ah, al);
#pragma unroll
		for (int nt = 0; nt < NT; ++nt) {
			unsigned bh[2], bl[2];
			frag_b<BP, BT>(b + (BT ? 16 * kk * BP + 8 * nt : 16 * kk + 8 * nt * BP), g, t, bh, bl);
			mma_t<LO, LO>(acc[nt], ah, al, bh, bl);
		}
	}
}

// copy_f32: cp.async of the rows < n of a [ROWS][128] fp32 tile (global row stride `stride`) into a
// [ROWS][kP] rowo stage, zeros in the rows >= n; thread tid owns the 16-byte units tid + 256 x.
template <int ROWS>
__device__ __forceinline__ void copy_f32(float* dst, const float* src, long long stride, int n) {
#pragma unroll
	for (int x = 0; x < ROWS * 32 / kThreads; ++x) {
		const int u = threadIdx.x + kThreads * x, r = u >> 5, c4 = 4 * (u & 31);
		float* d = dst + rowo<kP>(threadIdx.x >> 5) + 8 * x * kP + c4;  // rowo(r), r = threadIdx.x / 32 + 8 x
		if (r < n) {
			tc::cp_async16(d, src + r * stride + c4);
		} else {
			*reinterpret_cast<float4*>(d) = make_float4(0.f, 0.f, 0.f, 0.f);
		}
	}
}

// d_dot_h returns the warp's partial of S2's <D, H> (every lane the same value; lane 0 stores it). D's copy
// into BIG (copy_f32<kD>) must be the last committed group. H's units come from global memory first, while
// that copy is in flight (both latencies at once; ~64 registers live only here, far below the S3 / S4
// peak); then the thread waits for its copies and multiplies its own D units (landed for it) by them, in
// the same order as ever, and the warp adds its lanes by the xor butterfly.
__device__ __forceinline__ float d_dot_h(const float* BIG, const float* __restrict__ hs) {
	const int tid = threadIdx.x, w = tid >> 5;
	float4 h4[kD * 32 / kThreads];
#pragma unroll
	for (int x = 0; x < kD * 32 / kThreads; ++x) {
		const int u = tid + kThreads * x, r = u >> 5, c4 = 4 * (u & 31);
		h4[x] = *reinterpret_cast<const float4*>(hs + r * kD + c4);
	}
	tc::cp_async_wait<0>();
	float dh = 0.f;
#pragma unroll
	for (int x = 0; x < kD * 32 / kThreads; ++x) {
		const int c4 = 4 * (tid & 31);
		const float4 d4 = *reinterpret_cast<const float4*>(BIG + rowo<kP>(w) + 8 * x * kP + c4);  // rowo(r), r = w + 8 x
		dh = fmaf(d4.x, h4[x].x, dh);
		dh = fmaf(d4.y, h4[x].y, dh);
		dh = fmaf(d4.z, h4[x].z, dh);
		dh = fmaf(d4.w, h4[x].w, dh);
	}
#pragma unroll
	for (int off = 16; off > 0; off >>= 1) dh += __shfl_xor_sync(0xffffffffu, dh, off);
	return dh;
}

// rowpart: the row dots of a lane's accumulator rows i0 (p0) and i1 (p1) over its 16 columns, added
// over the 4 lanes of a row by a fixed butterfly; lane t = 0 stores them at part[i] (the caller passes
// part + ch * 64: one partial a column half).
__device__ __forceinline__ void rowpart(float* part, int i0, int i1, float p0, float p1, int t) {
	p0 += __shfl_xor_sync(0xffffffffu, p0, 1);
	p1 += __shfl_xor_sync(0xffffffffu, p1, 1);
	p0 += __shfl_xor_sync(0xffffffffu, p0, 2);
	p1 += __shfl_xor_sync(0xffffffffu, p1, 2);
	if (t == 0) {
		part[i0] = p0;
		part[i1] = p1;
	}
}

extern "C" __global__ void __launch_bounds__(kThreads, 1)
gdn_chunk_grads_mma(const float* __restrict__ qn, const float* __restrict__ kn, const __nv_bfloat16* __restrict__ v,
                    int v_stride, const float* __restrict__ gcum, const float* __restrict__ beta,
                    const float* __restrict__ h_state, const float* __restrict__ vnew,
                    const float* __restrict__ d_chunk, const float* __restrict__ dvnew,
                    const __nv_bfloat16* __restrict__ dout, const int* __restrict__ chunk_tok0,
                    const int* __restrict__ chunk_len, float* __restrict__ dqv, float* __restrict__ dkv,
                    float* __restrict__ dv, int dv_stride, float* __restrict__ dg, float* __restrict__ dbeta,
                    int HQK, int HV, float scale) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	float* KF = smem;                                           // [64][kP] k, all along
	float* QF = KF + kTP;                                       // [64][kP] q; dW (S3-S4); dKK [64][kQ] (S5-S6)
	float* VF = QF + kTP;                                       // [64][kP] V' (S1-S2); dV' (S3-S4)
	unsigned* DOB = reinterpret_cast<unsigned*>(VF + kTP);      // [64][kW] dO bf16 pairs
	float* BIG = VF + kTP + kTW;                                // [128][kP], by phase:
	float* G1S = BIG;                                           //   S1: G1, E, L [64][kQ]
	float* ES = BIG + kTQ;
	float* LS = BIG + 2 * kTQ;
	unsigned* VB = reinterpret_cast<unsigned*>(BIG);            //   S4: v bf16 pairs [64][kW], dA, M [64][kQ]
	float* DAS = BIG + kTQ;
	float* MS = BIG + 2 * kTQ;
	float* E2S = BIG;                                           //   S5-S6: E2 (over v), F kk (over dA)
	float* FKS = BIG + kTQ;
	float* DKK = QF;
	float* AF = BIG + kBig;   // [64][kQ] (I + L)^-1, all along (zero above the diagonal blocks)
	float* KKF = AF + kTQ;    // [64][kQ] K K^T
	float* sv = KKF + kTQ;
	float* bet = sv;
	float* gam = sv + kC;
	float* eg = sv + 2 * kC;
	float* tail = sv + 3 * kC;
	float* bg = sv + 4 * kC;
	float* gt = sv + 5 * kC;    // [7][64] dgamma terms (row 0 ends as dgamma)
	float* bt = sv + 12 * kC;   // [3][64] (row 2: sum_j F kk)
	float* part = sv + 15 * kC;  // [4][2][64] row-dot partials: dQg.q, dKt.k, XU.v, XW.k
	float* red = sv + 23 * kC;   // [0, 8) <D, H> warp partials; [8] the last row's extra term

	const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
	const int lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3, rt = w & 3, ch = w >> 2;
	const int i0 = 16 * rt + g, i1 = i0 + 8;
	// rowo of rows i0, i1 (kP and kQ tiles) and of row 2t (kQ), spelled so that the lane's part is one term
	const int rp0 = 16 * rt * kP + rowo<kP>(g), rp1 = rp0 + 8 * kP, rq0 = 16 * rt * kQ + rowo<kQ>(g), rq1 = rq0 + 8 * kQ;
	const int rqt = rowo<kQ>(2 * t);
	const bool lower = !(ch == 1 && rt < 2);  // the warp's 16 x 32 tile of a 64 x 64 result touches j <= i
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int qh = h / (HV / HQK);
	const long long qrow = (long long)HQK * kD, vrow = (long long)HV * kD;
	const float* hs = h_state + ((long long)c * HV + h) * kD * kD;
	const float* ds = d_chunk + ((long long)c * HV + h) * kD * kD;

	// ---- S1: stage k, q, V', dO; beta, gamma ----
	copy_f32<kC>(KF, kn + ((long long)t0 * HQK + qh) * kD, qrow, n);
	copy_f32<kC>(QF, qn + ((long long)t0 * HQK + qh) * kD, qrow, n);
	copy_f32<kC>(VF, vnew + ((long long)t0 * HV + h) * kD, vrow, n);
	copy_dout(DOB, dout, t0, n, h, HV, tid);
	tc::cp_async_commit();
	for (int e = tid; e < kTQ; e += kThreads) AF[e] = 0.f;
	if (tid < kC) {
		bet[tid] = tid < n ? beta[(long long)(t0 + tid) * HV + h] : 0.f;
		gam[tid] = tid < n ? gcum[(long long)(t0 + tid) * HV + h] : 0.f;
	}
	tc::cp_async_wait<0>();
	__syncthreads();  // barrier 1
	const float glast = gam[n - 1];
	if (tid < kC) {
		const bool in = tid < n;
		const float e = expf(gam[tid]);
		eg[tid] = in ? e : 0.f;
		tail[tid] = in ? expf(glast - gam[tid]) : 0.f;
		bg[tid] = in ? bet[tid] * e : 0.f;
	}

	// ---- 1a: K K^T, S = Q K^T, dP = dO V'^T on the warp's 16 x 32 tile ----
	{
		float kk[4][4] = {}, s[4][4] = {}, dp[4][4] = {};
		if (lower) {
			for (int k8 = 0; k8 < kD / 16; ++k8) {
				unsigned kh[4], kl[4], qa[4], ql[4], oa[4];
				frag_a<true, kP, false>(KF + 16 * rt * kP + 16 * k8, g, t, kh, kl);
				frag_a<true, kP, false>(QF + 16 * rt * kP + 16 * k8, g, t, qa, ql);
				frag_a_bf(DOB + 16 * rt * kW + 8 * k8, kW, g, t, oa);
#pragma unroll
				for (int nt = 0; nt < 4; ++nt) {
					unsigned bh[2], bl[2], vh[2], vl[2];
					frag_b<kP, false>(KF + (32 * ch + 8 * nt) * kP + 16 * k8, g, t, bh, bl);  // (k, n) = K[j][d]
					mma_t<true, true>(kk[nt], kh, kl, bh, bl);
					mma_t<true, true>(s[nt], qa, ql, bh, bl);
					frag_b<kP, false>(VF + (32 * ch + 8 * nt) * kP + 16 * k8, g, t, vh, vl);  // (k, n) = V'[j][d]
					tc::mma_bf16_16816(dp[nt], oa, vh, dp[nt]);
					tc::mma_bf16_16816(dp[nt], oa, vl, dp[nt]);
				}
			}
		}
#pragma unroll
		for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
			for (int r2 = 0; r2 < 4; r2 += 2) {  // the pair r2, r2 + 1: columns j, j + 1 of row i, 8-byte stores
				float kv[2], lv[2], gv[2], ev[2];
				const int i = i0 + 8 * (r2 >> 1);
#pragma unroll
				for (int r1 = 0; r1 < 2; ++r1) {
					const int r = r2 + r1, j = 32 * ch + 8 * nt + 2 * t + r1;
					const float ge = expf(gam[i] - gam[j]);
					kv[r1] = kk[nt][r];
					lv[r1] = (j < i && i < n) ? bet[i] * kk[nt][r] * ge : 0.f;
					gv[r1] = (j <= i && i < n) ? scale * dp[nt][r] * ge : 0.f;
					ev[r1] = gv[r1] * s[nt][r];
				}
				const int j = 32 * ch + 8 * nt + 2 * t;
				st2(KKF + (r2 < 2 ? rq0 : rq1) + j, kv[0], kv[1]);
				st2(LS + (r2 < 2 ? rq0 : rq1) + j, lv[0], lv[1]);
				st2(G1S + (r2 < 2 ? rq0 : rq1) + j, gv[0], gv[1]);
				st2(ES + i * kQ + j, ev[0], ev[1]);  // ES: plain rows (read only by the row / column sums)
			}
		}
	}
	__syncthreads();  // barrier 2: G1, E, L, kk, eg, tail, bg

	// ---- 1b: dq = G1 K, dk = G1^T Q; the diagonal blocks of A; the sums of E ----
	float DQ[8][4] = {}, DK[8][4] = {};
	gemm<8, kQ, false, kP, true>(DQ, G1S + 16 * rt * kQ, KF + 64 * ch, 0, rt + 1, g, t);  // G1 lower: j <= i
	gemm<8, kQ, true, kP, true>(DK, G1S + 16 * rt, QF + 64 * ch, rt, kC / 16, g, t);    // (m, k) = G1[i][j], i >= j
	if (w < 4 && lane < 16) {  // (I + L_bb)^-1, block b = w, column lane
		const int o = 16 * w;  // row o + i at o kQ + rowo(i) (o a multiple of 8; i unrolled: a constant)
		float xcol[16];
#pragma unroll
		for (int i = 0; i < 16; ++i) {
			float sacc = 0.f;
#pragma unroll
			for (int j = 0; j < 16; ++j)  // j < i (fully unrolled: a loop bound of i kept xcol in local memory)
				if (j < i) sacc = fmaf(LS[o * kQ + rowo<kQ>(i) + o + j], xcol[j], sacc);
			xcol[i] = (i == lane ? 1.f : 0.f) - sacc;
			AF[o * kQ + rowo<kQ>(i) + o + lane] = xcol[i];
		}
	}
	if (tid >= 2 * kC && tid < 3 * kC) {  // sum_j E_ij, j ascending
		const int i = tid - 2 * kC;
		float sacc = 0.f;
		for (int j = 0; j <= i; ++j) sacc += ES[i * kQ + j];
		gt[1 * kC + i] = sacc;
	} else if (tid >= 3 * kC) {  // sum_i E_ij, i ascending
		const int j = tid - 3 * kC;
		float sacc = 0.f;
		for (int i = j; i < n; ++i) sacc += ES[i * kQ + j];
		gt[2 * kC + j] = sacc;
	}
	__syncthreads();  // barrier 3: the diagonal blocks

	// ---- 1c: A_ij = -D_i sum_{k=j}^{i-1} L_ik A_kj, block column j by warp j (gdn_prep_mma's P4) ----
	if (w < 3) {
		const int bj = w;
		for (int bi = bj + 1; bi < 4; ++bi) {
			float xt[2][4] = {};  // X^T: m = column in block j, n = row in block i
			for (int bk = bj; bk < bi; ++bk) {
				unsigned ah[4], al[4];
				frag_a<true, kQ, true>(AF + (16 * bk) * kQ + 16 * bj, g, t, ah, al);  // (m, k) = A_kj[k][m]
#pragma unroll
				for (int nt = 0; nt < 2; ++nt) {
					unsigned bh[2], bl[2];  // (k, n) = L_ik[n][k]
					frag_b<kQ, false>(LS + (16 * bi + 8 * nt) * kQ + 16 * bk, g, t, bh, bl);
					mma_t<true, true>(xt[nt], ah, al, bh, bl);
				}
			}
			unsigned ah[4], al[4];  // X^T's accumulator tiles as the A fragment
#pragma unroll
			for (int r = 0; r < 4; ++r)
				tc::split_bf16x2(xt[r >> 1][2 * (r & 1)], xt[r >> 1][2 * (r & 1) + 1], ah[r], al[r]);
			float res[2][4] = {};
#pragma unroll
			for (int nt = 0; nt < 2; ++nt) {
				unsigned bh[2], bl[2];  // (k, n) = -D_i[n][k]
				frag_b<kQ, false>(AF + (16 * bi + 8 * nt) * kQ + 16 * bi, g, t, bh, bl, -1.f);
				mma_t<true, true>(res[nt], ah, al, bh, bl);
			}
#pragma unroll
			for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
				for (int r = 0; r < 4; ++r) {
					const int m = g + 8 * (r >> 1);  // row nn = 8 nt + 2 t + (r & 1) of block i
					AF[(16 * bi + 8 * nt) * kQ + rqt + (r & 1) * (kQ + 4) + 16 * bj + m] = res[nt][r];
				}
			}
		}
	}
	__syncthreads();  // barrier 4: A complete; G1, E, L dead

	// ---- S2: D; <D, H>; dKt = V' D^T ----
	copy_f32<kD>(BIG, ds, kD, kD);
	tc::cp_async_commit();
	{
		const float dh = d_dot_h(BIG, hs);
		if (lane == 0) red[w] = dh;
	}
	__syncthreads();  // barrier 5: every thread's D units landed
	{
		float acc[8][4] = {};
		gemm<8, kP, false, kP, false>(acc, VF + 16 * rt * kP, BIG + 64 * ch * kP, 0, kD / 16, g, t);  // (k, n) = D[n][k]
		float p0 = 0.f, p1 = 0.f;
		const float ta = tail[i0], tb = tail[i1];
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
			const int col = 64 * ch + 8 * nt + 2 * t;
			DK[nt][0] = fmaf(ta, acc[nt][0], DK[nt][0]);
			DK[nt][1] = fmaf(ta, acc[nt][1], DK[nt][1]);
			DK[nt][2] = fmaf(tb, acc[nt][2], DK[nt][2]);
			DK[nt][3] = fmaf(tb, acc[nt][3], DK[nt][3]);
			{
				const float2 ya = ld2(KF + rp0 + col), yb = ld2(KF + rp1 + col);
				p0 = fmaf(acc[nt][0], ya.x, p0);
				p0 = fmaf(acc[nt][1], ya.y, p0);
				p1 = fmaf(acc[nt][2], yb.x, p1);
				p1 = fmaf(acc[nt][3], yb.y, p1);
			}
		}
		rowpart(part + (1 * 2 + ch) * kC, i0, i1, p0, p1, t);
	}
	__syncthreads();  // barrier 6: D and V' dead

	// ---- S3: H, dV'; dQg = dO H^T, dW = -dV' H^T ----
	copy_f32<kD>(BIG, hs, kD, kD);
	copy_f32<kC>(VF, dvnew + ((long long)t0 * HV + h) * kD, vrow, n);
	tc::cp_async_commit();
	tc::cp_async_wait<0>();
	__syncthreads();  // barrier 7
	float wa[8][4] = {};
	{
		float qg[8][4] = {};
		for (int k8 = 0; k8 < kD / 16; ++k8) {
			unsigned oa[4], ah[4], al[4];
			frag_a_bf(DOB + 16 * rt * kW + 8 * k8, kW, g, t, oa);
			frag_a<true, kP, false>(VF + 16 * rt * kP + 16 * k8, g, t, ah, al);
#pragma unroll
			for (int nt = 0; nt < 8; ++nt) {
				unsigned bh[2], bl[2];  // (k, n) = H[n][k]
				frag_b<kP, false>(BIG + (64 * ch + 8 * nt) * kP + 16 * k8, g, t, bh, bl);
				tc::mma_bf16_16816(qg[nt], oa, bh, qg[nt]);
				tc::mma_bf16_16816(qg[nt], oa, bl, qg[nt]);
				mma_t<true, true>(wa[nt], ah, al, bh, bl);
			}
		}
		float p0 = 0.f, p1 = 0.f;
		const float ea = eg[i0], eb = eg[i1];
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
			const int col = 64 * ch + 8 * nt + 2 * t;
#pragma unroll
			for (int r = 0; r < 4; ++r) {
				const int cc = col + (r & 1);  // row r < 2 ? i0 : i1
				const float x = scale * qg[nt][r];
				DQ[nt][r] = fmaf(r < 2 ? ea : eb, x, DQ[nt][r]);
				if (r < 2)
					p0 = fmaf(x, QF[(r < 2 ? rp0 : rp1) + cc], p0);
				else
					p1 = fmaf(x, QF[(r < 2 ? rp0 : rp1) + cc], p1);
			}
			if (i0 < n)
				*reinterpret_cast<float2*>(dqv + ((long long)(t0 + i0) * HV + h) * kD + col) = make_float2(DQ[nt][0], DQ[nt][1]);
			if (i1 < n)
				*reinterpret_cast<float2*>(dqv + ((long long)(t0 + i1) * HV + h) * kD + col) = make_float2(DQ[nt][2], DQ[nt][3]);
		}
		rowpart(part + (0 * 2 + ch) * kC, i0, i1, p0, p1, t);
	}
	__syncthreads();  // barrier 8: every warp done with q and H
#pragma unroll
	for (int nt = 0; nt < 8; ++nt) {
		const int col = 64 * ch + 8 * nt + 2 * t;
		st2(QF + rp0 + col, -wa[nt][0], -wa[nt][1]);
		st2(QF + rp1 + col, -wa[nt][2], -wa[nt][3]);
	}
	// v rows as bf16 pairs, zeros past n: one 4-byte load a pair where v and v_stride keep pairs 4-byte
	// aligned (every buffer kcp passes), else two 2-byte loads; the same word either way.
	const bool vpair = ((reinterpret_cast<unsigned long long>(v) & 3) | (v_stride & 1)) == 0;
	for (int e = tid; e < kC * (kD / 2); e += kThreads) {
		const int r = e >> 6, wd = e & 63;
		unsigned word = 0u;
		if (r < n) {
			const __nv_bfloat16* p = v + (long long)(t0 + r) * v_stride + h * kD + 2 * wd;
			word = vpair ? *reinterpret_cast<const unsigned*>(p)
			             : static_cast<unsigned>(__bfloat16_as_ushort(p[0])) |
			                   (static_cast<unsigned>(__bfloat16_as_ushort(p[1])) << 16);
		}
		VB[r * kW + wd] = word;
	}
	__syncthreads();  // barrier 9: dW, v

	// ---- S4: XU = A^T dV', XW = A^T dW; T1 = dV' v^T, T2 = dW K^T -> dA ----
	{
		float xu[8][4] = {}, xw[8][4] = {};
		for (int k8 = rt; k8 < kC / 16; ++k8) {  // (m, k) = A[i][j]: i >= j
			unsigned ah[4], al[4];
			frag_a<true, kQ, true>(AF + 16 * rt + 16 * k8 * kQ, g, t, ah, al);
#pragma unroll
			for (int nt = 0; nt < 8; ++nt) {
				unsigned bh[2], bl[2];
				frag_b<kP, true>(VF + 16 * k8 * kP + 64 * ch + 8 * nt, g, t, bh, bl);
				mma_t<true, true>(xu[nt], ah, al, bh, bl);
				frag_b<kP, true>(QF + 16 * k8 * kP + 64 * ch + 8 * nt, g, t, bh, bl);
				mma_t<true, true>(xw[nt], ah, al, bh, bl);
			}
		}
		float pu0 = 0.f, pu1 = 0.f, pr0 = 0.f, pr1 = 0.f;
		const float ba = bet[i0], bb = bet[i1], ga = bg[i0], gb = bg[i1];
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
			const int col = 64 * ch + 8 * nt + 2 * t;
			const unsigned va = VB[i0 * kW + (col >> 1)], vb = VB[i1 * kW + (col >> 1)];
			pu0 = fmaf(xu[nt][0], __uint_as_float(va << 16), pu0);
			pu0 = fmaf(xu[nt][1], __uint_as_float(va & 0xffff0000u), pu0);
			pu1 = fmaf(xu[nt][2], __uint_as_float(vb << 16), pu1);
			pu1 = fmaf(xu[nt][3], __uint_as_float(vb & 0xffff0000u), pu1);
			if (i0 < n) {
				float* o = dv + (long long)(t0 + i0) * dv_stride + h * kD + col;
				o[0] = ba * xu[nt][0];
				o[1] = ba * xu[nt][1];
			}
			if (i1 < n) {
				float* o = dv + (long long)(t0 + i1) * dv_stride + h * kD + col;
				o[0] = bb * xu[nt][2];
				o[1] = bb * xu[nt][3];
			}
			DK[nt][0] = fmaf(ga, xw[nt][0], DK[nt][0]);
			DK[nt][1] = fmaf(ga, xw[nt][1], DK[nt][1]);
			DK[nt][2] = fmaf(gb, xw[nt][2], DK[nt][2]);
			DK[nt][3] = fmaf(gb, xw[nt][3], DK[nt][3]);
			{
				const float2 ya = ld2(KF + rp0 + col), yb = ld2(KF + rp1 + col);
				pr0 = fmaf(xw[nt][0], ya.x, pr0);
				pr0 = fmaf(xw[nt][1], ya.y, pr0);
				pr1 = fmaf(xw[nt][2], yb.x, pr1);
				pr1 = fmaf(xw[nt][3], yb.y, pr1);
			}
		}
		rowpart(part + (2 * 2 + ch) * kC, i0, i1, pu0, pu1, t);
		rowpart(part + (3 * 2 + ch) * kC, i0, i1, pr0, pr1, t);
	}
	{
		float t1[4][4] = {}, t2[4][4] = {};
		if (lower) {
			for (int k8 = 0; k8 < kD / 16; ++k8) {
				unsigned dh[4], dl[4], wh[4], wl[4];
				frag_a<true, kP, false>(VF + 16 * rt * kP + 16 * k8, g, t, dh, dl);
				frag_a<true, kP, false>(QF + 16 * rt * kP + 16 * k8, g, t, wh, wl);
#pragma unroll
				for (int nt = 0; nt < 4; ++nt) {
					unsigned vv[2], kh[2], kl[2];
					frag_bt_bf(VB + (32 * ch + 8 * nt) * kW + 8 * k8, kW, g, t, vv);  // (k, n) = v[j][d]
					tc::mma_bf16_16816(t1[nt], dh, vv, t1[nt]);
					tc::mma_bf16_16816(t1[nt], dl, vv, t1[nt]);
					frag_b<kP, false>(KF + (32 * ch + 8 * nt) * kP + 16 * k8, g, t, kh, kl);  // (k, n) = K[j][d]
					mma_t<true, true>(t2[nt], wh, wl, kh, kl);
				}
			}
		}
#pragma unroll
		for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
			for (int r = 0; r < 4; ++r) {
				const int i = i0 + 8 * (r >> 1), j = 32 * ch + 8 * nt + 2 * t + (r & 1);
				DAS[(r < 2 ? rq0 : rq1) + j] = (j < i && i < n) ? fmaf(bet[j], t1[nt][r], bg[j] * t2[nt][r]) : 0.f;
			}
		}
	}
	__syncthreads();  // barrier 10: dA; dW and v dead

	// ---- S5: M = A^T dA; dL = -M A^T; F, dKK, E2, F kk ----
	{
		float m[4][4] = {};
		gemm<4, kQ, true, kQ, true>(m, AF + 16 * rt, DAS + 32 * ch, rt, kC / 16, g, t);  // (m, k) = A[a][x], a >= x
#pragma unroll
		for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
			for (int r = 0; r < 4; ++r) MS[(r < 2 ? rq0 : rq1) + 32 * ch + 8 * nt + 2 * t + (r & 1)] = m[nt][r];
		}
	}
	__syncthreads();  // barrier 11: M
	{
		float l[4][4] = {};
		if (lower) gemm<4, kQ, false, kQ, false>(l, MS + 16 * rt * kQ, AF + 32 * ch * kQ, 0, 2 * ch + 2, g, t);  // (k, n) = A[j][b]
#pragma unroll
		for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
			for (int r = 0; r < 4; ++r) {
				const int i = i0 + 8 * (r >> 1), j = 32 * ch + 8 * nt + 2 * t + (r & 1);
				float x = 0.f, e2 = 0.f, fk = 0.f;
				if (j < i && i < n) {
					const float f = -l[nt][r] * expf(gam[i] - gam[j]);  // F = dL Γ
					const float kkv = KKF[(r < 2 ? rq0 : rq1) + j];
					x = bet[i] * f;
					e2 = x * kkv;
					fk = f * kkv;
				}
				DKK[(r < 2 ? rq0 : rq1) + j] = x;
				E2S[i * kQ + j] = e2;
				FKS[i * kQ + j] = fk;
			}
		}
	}
	__syncthreads();  // barrier 12: dKK, E2, F kk

	// ---- S6: dk += dKK K + dKK^T K; the sums; dgamma, dbeta, dg ----
	if (tid < kC) {
		const int i = tid;
		float sacc = 0.f;
		for (int j = 0; j < i; ++j) sacc += FKS[i * kQ + j];
		bt[2 * kC + i] = sacc;
	} else if (tid < 2 * kC) {
		const int i = tid - kC;
		float sacc = 0.f;
		for (int j = 0; j < i; ++j) sacc += E2S[i * kQ + j];
		gt[5 * kC + i] = sacc;
	} else if (tid < 3 * kC) {
		const int j = tid - 2 * kC;
		float sacc = 0.f;
		for (int i = j + 1; i < n; ++i) sacc += E2S[i * kQ + j];
		gt[6 * kC + j] = sacc;
	} else {
		const int i = tid - 3 * kC;
		gt[3 * kC + i] = tail[i] * (part[(1 * 2 + 0) * kC + i] + part[(1 * 2 + 1) * kC + i]);  // s_i
	}
	gemm<8, kQ, false, kP, true>(DK, DKK + 16 * rt * kQ, KF + 64 * ch, 0, rt + 1, g, t);  // dKK[i][j], j < i
	gemm<8, kQ, true, kP, true>(DK, DKK + 16 * rt, KF + 64 * ch, rt, kC / 16, g, t);      // dKK[j][i], j > i
#pragma unroll
	for (int nt = 0; nt < 8; ++nt) {
		const int col = 64 * ch + 8 * nt + 2 * t;
		if (i0 < n)
			*reinterpret_cast<float2*>(dkv + ((long long)(t0 + i0) * HV + h) * kD + col) = make_float2(DK[nt][0], DK[nt][1]);
		if (i1 < n)
			*reinterpret_cast<float2*>(dkv + ((long long)(t0 + i1) * HV + h) * kD + col) = make_float2(DK[nt][2], DK[nt][3]);
	}
	__syncthreads();  // barrier 13: the sums and s_i
	if (tid < n) {
		const int i = tid;
		const float pq = part[(0 * 2 + 0) * kC + i] + part[(0 * 2 + 1) * kC + i];  // scale dQg_i . q_i
		const float xv = part[(2 * 2 + 0) * kC + i] + part[(2 * 2 + 1) * kC + i];  // XU_i . v_i
		const float rr = part[(3 * 2 + 0) * kC + i] + part[(3 * 2 + 1) * kC + i];  // XW_i . k_i
		float a = eg[i] * pq;
		a += gt[1 * kC + i];
		a -= gt[2 * kC + i];
		a -= gt[3 * kC + i];
		a += bg[i] * rr;
		a += gt[5 * kC + i];
		a -= gt[6 * kC + i];
		gt[i] = a;
		dbeta[(long long)(t0 + i) * HV + h] = (xv + eg[i] * rr) + bt[2 * kC + i];
	}
	if (tid == kC) {
		float sacc = 0.f;
		for (int i = 0; i < n; ++i) sacc += gt[3 * kC + i];
		float dhs = 0.f;
		for (int x = 0; x < kThreads / 32; ++x) dhs += red[x];
		red[8] = fmaf(expf(glast), dhs, sacc);  // sum_i s_i + e^(gamma_last) <D, H>
	}
	__syncthreads();  // barrier 14
	if (tid == 0) {
		float acc = 0.f;
		for (int i = n - 1; i >= 0; --i) {
			float x = gt[i];
			if (i == n - 1) x += red[8];
			acc += x;
			dg[(long long)(t0 + i) * HV + h] = acc;
		}
	}
}

}  // namespace gradmma
}  // namespace gdnkcp
