// gdn_output_mma.cu (checked on the CPU emulator and on the H200; docs/perf-notes.md has its times): the
// forward output on mma.sync m16n8k16 (bf16 in, fp32 accumulate), v4 of the output. Same arguments,
// grid and output as gdn_output_fwd of gdn_fwd.cu (block 256):
//   gdn_output_mma   grid (NC, HV)   kOutputMMASmem = 98560 bytes (two CTAs an SM)
//   O = scale ((Q e^gamma) H + (Q K^T ⊙ e^(gamma_i - gamma_j), j <= i < n) V'), written bf16,
// rows past a short chunk's end neither read nor written. And the same output from the bf16 H^T and V'^T
// of gdn_state_walk_mma16 (gdn_walk_mma.cu), H and V' plain bf16 operands (its own section at the end):
//   gdn_output_mma16   grid (NC, HV)   kOutputMMA16Smem = 114944 bytes (two CTAs an SM)
//
// ---- The data flow -----------------------------------------------------------------------------------
// Warp w owns the output tile rows 16 rt .. 16 rt + 15 (rt = w % 4) x columns c0 .. c0 + 63 (c0 = 64 (w / 4)):
// 8 accumulator tiles of m16n8 (32 fp32 registers a lane).
//   (1) O = Q H          A = Q rows (ldmatrix.x4), B = H (k = key, n = column: row-major, ldmatrix.x4.trans);
//                        then each accumulator row i times e^gamma_i in fp32 (= (Q e^gamma) H).
//   (2) S = Q K^T        the warp's 16 rows x keys j < 16 (rt + 1) only (causal: 2..8 of the 8 n-tiles;
//                        both column halves compute it, 16x64x128 is cheaper than a barrier and a stage),
//                        A = Q rows, B = rows of K (k = dim, n = j: ldmatrix.x4 not transposed).
//                        P = S e^(gamma_i - gamma_j) where j <= i < n, else 0, in the registers.
//   (3) O += P V'        A = P: the accumulator tiles 2kj, 2kj+1 of S are the A fragment of k step kj
//                        (the m16n8 C layout of two adjacent n-tiles is the m16k16 A layout), converted
//                        in registers; B = V' rows (k = j, n = column, ldmatrix.x4.trans); k steps kj <= rt.
//   O times scale, rounded to bf16 (nearest even), stored from the registers (rows < n). Every output
//   element has exactly one owner lane: no atomics, no element written twice.
//
// ---- The stages: fp32 copied by cp.async and split to bf16 in place -----------------------------------
// Each 64 x 128 (Q, K, V') or 128 x 128 (H) fp32 tile is copied by cp.async (16 bytes a copy) into a
// stage of the same size, then converted IN PLACE: the 8 floats of columns 8cb .. 8cb+7 of row r (32 bytes,
// one "pair") become one 16-byte unit of 8 bf16 hi and one of 8 bf16 lo in the same 32 bytes. The pair
// of (r, cb) sits at pair slot cb ^ ((r >> 1) & 3) of its row and its hi unit in the slot's first half
// when r is even, second half when r is odd (lo the other half): the 8 rows of every ldmatrix 8x8 then
// fall in 8 different 16-byte bank groups (row stride 512 bytes, a multiple of 128), conflict-free without
// padding. The fp32 halves sit where the bf16 units will: columns 8cb .. 8cb+3 where the hi unit goes
// (first half on even rows, second on odd), columns 8cb+4 .. 8cb+7 in the other half. The same thread copies
// a pair, waits for its own copies and converts it (reading both halves before writing), so the conversion
// needs no barrier; one __syncthreads then publishes the stage. A warp's 32 pairs are rows 2m and 2m + 1,
// pairs 4 (l / 8) + l % 4 (lane l; row 2m + (l / 4) % 2), and it copies, reads and writes one half of each
// a 16-byte access: the 8 lanes of a quarter-warp (4 slots cb % 4 apart x 2 row parities) hit 8 different
// 16-byte bank groups, so cp.async, the split's loads and its hi / lo stores are conflict-free (with 16 pairs
// of one row a quarter-warp, the layout before 2026-12, each of them was 2-way: 8 wavefronts, not 4).
// Rows past n are zero-filled by the thread that owns them (0 splits to 0): a guard, as masked P is a
// select (exactly 0) and K / V' land where H's finite splits were, so 0 * V' is 0 even without it.
// Regions: QR [64][128] (Q for both phases) | XR [128][128] (H, then K [64][128] and V' [64][128]) | gam.
//   copy Q, H; gamma; wait; convert                __syncthreads (1)
//   (1) O = Q H; rows times e^gamma                __syncthreads (2): everyone done with H
//   copy K, V'; wait; convert                      __syncthreads (3)
//   (2), mask, (3), store
// Three block barriers, no warp barrier. Shared memory 4 (64 128 + 128 128 + 64) = 98560 bytes: two CTAs
// an SM (197120 + 2 KB reserved of 228 KB); the second CTA's copies and math overlap this one's waits.
//
// ---- Precision -----------------------------------------------------------------------------------------
// The template parameter PREC chooses which operands run as hi + lo (x = hi + lo, hi = rn(x),
// lo = rn(x - hi), ~16 bits) and which as plain bf16 (8 bits, unit roundoff 2^-9): bits kSplitQ, kSplitK,
// kSplitH, kSplitV, kSplitP. A product with both operands split runs as ah bh + ah bl + al bh, with one
// split as two products, with none as one. Measured on the emulator (TestMMAOutputOnCPU's fp32 probes
// with GDNKCP_OUTPUT_PROBES=1: normwise relative error of O before its bf16 rounding against
// gdnref.Output in float64 from the same fp32 qn, kn, gamma, V', H; q, k unit rows, V' N(0,1), H
// N(0,0.25)):
//   every operand plain bf16        3.0e-3      Q, H split (K, V', P plain)     2.35e-3
//   H, V', P split (Q, K plain)     2.15e-3     all but K / V' / P split        1.35e-3 / 1.36e-3 / 1.35e-3
//   every operand split             5.7e-6      (worst element 4.9e-5 of the rms)
// Each plain operand costs ~1.1-1.4e-3 on its own (its bf16 rounding, 2^-9 relative, enters one of the
// two terms of O at full weight), so no plain operand keeps the kernel's own error under ~1e-3 beside the
// ~1.1e-3 of rounding O to bf16 (5e-3 budget for the whole forward): kOutputPrec = kSplitAll, ~3x the
// mma.sync and 2x the ldmatrix of plain bf16, which the cost below absorbs (HBM and shared memory bound
// the kernel, the tensor cores have room). The bf16 output is then within one bf16 ulp per element.
//
// ---- Cost, predicted for an H200 (132 SMs, ~1 PFLOP/s dense bf16, ~4 TB/s) at 32K tokens ----------------
// Per CTA (one chunk, one value head): math 2 64 128 128 (QH) + 2 64 64 128 (QK^T) + 2 64 64 128 (PV')
// = 4.2 MFLOP, 3.1 MFLOP counting only the causal half of QK^T and PV'; issued as mma.sync: QH 512,
// QK^T 320 (both column halves, 5 of 8 n-tiles on average), PV' 160 m16n8k16, times 3 (every operand
// split): ~3000 mma.sync, 12.2 MFLOP. Bytes: Q, K 32 KB each (shared by HV/HQK = 3 value heads, mostly
// from L2), H 64 KB fp32, V' 32 KB fp32 read, O 16 KB bf16 written: 176 KB a CTA, ~133 KB of it unique
// in HBM. Shared memory: cp.async writes 160 KB, the in-place split reads and writes 160 KB each, the
// ldmatrix.x4 read ~78 KB a warp (Q twice, 8 KB each as hi + lo; the warp's half of H 32 KB; K ~20 KB and
// V' ~10 KB with the causal skips): ~1.1 MB a CTA.
// 512 chunks x 48 heads = 24576 CTAs, 186 an SM:
//   HBM      24576 x 133 KB = 3.3 GB / ~4 TB/s                     ~0.8 ms
//   smem     186 x ~1.1 MB / (128 B/clk at ~1.8 GHz)                ~0.9 ms
//   tensor   24576 x 12.2 MFLOP = 3.0e11 at ~60% of 1 PFLOP/s      ~0.5 ms (0.17 ms with plain bf16)
// Predicted ~0.9-1.0 ms (v3 2.2 ms), bound by HBM and shared memory together (the fp32 H, 64 KB a chunk
// and head, is half the bytes; a bf16 H from the state walk would halve that and drop H's split).
// Registers (estimate): O 32 + S 32 + A hi/lo 8 + B hi/lo 8 + ~25: ~110 under the 128 a thread that two
// CTAs of 256 threads allow (__launch_bounds__(256, 2)). With phase (1)'s k loop unrolled ptxas hoisted
// the next k steps' ldmatrix and spilled (11.8: 24 bytes on sm_90, 76 on sm_80); `#pragma unroll 1` on
// it gives 124 registers and no spill on either (scripts/nvcc-check.sh), the same sums in the same order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gdn_fwd.cu"
#include "mma.cuh"
#include "walk_planes.cuh"
#include "wgmma.cuh"

