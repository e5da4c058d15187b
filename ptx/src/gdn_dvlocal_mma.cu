// gdn_dvlocal_mma.cu (checked on the CPU emulator and on the H200; docs/perf-notes.md has its times): the
// backward's dV'_local on mma.sync m16n8k16 (bf16 in, fp32 accumulate, hi/lo splits),
// first tensor-core version of gdn_dvlocal_bwd (gdn_bwd.cu, docs/gpu-backward.md item 1). Same arguments,
// grid and output:
//   gdn_dvlocal_mma   grid (NC, HV), block 256, kDvlMMASmem = 82176 bytes (two CTAs an SM)
//   gdn_dvlocal_mma(qn, kn, gcum, dout bf16, chunk_tok0, chunk_len, dvl, int HQK, int HV, float scale)
//   dvl [Tr, HV, 128]:  dvl_j = scale * sum_{i=j..n-1} (q_i . k_j) e^(gamma_i - gamma_j) dO_i
// i.e. per chunk dvl = scale P^T dO with P^T = (K Q^T) ⊙ e^(gamma_i - gamma_j) on j <= i < n. qn, kn fp32
// [Tr, HQK, 128] (value head h reads QK head h / (HV / HQK)), gcum fp32 [Tr, HV], dout bf16 [Tr, HV, 128].
// Rows past a short chunk's end are neither read (their inputs may be NaN) nor written. The block index is
// read linearly with the head fastest (lin = blockIdx.y * NC + blockIdx.x, c = lin / HV, h = lin % HV, as
// gdn_prep_mma): the HV / HQK value heads that read the same q, k rows run back to back and find them in L2.
// It relies on gridDim.x being NC, as the ABI says.
//
// ---- The data flow: one block barrier ----------------------------------------------------------------
// Warp w owns the result rows j = 16 rt .. 16 rt + 15 and the columns 64 hf .. 64 hf + 63, hf = w / 4,
// rt = w % 4 for w < 4 and 3 - w % 4 for w >= 4 (warp w runs on SM sub-partition w % 4, so warps w and
// w + 4 share one: rt and 3 - rt give each sub-partition the same 5 units of causal work, 4 - rt column
// tiles of (1) and k steps of (2) a warp; rt = w % 4 for both halves would put 8 units on the first
// sub-partition and 2 on the last).
//   S   cp.async q and k (fp32, group 1) into stages of their size; dO (bf16, group 2) into a [64][128]
//       stage with the 16-byte units XOR-swizzled by row % 8; rows >= n zero-filled: for dO the fill is
//       load-bearing (a row past n may hold NaN and masked P^T x NaN is NaN), for q, k it is a guard (the
//       mask is a select, so S^T of a row or column past n never reaches (2)); gamma.
//       wait group 1; each thread splits the q, k pairs it copied to bf16 hi/lo IN PLACE (as
//       gdn_output_mma: the 8 fp32 of columns 8cb .. 8cb+7 of row r become a 16-byte hi unit and a 16-byte
//       lo unit in the same 32 bytes, pair slot cb ^ ((r >> 1) & 3), hi first on even rows; copies, loads
//       and stores conflict-free, see copy_tile there); wait group 0.
//                                                                                        __syncthreads
//   (1) S^T = K Q^T   rows j of the warp x columns i >= 16 rt (causal: 1..4 of the 4 column tiles of 16,
//                     and none at or past n): A = K rows (ldmatrix.x4), B = rows of Q (the n index;
//                     ldmatrix.x4 not transposed); kh qh + kh ql + kl qh per k step of 16, k ascending.
//                     Both column halves compute it (16 x 64 x 128 a warp is cheaper than a barrier
//                     and a stage).
//       P^T_ji = S^T_ji e^(gamma_i - gamma_j) where j <= i < n, else exactly 0 (a select), in the registers.
//   (2) dvl = P^T dO  A = P^T: the accumulator tiles 2ki, 2ki + 1 of S^T are the A fragment of k step ki
//                     (the m16n8 C layout of two adjacent n-tiles is the m16k16 A layout), split in
//                     registers; B = dO rows (k = i, n = column, ldmatrix.x4.trans of the swizzled stage);
//                     ph dO + pl dO per k step, k steps ki = rt .. (n - 1) / 16 ascending.
//   dvl = scale * acc, stored from the registers (8-byte stores, rows < n). Every output element has
//   exactly one owner lane and one fixed instruction sequence: no atomics, bitwise reproducible.
// A warp whose rows all lie at or past n (16 rt >= n) does nothing after the barrier.
//
// ---- Precision --------------------------------------------------------------------------------------
// q, k are fp32: x = hi + lo, hi = rn(x), lo = rn(x - hi) keeps ~16 bits, and S^T = K Q^T runs as three
// products (each term off by <= ~3 2^-16 |k||q|, random in sign); P^T is split in registers the same way;
// dO is exact bf16 and enters as one part (two products). Measured on the emulator
// (TestMMADvLocalOnCPU, normwise against float64 from the same fp32 q, k, gamma and bf16 dO; chunks of
// 1, 17, 40, 63, 64 rows): 5.0e-6, worst element 3.5e-5 of the rms (the fp32 gdn_dvlocal_bwd on the same
// buffers: 2.5e-7, 2.4e-6). Each dropped lo part costs 1.6e-3-1.7e-3 on its own (K's, Q's or P's): the
// bf16 rounding of one operand (2^-9) at full weight; no plain operand comes near the ~1e-5 class of the
// other backward kernels' inputs, and the kernel is bound by HBM and shared memory, not by the tensor cores.
//
// ---- Cost per CTA (n = 64) and at 32K tokens (512 chunks x 48 heads = 24576 CTAs), predicted for an H200
// (132 SMs, ~1.8 GHz, ~1 PFLOP/s dense bf16 ~ 1 m16n8k16 a clock an SM, ~4 TB/s) ----------------------------
// Math: S^T and P^T dO on the causal triangle, 2 x 2 x 128 x 64 x 65 / 2 = 1.06 MFLOP (gdn_dvlocal_bwd's
// count); 26 GFLOP at 32K. mma.sync issued: (1) 48 a column tile of 16 and warp (8 k steps x 2 n-tiles x 3),
// 2 x 48 x (4 + 3 + 2 + 1) = 960; (2) 16 a k step and warp (8 n-tiles x 2), 2 x 16 x 10 = 320: 1280
// m16n8k16 = 5.2 MFLOP a CTA (5x the math: the split products, the causal waste inside 16 x 16 tiles, the
// duplicated S^T), 320 a sub-partition; 1.3e11 FLOP at 32K: 0.13 ms at the dense peak, ~0.2 ms at
// mma.sync's ~60%.
// Global bytes a CTA: q, k 64 KB (one in HV / HQK = 3 value heads from HBM, the rest from L2 through the
// head-fastest block order), dO 16 KB, gamma 0.25 KB read; dvl 32 KB written: 112 KB, ~70 KB of it HBM.
// At 32K: 1.7 GB of HBM traffic, ~0.43 ms at ~4 TB/s (2.75 GB, 0.69 ms if the L2 reuse fails).
// Shared memory a CTA: cp.async 80 KB; the in-place split reads 64 KB and writes 64 KB; ldmatrix (1) K
// 8 KB a warp plus Q 8 KB a column tile, 64 + 160 = 224 KB; (2) dO 2 KB a k step and warp, 40 KB:
// ~470 KB, ~3.7k clocks at 128 B a clock; 186 CTAs an SM at 32K: ~0.38 ms.
// Latency of one CTA: the copies' round trip ~1-1.5 us, the split, then a sub-partition's 320 mma
// (~1300 clocks at a quarter of the SM's rate, ~0.7 us) behind its ldmatrix: ~3 us, serial; two CTAs an SM
// (82 KB each; __launch_bounds__(256, 2): <= 128 registers; ptxas of CUDA 11.8: 87 on sm_90, 96 on
// sm_80 from the compute_80 PTX, no spills, no stack frame) overlap one's copies with the
// other's math. The SM's share of HBM (~30 KB/us) makes one CTA's ~70 KB ~2.3 us, a round of two ~4.7 us,
// the shared memory ~4 us of a round: 93 rounds of ~5 us.
// Predicted ~0.45-0.6 ms at 32K tokens (fp32 gdn_dvlocal_bwd: 5.1 ms measured), bound by HBM with the
// shared memory close behind (staging q, k through registers instead of the in-place split would save
// ~130 KB of it a CTA; computing S^T once, split over the warps through a P^T stage, another ~110 KB and
// 480 mma, at the price of a second barrier and 16 KB).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gdn_fwd.cu"
#include "mma.cuh"
#include "gdn_output_mma.cu"
#include "walk_planes.cuh"

