// gdn_output_mma.cu (staged: proven on the CPU emulator, not yet built by nvcc nor run on a GPU): the
// forward output on mma.sync m16n8k16 (bf16 in, fp32 accumulate), v4 of the output. Same arguments,
// grid and output as gdn_output_fwd of gdn_fwd.cu (block 256):
//   gdn_output_mma   grid (NC, HV)   kOutputMMASmem = 98560 bytes (two CTAs an SM)
//   O = scale ((Q e^gamma) H + (Q K^T ⊙ e^(gamma_i - gamma_j), j <= i < n) V'), written bf16,
// rows past a short chunk's end neither read nor written.
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
// padding. The same thread copies a pair, waits for its own copies and converts it (reading all 8 floats
// before writing), so the conversion needs no barrier; one __syncthreads then publishes the stage.
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
// Registers (estimate): O 32 + S 32 + A hi/lo 8 + B hi/lo 8 + ~25: ~110, no spills expected under the
// 128 a thread that two CTAs of 256 threads allow (__launch_bounds__(256, 2)).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "../src/gdn_fwd.cu"
#include "../src/mma.cuh"

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

// pair: the float offset of the 8 fp32 of columns 8cb .. 8cb+7 of row r in a staged [rows][128] tile.
__device__ __forceinline__ int pair(int r, int cb) { return r * kD + 8 * (cb ^ ((r >> 1) & 3)); }
// unit: the bf16 offset of the 8 bf16 of those columns after the split, part 0 hi, 1 lo.
__device__ __forceinline__ int unit(int r, int cb, int part) {
	return 2 * pair(r, cb) + 8 * ((r & 1) ^ part);
}

// copy_tile issues the cp.async copies of the rows < n of a [ROWS][128] fp32 tile (row stride `stride`
// elements in global memory) into the stage dst, and zero-fills the rows >= n; each thread owns the
// pairs tid + 256 k.
template <int ROWS>
__device__ __forceinline__ void copy_tile(float* dst, const float* src, long long stride, int n) {
#pragma unroll
	for (int k = 0; k < ROWS * 16 / kThreads; ++k) {
		const int p = threadIdx.x + kThreads * k, r = p >> 4, cb = p & 15;
		float* d = dst + pair(r, cb);
		if (r < n) {
			const float* s = src + r * stride + 8 * cb;
			tc::cp_async16(d, s);
			tc::cp_async16(d + 4, s + 4);
		} else {
			unsigned* z = reinterpret_cast<unsigned*>(d);
#pragma unroll
			for (int i = 0; i < 8; ++i) z[i] = 0u;
		}
	}
}

// convert_tile splits the thread's own pairs of a staged tile in place (after its cp.async wait): hi
// unit and, when SPLIT, lo unit. Words are read and written as unsigned only (no type punning between
// the loads and the stores for the compiler to reorder).
template <int ROWS, bool SPLIT>
__device__ __forceinline__ void convert_tile(float* tile) {
	unsigned* w = reinterpret_cast<unsigned*>(tile);
#pragma unroll
	for (int k = 0; k < ROWS * 16 / kThreads; ++k) {
		const int p = threadIdx.x + kThreads * k, r = p >> 4, cb = p & 15;
		const unsigned* f = w + pair(r, cb);
		float x[8];
#pragma unroll
		for (int i = 0; i < 8; ++i) x[i] = __uint_as_float(f[i]);
		unsigned hi[4], lo[4];
#pragma unroll
		for (int i = 0; i < 4; ++i) {
			if (SPLIT)
				tc::split_bf16x2(x[2 * i], x[2 * i + 1], hi[i], lo[i]);
			else
				hi[i] = tc::pack_bf16x2(x[2 * i], x[2 * i + 1]);
		}
		unsigned* uh = w + unit(r, cb, 0) / 2;
#pragma unroll
		for (int i = 0; i < 4; ++i) uh[i] = hi[i];
		if (SPLIT) {
			unsigned* ul = w + unit(r, cb, 1) / 2;
#pragma unroll
			for (int i = 0; i < 4; ++i) ul[i] = lo[i];
		}
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
#pragma unroll
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
	const float g0 = gam[i0], g1 = gam[i1];
	{
		const float e0 = expf(g0), e1 = expf(g1);
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
			acc[nt][0] *= e0;
			acc[nt][1] *= e0;
			acc[nt][2] *= e1;
			acc[nt][3] *= e1;
		}
	}
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
			bn_frag<SK>(bh, bl, Xb, jp, kk, lane);
			mma_terms<SQ, SK>(s[2 * jp], ah, al, bh, bl);
			mma_terms<SQ, SK>(s[2 * jp + 1], ah, al, bh + 2, bl + 2);
		}
	}
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

}  // namespace outmma
}  // namespace gdnkcp