namespace gdnkcp {
namespace outmma {

using tc::bf16;
constexpr int kD = fwd::kD, kC = fwd::kC, kThreads = fwd::kThreads;
static_assert(kThreads == 256 && kD == 128 && kC == 64, "the fragment bookkeeping below assumes these");

constexpr int kOutputMMASmem = 4 * (kC * kD + kD * kD + kC);  // 98560 bytes

// Which operands run as bf16 hi + lo (else plain bf16).
constexpr int kSplitQ = 1, kSplitK = 2, kSplitH = 4, kSplitV = 8, kSplitP = 16;
constexpr int kSplitAll = 31;
constexpr int kOutputPrec = kSplitAll;

// pair: the float offset of the 32-byte slot of the 8 fp32 of columns 8cb .. 8cb+7 of row r in a staged
// [rows][128] tile.
__device__ __forceinline__ int pair(int r, int cb) { return r * kD + 8 * (cb ^ ((r >> 1) & 3)); }
// hslot: the float offset of columns 8cb + 4q .. 8cb + 4q + 3 (q = 0, 1) of row r: the slot's first 16 bytes
// when q == r % 2, else its second 16 bytes (odd rows hold their columns 4..7 first).
__device__ __forceinline__ int hslot(int r, int cb, int q) { return pair(r, cb) + 4 * ((r & 1) ^ q); }
// unit: the bf16 offset of the 8 bf16 of those columns after the split, part 0 hi (over the fp32 of
// columns 8cb .. 8cb+3), 1 lo (over columns 8cb+4 .. 8cb+7).
__device__ __forceinline__ int unit(int r, int cb, int part) { return 2 * hslot(r, cb, part); }
// owned: the pair (r, cb) that index p = tid + 256 k of copy_tile / convert_tile stands for. The 32 p of a
// warp cover rows 2m, 2m + 1 (m = p / 32); lane l takes row 2m + (l / 4) % 2 and pair 4 (l / 8) + l % 4, so
// a quarter-warp (8 lanes) holds 4 pairs of each row, whose slots differ in cb % 4: their 16-byte halves
// q (at 32 slot + 16 (q ^ r % 2) bytes) fall in 8 different 16-byte bank groups.
__device__ __forceinline__ void owned(int p, int& r, int& cb) {
	r = 2 * (p >> 5) + ((p >> 2) & 1);
	cb = (p & 3) + 4 * ((p >> 3) & 3);
}

// copy_tile issues the cp.async copies of the rows < n of a [ROWS][128] fp32 tile (row stride `stride`
// elements in global memory) into the stage dst, and zero-fills the rows >= n; each thread owns the
// pairs owned(tid + 256 k) and copies their halves q = 0, 1 one instruction each (conflict-free).
template <int ROWS>
__device__ __forceinline__ void copy_tile(float* dst, const float* src, long long stride, int n) {
	int r0, cb;
	owned(threadIdx.x, r0, cb);  // owned(tid + 256 k) is (r0 + 16 k, cb): same row parity and slot, 16 rows on
#pragma unroll
	for (int k = 0; k < ROWS * 16 / kThreads; ++k) {
		const int r = r0 + 16 * k;
		float* d0 = dst + hslot(r0, cb, 0) + 16 * k * kD;  // hslot(r, cb, 0)
		float* d1 = dst + hslot(r0, cb, 1) + 16 * k * kD;  // hslot(r, cb, 1)
		if (r < n) {
			const float* s = src + r * stride + 8 * cb;
			tc::cp_async16(d0, s);
			tc::cp_async16(d1, s + 4);
		} else {
			*reinterpret_cast<uint4*>(d0) = uint4{0u, 0u, 0u, 0u};
			*reinterpret_cast<uint4*>(d1) = uint4{0u, 0u, 0u, 0u};
		}
	}
}

// convert_tile splits the thread's own pairs of a staged tile in place (after its cp.async wait): hi
// unit over half 0 and, when SPLIT, lo unit over half 1, each half one 16-byte access (conflict-free).
// Words are read and written as unsigned only (no type punning between the loads and the stores for the
// compiler to reorder).
template <int ROWS, bool SPLIT>
__device__ __forceinline__ void convert_tile(float* tile) {
	unsigned* w = reinterpret_cast<unsigned*>(tile);
	int r0, cb;
	owned(threadIdx.x, r0, cb);  // as copy_tile: pair k is (r0 + 16 k, cb)
#pragma unroll
	for (int k = 0; k < ROWS * 16 / kThreads; ++k) {
		uint4* f0 = reinterpret_cast<uint4*>(w + hslot(r0, cb, 0) + 16 * k * kD);
		uint4* f1 = reinterpret_cast<uint4*>(w + hslot(r0, cb, 1) + 16 * k * kD);
		const uint4 a = *f0, b = *f1;
		const float x[8] = {__uint_as_float(a.x), __uint_as_float(a.y), __uint_as_float(a.z), __uint_as_float(a.w),
		                    __uint_as_float(b.x), __uint_as_float(b.y), __uint_as_float(b.z), __uint_as_float(b.w)};
		unsigned hi[4], lo[4];
#pragma unroll
		for (int i = 0; i < 4; ++i) {
			if (SPLIT)
				tc::split_bf16x2(x[2 * i], x[2 * i + 1], hi[i], lo[i]);
			else
				hi[i] = tc::pack_bf16x2(x[2 * i], x[2 * i + 1]);
		}
		*f0 = uint4{hi[0], hi[1], hi[2], hi[3]};
		if (SPLIT) *f1 = uint4{lo[0], lo[1], lo[2], lo[3]};
	}
}

// mma_terms: acc += a b as ah bh (+ ah bl when SB) (+ al bh when SA), in that order.
template <bool SA, bool SB>
__device__ __forceinline__ void mma_terms(float acc[4], const unsigned ah[4], const unsigned al[4], const unsigned* bh,
                                          const unsigned* bl) {
	tc::mma_bf16_16816(acc, ah, bh, acc);
	if (SB) tc::mma_bf16_16816(acc, ah, bl, acc);
	if (SA) tc::mma_bf16_16816(acc, al, bh, acc);
}

// a_frag loads the A fragments (hi and, when SPLIT, lo) of rows 16 rt .. of a staged tile, k step kk.
template <bool SPLIT>
__device__ __forceinline__ void a_frag(unsigned ah[4], unsigned al[4], const bf16* tile, int rt, int kk, int lane) {
	const int r = 16 * rt + (lane & 7) + 8 * ((lane >> 3) & 1), cb = 2 * kk + (lane >> 4);
	tc::ldmatrix_x4(ah, tile + unit(r, cb, 0));
	if (SPLIT) tc::ldmatrix_x4(al, tile + unit(r, cb, 1));
}

// bt_frag loads the B fragments of a row-major (k-major) staged tile, k rows 16 kk .., columns
// 8 cb0 .. 8 cb0 + 15 (two n-tiles: r[0..1] and r[2..3]) by ldmatrix.trans.
template <bool SPLIT>
__device__ __forceinline__ void bt_frag(unsigned bh[4], unsigned bl[4], const bf16* tile, int kk, int cb0, int lane) {
	const int r = 16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1), cb = cb0 + (lane >> 4);
	tc::ldmatrix_x4_trans(bh, tile + unit(r, cb, 0));
	if (SPLIT) tc::ldmatrix_x4_trans(bl, tile + unit(r, cb, 1));
}

// bn_frag loads the B fragments of a tile whose rows are the n index (B = tile^T): n rows 16 jp ..
// (two n-tiles: r[0..1] and r[2..3]), k columns 16 kk .., by ldmatrix not transposed.
template <bool SPLIT>
__device__ __forceinline__ void bn_frag(unsigned bh[4], unsigned bl[4], const bf16* tile, int jp, int kk, int lane) {
	const int r = 16 * jp + (lane & 7) + 8 * (lane >> 4), cb = 2 * kk + ((lane >> 3) & 1);
	tc::ldmatrix_x4(bh, tile + unit(r, cb, 0));
	if (SPLIT) tc::ldmatrix_x4(bl, tile + unit(r, cb, 1));
}

// scale_rows_exp multiplies a warp's accumulator rows by e^gamma: row i0 (elements 0, 1 of every tile)
// by e^g0, row i1 (elements 2, 3) by e^g1, making Q H into (Q e^gamma) H.
__device__ __forceinline__ void scale_rows_exp(float acc[8][4], float g0, float g1) {
	const float e0 = expf(g0), e1 = expf(g1);
#pragma unroll
	for (int nt = 0; nt < 8; ++nt) {
		acc[nt][0] *= e0;
		acc[nt][1] *= e0;
		acc[nt][2] *= e1;
		acc[nt][3] *= e1;
	}
}

// raw_scores computes the warp's scores S = Q K^T: rows 16 rt .. of the Q stage Qb, keys j < 16 (rt + 1) of
// the K stage Kb, both split in place (SQ / SK: with their lo parts); the tiles past the diagonal block stay 0.
template <bool SQ, bool SK>
__device__ __forceinline__ void raw_scores(float s[8][4], const bf16* Qb, const bf16* Kb, int rt, int lane) {
#pragma unroll
	for (int nt = 0; nt < 8; ++nt)
#pragma unroll
		for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
#pragma unroll
	for (int kk = 0; kk < 8; ++kk) {
		unsigned ah[4], al[4];
		a_frag<SQ>(ah, al, Qb, rt, kk, lane);
#pragma unroll
		for (int jp = 0; jp < 4; ++jp) {
			if (jp > rt) break;  // warp-uniform
			unsigned bh[4], bl[4];
			bn_frag<SK>(bh, bl, Kb, jp, kk, lane);
			mma_terms<SQ, SK>(s[2 * jp], ah, al, bh, bl);
			mma_terms<SQ, SK>(s[2 * jp + 1], ah, al, bh + 2, bl + 2);
		}
	}
}

// raw_scores_kt: raw_scores<true, true> with K's hi / lo B fragments read from the prep's K^T walk planes
// (walk_planes.cuh: row = key, 128 bytes of tokens, unit b at b ^ (key % 8); lo 16384 bytes on) staged as
// they lie at kt, by ldmatrix.trans: matrices (keys 16 kk .. + 7, tokens of tile 2 jp), (keys + 8 .., tile
// 2 jp), (.., tile 2 jp + 1), (+ 8 .., 2 jp + 1), bn_frag's fragments. The planes hold split_bf16x2 of the
// normalised k (gdn_l2norm_fwd's rows, zero past n), which is what convert_tile makes of K's fp32 tile: the
// same fragments, products and order, so the same scores bit for bit.
__device__ __forceinline__ void raw_scores_kt(float s[8][4], const bf16* Qb, const unsigned char* kt, int rt, int lane) {
#pragma unroll
	for (int nt = 0; nt < 8; ++nt)
#pragma unroll
		for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
	const int mi = lane >> 3, lr = lane & 7;
#pragma unroll
	for (int kk = 0; kk < 8; ++kk) {
		unsigned ah[4], al[4];
		a_frag<true>(ah, al, Qb, rt, kk, lane);
		const int key = 16 * kk + 8 * (mi & 1) + lr;
#pragma unroll
		for (int jp = 0; jp < 4; ++jp) {
			if (jp > rt) break;  // warp-uniform
			const unsigned char* a = kt + key * 128 + (((2 * jp + (mi >> 1)) ^ (key & 7)) << 4);
			unsigned bh[4], bl[4];
			tc::ldmatrix_x4_trans(bh, a);
			tc::ldmatrix_x4_trans(bl, a + walkplanes::kOffLo);
			mma_terms<true, true>(s[2 * jp], ah, al, bh, bl);
			mma_terms<true, true>(s[2 * jp + 1], ah, al, bh + 2, bl + 2);
		}
	}
}

// mask_decay turns raw scores in place into P = S e^(gamma_i - gamma_j) where j <= i < n, exactly 0
// elsewhere (a select), with the gamma of the value head at hand.
__device__ __forceinline__ void mask_decay(float s[8][4], const float* gam, int rt, int lane, int n) {
	const int g = lane >> 2, t = lane & 3, i0 = 16 * rt + g, i1 = i0 + 8;
	const float g0 = gam[i0], g1 = gam[i1];
#pragma unroll
	for (int nt = 0; nt < 8; ++nt) {
		if (nt / 2 > rt) break;
		const int j0 = 8 * nt + 2 * t, j1 = j0 + 1;
		const float gj0 = gam[j0], gj1 = gam[j1];
		s[nt][0] = (j0 <= i0 && i0 < n) ? s[nt][0] * expf(g0 - gj0) : 0.f;
		s[nt][1] = (j1 <= i0 && i0 < n) ? s[nt][1] * expf(g0 - gj1) : 0.f;
		s[nt][2] = (j0 <= i1 && i1 < n) ? s[nt][2] * expf(g1 - gj0) : 0.f;
		s[nt][3] = (j1 <= i1 && i1 < n) ? s[nt][3] * expf(g1 - gj1) : 0.f;
	}
}

// masked_scores: raw_scores, then mask_decay. Both outputs run it, so they share its bits.
template <bool SQ, bool SK>
__device__ __forceinline__ void masked_scores(float s[8][4], const bf16* Qb, const bf16* Kb, const float* gam, int rt,
                                              int lane, int n) {
	raw_scores<SQ, SK>(s, Qb, Kb, rt, lane);
	mask_decay(s, gam, rt, lane, n);
}

__device__ __forceinline__ void store2(__nv_bfloat16* p, float a, float b) {
	*reinterpret_cast<unsigned*>(p) = tc::pack_bf16x2(a, b);
}
__device__ __forceinline__ void store2(float* p, float a, float b) {
	p[0] = a;
	p[1] = b;
}

// output_mma: the kernel body; OutT is __nv_bfloat16 for the entry (float only for the emulator's
// precision probes of ptx/cpuemu/testdata/kernels_output_mma.cpp).
template <int PREC, typename OutT>
__device__ __forceinline__ void output_mma(float* smem, const float* qn, const float* kn, const float* gcum,
                                           const float* vnew, const float* h_state, const int* chunk_tok0,
                                           const int* chunk_len, OutT* o, int HQK, int HV, float scale) {
	constexpr bool SQ = PREC & kSplitQ, SK = PREC & kSplitK, SH = PREC & kSplitH, SV = PREC & kSplitV,
	               SP = PREC & kSplitP;
	float* QR = smem;            // [64][128]: Q
	float* XR = QR + kC * kD;    // [128][128]: H, then K [64][128] and V' [64][128]
	float* gam = XR + kD * kD;   // [64]
	const bf16* Qb = reinterpret_cast<const bf16*>(QR);
	const bf16* Xb = reinterpret_cast<const bf16*>(XR);
	const bf16* Vb = Xb + 2 * kC * kD;
	const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int g = lane >> 2, t = lane & 3, rt = warp & 3, cb0 = 8 * (warp >> 2);  // cb0: column block of c0
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int qh = h / (HV / HQK);
	const long long qk = (long long)HQK * kD;

	copy_tile<kC>(QR, qn + ((long long)t0 * HQK + qh) * kD, qk, n);
	copy_tile<kD>(XR, h_state + ((long long)c * HV + h) * kD * kD, kD, kD);
	tc::cp_async_commit();
	if (tid < kC) gam[tid] = tid < n ? gcum[(long long)(t0 + tid) * HV + h] : 0.f;
	tc::cp_async_wait<0>();
	convert_tile<kC, SQ>(QR);
	convert_tile<kD, SH>(XR);
	__syncthreads();  // (1) Q, H and gamma staged

	// (1) O = Q H over the warp's 16 rows x 64 columns.
	float acc[8][4];
#pragma unroll
	for (int nt = 0; nt < 8; ++nt)
#pragma unroll
		for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
#pragma unroll 1
	for (int kk = 0; kk < 8; ++kk) {
		unsigned ah[4], al[4];
		a_frag<SQ>(ah, al, Qb, rt, kk, lane);
#pragma unroll
		for (int np = 0; np < 4; ++np) {
			unsigned bh[4], bl[4];
			bt_frag<SH>(bh, bl, Xb, kk, cb0 + 2 * np, lane);
			mma_terms<SQ, SH>(acc[2 * np], ah, al, bh, bl);
			mma_terms<SQ, SH>(acc[2 * np + 1], ah, al, bh + 2, bl + 2);
		}
	}
	const int i0 = 16 * rt + g, i1 = i0 + 8;
	scale_rows_exp(acc, gam[i0], gam[i1]);
	__syncthreads();  // (2) every warp done with H: XR is free

	copy_tile<kC>(XR, kn + ((long long)t0 * HQK + qh) * kD, qk, n);
	copy_tile<kC>(XR + kC * kD, vnew + ((long long)t0 * HV + h) * kD, (long long)HV * kD, n);
	tc::cp_async_commit();
	tc::cp_async_wait<0>();
	convert_tile<kC, SK>(XR);
	convert_tile<kC, SV>(XR + kC * kD);
	__syncthreads();  // (3) K and V' staged

	// (2) S = Q K^T over keys j < 16 (rt + 1), masked and decayed into P in place.
	float s[8][4];
	masked_scores<SQ, SK>(s, Qb, Xb, gam, rt, lane, n);

	// (3) O += P V' over k steps kj <= rt.
#pragma unroll
	for (int kj = 0; kj < 4; ++kj) {
		if (kj > rt) break;
		unsigned ah[4], al[4];
		const int k0 = 2 * kj, k1 = 2 * kj + 1;  // constant indices after unrolling: s stays in registers
		if (SP) {
			tc::split_bf16x2(s[k0][0], s[k0][1], ah[0], al[0]);
			tc::split_bf16x2(s[k0][2], s[k0][3], ah[1], al[1]);
			tc::split_bf16x2(s[k1][0], s[k1][1], ah[2], al[2]);
			tc::split_bf16x2(s[k1][2], s[k1][3], ah[3], al[3]);
		} else {
			ah[0] = tc::pack_bf16x2(s[k0][0], s[k0][1]);
			ah[1] = tc::pack_bf16x2(s[k0][2], s[k0][3]);
			ah[2] = tc::pack_bf16x2(s[k1][0], s[k1][1]);
			ah[3] = tc::pack_bf16x2(s[k1][2], s[k1][3]);
		}
#pragma unroll
		for (int np = 0; np < 4; ++np) {
			unsigned bh[4], bl[4];
			bt_frag<SV>(bh, bl, Vb, kj, cb0 + 2 * np, lane);
			mma_terms<SP, SV>(acc[2 * np], ah, al, bh, bl);
			mma_terms<SP, SV>(acc[2 * np + 1], ah, al, bh + 2, bl + 2);
		}
	}

	// Store: row i0 / i1, columns 8 (cb0 + nt) + 2t, +1.
#pragma unroll
	for (int nt = 0; nt < 8; ++nt) {
		const int d = 8 * (cb0 + nt) + 2 * t;
		if (i0 < n) store2(o + ((long long)(t0 + i0) * HV + h) * kD + d, scale * acc[nt][0], scale * acc[nt][1]);
		if (i1 < n) store2(o + ((long long)(t0 + i1) * HV + h) * kD + d, scale * acc[nt][2], scale * acc[nt][3]);
	}
}

extern "C" __global__ void __launch_bounds__(kThreads, 2)
gdn_output_mma(const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ gcum,
               const float* __restrict__ vnew, const float* __restrict__ h_state,
               const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
               __nv_bfloat16* __restrict__ o, int HQK, int HV, float scale) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	output_mma<kOutputPrec>(smem, qn, kn, gcum, vnew, h_state, chunk_tok0, chunk_len, o, HQK, HV, scale);
}