namespace gdnkcp {
namespace dvlmma {

using tc::bf16;
constexpr int kD = fwd::kD, kC = fwd::kC, kThreads = fwd::kThreads;
static_assert(kThreads == 256 && kD == 128 && kC == 64, "the fragment bookkeeping below assumes these");

// Shared memory: QR, KR fp32 [64][128] (split in place) | DO bf16 [64][128] swizzled | gam fp32 [64].
constexpr int kDvlMMASmem = 4 * 2 * kC * kD + 2 * kC * kD + 4 * kC;
static_assert(kDvlMMASmem == 82176, "kDvlMMASmem: keep the header and kcp in step");

// The in-place hi/lo staging of q and k (pair, unit, copy_tile, convert_tile) and the fragment loads
// (a_frag, bn_frag) and products (mma_terms) are gdn_output_mma's: one scheme for both kernels.
using outmma::a_frag;
using outmma::bn_frag;
using outmma::copy_tile;
using outmma::convert_tile;
using outmma::mma_terms;

// swz: the bf16 offset of (row, col) in the swizzled [64][128] bf16 dO stage: the 16-byte unit col / 8 of a
// row is stored at unit (col / 8) ^ (row % 8).
__device__ __forceinline__ int swz(int row, int col) { return row * kD + (((col >> 3) ^ (row & 7)) << 3) + (col & 7); }

// GDNKCP_DVL_ZFILL: copy_do zero-fills dO's rows from n on by cp.async's src-size (tc::cp_async16_zfill, row
// 0's address for them: n >= 1), one instruction where the copy-or-zero-store branch (0) took ~20, and no
// zero store for a later head's cp.async into the same double-buffered bytes to order against (mma.cuh).
// Off on Blackwell (sm_100 and newer): there it took gdn_dvlocal_mma_g / _gk's spills from 24 to 44 bytes
// (v5.35's blobs; not timed there); on sm_90a it spills nothing and took dV'_local 2.173 -> 2.125 ms at
// 120,908 tokens (docs/perf-notes.md, v5.35).
#ifndef GDNKCP_DVL_ZFILL
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define GDNKCP_DVL_ZFILL 0
#else
#define GDNKCP_DVL_ZFILL 1
#endif
#endif

// copy_do issues the cp.async copies of the rows < n of the chunk's bf16 dO (row stride `stride` elements)
// into the swizzled stage and zero-fills the rows >= n; thread tid owns the 16-byte units tid + 256 k.
__device__ __forceinline__ void copy_do(bf16* dst, const bf16* src, long long stride, int n) {
#pragma unroll
	for (int k = 0; k < kC * 16 / kThreads; ++k) {
		const int p = threadIdx.x + kThreads * k, r = p >> 4, cb = p & 15;
		bf16* d = dst + swz(r, 8 * cb);
		if (GDNKCP_DVL_ZFILL)
			tc::cp_async16_zfill(d, src + (r < n ? r : 0) * stride + 8 * cb, r < n);
		else if (r < n)
			tc::cp_async16(d, src + r * stride + 8 * cb);
		else
			*reinterpret_cast<float4*>(d) = make_float4(0.f, 0.f, 0.f, 0.f);
	}
}

// do_frag loads the B fragments of the swizzled dO stage (k = row i, n = column): k rows 16 ki .., columns
// 8 cb0 .. 8 cb0 + 15 (two n-tiles: r[0..1] and r[2..3]) by ldmatrix.trans.
__device__ __forceinline__ void do_frag(unsigned b[4], const bf16* DO, int ki, int cb0, int lane) {
	const int r = 16 * ki + (lane & 7) + 8 * ((lane >> 3) & 1), cb = cb0 + (lane >> 4);
	tc::ldmatrix_x4_trans(b, DO + swz(r, 8 * cb));
}

// dvl_stage: gdn_dvlocal_mma's staging (also gdn_dvlocal_mma_g's first head): q, k rows (group 1) and the
// value head's dO (group 2) by cp.async, gamma; this thread's q, k pairs split in place once landed, and its
// dO units waited for. A __syncthreads publishes it all.
__device__ __forceinline__ void dvl_stage(float* QR, float* KR, bf16* DO, float* gam, const float* q, const float* k,
                                          long long qk, const bf16* dO, long long dstride, const float* gcum, int t0,
                                          int n, int h, int HV) {
	const int tid = threadIdx.x;
	copy_tile<kC>(QR, q, qk, n);
	copy_tile<kC>(KR, k, qk, n);
	tc::cp_async_commit();  // group 1: q, k
	copy_do(DO, dO, dstride, n);
	tc::cp_async_commit();  // group 2: dO
	if (tid < kC) gam[tid] = tid < n ? gcum[(long long)(t0 + tid) * HV + h] : 0.f;
	tc::cp_async_wait<1>();  // this thread's q, k pairs have landed
	convert_tile<kC, true>(QR);
	convert_tile<kC, true>(KR);
	tc::cp_async_wait<0>();  // and its dO units
}

// dvl_stage_kt: dvl_stage with K as the prep's K^T walk planes of the chunk and QK head (kt: 32 KB, hi then
// lo, row = key, tokens contiguous in the 128-byte swizzle; walk_planes.cuh), copied as they lie into K's
// region in group 1: only q is split in place.
__device__ __forceinline__ void dvl_stage_kt(float* QR, float* KR, bf16* DO, float* gam, const float* q,
                                             const unsigned char* kt, long long qk, const bf16* dO, long long dstride,
                                             const float* gcum, int t0, int n, int h, int HV) {
	const int tid = threadIdx.x;
	copy_tile<kC>(QR, q, qk, n);
	unsigned char* kd = reinterpret_cast<unsigned char*>(KR);
#pragma unroll
	for (int j = 0; j < walkplanes::kKBytes / 16 / kThreads; ++j) tc::cp_async16(kd + 16 * (tid + kThreads * j), kt + 16 * (tid + kThreads * j));
	tc::cp_async_commit();  // group 1: q, K^T's planes
	copy_do(DO, dO, dstride, n);
	tc::cp_async_commit();  // group 2: dO
	if (tid < kC) gam[tid] = tid < n ? gcum[(long long)(t0 + tid) * HV + h] : 0.f;
	tc::cp_async_wait<1>();  // this thread's q pairs and plane units have landed
	convert_tile<kC, true>(QR);
	tc::cp_async_wait<0>();  // and its dO units
}

// ak_frag: a_frag<true>'s fragments of K (rows = tokens 16 rt .., k = keys 16 kk ..) from K^T's planes at kt
// by ldmatrix.trans: matrices (keys 16 kk .. + 7, tokens 16 rt .. + 7), (keys .., tokens + 8 ..), (keys + 8 ..,
// tokens ..), (+ 8 .., + 8 ..). The planes hold split_bf16x2 of the normalised k, the values convert_tile
// makes of K's fp32 rows: the same fragments.
__device__ __forceinline__ void ak_frag(unsigned ah[4], unsigned al[4], const unsigned char* kt, int rt, int kk, int lane) {
	const int mi = lane >> 3, key = 16 * kk + 8 * (mi >> 1) + (lane & 7);
	const unsigned char* a = kt + key * 128 + (((2 * rt + (mi & 1)) ^ (key & 7)) << 4);
	tc::ldmatrix_x4_trans(ah, a);
	tc::ldmatrix_x4_trans(al, a + walkplanes::kOffLo);
}

// dvl_raw: (1) of gdn_dvlocal_mma, the raw S^T = K Q^T over the warp's rows j x the column tiles rt .. last.
// With KT, K's fragments come from K^T's planes at Kb (ak_frag; dvl_stage_kt), the same values.
template <bool KT = false>
__device__ __forceinline__ void dvl_raw(float s[8][4], const bf16* Qb, const bf16* Kb, int rt, int last, int lane) {
#pragma unroll
	for (int nt = 0; nt < 8; ++nt)
#pragma unroll
		for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
#pragma unroll
	for (int kk = 0; kk < 8; ++kk) {
		unsigned ah[4], al[4];
		if (KT)
			ak_frag(ah, al, reinterpret_cast<const unsigned char*>(Kb), rt, kk, lane);
		else
			a_frag<true>(ah, al, Kb, rt, kk, lane);
#pragma unroll
		for (int ip = 0; ip < 4; ++ip) {
			if (ip < rt || ip > last) continue;  // warp-uniform
			unsigned bh[4], bl[4];
			bn_frag<true>(bh, bl, Qb, ip, kk, lane);
			mma_terms<true, true>(s[2 * ip], ah, al, bh, bl);
			mma_terms<true, true>(s[2 * ip + 1], ah, al, bh + 2, bl + 2);
		}
	}
}

// dvl_mask: P^T_ji = S^T_ji e^(gamma_i - gamma_j) on j <= i < n, else 0 (rows j0, j1; columns i0, i1), in place,
// with the gamma of the value head at hand.
__device__ __forceinline__ void dvl_mask(float s[8][4], const float* gam, int rt, int last, int lane, int n) {
	const int g = lane >> 2, t = lane & 3, j0 = 16 * rt + g, j1 = j0 + 8;
	const float gj0 = gam[j0], gj1 = gam[j1];
#pragma unroll
	for (int nt = 0; nt < 8; ++nt) {
		if (nt / 2 < rt || nt / 2 > last) continue;
		const int i0 = 8 * nt + 2 * t, i1 = i0 + 1;
		const float gi0 = gam[i0], gi1 = gam[i1];
		s[nt][0] = (j0 <= i0 && i0 < n) ? s[nt][0] * expf(gi0 - gj0) : 0.f;
		s[nt][1] = (j0 <= i1 && i1 < n) ? s[nt][1] * expf(gi1 - gj0) : 0.f;
		s[nt][2] = (j1 <= i0 && i0 < n) ? s[nt][2] * expf(gi0 - gj1) : 0.f;
		s[nt][3] = (j1 <= i1 && i1 < n) ? s[nt][3] * expf(gi1 - gj1) : 0.f;
	}
}

// dvl_pdo_store: (2) dvl = P^T dO over the k steps rt .. last and the warp's 64 columns (dO from the swizzled
// stage DO), then scale * dvl stored at orow + j * ostride (rows j0 / j1 < n), columns 8 (cb0 + nt) + 2t, +1.
__device__ __forceinline__ void dvl_pdo_store(float s[8][4], const bf16* DO, int rt, int last, int cb0, int lane, float* orow,
                                              long long ostride, int n, float scale) {
	float o[8][4];
#pragma unroll
	for (int nt = 0; nt < 8; ++nt)
#pragma unroll
		for (int e = 0; e < 4; ++e) o[nt][e] = 0.f;
#pragma unroll
	for (int ki = 0; ki < 4; ++ki) {
		if (ki < rt || ki > last) continue;  // warp-uniform
		const int k0 = 2 * ki, k1 = 2 * ki + 1;  // constant indices after unrolling: s stays in registers
		unsigned ah[4], al[4];
		tc::split_bf16x2(s[k0][0], s[k0][1], ah[0], al[0]);
		tc::split_bf16x2(s[k0][2], s[k0][3], ah[1], al[1]);
		tc::split_bf16x2(s[k1][0], s[k1][1], ah[2], al[2]);
		tc::split_bf16x2(s[k1][2], s[k1][3], ah[3], al[3]);
#pragma unroll
		for (int np = 0; np < 4; ++np) {
			unsigned b[4];
			do_frag(b, DO, ki, cb0 + 2 * np, lane);
			mma_terms<true, false>(o[2 * np], ah, al, b, b);
			mma_terms<true, false>(o[2 * np + 1], ah, al, b + 2, b + 2);
		}
	}
	const int j0 = 16 * rt + (lane >> 2), j1 = j0 + 8, t = lane & 3;
#pragma unroll
	for (int nt = 0; nt < 8; ++nt) {
		const int d = 8 * (cb0 + nt) + 2 * t;
		if (j0 < n) *reinterpret_cast<float2*>(orow + j0 * ostride + d) = make_float2(scale * o[nt][0], scale * o[nt][1]);
		if (j1 < n) *reinterpret_cast<float2*>(orow + j1 * ostride + d) = make_float2(scale * o[nt][2], scale * o[nt][3]);
	}
}

extern "C" __global__ void __launch_bounds__(kThreads, 2)
gdn_dvlocal_mma(const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ gcum,
                const __nv_bfloat16* __restrict__ dout, const int* __restrict__ chunk_tok0,
                const int* __restrict__ chunk_len, float* __restrict__ dvl, int HQK, int HV, float scale) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	float* QR = smem;                // [64][128] q, split in place
	float* KR = QR + kC * kD;        // [64][128] k, split in place
	bf16* DO = reinterpret_cast<bf16*>(KR + kC * kD);  // [64][128] dO, swizzled
	float* gam = reinterpret_cast<float*>(DO + kC * kD);  // [64]
	const bf16* Qb = reinterpret_cast<const bf16*>(QR);
	const bf16* Kb = reinterpret_cast<const bf16*>(KR);
	// (chunk, head) from the linear block index with the head fastest.
	const int lin = blockIdx.y * gridDim.x + blockIdx.x;
	const int c = lin / HV, h = lin % HV;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int hf = warp >> 2, rt = hf ? 3 - (warp & 3) : (warp & 3), cb0 = 8 * hf;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int qh = h / (HV / HQK);
	const long long qk = (long long)HQK * kD;

	dvl_stage(QR, KR, DO, gam, qn + ((long long)t0 * HQK + qh) * kD, kn + ((long long)t0 * HQK + qh) * kD, qk,
	          dout + ((long long)t0 * HV + h) * kD, (long long)HV * kD, gcum, t0, n, h, HV);
	__syncthreads();  // q, k split, dO and gamma staged

	const int last = (n - 1) >> 4;  // the last 16-row tile holding a row < n
	if (rt > last) return;          // warp-uniform: every row of the warp is at or past n

	float s[8][4];
	dvl_raw(s, Qb, Kb, rt, last, lane);
	dvl_mask(s, gam, rt, last, lane, n);
	dvl_pdo_store(s, DO, rt, last, cb0, lane, dvl + ((long long)t0 * HV + h) * kD, (long long)HV * kD, n, scale);
}

// ==== gdn_dvlocal_mma_g: gdn_dvlocal_mma a QK head at a time ============================================
//   gdn_dvlocal_mma_g   grid (NC, HQK), block 256, kDvlMMAGSmem = 82432 bytes (two CTAs an SM)
// gdn_dvlocal_mma's arguments and output, bit for bit, with one CTA a (chunk, QK head) running the
// G = HV / HQK value heads that read the same q and k rows, in ascending order (lin = blockIdx.y gridDim.x +
// blockIdx.x, c = lin / HQK, qh = lin % HQK). Why: per value head gdn_dvlocal_mma copies and splits the same
// fp32 q and k (64 KB of cp.async, 128 KB of shared traffic) and spends 960 of its 1280 mma.sync on the same
// S^T = K Q^T. Here they happen once: the raw S^T (dvl_raw, (1)'s mma sequence) goes to Q's region once
// every warp is done with q and k (each lane its own 32 values, lane-fastest: conflict-free, read back only
// by that lane), K's region becomes two dO stages, and each head forms its P^T with its own gamma (dvl_mask)
// and runs (2) and the store (dvl_pdo_store): the same expressions, so the same bits.
//   head 0: copy q, k (group 1), dO into DO (group 2); gamma; wait; split q, k in place; __syncthreads;
//           (1) raw S^T; __syncthreads; stash S^T; copy head 1's dO into stage 0, its gamma; P^T, (2), store
//   head j > 0: wait; __syncthreads (head j's dO and gamma staged; head j - 1's stage and gamma free);
//               copy head j + 1's dO into stage j % 2, its gamma; S^T from the stash; P^T, (2), store
// A warp whose rows all lie at or past n computes nothing but takes every barrier.
// Predicted (not measured): per QK head 1280 + (G - 1) 320 mma.sync instead of G 1280, the q, k staging
// once, each later head's dO copy under the previous head's work: 0.90 ms at 32K -> ~0.5-0.6 ms.
constexpr int kDvlMMAGSmem = kDvlMMASmem + 4 * kC;  // a second gamma stage
static_assert(kDvlMMAGSmem == 82432, "kDvlMMAGSmem: keep the header and kcp in step");

// dvl_later_heads: heads 1 .. G - 1 of a grouped dV'_local (dvlocal_g, gdn_dvlocal_mma_gr), once head 0 is
// stored and head 1's dO (stage 0) and gamma (gam + 64) are on their way: for head j, wait and
// __syncthreads (head j's dO and gamma staged; head j - 1's stage and gamma free), copy head j + 1's dO into
// stage j % 2 and its gamma, then the lane's raw S^T from the stash ss, P^T by mask(s, head j's gamma) and
// (2) with the store.
template <class Mask>
__device__ __forceinline__ void dvl_later_heads(const float* ss, bf16* stage0, float* gam, const bf16* dout, const float* gcum,
                                                float* dvl, long long vrow, int t0, int n, int h0, int G, int HV, int rt,
                                                int last, int cb0, int lane, bool active, float scale, Mask mask) {
	const int tid = threadIdx.x;
	float s[8][4];
#pragma unroll 1
	for (int j = 1; j < G; ++j) {
		tc::cp_async_wait<0>();
		__syncthreads();  // head j's dO and gamma staged; head j - 1's stage and gamma free
		if (j + 1 < G) {
			copy_do(stage0 + kC * kD * (j % 2), dout + ((long long)t0 * HV + h0 + j + 1) * kD, vrow, n);
			tc::cp_async_commit();
			if (tid < kC) gam[kC * ((j + 1) % 2) + tid] = tid < n ? gcum[(long long)(t0 + tid) * HV + h0 + j + 1] : 0.f;
		}
		if (active) {
#pragma unroll
			for (int nt = 0; nt < 8; ++nt)
#pragma unroll
				for (int e = 0; e < 4; ++e) s[nt][e] = ss[32 * (4 * nt + e)];
			mask(s, gam + kC * (j % 2));
			dvl_pdo_store(s, stage0 + kC * kD * ((j - 1) % 2), rt, last, cb0, lane, dvl + ((long long)t0 * HV + h0 + j) * kD,
			              vrow, n, scale);
		}
	}
}

// dvlocal_g: gdn_dvlocal_mma_g's body; KT: gdn_dvlocal_mma_gk (kn is K^T's walk planes).
template <bool KT>
__device__ __forceinline__ void dvlocal_g(float* smem, const float* qn, const float* kn, const float* gcum, const bf16* dout,
                                          const int* chunk_tok0, const int* chunk_len, float* dvl, int HQK, int HV,
                                          float scale) {
	float* QR = smem;                // [64][128] q, split in place; then the raw S^T
	float* KR = QR + kC * kD;        // [64][128] k, split in place; then two dO stages
	bf16* DO = reinterpret_cast<bf16*>(KR + kC * kD);     // [64][128] head 0's dO, swizzled
	float* gam = reinterpret_cast<float*>(DO + kC * kD);  // [2][64]: head j's gamma at gam + 64 (j % 2)
	const bf16* Qb = reinterpret_cast<const bf16*>(QR);
	const bf16* Kb = reinterpret_cast<const bf16*>(KR);
	bf16* const stage0 = reinterpret_cast<bf16*>(KR);  // head j's dO (j >= 1) at stage0 + kC kD ((j - 1) % 2)
	const int lin = blockIdx.y * gridDim.x + blockIdx.x;
	const int c = lin / HQK, qh = lin % HQK;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int hf = warp >> 2, rt = hf ? 3 - (warp & 3) : (warp & 3), cb0 = 8 * hf;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int G = HV / HQK, h0 = qh * G;
	const long long qk = (long long)HQK * kD, vrow = (long long)HV * kD;
	const int last = (n - 1) >> 4;
	const bool active = rt <= last;      // warp-uniform
	float* const ss = QR + 1024 * warp + lane;  // this lane's raw S^T: value (nt, e) at ss[32 (4 nt + e)]

	if (KT)
		dvl_stage_kt(QR, KR, DO, gam, qn + ((long long)t0 * HQK + qh) * kD,
		             reinterpret_cast<const unsigned char*>(kn) + ((long long)c * HQK + qh) * walkplanes::kKBytes, qk,
		             dout + ((long long)t0 * HV + h0) * kD, vrow, gcum, t0, n, h0, HV);
	else
		dvl_stage(QR, KR, DO, gam, qn + ((long long)t0 * HQK + qh) * kD, kn + ((long long)t0 * HQK + qh) * kD, qk,
		          dout + ((long long)t0 * HV + h0) * kD, vrow, gcum, t0, n, h0, HV);
	__syncthreads();  // q, k split, dO and gamma staged

	float s[8][4];
	if (active) dvl_raw<KT>(s, Qb, Kb, rt, last, lane);
	__syncthreads();  // every warp done with q and k: Q's region takes S^T, K's the next heads' dO
	if (active) {
#pragma unroll
		for (int nt = 0; nt < 8; ++nt)
#pragma unroll
			for (int e = 0; e < 4; ++e) ss[32 * (4 * nt + e)] = s[nt][e];
	}
	if (G > 1) {
		copy_do(stage0, dout + ((long long)t0 * HV + h0 + 1) * kD, vrow, n);
		tc::cp_async_commit();
		if (tid < kC) gam[kC + tid] = tid < n ? gcum[(long long)(t0 + tid) * HV + h0 + 1] : 0.f;
	}
	if (active) {
		dvl_mask(s, gam, rt, last, lane, n);
		dvl_pdo_store(s, DO, rt, last, cb0, lane, dvl + ((long long)t0 * HV + h0) * kD, vrow, n, scale);
	}
	dvl_later_heads(ss, stage0, gam, dout, gcum, dvl, vrow, t0, n, h0, G, HV, rt, last, cb0, lane, active, scale,
	                [&](float (&m)[8][4], const float* gj) { dvl_mask(m, gj, rt, last, lane, n); });
}

extern "C" __global__ void __launch_bounds__(kThreads, 2)
gdn_dvlocal_mma_g(const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ gcum,
                  const __nv_bfloat16* __restrict__ dout, const int* __restrict__ chunk_tok0,
                  const int* __restrict__ chunk_len, float* __restrict__ dvl, int HQK, int HV, float scale) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	dvlocal_g<false>(smem, qn, kn, gcum, dout, chunk_tok0, chunk_len, dvl, HQK, HV, scale);
}