// ==== gdn_output_mma16: the output from bf16 H^T and V'^T ================================================
//   gdn_output_mma16   grid (NC, HV)   kOutputMMA16Smem = 114944 bytes (two CTAs an SM)
// Arguments: gdn_output_mma's, in its order, with vnew and h_state retyped to the bf16 tiles of
// gdn_state_walk_mma16 (gdn_walk_mma.cu): (qn, kn, gcum, vnew16, h16, chunk_tok0, chunk_len, o, HQK, HV,
// scale), block 256. h16 is [NC, HV, 128 (column), 128 (key)] (H^T of chunk c's start state), vnew16
// [NC, HV, 128 (column), 64 (token)] (V'^T, tokens past a short chunk's end 0: they are read, so they must
// be finite; the walk writes zeros). The same O = scale ((Q e^gamma) H + (Q K^T ⊙ e^(gamma_i - gamma_j),
// j <= i < n) V') in bf16, rows past n neither read (q, k, gamma) nor written.
//
// ---- Design ----------------------------------------------------------------------------------------------
// gdn_output_mma's warps, tiles and phases: warp w owns rows 16 rt .. (rt = w % 4) x columns 64 wc ..
// (wc = w / 4), 8 accumulator tiles; (1) O = Q H, rows times e^gamma; (2) S = Q K^T over the causal key
// tiles, masked and decayed into P in the registers; (3) O += P V'; times scale, bf16, stored by its owner.
// What changes: H and V' arrive as bf16 and enter the tensor cores as they are (one operand of a product
// plain: ah b + al b, two mma.sync instead of three); Q, K and P stay split hi/lo (Q, K staged fp32 and
// split in place by copy_tile / convert_tile as in gdn_output_mma, P split in registers).
// The bf16 tiles are copied by cp.async straight into their stages, no conversion pass: both are stored
// with the n index (column) as the row, so B = tile^T comes from ldmatrix.x4 without .trans (lanes 0-7:
// columns 16 jp .. + 7 at k unit 2 kk, 8-15: the same columns at unit 2 kk + 1, 16-31: columns + 8), and
// each row's 16-byte unit u is stored at unit u ^ (row % 8) (sw16): the 8 rows of an 8x8 matrix, 256 (H^T)
// or 128 (V'^T) bytes apart, fall in 8 different 16-byte bank groups; a warp's cp.async writes (two rows
// of H^T, four of V'^T, a row's units permuted) are conflict-free as well.
// Block order: lin = blockIdx.y gridDim.x + blockIdx.x, c = lin / HV, h = lin % HV (gridDim is (NC, HV) by
// the ABI): the HV / HQK value heads that read the same q, k rows run back to back and find them in L2
// (gdn_prep_mma does the same), so Q and K cost HBM once per QK head, not once per value head.
// Regions: QR [64][128] fp32 (Q, split in place) | XR [128][128] bf16 (H^T) | VT [128][64] bf16 (V'^T) |
// KR [64][128] fp32 (K, split in place) | gam [64].
//   copy Q, H^T (group 1), V'^T, K (group 2); gamma; wait_group 1; convert Q     __syncthreads (1)
//   (1) O = Q H; rows times e^gamma
//   wait_group 0 (V'^T, K); convert K (each thread its own units)              __syncthreads (2)
//   (2), mask, (3), store
// V'^T and K land during phase (1). Two block barriers, no warp barrier, no atomics; every sum in a fixed
// order (k steps ascending; per step ah b, then al b; S as ah bh + ah bl + al bh).
// Shared memory 4 (64 128) + 2 (128 128) + 2 (128 64) + 4 (64 128) + 4 64 = 32768 + 32768 + 16384 + 32768 +
// 256 = 114944 bytes (gdn_output_mma: 98560): two CTAs an SM (2 (114944 + 1024 reserved) = 231936 of 233472
// bytes). Until 2026-12-01 K took H^T's place after phase (1) (82176 bytes, three barriers): its copy was
// then issued after barrier (2) and waited for at once, and ncu put 5.7% of the kernel's stall samples on
// the first shared load after that wait (6.9% on the one after Q's and H^T's); K's own region lets its
// copy land under phase (1).
//
// ---- Precision -------------------------------------------------------------------------------------------
// H and V' are plain bf16 now (the walk rounded them, 2^-9 relative: there is no lo part to keep); Q, K
// and P stay split (the measurement of gdn_output_mma's PREC bits above: each plain operand costs
// ~1.1-1.4e-3, so splitting Q, K, P keeps the kernel's own error ~100x below the bf16 hand-over).
// Measured on the emulator (TestMMA16OnCPU: segments of 1..200 tokens, HQK 1 / HV 1 and HQK 2 / HV 4,
// q, k l2-normalised, H and V' from gdn_state_walk_mma16 on random non-zero start states; normwise
// relative error against gdnref.Output in float64):
//   O before its bf16 rounding (fp32 probe) vs gdnref from the bf16 H, V' it read   4.1e-6 (the kernel's own)
//   O before its bf16 rounding vs gdnref from the walk's fp32 H, V'                 1.69e-3 (the hand-over)
//     of which H's rounding alone 1.1-1.2e-3, V''s alone 1.15-1.26e-3 (gdnref with one of them rounded)
//   O in bf16 (the entry) vs gdnref from the fp32 H, V'                             2.34-2.36e-3 (total)
//   O in bf16 vs gdnref from the bf16 H, V'                                         1.64-1.65e-3 (O's rounding)
// gdn_output_mma (fp32 H, V', every operand split): 5.7e-6 before and ~1.67e-3 after O's rounding. The
// bf16 hand-over adds ~0.7e-3 to the output's total (errors of independent roundings add in quadrature:
// sqrt(1.69^2 + 1.65^2) = 2.36), about half of the forward's 5e-3 budget against the ~1/3 before.
//
// ---- Cost, predicted for an H200 (132 SMs, ~4 TB/s HBM) at 32K tokens (512 chunks x 48 value heads) ---
// Per CTA (one chunk, one value head), bytes: Q and K 32 KB each fp32 (one HBM read per QK head through
// the head-fastest block order, so ~21.3 KB a CTA of the 3 value heads that share them), h16 32 KB,
// vnew16 16 KB, O 16 KB bf16 written, gamma 256: 128 KB moved, ~85.6 KB unique in HBM (gdn_output_mma:
// H 64 KB + V' 32 KB fp32, ~133.6 KB unique with the same L2 reuse of Q and K, ~176 KB without it).
// Shared memory: cp.async writes 112 KB, the in-place splits of Q and K read and write 64 KB each, the
// ldmatrix.x4 read per warp Q twice (8 KB each as hi + lo), its half of H^T 16 KB, K ~20 KB (hi + lo, the
// causal skips) and V'^T ~5 KB: ~700 KB a CTA (gdn_output_mma ~1.1 MB). Tensor cores: Q H 1024, Q K^T
// 960, P V' 320 = 2304 mma.sync m16n8k16 (9.4 MFLOP; gdn_output_mma ~3000).
// 24576 CTAs, 186 an SM:
//   HBM      24576 x 85.6 KB = 2.15 GB / ~4 TB/s                   ~0.54 ms   (gdn_output_mma ~0.84)
//   smem     186 x ~700 KB / (128 B/clk at ~1.8 GHz)                 ~0.57 ms   (~0.9)
//   tensor   24576 x 9.4 MFLOP = 2.3e11 at ~60% of ~1 PFLOP/s       ~0.39 ms   (~0.5)
// Predicted ~0.6-0.7 ms at 32K (gdn_output_mma ~0.9-1.0 ms), bound by shared memory and HBM together.
// With the walk's halved stores (gdn_state_walk_mma16 with h_out and vnew null: 48 KB a chunk and head
// written instead of 96) the H / V' hand-over moves 96 KB less per chunk and head, 2.4 GB at 32K: ~0.6 ms
// of HBM time, of which the output keeps ~0.3 ms and the walk ~0.1-0.2 ms (it becomes bound by its
// shared memory, ~2.1 us a chunk at vh 64, instead of HBM, ~2.3 us). Core forward at 32K: ~3.3 ->
// ~2.8-2.9 ms predicted, still over the 2.0 ms target (next: W, U, Kt, the prep's fp32 outputs).
// Registers: 118 (sm_90) / 109 (sm_80, compute_80 PTX) with ptxas 11.8, no spill, under the 128 of
// __launch_bounds__(256, 2); phase (1)'s k loop keeps gdn_output_mma's `#pragma unroll 1`.
template <int UNITS>
__device__ __forceinline__ int sw16(int r, int u) {
	return r * 8 * UNITS + 8 * (u ^ (r & 7));
}

// copy_bf16_tile issues the cp.async copies of a whole [ROWS][8 UNITS] bf16 tile (contiguous in global
// memory) into its swizzled stage; thread tid copies the units tid + 256 k (a warp: 512 contiguous bytes).
template <int ROWS, int UNITS>
__device__ __forceinline__ void copy_bf16_tile(bf16* dst, const bf16* src) {
#pragma unroll
	for (int k = 0; k < ROWS * UNITS / kThreads; ++k) {
		const int p = threadIdx.x + kThreads * k;
		tc::cp_async16(dst + sw16<UNITS>(p / UNITS, p % UNITS), src + 8 * p);
	}
}

// bn16_frag loads the B fragments of a swizzled bf16 tile whose rows are the n index (B = tile^T): n rows
// 16 jp .. (two n-tiles: b[0..1] and b[2..3]), k columns 16 kk .., by ldmatrix not transposed.
template <int UNITS>
__device__ __forceinline__ void bn16_frag(unsigned b[4], const bf16* tile, int jp, int kk, int lane) {
	const int r = 16 * jp + (lane & 7) + 8 * (lane >> 4), u = 2 * kk + ((lane >> 3) & 1);
	tc::ldmatrix_x4(b, tile + sw16<UNITS>(r, u));
}

// out16_qh: phase (1) of gdn_output_mma16: O = Q H over the warp's 16 rows x 64 columns (A = Q hi/lo, B =
// H^T rows 64 wc + 16 np ...), then each row i times e^gamma_i.
__device__ __forceinline__ void out16_qh(float acc[8][4], const bf16* Qb, const bf16* Xb, const float* gam, int rt, int wc,
                                         int lane) {
#pragma unroll
	for (int nt = 0; nt < 8; ++nt)
#pragma unroll
		for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
#pragma unroll 1
	for (int kk = 0; kk < 8; ++kk) {
		unsigned ah[4], al[4];
		a_frag<true>(ah, al, Qb, rt, kk, lane);
#pragma unroll
		for (int np = 0; np < 4; ++np) {
			unsigned b[4];
			bn16_frag<kD / 8>(b, Xb, 4 * wc + np, kk, lane);
			mma_terms<true, false>(acc[2 * np], ah, al, b, b);
			mma_terms<true, false>(acc[2 * np + 1], ah, al, b + 2, b + 2);
		}
	}
	const int i0 = 16 * rt + (lane >> 2), i1 = i0 + 8;
	scale_rows_exp(acc, gam[i0], gam[i1]);
}