// gdn_dvlocal_mma_gk: gdn_dvlocal_mma_g with K read as the prep's K^T walk planes (wk: 32 KB a chunk and QK
// head, walk_planes.cuh) in place of kn: the same grid, shared memory and bits (dvl_stage_kt, ak_frag). The v5
// set's dV'_local where the forward wrote the planes: no in-place split of K.
extern "C" __global__ void __launch_bounds__(kThreads, 2)
gdn_dvlocal_mma_gk(const float* __restrict__ qn, const __nv_bfloat16* __restrict__ wk, const float* __restrict__ gcum,
                   const __nv_bfloat16* __restrict__ dout, const int* __restrict__ chunk_tok0,
                   const int* __restrict__ chunk_len, float* __restrict__ dvl, int HQK, int HV, float scale) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	dvlocal_g<true>(smem, qn, reinterpret_cast<const float*>(wk), gcum, dout, chunk_tok0, chunk_len, dvl, HQK, HV, scale);
}

// ==== gdn_dvlocal_mma_gr: gdn_dvlocal_mma_g on q's and k's raw bf16 rows ==================================
//   gdn_dvlocal_mma_gr   grid (NC, HQK), block 256, kDvlMMAGRSmem = 82944 bytes (two CTAs an SM)
// gdn_dvlocal_mma_g's output with S^T from q's and k's raw bf16 rows (q_stride / k_stride elements a token,
// 16-byte aligned, QK head qh at element 128 qh) and their l2norm factors q_rstd, k_rstd ([T, HQK]: qn = q rstd,
// kn = k rstd) in place of fp32 qn and K^T's hi / lo planes, as the plane walks read them:
//   S^T_ji = k_j . q_i                 one mma.sync a product (the rows are exact bf16; fp32 sums), where
//                                      gdn_dvlocal_mma_g takes three (kh qh + kh ql + kl qh) of ~16-bit splits
//   P^T_ji = S^T_ji (rk_j rq_i) e^(gamma_i - gamma_j)   on j <= i < n, else 0 (dvl_mask_r)
//   dvl    = scale P^T dO               (2) as gdn_dvlocal_mma_g (P^T split hi / lo, dO exact): dvl_pdo_store.
// S^T is exact but for the fp32 sums (~2^-24 a term; the splits' ~2^-16), so dvl is as close to float64 as
// gdn_dvlocal_mma_g's or closer, in other bits. Per QK head: (1) 320 mma.sync instead of 960, no in-place split
// of q (64 KB of shared reads and writes), 32 KB of q and k copied instead of 64 KB of fp32 q and K^T's planes.
// Shared memory: QS, KS bf16 [64][128] (swz; zero from row n on), then the raw S^T stash over both | two dO
// stages for the heads after the first (free from the start: head 1's dO is copied under (1)) | head 0's dO |
// gamma [2][64] | rq, rk [64] each.
constexpr int kDvlMMAGRSmem = kDvlMMAGSmem + 4 * 2 * kC;
static_assert(kDvlMMAGRSmem == 82944, "kDvlMMAGRSmem: keep the header and kcp in step");
static_assert(2 * (kDvlMMAGRSmem + 1024) <= 233472, "two CTAs an SM");

// copy_rows_r issues the cp.async copies of a chunk's 64 bf16 rows of 128 (row r at src + r stride elements)
// into the swizzled [64][128] stage dst, rows from n on zero-filled (src-size 0, row 0 as the source);
// thread tid owns the 16-byte units tid + 256 k (copy_do's pattern).
__device__ __forceinline__ void copy_rows_r(bf16* dst, const bf16* src, long long stride, int n) {
#pragma unroll
	for (int k = 0; k < kC * 16 / kThreads; ++k) {
		const int p = threadIdx.x + kThreads * k, r = p >> 4, cb = p & 15;
		tc::cp_async16_zfill(dst + swz(r, 8 * cb), src + (r < n ? r : 0) * stride + 8 * cb, r < n);
	}
}

// dvl_raw_r: (1) on the raw rows, S^T = K Q^T over the warp's rows j (16 rt ..) x the column tiles rt .. last:
// A = K's rows (m = token j, k = key) and B = Q's rows (n = token i) by ldmatrix.x4 of the swizzled stages,
// one mma.sync a k step and n-tile, k ascending.
__device__ __forceinline__ void dvl_raw_r(float s[8][4], const bf16* QS, const bf16* KS, int rt, int last, int lane) {
	const int mi = lane >> 3, lr = lane & 7;
#pragma unroll
	for (int nt = 0; nt < 8; ++nt)
#pragma unroll
		for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
#pragma unroll
	for (int kk = 0; kk < 8; ++kk) {
		unsigned a[4];  // matrices (tokens 16 rt .. + 7, keys 16 kk ..), (tokens + 8 .., ..), (.., keys + 8 ..), (..)
		tc::ldmatrix_x4(a, KS + swz(16 * rt + 8 * (mi & 1) + lr, 16 * kk + 8 * (mi >> 1)));
#pragma unroll
		for (int ip = 0; ip < 4; ++ip) {
			if (ip < rt || ip > last) continue;  // warp-uniform
			unsigned b[4];  // (tokens 16 ip .. + 7, keys 16 kk ..), (.., keys + 8 ..), (tokens + 8 .., ..), (..)
			tc::ldmatrix_x4(b, QS + swz(16 * ip + 8 * (mi >> 1) + lr, 16 * kk + 8 * (mi & 1)));
			tc::mma_bf16_16816(s[2 * ip], a, b, s[2 * ip]);
			tc::mma_bf16_16816(s[2 * ip + 1], a, b + 2, s[2 * ip + 1]);
		}
	}
}