// out16_pv_store: phase (3) of gdn_output_mma16, O += P V' over k steps kj <= rt (A = P hi/lo from the
// score tiles, B = V'^T rows 64 wc + 16 np ...), then O times scale stored at orow + i * ostride (rows
// i < n), columns 64 wc + 8 nt + 2t, +1.
template <typename OutT>
__device__ __forceinline__ void out16_pv_store(float acc[8][4], float s[8][4], const bf16* Vb, int rt, int wc, int lane,
                                               OutT* orow, long long ostride, int n, float scale) {
#pragma unroll
	for (int kj = 0; kj < 4; ++kj) {
		if (kj > rt) break;
		unsigned ah[4], al[4];
		const int k0 = 2 * kj, k1 = 2 * kj + 1;  // constant indices after unrolling: s stays in registers
		tc::split_bf16x2(s[k0][0], s[k0][1], ah[0], al[0]);
		tc::split_bf16x2(s[k0][2], s[k0][3], ah[1], al[1]);
		tc::split_bf16x2(s[k1][0], s[k1][1], ah[2], al[2]);
		tc::split_bf16x2(s[k1][2], s[k1][3], ah[3], al[3]);
#pragma unroll
		for (int np = 0; np < 4; ++np) {
			unsigned b[4];
			bn16_frag<kC / 8>(b, Vb, 4 * wc + np, kj, lane);
			mma_terms<true, false>(acc[2 * np], ah, al, b, b);
			mma_terms<true, false>(acc[2 * np + 1], ah, al, b + 2, b + 2);
		}
	}
	const int i0 = 16 * rt + (lane >> 2), i1 = i0 + 8, t = lane & 3;
#pragma unroll
	for (int nt = 0; nt < 8; ++nt) {
		const int d = 64 * wc + 8 * nt + 2 * t;
		if (i0 < n) store2(orow + i0 * ostride + d, scale * acc[nt][0], scale * acc[nt][1]);
		if (i1 < n) store2(orow + i1 * ostride + d, scale * acc[nt][2], scale * acc[nt][3]);
	}
}

// ---- gdn_output_mma16g's Q H on wgmma (sm_90a; GDNKCP_OUT_WGMMA, default 1) ----------------------------
// Where wgmma.cuh has wgmma (the sm_90a cubin, and the CPU emulator's runner_mma16_wg), the grouped output
// (gdn_output_mma16g / gn / gnk) runs (1) O = Q H as 16 warpgroup MMAs m64n64k16 (8 k steps x Qh, Ql):
// warpgroup wc (warps 4 wc .. 4 wc + 3) owns O's columns 64 wc .., warp w % 4 its rows 16 (w % 4) .. (the
// mma.sync path's layout), A = Q's fragments as that path loads them, B = H^T staged as two 64-key halves of
// 128-byte rows in the 128-byte swizzle (copy_ht_sw128, desc_sw128), read once a warpgroup where the mma.sync
// path has each of the four row warps of a column half load the same B fragments (4x the shared-memory reads
// of H^T). Each accumulator gets that path's products in its order, so on the emulator (whose wgmma is
// mma.sync's arithmetic tile by tile) the bits are the mma.sync path's; on the GPU the sm_90a output is its
// own. The scores and P V' stay on mma.sync with their causal skips and registers (all three on wgmma spilled
// 180-272 bytes on sm_90a and took the output 0.840 -> 1.30-1.45 ms at 32K: ptx/staging/parked/README.md,
// output_wgmma). H^T's stage, landed by cp.async, is published to wgmma with fence_proxy_async before its
// barrier.
#ifndef GDNKCP_OUT_WGMMA
#define GDNKCP_OUT_WGMMA 1
#endif
#if defined(GDNKCP_HAS_WGMMA) && GDNKCP_OUT_WGMMA
#define GDNKCP_OUT_WG 1

// acc32: a [8][4] accumulator tile set as wgmma's [32] (d[4 nt + e] is acc[nt][e]: the same layout).
__device__ __forceinline__ float (&acc32(float (*a)[4]))[32] { return *reinterpret_cast<float(*)[32]>(&a[0][0]); }

// copy_ht_sw128: cp.async of a chunk and head's H^T ([128 columns][128 keys] bf16, contiguous) into two 16 KB
// halves, keys 0-63 then 64-127, each [128 columns][128 bytes] with the 16-byte unit u of row r at u ^ (r % 8)
// (dst 1024-aligned): wgmma's K-major 128-byte swizzle. A warp copies two rows (512 contiguous bytes).
__device__ __forceinline__ void copy_ht_sw128(void* dst, const bf16* src) {
	unsigned char* d = reinterpret_cast<unsigned char*>(dst);
#pragma unroll
	for (int k = 0; k < kD * (kD / 8) / kThreads; ++k) {
		const int p = threadIdx.x + kThreads * k, r = p >> 4, u = p & 15;
		tc::cp_async16(d + (u >> 3) * (kD * 128) + r * 128 + (((u & 7) ^ (r & 7)) << 4), src + 8 * p);
	}
}

// GDNKCP_OUT_WG_QH_BATCH: the k steps of Q H whose Q fragments out16_qh_wg loads before it issues their
// products, a commit group each, the previous group waited for (wait<1>) before the next one's loads: 8 (all
// 16 fragments first, 64 registers, one group), 2 (32 registers, four groups, two in flight) or 1 (16). The
// same products in the same order either way. 1 since the thirty-seventh session: sm_90a's grouped entries
// spill 8-16 bytes where 2 spilled 16-32, and the output took 0.812 against 0.816 ms at 32K and 2.929 against
// 2.934 at 120,908 tokens on an H100 (knob-sweep, two rounds of medians of 5).
#ifndef GDNKCP_OUT_WG_QH_BATCH
#define GDNKCP_OUT_WG_QH_BATCH 1
#endif
constexpr int kQHBatch = GDNKCP_OUT_WG_QH_BATCH;
static_assert(kQHBatch == 1 || kQHBatch == 2 || kQHBatch == 4 || kQHBatch == 8, "GDNKCP_OUT_WG_QH_BATCH divides 8");

// out16_qh_wg: out16_qh on wgmma: O (the warpgroup's 64 rows x columns 64 wc ..) = Q H, then rows times
// e^gamma. ht: copy_ht_sw128's stage.
__device__ __forceinline__ void out16_qh_wg(float acc[8][4], const bf16* Qb, const unsigned char* ht, const float* gam,
                                            int rt, int wc, int lane) {
	float(&d)[32] = acc32(acc);
#pragma unroll
	for (int k0 = 0; k0 < 8; k0 += kQHBatch) {
		unsigned ah[kQHBatch][4], al[kQHBatch][4];
#pragma unroll
		for (int j = 0; j < kQHBatch; ++j) a_frag<true>(ah[j], al[j], Qb, rt, k0 + j, lane);
		wg::fence();
#pragma unroll
		for (int j = 0; j < kQHBatch; ++j) {
			const int kk = k0 + j;
			const unsigned long long b = wg::desc_sw128(ht + (kk >> 2) * (kD * 128) + wc * 64 * 128 + 32 * (kk & 3));
			wg::mma_m64n64k16_rs(d, ah[j], b, kk > 0 ? 1 : 0);
			wg::mma_m64n64k16_rs(d, al[j], b, 1);
		}
		wg::commit();
		if (k0 + kQHBatch < 8) wg::wait<1>();  // the previous group: its fragments are free
	}
	wg::wait<0>();
	wg::fence_operand(d);
	const int i0 = 16 * rt + (lane >> 2), i1 = i0 + 8;
	scale_rows_exp(acc, gam[i0], gam[i1]);
}

#endif  // GDNKCP_OUT_WG

// copy_h16: H^T's copy into its stage for gdn_output_mma16g: copy_ht_sw128's halves on the wgmma path, else
// copy_bf16_tile's 256-byte rows (gdn_output_mma16 always takes the latter).
__device__ __forceinline__ void copy_h16(float* XR, const bf16* src) {
#if defined(GDNKCP_OUT_WG)
	copy_ht_sw128(XR, src);
#else
	copy_bf16_tile<kD, kD / 8>(reinterpret_cast<bf16*>(XR), src);
#endif
}

// out16_stage: the first staging of gdn_output_mma16 (and of gdn_output_mma16g's first head): Q's rows
// (q: the chunk's first row) and H^T (group 1), V'^T and K's rows (group 2) by cp.async, gamma; then Q's
// copies waited for and split in place (V'^T and K may still be in flight).
// G: gdn_output_mma16g's first head (H^T by copy_h16).
template <bool G = false>
__device__ __forceinline__ void out16_stage(float* QR, float* XR, bf16* VT, float* KR, float* gam, const float* q,
                                            const float* k, long long qk, const float* gcum, const bf16* h16b,
                                            const bf16* v16b, int t0, int n, int h, int HV) {
	const int tid = threadIdx.x;
	copy_tile<kC>(QR, q, qk, n);
	if (G)
		copy_h16(XR, h16b);
	else
		copy_bf16_tile<kD, kD / 8>(reinterpret_cast<bf16*>(XR), h16b);
	tc::cp_async_commit();
	copy_bf16_tile<kD, kC / 8>(VT, v16b);
	copy_tile<kC>(KR, k, qk, n);
	tc::cp_async_commit();
	if (tid < kC) gam[tid] = tid < n ? gcum[(long long)(t0 + tid) * HV + h] : 0.f;
	tc::cp_async_wait<1>();  // Q and H^T (V'^T and K may still be in flight)
	convert_tile<kC, true>(QR);
}

constexpr int kOutputMMA16Smem = 4 * kC * kD + 2 * kD * kD + 2 * kD * kC + 4 * kC * kD + 4 * kC;
static_assert(kOutputMMA16Smem == 114944, "kOutputMMA16Smem: the header says 114944 bytes");
static_assert(2 * (kOutputMMA16Smem + 1024) <= 233472, "two CTAs an SM");

// output_mma16: the kernel body; OutT is __nv_bfloat16 for the entry (float only for the emulator's
// precision probe of ptx/cpuemu/testdata/kernels_mma16.cpp).
template <typename OutT>
__device__ __forceinline__ void output_mma16(float* smem, const float* qn, const float* kn, const float* gcum,
                                             const bf16* vnew16, const bf16* h16, const int* chunk_tok0,
                                             const int* chunk_len, OutT* o, int HQK, int HV, float scale) {
	float* QR = smem;                                    // [64][128] fp32: Q, split in place
	float* XR = QR + kC * kD;                            // H^T [128][128] bf16
	bf16* VT = reinterpret_cast<bf16*>(XR + kC * kD);    // [128][64] bf16: V'^T
	float* KR = reinterpret_cast<float*>(VT + kD * kC);  // [64][128] fp32: K, split in place (16g: then S)
	float* gam = KR + kC * kD;                           // [64]
	const bf16* Qb = reinterpret_cast<const bf16*>(QR);
	const bf16* Xb = reinterpret_cast<const bf16*>(XR);
	const bf16* Kb = reinterpret_cast<const bf16*>(KR);
	const int lin = blockIdx.y * gridDim.x + blockIdx.x, c = lin / HV, h = lin % HV;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int rt = warp & 3, wc = warp >> 2;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int qh = h / (HV / HQK);
	const long long qk = (long long)HQK * kD, blk = (long long)c * HV + h;

	out16_stage(QR, XR, VT, KR, gam, qn + ((long long)t0 * HQK + qh) * kD, kn + ((long long)t0 * HQK + qh) * kD, qk,
	            gcum, h16 + blk * kD * kD, vnew16 + blk * kD * kC, t0, n, h, HV);
	__syncthreads();  // (1) Q, H^T and gamma staged

	// (1) O = Q H over the warp's 16 rows x 64 columns: A = Q hi/lo, B = H^T rows 64 wc + 16 np ...
	float acc[8][4];
	out16_qh(acc, Qb, Xb, gam, rt, wc, lane);

	tc::cp_async_wait<0>();  // V'^T and K
	convert_tile<kC, true>(KR);
	__syncthreads();  // (2) K and V'^T staged

	// (2) S = Q K^T over keys j < 16 (rt + 1), masked and decayed into P in place.
	float s[8][4];
	masked_scores<true, true>(s, Qb, Kb, gam, rt, lane, n);

	// (3) O += P V', stored.
	out16_pv_store(acc, s, VT, rt, wc, lane, o + ((long long)t0 * HV + h) * kD, (long long)HV * kD, n, scale);
}

extern "C" __global__ void __launch_bounds__(kThreads, 2)
gdn_output_mma16(const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ gcum,
                 const __nv_bfloat16* __restrict__ vnew16, const __nv_bfloat16* __restrict__ h16,
                 const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
                 __nv_bfloat16* __restrict__ o, int HQK, int HV, float scale) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	output_mma16(smem, qn, kn, gcum, vnew16, h16, chunk_tok0, chunk_len, o, HQK, HV, scale);
}

// ==== gdn_output_mma16g: gdn_output_mma16 a QK head at a time ===========================================
//   gdn_output_mma16g   grid (NC, HQK)   kOutputMMA16Smem = 114944 bytes (two CTAs an SM)
// gdn_output_mma16's arguments and output, bit for bit, with one CTA a (chunk, QK head) running the
// G = HV / HQK value heads that read the same q and k rows, in ascending order. Block order: lin = blockIdx.y
// gridDim.x + blockIdx.x, c = lin / HQK, qh = lin % HQK.
// Why: Q and K, their in-place splits and the scores S = Q K^T do not depend on the value head; per head
// gdn_output_mma16 copies 64 KB of fp32 Q and K, splits them (128 KB of shared traffic) and spends 960 of its
// 2304 mma.sync (and their ldmatrix) on S. Here they happen once a QK head: the raw scores (raw_scores: the
// same mma sequence) are stashed in K's region once every warp is done with K (each lane its own 32
// fragment values, lane-fastest: conflict-free, and read back only by the lane that wrote them), and each
// head forms its P from them with its own gamma (mask_decay: the same expressions). Phases (1) and (3) and
// the store are gdn_output_mma16's (out16_qh, out16_pv_store), so every output element is the same bits.
//   head 0: copy Q, H^T (group 1), V'^T, K (group 2); gamma; wait_group 1; convert Q; __syncthreads;
//           (1); wait_group 0; convert K; __syncthreads; raw S; __syncthreads; stash S; P; (3), store
//   head j > 0: __syncthreads (H^T, V'^T, gamma free); copy H^T, V'^T; gamma; wait; __syncthreads;
//               (1); S from the stash; P; (3), store
// Predicted (not measured): per value head after the first, ~1660 mma.sync instead of 2304 and ~60% of the
// shared-memory traffic; the copies of H^T and V'^T are exposed per head (one wait each), hidden by the
// second CTA of the SM as in gdn_output_mma16. 1.12 ms at 32K -> ~0.8-0.9 ms if the kernel stays bound by
// issue and shared memory.
// out16_norm_tile: gdn_output_mma16gn's Q or K rows, normalised here from the bf16 x (the chunk's first row,
// row stride xs elements; fwd::load_row4 and l2norm_lane, gdn_l2norm_fwd's arithmetic) into the staged fp32
// tile where copy_tile would have put the fp32 rows gdn_l2norm_fwd writes (element (r, d) at hslot(r, d / 8,
// d / 4 % 2) + d % 4: lane l's four columns 4 l .. are one 16-byte store), rows from n on zero: the same tile,
// so convert_tile and everything after it are the bits of gdn_output_mma16g. Warp w takes rows w, w + 8, ..,
// kNormRows rows' loads at a time. Plain shared stores: a __syncthreads publishes them.
// norm_split_store writes lane's four normalised columns 4 lane .. 4 lane + 3 of row i (zero from row n on)
// straight into the split tile: the bf16 hi halves into the hi unit of pair (i, lane / 2) and the lo halves
// into its lo unit, 8 bytes each (half lane % 2 of the unit), the values convert_tile<.., true> makes of the
// fp32 tile (split_bf16x2 of the same adjacent pairs), so no fp32 tile and no in-place split.
__device__ __forceinline__ void norm_split_store(float* tile, int i, int n, int lane, const float (&v)[4]) {
	unsigned h0 = 0u, l0 = 0u, h1 = 0u, l1 = 0u;
	if (i < n) {
		tc::split_bf16x2(v[0], v[1], h0, l0);
		tc::split_bf16x2(v[2], v[3], h1, l1);
	}
	bf16* b = reinterpret_cast<bf16*>(tile);
	*reinterpret_cast<uint2*>(b + unit(i, lane >> 1, 0) + 4 * (lane & 1)) = uint2{h0, h1};
	*reinterpret_cast<uint2*>(b + unit(i, lane >> 1, 1) + 4 * (lane & 1)) = uint2{l0, l1};
}