// dvl_mask_r: dvl_mask with the l2norm factors: P^T_ji = S^T_ji (rk_j rq_i) e^(gamma_i - gamma_j) on j <= i < n,
// else 0 (rq, rk zero from row n on).
__device__ __forceinline__ void dvl_mask_r(float s[8][4], const float* gam, const float* rq, const float* rk, int rt, int last,
                                           int lane, int n) {
	const int g = lane >> 2, t = lane & 3, j0 = 16 * rt + g, j1 = j0 + 8;
	const float gj0 = gam[j0], gj1 = gam[j1], kj0 = rk[j0], kj1 = rk[j1];
#pragma unroll
	for (int nt = 0; nt < 8; ++nt) {
		if (nt / 2 < rt || nt / 2 > last) continue;
		const int i0 = 8 * nt + 2 * t, i1 = i0 + 1;
		const float gi0 = gam[i0], gi1 = gam[i1], qi0 = rq[i0], qi1 = rq[i1];
		s[nt][0] = (j0 <= i0 && i0 < n) ? s[nt][0] * (kj0 * qi0) * expf(gi0 - gj0) : 0.f;
		s[nt][1] = (j0 <= i1 && i1 < n) ? s[nt][1] * (kj0 * qi1) * expf(gi1 - gj0) : 0.f;
		s[nt][2] = (j1 <= i0 && i0 < n) ? s[nt][2] * (kj1 * qi0) * expf(gi0 - gj1) : 0.f;
		s[nt][3] = (j1 <= i1 && i1 < n) ? s[nt][3] * (kj1 * qi1) * expf(gi1 - gj1) : 0.f;
	}
}