// out16_norm_out: row i's normalised part (lane's columns 4 lane ..) to xo + i os and, lane 0, its rstd to
// ro[i rs], for rows < n, where xo is given.
__device__ __forceinline__ void out16_norm_out(float* xo, long long os, float* ro, int rs, int i, int n, int lane,
                                               const float (&v)[4], float rstd) {
	if (i >= n) return;
	if (xo != nullptr) *reinterpret_cast<float4*>(xo + i * os + 4 * lane) = make_float4(v[0], v[1], v[2], v[3]);
	if (ro != nullptr && lane == 0) ro[(long long)i * rs] = rstd;
}

#ifndef GDNKCP_OUT_NORM_ROWS
#define GDNKCP_OUT_NORM_ROWS 8
#endif
constexpr int kNormRows = GDNKCP_OUT_NORM_ROWS;  // rows a warp loads at once (8: all; fewer: fewer registers)
static_assert(8 % kNormRows == 0, "kNormRows divides a warp's 8 rows");
// xo, ro (each may be null): the normalised rows < n also to xo + i os (fp32, 128 a row) and their rstd to
// ro[i rs] (lane 0): gdn_l2norm_fwd's values and places for a forward kept for a backward (the output's q; a
// backward that reads q's raw rows takes the rstd alone).
template <bool SPLIT = false>
__device__ __forceinline__ void out16_norm_tile(float* tile, const bf16* x, long long xs, int l2norm, int n,
                                                float* xo = nullptr, long long os = 0, float* ro = nullptr, int rs = 0) {
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const bool vec = fwd::rows_vec8(x, xs);
#pragma unroll 1
	for (int r0 = 0; r0 < 8; r0 += kNormRows) {
		float v[kNormRows][4];
#pragma unroll
		for (int r = 0; r < kNormRows; ++r) fwd::load_row4(x + (long long)min(warp + 8 * (r0 + r), n - 1) * xs, lane, vec, v[r]);
#pragma unroll
		for (int r = 0; r < kNormRows; ++r) {
			const int i = warp + 8 * (r0 + r);
			const float rstd = fwd::l2norm_lane(v[r], l2norm);  // every lane of the warp: its shuffles
			if (SPLIT) {
				norm_split_store(tile, i, n, lane, v[r]);
			} else {
				// columns 4 lane .. 4 lane + 3: one 16-byte half of slot (i, lane / 2)
				*reinterpret_cast<float4*>(tile + hslot(i, lane >> 1, lane & 1)) =
				    i < n ? make_float4(v[r][0], v[r][1], v[r][2], v[r][3]) : make_float4(0.f, 0.f, 0.f, 0.f);
			}
			out16_norm_out(xo, os, ro, rs, i, n, lane, v[r], rstd);
		}
	}
}

// rows_al16: whether every row at base + r stride (bf16 elements) is 16-byte aligned (cp.async's unit).
__device__ __forceinline__ bool rows_al16(const bf16* base, long long stride) {
	return ((reinterpret_cast<unsigned long long>(base) | (unsigned long long)(2 * stride)) & 15) == 0;
}

// copy_rows16: cp.async of the chunk's rows < n of x (row stride xs elements, 128 bf16 a row) into dst
// as plain 256-byte rows; thread tid takes the units tid + 256 j (j = 0..3), a warp two whole rows
// (not committed). Rows from n on are not written.
__device__ __forceinline__ void copy_rows16(bf16* dst, const bf16* x, long long xs, int n) {
#pragma unroll
	for (int j = 0; j < kC * kD / 8 / kThreads; ++j) {
		const int e = threadIdx.x + kThreads * j, r = e >> 4, u = e & 15;
		if (r < n) tc::cp_async16(dst + r * kD + 8 * u, x + (long long)r * xs + 8 * u);
	}
}

// out16_norm_staged: out16_norm_tile from rows staged in shared memory by copy_rows16 (row r at rows +
// 128 r; rows from n on read as row n - 1, as out16_norm_tile's loads): the same values, so the same tile.
// Each warp loads its eight rows before it normalises them; with SYNC a __syncthreads follows the loads
// (the tile overlaps the staged rows: every warp must have read them before any writes).
template <bool SYNC, bool SPLIT = false>
__device__ __forceinline__ void out16_norm_staged(float* tile, const bf16* rows, int l2norm, int n, float* xo = nullptr,
                                                  long long os = 0, float* ro = nullptr, int rs = 0) {
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	float v[8][4];
#pragma unroll
	for (int r = 0; r < 8; ++r) fwd::load_row4(rows + min(warp + 8 * r, n - 1) * kD, lane, true, v[r]);
	if (SYNC) __syncthreads();
#pragma unroll
	for (int r = 0; r < 8; ++r) {
		const int i = warp + 8 * r;
		const float rstd = fwd::l2norm_lane(v[r], l2norm);  // every lane of the warp: its shuffles
		if (SPLIT) {
			norm_split_store(tile, i, n, lane, v[r]);
		} else {
			*reinterpret_cast<float4*>(tile + hslot(i, lane >> 1, lane & 1)) =
			    i < n ? make_float4(v[r][0], v[r][1], v[r][2], v[r][3]) : make_float4(0.f, 0.f, 0.f, 0.f);
		}
		out16_norm_out(xo, os, ro, rs, i, n, lane, v[r], rstd);
	}
}

// out16_stage_norm: out16_stage for gdn_output_mma16gn. Where q's rows are 16-byte aligned (every buffer
// kcp passes): its bf16 rows by cp.async into Q's tile region (group 1), H^T (group 2), V'^T and K^T's walk
// planes of the chunk and QK head (kt: 32 KB, as they lie, into K's region; group 3), gamma; group 1 waited
// for and published; Q's rows normalised from there straight into Q's split tile once every warp has read
// them (out16_norm_staged, norm_split_store). Otherwise the rows loaded and normalised from global memory
// under the copies (out16_norm_tile). Either way the split tile that out16_stage's copy and convert_tile
// make; then H^T waited for (the caller's __syncthreads publishes both). K is not normalised here: the prep
// wrote its planes (raw_scores_kt).
__device__ __forceinline__ void out16_stage_norm(float* QR, float* XR, bf16* VT, float* KR, float* gam, const bf16* q,
                                                 const unsigned char* kt, long long qs, int l2norm, const float* gcum,
                                                 const bf16* h16b, const bf16* v16b, int t0, int n, int h, int HV,
                                                 float* qo = nullptr, long long qos = 0, float* qro = nullptr,
                                                 int qrs = 0) {
	const int tid = threadIdx.x;
	const bool async = rows_al16(q, qs);
	bf16* const qst = reinterpret_cast<bf16*>(QR);  // staged rows: q's (16 KB), in Q's own region
	if (async) copy_rows16(qst, q, qs, n);
	tc::cp_async_commit();  // group 1: q's rows (empty without async)
	copy_h16(XR, h16b);
	tc::cp_async_commit();  // group 2: H^T
	copy_bf16_tile<kD, kC / 8>(VT, v16b);
	unsigned char* kd = reinterpret_cast<unsigned char*>(KR);
#pragma unroll
	for (int j = 0; j < walkplanes::kKBytes / 16 / kThreads; ++j) tc::cp_async16(kd + 16 * (tid + kThreads * j), kt + 16 * (tid + kThreads * j));
	tc::cp_async_commit();  // group 3: V'^T, K^T's planes
	if (tid < kC) gam[tid] = tid < n ? gcum[(long long)(t0 + tid) * HV + h] : 0.f;
	if (async) {
		tc::cp_async_wait<2>();  // this thread's rows
		__syncthreads();         // every thread's rows
		out16_norm_staged<true, true>(QR, qst, l2norm, n, qo, qos, qro, qrs);
	} else {
		out16_norm_tile<true>(QR, q, qs, l2norm, n, qo, qos, qro, qrs);
	}
	tc::cp_async_wait<1>();  // H^T (V'^T and K^T may still be in flight)
}

// NORM: gdn_output_mma16gn (q: the raw bf16 rows, stride qs, normalised in the kernel; wk: the prep's K^T walk
// planes), else gdn_output_mma16g (qn, kn: gdn_l2norm_fwd's fp32 rows; q, wk unused).
template <typename OutT, bool NORM = false>
__device__ __forceinline__ void output_mma16g(float* smem, const float* qn, const float* kn, const float* gcum,
                                              const bf16* vnew16, const bf16* h16, const int* chunk_tok0,
                                              const int* chunk_len, OutT* o, int HQK, int HV, float scale,
                                              const bf16* q = nullptr, const unsigned char* wk = nullptr, int qs = 0,
                                              int l2norm = 0, float* qn_out = nullptr, float* q_rstd = nullptr) {
	float* QR = smem;                                    // [64][128] fp32: Q, split in place
	float* XR = QR + kC * kD;                            // H^T [128][128] bf16
	bf16* VT = reinterpret_cast<bf16*>(XR + kC * kD);    // [128][64] bf16: V'^T
	float* KR = reinterpret_cast<float*>(VT + kD * kC);  // [64][128] fp32: K, split in place (16g: then S)
	float* gam = KR + kC * kD;                           // [64]
	const bf16* Qb = reinterpret_cast<const bf16*>(QR);
#if !defined(GDNKCP_OUT_WG)
	const bf16* Xb = reinterpret_cast<const bf16*>(XR);  // the mma.sync path's H^T
#endif
	const bf16* Kb = reinterpret_cast<const bf16*>(KR);
	const int lin = blockIdx.y * gridDim.x + blockIdx.x, c = lin / HQK, qh = lin % HQK;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int rt = warp & 3, wc = warp >> 2;
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int G = HV / HQK;
	const long long qk = (long long)HQK * kD;

	const int h0 = qh * G;
	if (NORM) {
		const long long blk = (long long)c * HV + h0;
		out16_stage_norm(QR, XR, VT, KR, gam, q + (long long)t0 * qs + qh * kD,
		                 wk + ((long long)c * HQK + qh) * walkplanes::kKBytes, qs, l2norm, gcum, h16 + blk * kD * kD, vnew16 + blk * kD * kC, t0, n, h0, HV,
		                 qn_out != nullptr ? qn_out + ((long long)t0 * HQK + qh) * kD : nullptr, qk,
		                 q_rstd != nullptr ? q_rstd + (long long)t0 * HQK + qh : nullptr, HQK);
	}
#pragma unroll 1
	for (int h = h0; h < h0 + G; ++h) {
		const long long blk = (long long)c * HV + h;
		if (h == h0 && NORM) {
			// staged before the loop (q, k and their strides dead in it)
		} else if (h == h0) {
			out16_stage<true>(QR, XR, VT, KR, gam, qn + ((long long)t0 * HQK + qh) * kD, kn + ((long long)t0 * HQK + qh) * kD,
			                  qk, gcum, h16 + blk * kD * kD, vnew16 + blk * kD * kC, t0, n, h, HV);
		} else {
			__syncthreads();  // every warp done with the previous head's H^T, V'^T and gamma
			copy_h16(XR, h16 + blk * kD * kD);
			copy_bf16_tile<kD, kC / 8>(VT, vnew16 + blk * kD * kC);
			tc::cp_async_commit();
			if (tid < kC) gam[tid] = tid < n ? gcum[(long long)(t0 + tid) * HV + h] : 0.f;
			tc::cp_async_wait<0>();
		}
#if defined(GDNKCP_OUT_WG)
		wg::fence_proxy_async();  // H^T landed by cp.async, read by wgmma
#endif
		__syncthreads();  // Q (split), H^T and gamma staged (and, after head 0, V'^T)

		float acc[8][4];
#if defined(GDNKCP_OUT_WG)
		out16_qh_wg(acc, Qb, reinterpret_cast<const unsigned char*>(XR), gam, rt, wc, lane);
#else
		out16_qh(acc, Qb, Xb, gam, rt, wc, lane);
#endif

		float s[8][4];
		float* ss = KR + 1024 * warp + lane;  // this lane's stash: value (nt, e) at ss[32 (4 nt + e)]
		if (h == h0) {
			tc::cp_async_wait<0>();  // V'^T and K
			if (!NORM) convert_tile<kC, true>(KR);
			__syncthreads();  // K and V'^T staged
			if (NORM)
				raw_scores_kt(s, Qb, reinterpret_cast<const unsigned char*>(KR), rt, lane);
			else
				raw_scores<true, true>(s, Qb, Kb, rt, lane);
			__syncthreads();  // every warp done with K: its region takes the raw scores
#pragma unroll
			for (int nt = 0; nt < 8; ++nt)
#pragma unroll
				for (int e = 0; e < 4; ++e) ss[32 * (4 * nt + e)] = s[nt][e];
		} else {
#pragma unroll
			for (int nt = 0; nt < 8; ++nt)
#pragma unroll
				for (int e = 0; e < 4; ++e) s[nt][e] = ss[32 * (4 * nt + e)];
		}
		mask_decay(s, gam, rt, lane, n);
		out16_pv_store(acc, s, VT, rt, wc, lane, o + ((long long)t0 * HV + h) * kD, (long long)HV * kD, n, scale);
	}
}

extern "C" __global__ void __launch_bounds__(kThreads, 2)
gdn_output_mma16g(const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ gcum,
                  const __nv_bfloat16* __restrict__ vnew16, const __nv_bfloat16* __restrict__ h16,
                  const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
                  __nv_bfloat16* __restrict__ o, int HQK, int HV, float scale) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	output_mma16g(smem, qn, kn, gcum, vnew16, h16, chunk_tok0, chunk_len, o, HQK, HV, scale);
}

// ==== gdn_output_mma16gn, gdn_output_mma16gnk: gdn_output_mma16g on the raw bf16 q and the K^T walk planes
//   gdn_output_mma16gn    grid (NC, HQK)   kOutputMMA16Smem (two CTAs an SM)
//   gdn_output_mma16gnk   grid (NC, HQK)   kOutputMMA16Smem (two CTAs an SM)
// gdn_output_mma16g whose first head normalises the chunk's q rows itself (out16_stage_norm: q bf16 with
// q_stride elements a token, QK head qh at qh 128; l2norm 0: the rows as they are) and reads K as the
// prep's K^T walk planes (wk: 32 KB a chunk and QK head, walk_planes.cuh; raw_scores_kt) instead of
// copying gdn_l2norm_fwd's fp32 qn, kn: the same tiles and fragments, so the output is gdn_output_mma16g's
// bits. With gdn_prep_mma_gn / _gnk (which write the planes), gdn_l2norm_fwd does not run, and q is read as
// bf16 (half the bytes).
// gdn_output_mma16gn is the forward alone (nothing else written); gdn_output_mma16gnk, the forward kept for
// a backward, takes two more arguments, qn_out and q_rstd (each may be null): the normalised q rows < n of
// the chunk and QK head and their rstd, where gdn_l2norm_fwd writes qn ([T, HQK, 128] fp32) and q_rstd ([T,
// HQK]); gdn_prep_mma_gnk writes kn and k_rstd. Two entries, so that the forward alone's code carries no
// runtime test of them.
extern "C" __global__ void __launch_bounds__(kThreads, 2)
gdn_output_mma16gn(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ wk, int q_stride, int l2norm,
                   const float* __restrict__ gcum, const __nv_bfloat16* __restrict__ vnew16,
                   const __nv_bfloat16* __restrict__ h16, const int* __restrict__ chunk_tok0,
                   const int* __restrict__ chunk_len, __nv_bfloat16* __restrict__ o, int HQK, int HV, float scale) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	output_mma16g<__nv_bfloat16, true>(smem, nullptr, nullptr, gcum, vnew16, h16, chunk_tok0, chunk_len, o, HQK, HV,
	                                   scale, q, reinterpret_cast<const unsigned char*>(wk), q_stride, l2norm);
}

extern "C" __global__ void __launch_bounds__(kThreads, 2)
gdn_output_mma16gnk(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ wk, int q_stride,
                    int l2norm, const float* __restrict__ gcum, const __nv_bfloat16* __restrict__ vnew16,
                    const __nv_bfloat16* __restrict__ h16, const int* __restrict__ chunk_tok0,
                    const int* __restrict__ chunk_len, __nv_bfloat16* __restrict__ o, int HQK, int HV, float scale,
                    float* __restrict__ qn_out, float* __restrict__ q_rstd) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	output_mma16g<__nv_bfloat16, true>(smem, nullptr, nullptr, gcum, vnew16, h16, chunk_tok0, chunk_len, o, HQK, HV,
	                                   scale, q, reinterpret_cast<const unsigned char*>(wk), q_stride, l2norm, qn_out,
	                                   q_rstd);
}

}  // namespace outmma
}  // namespace gdnkcp