extern "C" __global__ void __launch_bounds__(kThreads, 2)
gdn_dvlocal_mma_gr(const __nv_bfloat16* __restrict__ q, int q_stride, const float* __restrict__ q_rstd,
                   const __nv_bfloat16* __restrict__ k, int k_stride, const float* __restrict__ k_rstd,
                   const float* __restrict__ gcum, const __nv_bfloat16* __restrict__ dout,
                   const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len, float* __restrict__ dvl,
                   int HQK, int HV, float scale) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	float* QR = smem;                                     // QS, KS; then the raw S^T stash
	bf16* const QS = reinterpret_cast<bf16*>(QR);         // [64][128] q's rows, swizzled
	bf16* const KS = QS + kC * kD;                        // [64][128] k's rows
	bf16* const stage0 = reinterpret_cast<bf16*>(QR + kC * kD);  // head j's dO (j >= 1) at stage0 + kC kD ((j - 1) % 2)
	bf16* const DO = stage0 + 2 * kC * kD;                // [64][128] head 0's dO
	float* const gam = reinterpret_cast<float*>(DO + kC * kD);  // [2][64]: head j's gamma at gam + 64 (j % 2)
	float* const rq = gam + 2 * kC;                       // [64] q's factors, 0 from n on
	float* const rk = rq + kC;                            // [64] k's
	const int lin = blockIdx.y * gridDim.x + blockIdx.x;
	const int c = lin / HQK, qh = lin % HQK;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int hf = warp >> 2, rt = hf ? 3 - (warp & 3) : (warp & 3), cb0 = 8 * hf;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int G = HV / HQK, h0 = qh * G;
	const long long vrow = (long long)HV * kD;
	const int last = (n - 1) >> 4;
	const bool active = rt <= last;             // warp-uniform
	float* const ss = QR + 1024 * warp + lane;  // this lane's raw S^T: value (nt, e) at ss[32 (4 nt + e)]

	copy_rows_r(QS, q + (long long)t0 * q_stride + (long long)qh * kD, q_stride, n);
	copy_rows_r(KS, k + (long long)t0 * k_stride + (long long)qh * kD, k_stride, n);
	tc::cp_async_commit();  // group 1: q, k
	copy_do(DO, dout + ((long long)t0 * HV + h0) * kD, vrow, n);
	tc::cp_async_commit();  // group 2: head 0's dO
	if (G > 1) {
		copy_do(stage0, dout + ((long long)t0 * HV + h0 + 1) * kD, vrow, n);
		tc::cp_async_commit();  // group 3: head 1's dO, under (1)
	}
	if (tid < kC) {  // every load issued before the first store: one round trip, not four
		float g0 = 0.f, g1 = 0.f, fq = 0.f, fk = 0.f;
		if (tid < n) {
			g0 = gcum[(long long)(t0 + tid) * HV + h0];
			if (G > 1) g1 = gcum[(long long)(t0 + tid) * HV + h0 + 1];
			fq = q_rstd[(long long)(t0 + tid) * HQK + qh];
			fk = k_rstd[(long long)(t0 + tid) * HQK + qh];
		}
		gam[tid] = g0;
		if (G > 1) gam[kC + tid] = g1;
		rq[tid] = fq;
		rk[tid] = fk;
	}
	if (G > 1)
		tc::cp_async_wait<1>();  // this thread's q, k and head 0's dO units (head 1's may still be in flight)
	else
		tc::cp_async_wait<0>();
	__syncthreads();  // q, k, head 0's dO, gamma and the factors staged

	float s[8][4];
	if (active) dvl_raw_r(s, QS, KS, rt, last, lane);
	__syncthreads();  // every warp done with q and k: their region takes the S^T stash
	if (active) {
#pragma unroll
		for (int nt = 0; nt < 8; ++nt)
#pragma unroll
			for (int e = 0; e < 4; ++e) ss[32 * (4 * nt + e)] = s[nt][e];
		dvl_mask_r(s, gam, rq, rk, rt, last, lane, n);
		dvl_pdo_store(s, DO, rt, last, cb0, lane, dvl + ((long long)t0 * HV + h0) * kD, vrow, n, scale);
	}
	dvl_later_heads(ss, stage0, gam, dout, gcum, dvl, vrow, t0, n, h0, G, HV, rt, last, cb0, lane, active, scale,
	                [&](float (&m)[8][4], const float* gj) { dvl_mask_r(m, gj, rq, rk, rt, last, lane, n); });
}

}  // namespace dvlmma
}  // namespace gdnkcp
