// gdn_chunk_grads_mma5.cu (checked on the CPU emulator and on the H200; docs/perf-notes.md has its times): the
// backward's chunk gradients and the qk reduce + l2norm backward in one kernel, one CTA per (chunk, QK head)
// (docs/gpu-backward.md steps 5+6). Built on gdn_chunk_grads_mma (included: its helpers, sizes and phases;
// that kernel is unchanged):
//   gdn_chunk_grads_mma5   grid (NC, HQK), block 256, kGradMMA5Smem = 227136 bytes
//   gdn_chunk_grads_mma6   the same, with vnew and dvnew as token-slot blocks (tp_pos below: the plane state
//                          walk's vnewp, the mma tape walk's dvnewp) copied by cp.async and split in place,
//                          not fp32 rows loaded and split in registers (S1, S3); the same bits
//                          (TestMMA5ChunkGradsOnCPU)
//   gdn_chunk_grads_mma7   mma6 with every product on the bf16 hi halves of its operands alone (one mma.sync
//                          where mma6 runs two or three; no lo planes, no lo fragments; B fragments of two
//                          n tiles an ldmatrix.x4): gradients good to bf16, not fp32 (precision below)
//   gdn_chunk_grads_mma8   mma7 on the state walk's bf16 h16, vnew16 and the tape walk's dvnew16 and d16
//                          (rn(H), rn(V'), rn(dV'), rn(D): mma7's hi halves) in place of fp32 H, D and the
//                          V', dV' slots: V' and dV' copied in S1 (hi and lo units; dV' waited for in
//                          S3), D^T copied whole after 1b and H^T after 1c, each landing behind the
//                          products before its first reader; nothing split (one barrier fewer a head);
//                          mma7's bits but dg's <D, H>
// ABI: gdn_chunk_grads_mma5(qn, kn, v bf16, int v_stride, gcum, beta, h, vnew, d_chunk, dvnew, dout bf16,
//   chunk_tok0, chunk_len, q_rstd, k_rstd, dq, dk, int dq_stride, dv, int dv_stride, dg, dbeta, int HQK, int HV,
//   float scale, int l2norm, dq16 bf16, dk16 bf16, dv16 bf16); q_rstd, k_rstd fp32 [Tr, HQK] (read only when
//   l2norm != 0). dq16 (with dk16) and dv16 are optional: where given, dq and dk (or dv) go there as bf16,
//   rounded to nearest even (the bits gdn_f32_to_bf16 would make of the fp32 values), at the same strides,
//   and their fp32 pointers are not written (may be null); a bf16 pair is one 4-byte store where the stride
//   is even, two 2-byte ones otherwise. The core backward's outputs are bf16, so it needs no cast kernel.
// Per (chunk c, QK head qh) the CTA runs the value heads h = qh G .. qh G + G - 1 (G = HV / HQK) in ascending
// order: dv at dv + t*dv_stride + h*128, dg (reverse in-chunk cumsum of dgamma), dbeta [Tr, HV] per value
// head exactly as gdn_chunk_grads_mma; dq, dk (w.r.t. the normalised q, k) summed over the value heads in
// registers, then dx = (dy - y (y . dy)) rstd (gdn_qk_bwd's formula, y the qn / kn row, rstd = q_rstd /
// k_rstd; dx = dy when l2norm == 0), fp32 at dq[t*dq_stride + qh*128 + d] and dk[t*dq_stride + qh*128 + d]
// (scalar stores: any dq_stride). No dqv / dkv buffers, no gdn_qk_bwd launch. Rows past a short chunk's
// end are neither read nor written. No atomics; every sum has one fixed order.
//
// ---- The data flow (phases and barriers as gdn_chunk_grads_mma's header unless said) -------------------
//   S0  cp.async K, Q once (rows < n, zeros past n).                                            barrier 0
//       K K^T and S = Q K^T once (3 products each) into one [64][68] tile SKK: S_ij at [i][j] for j <= i,
//       (K K^T)_ij at [j][i] for j < i (K K^T is symmetric and only its strict lower triangle is used).
//   per value head, ascending (DQ, DK accumulator registers never reset):
//   S1  cp.async V', dO; beta, gamma.                                    barrier 1 (also publishes SKK)
//   1a  dP = dO V'^T only (2 products); L, G1, E from dP and SKK.                                barrier 2
//   1b  DQ += G1 K, DK += G1^T Q; diagonal blocks of A; E's sums.                               barrier 3
//   1c  A's blocks below the diagonal.                                                          barrier 4
//   S2  D over BIG as bf16 hi / lo planes with <D, H> from the same loads (split_h; mma8: D^T copied
//       from barrier 3 on, H^T from here on, <D, H> from the copies in S3); barrier 5;
//       dKt = V' D^T (B fragments by ldmatrix): DK += tail dKt, row dots.                       barrier 6
//   S3  H over BIG as bf16 hi / lo planes (split_h: split once, B fragments by ldmatrix), dV' over V';
//       barrier 7; dQg, dW: DQ += e^gamma scale dQg (not stored), row dots.
//                                                                                               barrier 8
//       dW over H (BIG rows 0-63; Q stays: it is the l2norm's y), v (bf16) over dO.              barrier 9
//   S4  XU = A^T dV' (dv stored, row dots), then XW = A^T dW (DK += bg XW, row dots) as two passes over A
//       (32 accumulators fewer live beside DQ, DK); T1 = dV' v^T, T2 = dW K^T -> dA (BIG after dW).
//                                                                                              barrier 10
//   S5  M = A^T dA over dW.                                                                    barrier 11
//       dL = -M A^T; dKK over dV', E2 over v, F kk over dA (kk read transposed from SKK).         barrier 12
//   S6  DK += dKK K + dKK^T K (not stored); the sums; barrier 13; dgamma, dbeta; barrier 14 (the end of a
//       head: every stage is free for the next head's S1); dg by thread 0 (touches only gt, red, dg).
//   E   with l2norm: y . dy for q and k rows (a lane's 16 columns by fmaf, nt ascending, then the 4 lanes
//       of a row by the xor 1, 2 butterfly, then column half 0 + half 1 through shared memory); barrier 15;
//       dx = fmaf(-y, y . dy, dy) * rstd. dq, dk rows < n stored.
// 14 G + 1 barriers a CTA (+ 1 with l2norm). Shared memory: gdn_chunk_grads_mma's 227136 bytes re-laid so
// that nothing grows: Q stays all along (dW moves from Q's slot to BIG rows 0-63, dA after it, M over dW; dKK
// goes over dV', E2 and v over dO), and S shares K K^T's tile. (227136 <= 232448: one CTA an SM.) The fp32
// tiles use gdn_chunk_grads_mma's rowo layout (K, Q, V' / dV' / dKK, D / H / dW, L, G1, dA, M, A, SKK; E,
// F kk and E2 plain rows), whose header gives the bank-conflict analysis.
//
// ---- Precision --------------------------------------------------------------------------------------------
// The products are gdn_chunk_grads_mma's (fp32 x fp32 as ah bh + ah bl + al bh; dO, v exact bf16); the sum over
// value heads is the accumulators running on (one fp32 rounding per mma / fmaf, fixed order), and the l2norm
// backward is gdn_qk_bwd's fp32 formula. Measured on the emulator (TestMMA5ChunkGradsOnCPU, normwise against
// gdnref.ChunkGrads in float64 per value head, summed over the QK head's value heads and pushed through
// gdnref.L2NormBackward with float64 rows and inverse norms; worst of the three cases; worst element over the
// rms; the fp32 gdn_chunk_grads + gdn_qk_bwd pair on the same buffers in brackets):
//   dq 4.26e-6 (max/rms 4.4e-5) [2.2e-7]   dk 4.98e-6 (6.0e-5) [2.5e-7]   dv 2.52e-6 (2.7e-5) [1.4e-7]
//   dg 2.35e-6 (1.4e-5) [2.0e-7]           dbeta 2.66e-6 (8.8e-6) [1.7e-7]
// (bounds: 3e-5 normwise, 3e-4 of the rms an element, as gdn_chunk_grads_mma's test).
// gdn_chunk_grads_mma7 (grads5<true, false>: every product on the bf16 hi halves alone) on the same cases
// (TestMMA5ChunkGradsOnCPU, worst of the three; bounds 4e-3 normwise, 0.1 of the rms an element):
//   dq 2.50e-3 (max/rms 2.4e-2)   dk 2.78e-3 (2.8e-2)   dv 1.69e-3 (1.8e-2)   dg 2.40e-3 (1.0e-2)
//   dbeta 1.75e-3 (5.1e-3)
// which is what bf16 operands give (2^-9 of each, rounded once) and leaves the gradients' end-to-end budget
// (1e-2 for dq, dk, dv; 5e-3 for dg, dbeta) to the rest of the backward. Its bf16 dq, dk, dv add their own
// rounding (~1.1e-3) on top, as mma5's do.
// gdn_chunk_grads_mma8 gives mma7's dq, dk, dv, dbeta bit for bit (the same cases, both launches); its dg
// (<D, H> with H as bf16) is within 1.1e-3 of mma7's and at worst 2.40e-3 of float64 (max/rms 1.9e-2).
//
// ---- Registers ----------------------------------------------------------------------------------------------
// DQ and DK (64 registers) live across the whole head loop (in gdn_chunk_grads_mma DQ dies at S3), so S3 (qg, wa,
// DQ, DK: 128 accumulators) and S4 are the peaks. Measured (nvcc 11.8, -O3 -std=c++17): sm_90 cubin 254
// registers, compute_80 PTX through ptxas -arch=sm_80 254 registers; both 0 bytes stack frame, 0 spill stores
// / loads (with XU and XW in one pass: 255 / 254, also no spills). 254 x 256 = 65024 <= 65536: one CTA an SM.
// With gdn_chunk_grads_mma's rowo layout: sm_90 cubin 246 registers (244 before it, same nvcc), compute_80 PTX
// through ptxas -arch=sm_80 245 (254), both 0 bytes stack frame, no spill.
// ptxas simply fills what __launch_bounds__(256, 1) allows: a probe copy without the bounds, under
// -maxrregcount, builds spill-free at 232, 216 and 200 registers and first spills at 184 (36 bytes), so a
// newer ptxas (sm_90a, Blackwell) has ~50 registers of room before it must spill.
//
// ---- Cost at 32K tokens (512 chunks x 16 QK heads = 8192 CTAs, G = 3), predicted for an H200 ---------------
// Per value head the work of a gdn_chunk_grads_mma CTA less 1a's K K^T and S (1152 of its ~10000 mma.sync and
// the K, Q fragment loads and splits, ~10% of its issue) and less the K, Q staging (64 KB) after the first
// head: ~25 + 2 x 22.5 ~ 70 us a CTA (gdn_chunk_grads_mma: ~23-27 us a CTA). 8192 CTAs over 132 SMs: 63
// rounds (62 full and one of 8 CTAs) ~ 4.4 ms (3.4-5.6 ms), against gdn_chunk_grads_mma ~4.5 ms (187
// rounds) + gdn_qk_bwd 0.6 ms = 5.1 ms: ~0.7 ms (~14%) saved; the dqv / dkv buffers (1.6 GB, written and
// read once) go. HBM bytes a CTA: q, k 64 KB once; per head V', dV' 64, dO, v 32, D, H 128, dv 32 KB; dq, dk
// 64 KB: ~0.9 MB, 7.3 GB at 32K (1.8 ms floor; gdn_chunk_grads_mma's ~7.1 GB + gdn_qk_bwd's ~2.1 GB). Bound,
// as gdn_chunk_grads_mma, by instruction issue (the in-register splits) and shared memory, not HBM.
#pragma once

#include "gdn_chunk_grads_mma.cu"

namespace gdnkcp {
namespace gradmma {

// KF | QF (q, all along) | VF (V'; dV'; dKK) | DOB (dO; v; E2) | BIG (G1, E, L; D; H; dW, dA; M, F kk) | AF |
// SKK (S on and below the diagonal, K K^T above it, transposed) | scalars: gdn_chunk_grads_mma's sizes.
constexpr int kGradMMA5Smem = 4 * (3 * kTP + kTW + kBig + 2 * kTQ + kScal);
static_assert(kGradMMA5Smem == 227136, "kGradMMA5Smem: keep the header and the README in step");
static_assert(kGradMMA5Smem <= 232448, "above the opt-in limit");
static_assert(kTP + kTQ <= kBig, "dW and dA (F kk over dA) fit in BIG");
static_assert(3 * kTQ + 3 * 8 * 32 <= kBig, "1c's partials fit in BIG past LS");

// W2: two 32-bit words, one 8-byte store.
struct alignas(8) W2 {
	unsigned a, b;
};

// split_h: thread tid's share of a [128][128] fp32 state (global, row stride 128: H, or D) split into bf16
// hi / lo planes at x (hi: 32 KB, lo: the next 32 KB), row n = key, 16 units of 16 bytes a row, unit u of
// row n at u ^ (n % 8). Thread tid takes the float4s tid + 256 j, j = 0..15 (row 8 j + tid / 32, columns
// 4 (tid % 32) ..: d_dot_h's units; a warp covers one row, two stores of 256 bytes a plane). With DOT (the
// state is D, h the fp32 H), it also returns the warp's <D, H> partial in d_dot_h's order and butterfly.
// Four batches of four loads: DQ and DK (64 registers) live across this (sixteen at once spilled under
// nvcc 11.8). LO false: the hi plane only (nothing reads the lo plane then).
template <bool DOT, bool LO = true>
__device__ __forceinline__ float split_h(unsigned char* x, const float* __restrict__ src, const float* __restrict__ h,
                                         int tid) {
	float dh = 0.f;
#pragma unroll 1
	for (int j0 = 0; j0 < 16; j0 += 4) {
		float4 f[4], h4[4];
#pragma unroll
		for (int j = 0; j < 4; ++j) {
			f[j] = reinterpret_cast<const float4*>(src)[tid + kThreads * (j0 + j)];
			if (DOT) h4[j] = reinterpret_cast<const float4*>(h)[tid + kThreads * (j0 + j)];
		}
#pragma unroll
		for (int j = 0; j < 4; ++j) {
			const int e = tid + kThreads * (j0 + j), row = e >> 5, c4 = e & 31;
			if (DOT) {
				dh = fmaf(f[j].x, h4[j].x, dh);
				dh = fmaf(f[j].y, h4[j].y, dh);
				dh = fmaf(f[j].z, h4[j].z, dh);
				dh = fmaf(f[j].w, h4[j].w, dh);
			}
			unsigned h0, h1, l0, l1;
			tc::split_bf16x2(f[j].x, f[j].y, h0, l0);
			tc::split_bf16x2(f[j].z, f[j].w, h1, l1);
			const int off = row * 256 + (((c4 >> 1) ^ (row & 7)) << 4) + 8 * (c4 & 1);
			*reinterpret_cast<W2*>(x + off) = W2{h0, h1};
			if (LO) *reinterpret_cast<W2*>(x + 32768 + off) = W2{l0, l1};
		}
	}
	if (DOT) {
#pragma unroll
		for (int off = 16; off > 0; off >>= 1) dh += __shfl_xor_sync(0xffffffffu, dh, off);
	}
	return dh;
}

// split_rows: thread tid's share of the rows < n of a [64][128] fp32 tile (global, row stride `stride`; zeros
// for the rows >= n) split into bf16 hi / lo planes at x (hi: 16 KB, lo: the next 16 KB), split_h's layout
// (row r at 256 r, 16-byte unit u at u ^ (r % 8)). Four batches of two loads a thread. Not inlined: inlined
// into the head loop (DQ, DK live), ptxas 11.8 spilled 12 bytes of the kernel on sm_80 whatever the batch.
__device__ __noinline__ void split_rows(unsigned char* x, const float* __restrict__ src, long long stride, int n,
                                           int tid) {
#pragma unroll 1
	for (int j0 = 0; j0 < 8; j0 += 2) {
		float4 f[2];
#pragma unroll
		for (int j = 0; j < 2; ++j) {
			const int e = tid + kThreads * (j0 + j), row = e >> 5, c4 = e & 31;
			f[j] = row < n ? *reinterpret_cast<const float4*>(src + row * stride + 4 * c4) : make_float4(0.f, 0.f, 0.f, 0.f);
		}
#pragma unroll
		for (int j = 0; j < 2; ++j) {
			const int e = tid + kThreads * (j0 + j), row = e >> 5, c4 = e & 31;
			unsigned h0, h1, l0, l1;
			tc::split_bf16x2(f[j].x, f[j].y, h0, l0);
			tc::split_bf16x2(f[j].z, f[j].w, h1, l1);
			const int off = row * 256 + (((c4 >> 1) ^ (row & 7)) << 4) + 8 * (c4 & 1);
			*reinterpret_cast<W2*>(x + off) = W2{h0, h1};
			*reinterpret_cast<W2*>(x + 16384 + off) = W2{l0, l1};
		}
	}
}

// plane_a: the A fragments, hi and lo, of rows m0 .. m0 + 15 and k step k8 of split_rows' planes at x (element
// (m, k) = row m, column k): frag_a<true, kP, false>'s values, by two ldmatrix.x4 (LO false: hi only, one
// ldmatrix.x4, al zero).
template <bool LO = true>
__device__ __forceinline__ void plane_a(const unsigned char* x, int m0, int k8, int lane, unsigned ah[4], unsigned al[4]) {
	const int mi = lane >> 3, r = m0 + (lane & 7) + 8 * (mi & 1), unit = 2 * k8 + (mi >> 1);
	const unsigned char* p = x + r * 256 + ((unit ^ (r & 7)) << 4);
	tc::ldmatrix_x4(ah, p);
	if (LO)
		tc::ldmatrix_x4(al, p + 16384);
	else
		al[0] = al[1] = al[2] = al[3] = 0u;
}

// plane_bt: the B fragments, hi (b[0], b[1]) and lo (b[2], b[3]), whose element (k, n) is row k, column n of
// split_rows' planes at x, for k step k8 and columns n0 .. n0 + 7: frag_b<kP, true>'s values, by one
// ldmatrix.x4.trans. HI2: the hi B fragments of columns n0 .. n0 + 7 (b[0], b[1]) and n0 + 8 .. n0 + 15
// (b[2], b[3]) instead (mma_b4).
template <bool HI2 = false>
__device__ __forceinline__ void plane_bt(const unsigned char* x, int n0, int k8, int lane, unsigned b[4]) {
	const int mi = lane >> 3, r = 16 * k8 + 8 * (mi & 1) + (lane & 7);
	const int unit = (n0 >> 3) + (HI2 ? (mi >> 1) : 0), plane = HI2 ? 0 : (mi >> 1);
	tc::ldmatrix_x4_trans(b, x + plane * 16384 + r * 256 + ((unit ^ (r & 7)) << 4));
}

// h_frag_row: lane's row address for the ldmatrix.x4 of split_h's planes that gives the B fragments, hi and
// lo, of n tile n0 (keys n0 .. n0 + 7) and k step k8 (columns 16 k8 ..): matrix lane / 8 (0, 1: hi at
// columns + 0 / + 8; 2, 3: lo), its row lane % 8.
// (PLANE: the bytes of a plane, 32768 for split_h's, 16384 for split_rows'.) HI2: matrices 2, 3 are the hi
// of n tile n0 + 8 instead of the lo of n0 (mma_b4).
template <int PLANE = 32768, bool HI2 = false>
__device__ __forceinline__ const unsigned char* h_frag_row(const unsigned char* x, int n0, int k8, int lane) {
	const int mi = lane >> 3, n = n0 + (HI2 ? 8 * (mi >> 1) : 0) + (lane & 7), unit = 2 * k8 + (mi & 1);
	return x + (HI2 ? 0 : (mi >> 1) * PLANE) + n * 256 + ((unit ^ (n & 7)) << 4);
}

// mma_b4: the products of one x4 B load b4 into acc (N tiles). LO: b4 is tile nt's hi (b4[0], b4[1]) and lo
// (b4[2], b4[3]), and acc[nt] += mma_t<SA, true> (ah bh + ah bl (+ al bh)). LO false: b4 is the hi of tiles
// nt and nt + 1 (a HI2 load; nt even), and acc[nt] += ah b4[0, 1], acc[nt + 1] += ah b4[2, 3]: bf16 products
// of the hi halves alone (gdn_chunk_grads_mma7).
template <bool LO, bool SA, int N>
__device__ __forceinline__ void mma_b4(float (*acc)[4], int nt, const unsigned ah[4], const unsigned al[4], const unsigned b4[4]) {
	const unsigned b0[2] = {b4[0], b4[1]}, b1[2] = {b4[2], b4[3]};
	if (LO) {
		mma_t<SA, true>(acc[nt], ah, al, b0, b1);
	} else {
		tc::mma_bf16_16816(acc[nt], ah, b0, acc[nt]);
		tc::mma_bf16_16816(acc[(nt + 1) % N], ah, b1, acc[(nt + 1) % N]);
	}
}

// out_pair stores elements e and e + 1 (e even within its row) of an output: as bf16 at o16 + e where o16
// is given (one 4-byte store when e is even in memory, i.e. the row stride is even; else two 2-byte ones),
// else as fp32 at o + e.
__device__ __forceinline__ void out_pair(float* o, __nv_bfloat16* o16, long long e, float x0, float x1) {
	if (o16 != nullptr) {
		if ((e & 1) == 0) {
			*reinterpret_cast<unsigned*>(o16 + e) = tc::pack_bf16x2(x0, x1);
		} else {
			o16[e] = __float2bfloat16_rn(x0);
			o16[e + 1] = __float2bfloat16_rn(x1);
		}
		return;
	}
	o[e] = x0;
	o[e + 1] = x1;
}

// ---- Token slots: V' and dV' as the walks write them for gdn_chunk_grads_mma6 ------------------------------
// In global memory one (chunk, value head) block of 32 KB (block c HV + h): V'^T (or dV'^T) fp32 [128 features]
// [64 tokens], row f of 256 bytes, the 32-byte slot of tokens 8 u .. 8 u + 7 at slot u ^ ((f % 8) / 2);
// tokens from the chunk's length on are +0 (WGWalker / Walker::store_vprime_slots). The CTA copies a block
// into shared memory as it is (copy_block32k) and each thread turns the slots it copied into bf16 hi / lo in
// place (slots_to_planes: no barrier, a thread reads only its own copies): a slot's 8 fp32 become the hi
// unit (8 bf16) and the lo unit, which, at 16-byte position p = (2 u + hi/lo) ^ (f % 8) of the row, are the
// slot's two halves (hi first where f is even). The 8 rows f .. f + 7 (f % 8 = 0) of one unit then sit at 8
// distinct 16-byte positions: the ldmatrix loads below are conflict-free. The values are split_rows'
// (tc::split_bf16x2 of the same fp32), so the fragments are plane_a's, h_frag_row<16384>'s and plane_bt's
// bit for bit.
__device__ __forceinline__ int tp_pos(int f, int u, int hl) { return f * 256 + (((2 * u + hl) ^ (f & 7)) << 4); }

// tp_a: the A fragments, hi and lo, of (m = token m0 .. m0 + 15, k = feature 16 k8 ..): plane_a's values,
// by two ldmatrix.x4.trans (matrix mi: features 16 k8 + 8 (mi / 2) .., tokens m0 + 8 (mi % 2) ..); LO false:
// hi only, al zero, from the units HL (0: the hi units; 1: the lo units, where gdn_chunk_grads_mma8 keeps a
// second bf16 tile).
template <bool LO = true, int HL = 0>
__device__ __forceinline__ void tp_a(const unsigned char* x, int m0, int k8, int lane, unsigned ah[4], unsigned al[4]) {
	static_assert(HL == 0 || !LO, "a second tile in the lo units: hi products only");
	const int mi = lane >> 3, f = 16 * k8 + 8 * (mi >> 1) + (lane & 7), u = (m0 >> 3) + (mi & 1);
	tc::ldmatrix_x4_trans(ah, x + tp_pos(f, u, HL));
	if (LO)
		tc::ldmatrix_x4_trans(al, x + tp_pos(f, u, 1));
	else
		al[0] = al[1] = al[2] = al[3] = 0u;
}

// tp_b: the B fragments, hi (b[0], b[1]) and lo (b[2], b[3]), of (k = feature 16 k8 .., n = token n0 ..
// n0 + 7): h_frag_row<16384>'s values, by one ldmatrix.x4.trans. HI2: the hi of tokens n0 .. n0 + 7 (b[0],
// b[1]) and n0 + 8 .. n0 + 15 (b[2], b[3]).
template <bool HI2 = false>
__device__ __forceinline__ void tp_b(const unsigned char* x, int n0, int k8, int lane, unsigned b[4]) {
	const int mi = lane >> 3, f = 16 * k8 + 8 * (mi & 1) + (lane & 7);
	tc::ldmatrix_x4_trans(b, x + (HI2 ? tp_pos(f, (n0 >> 3) + (mi >> 1), 0) : tp_pos(f, n0 >> 3, mi >> 1)));
}

// tp_bt: the B fragments, hi (b[0], b[1]) and lo (b[2], b[3]), of (k = token 16 k8 .., n = feature n0 ..
// n0 + 7): plane_bt's values, by one ldmatrix.x4. HI2: the hi of features n0 .. n0 + 7 (b[0], b[1]) and
// n0 + 8 .. n0 + 15 (b[2], b[3]), from the units HL (as tp_a).
template <bool HI2 = false, int HL = 0>
__device__ __forceinline__ void tp_bt(const unsigned char* x, int n0, int k8, int lane, unsigned b[4]) {
	static_assert(HL == 0 || HI2, "a second tile in the lo units: hi products only");
	const int mi = lane >> 3;
	tc::ldmatrix_x4(b, x + (HI2 ? tp_pos(n0 + 8 * (mi >> 1) + (lane & 7), 2 * k8 + (mi & 1), HL)
	                            : tp_pos(n0 + (lane & 7), 2 * k8 + (mi & 1), mi >> 1)));
}

// copy_block32k: cp.async of one 32 KB token-slot block into shared memory, thread tid taking the slots tid +
// 256 x (x = 0..3), two 16-byte copies each (not committed).
__device__ __forceinline__ void copy_block32k(unsigned char* dst, const float* src, int tid) {
#pragma unroll
	for (int x = 0; x < 4; ++x) {
		const int e = tid + kThreads * x;
		tc::cp_async16(dst + 32 * e, src + 8 * e);
		tc::cp_async16(dst + 32 * e + 16, src + 8 * e + 4);
	}
}

// slots_to_planes: thread tid's four slots of a copied block (after its own cp.async wait) split in place
// into their hi and lo units (tp_pos' layout); LO false: the hi units only.
template <bool LO = true>
__device__ __forceinline__ void slots_to_planes(unsigned char* x, int tid) {
#pragma unroll 1
	for (int j = 0; j < 4; ++j) {
		const int e = tid + kThreads * j, f = e >> 3;
		unsigned char* p = x + 32 * e;
		const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 16);
		uint4 hi, lo;
		tc::split_bf16x2(a.x, a.y, hi.x, lo.x);
		tc::split_bf16x2(a.z, a.w, hi.y, lo.y);
		tc::split_bf16x2(b.x, b.y, hi.z, lo.z);
		tc::split_bf16x2(b.z, b.w, hi.w, lo.w);
		*reinterpret_cast<uint4*>(p + 16 * (f & 1)) = hi;
		if (LO) *reinterpret_cast<uint4*>(p + 16 * (1 - (f & 1))) = lo;
	}
}

// ---- The forward's bf16 H^T and V'^T (gdn_chunk_grads_mma8) ---------------------------------------------
// mma7 uses only the bf16 hi halves of H and V', rn(H) and rn(V'): exactly the forward state walk's h16
// ([128 (column)][128 (key)] a (chunk, value head), rn) and vnew16 ([128 (feature)][64 (token)], rn, tokens
// from the chunk's length on 0), which the output kernel reads. mma8 reads those instead of fp32 H and V'
// token slots, so a forward that keeps states for a core-stage backward writes neither fp32 H nor V' slots.
//
// ht_pos: the byte of 16-byte unit a (keys 8 a .. 8 a + 7) of H^T's row v (a column of H) in shared memory:
// 256 bytes a row, unit a at a ^ ((v ^ (v >> 2)) % 8). The 8 rows v0 .. v0 + 7 (v0 % 8 = 0) of one ldmatrix
// matrix take 8 distinct positions (ht_b2); D^T (mma8's d16) takes the same layout.
__device__ __forceinline__ int ht_pos(int v, int a) { return v * 256 + ((a ^ ((v ^ (v >> 2)) & 7)) << 4); }

// ht_b2: the hi B fragments of (k = column 16 k8 .., n = key n0 .. n0 + 7) (b[0], b[1]) and of keys n0 + 8 ..
// n0 + 15 (b[2], b[3]) from H^T's units at x, by one ldmatrix.x4.trans: h_frag_row<32768, true>'s values
// (element (k, n) = H[n][k] = H^T[k][n]).
__device__ __forceinline__ void ht_b2(const unsigned char* x, int n0, int k8, int lane, unsigned b[4]) {
	const int mi = lane >> 3, v = 16 * k8 + 8 * (mi & 1) + (lane & 7);
	tc::ldmatrix_x4_trans(b, x + ht_pos(v, (n0 >> 3) + (mi >> 1)));
}

// copy_v16: cp.async of one (chunk, value head) block of vnew16 or dvnew16 (V'^T or dV'^T bf16, 128 bytes
// a feature row) into the units HL of tp_pos' layout: V' into the hi units, which then hold the bits of
// mma7's slots_to_planes<false>, dV' into the lo units (mma7 leaves them dead), read back by tp_a /
// tp_bt with HL 1. Thread tid takes the units tid + 256 x (x = 0..3) (not committed).
template <int HL>
__device__ __forceinline__ void copy_v16(unsigned char* dst, const __nv_bfloat16* src, int tid) {
#pragma unroll
	for (int x = 0; x < 4; ++x) {
		const int e = tid + kThreads * x;
		tc::cp_async16(dst + tp_pos(e >> 3, e & 7, HL), src + 8 * e);
	}
}

// u4_word: word i (0..3) of v; with i a compile-time constant, a register.
__device__ __forceinline__ unsigned u4_word(const uint4& v, int i) {
	return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// copy_dht: cp.async of one (chunk, value head) block of d16 (D^T bf16, as the tape walk writes it) or of
// h16 (H^T) to x in ht_pos' layout (not committed): thread tid takes the 16-byte units e = tid + 256 j (j =
// 0..7), row v = e / 16, unit a = e % 16 (16 threads a 256-byte row: coalesced). mma8 copies D^T to BIG and
// H^T to BIG + 32768, each thread the same units of both (dot_dht reads its own copies).
__device__ __forceinline__ void copy_dht(unsigned char* x, const __nv_bfloat16* __restrict__ src, int tid) {
#pragma unroll
	for (int j = 0; j < 8; ++j) {
		const int e = tid + kThreads * j, v = e >> 4, a = e & 15;
		tc::cp_async16(x + ht_pos(v, a), src + v * kD + 8 * a);
	}
}

// dot_dht: the warp's <D, H> partial over the units thread tid copied (copy_dht, landed: a thread reads only
// its own copies, so no barrier): D^T and H^T share one layout, so the same position holds D[key][col] and
// H[key][col]. The sum: j ascending, then the unit's 8 elements ascending, by fmaf, then the xor butterfly
// (d_dot_h's), a fixed order.
__device__ __forceinline__ float dot_dht(const unsigned char* x, int tid) {
	float dh = 0.f;
#pragma unroll
	for (int j = 0; j < 8; ++j) {
		const int e = tid + kThreads * j, pos = ht_pos(e >> 4, e & 15);
		const uint4 du = *reinterpret_cast<const uint4*>(x + pos), hu = *reinterpret_cast<const uint4*>(x + 32768 + pos);
#pragma unroll
		for (int i = 0; i < 4; ++i) {
			const unsigned dw = u4_word(du, i), hw = u4_word(hu, i);
			dh = fmaf(__uint_as_float(dw << 16), __uint_as_float(hw << 16), dh);
			dh = fmaf(__uint_as_float(dw & 0xffff0000u), __uint_as_float(hw & 0xffff0000u), dh);
		}
	}
#pragma unroll
	for (int off = 16; off > 0; off >>= 1) dh += __shfl_xor_sync(0xffffffffu, dh, off);
	return dh;
}

// copy_head16: mma8's copies of value head h's dO rows (DOB, zeros from row n on: direct stores), V'^T (the hi
// units of VP) and dV'^T (its lo units), a commit group each (the caller waits for dO and V' before barrier
// 1, for dV' in S3). Head 0's go out with K's and Q's in S0, the others' at their S1.
__device__ __forceinline__ void copy_head16(unsigned* DOB, unsigned char* VP, const __nv_bfloat16* __restrict__ dout,
                                            const __nv_bfloat16* __restrict__ vnew16,
                                            const __nv_bfloat16* __restrict__ dvnew16, int c, int h, int t0, int n,
                                            int HV, int tid) {
	copy_dout(DOB, dout, t0, n, h, HV, tid);
	tc::cp_async_commit();
	copy_v16<0>(VP, vnew16 + ((long long)c * HV + h) * kD * kC, tid);
	tc::cp_async_commit();
	copy_v16<1>(VP, dvnew16 + ((long long)c * HV + h) * kD * kC, tid);
	tc::cp_async_commit();
}

// load_v4 / store_v4: a thread's four 16-byte units of v's rows (8 bf16 each; unit u of row r = e / 16, e =
// tid + 256 x; zeros from row n on) into registers, and from there into VB's rows (words 4 u .. 4 u + 3):
// v's rows where v and v_stride keep them 16-byte aligned.
__device__ __forceinline__ void load_v4(uint4 (&q)[4], const __nv_bfloat16* __restrict__ v, long long v_stride, int t0,
                                        int h, int n, int tid) {
#pragma unroll
	for (int x = 0; x < 4; ++x) {
		const int e = tid + kThreads * x, r = e >> 4, u = e & 15;
		q[x] = r < n ? *reinterpret_cast<const uint4*>(v + (long long)(t0 + r) * v_stride + h * kD + 8 * u) : uint4{0u, 0u, 0u, 0u};
	}
}
__device__ __forceinline__ void store_v4(unsigned* VB, const uint4 (&q)[4], int tid) {
#pragma unroll
	for (int x = 0; x < 4; ++x) {
		const int e = tid + kThreads * x, r = e >> 4, u = e & 15;
		*reinterpret_cast<uint4*>(VB + r * kW + 4 * u) = q[x];
	}
}

// The hi-only entries (mma7, mma8) run S6's two products on K (DK += dKK K + dKK^T K) from bf16 tiles by
// ldmatrix: K's copy made once a head in S5 (k_to_b16: rn(K), the hi half frag_b's split gives at every use)
// into VF's last 16 KB (past dKK's tile; dV' is dead from barrier 10), and dKK stored by S5 as rn(dKK) pairs
// into a [64][64] tile at VF's start (g1_pos), so that S6 takes its A fragments by ldmatrix.x4 (dKK) and
// ldmatrix.x4.trans (dKK^T) and K's B fragments by ldmatrix.x4.trans, two n tiles a load (gemm_kb16): per k
// step and warp 5 ldmatrix in place of ~36 scalar loads and ~20 splits. The same operands in the same order:
// the same bits. Measured (2026-12-04, twenty-second session): chunk gradients 4.036 -> 4.023 ms at 32K,
// 14.69 -> 14.63 ms at 120,908 tokens; the same tiles for 1b, S4 and S5 were no faster or slower
// (docs/mma-kernels.md, "bf16 operand tiles").

// kb_pos: the byte offset of K's 16-byte unit u (d = 8 u .. 8 u + 7) of row j in k_to_b16's copy: 256-byte
// rows, unit u at u ^ (j % 8) (ldmatrix's eight rows of one unit column fall in eight bank groups).
__device__ __forceinline__ int kb_pos(int j, int u) { return j * 256 + ((u ^ (j & 7)) << 4); }

// k_to_b16: rn(K) from the fp32 rowo tile KF into kb (kb_pos), thread tid taking the float4s tid + 256 x
// (x = 0..7: a warp reads one row's 512 bytes, conflict-free) and storing each as 8 bytes, half a unit (a
// half-warp's 16 stores fill 128 bytes of distinct banks).
__device__ __forceinline__ void k_to_b16(unsigned char* kb, const float* KF, int tid) {
#pragma unroll
	for (int x = 0; x < 8; ++x) {
		const int f = tid + kThreads * x, j = f >> 5, c4 = f & 31;
		const float4 a = *reinterpret_cast<const float4*>(KF + rowo<kP>(j) + 4 * c4);
		uint2 q;
		unsigned lo;
		tc::split_bf16x2(a.x, a.y, q.x, lo);
		tc::split_bf16x2(a.z, a.w, q.y, lo);
		*reinterpret_cast<uint2*>(kb + kb_pos(j, c4 >> 1) + 8 * (c4 & 1)) = q;
	}
}

// g1_pos: the byte offset of unit u (columns 8 u .. 8 u + 7) of row i of a bf16 [64][64] tile: 128-byte rows,
// the unit XOR-swizzled by the row.
__device__ __forceinline__ int g1_pos(int i, int u) { return i * 128 + ((u ^ (i & 7)) << 4); }

// gemm_kb16: acc (NT n tiles) += A B on hi halves, A from a bf16 [64][64] tile (g1_pos) at the warp's 16-row
// block rt: (m, k) = a[16 rt + m][16 kk + k] (AT false, ldmatrix.x4) or a[16 kk + k][16 rt + m] (AT,
// ldmatrix.x4.trans); B (k, n) = K[16 kk + k][n0 + n] from k_to_b16's copy, NT / 2 ldmatrix.x4.trans a k step
// (matrices: rows 0-7 / 8-15 of the k step, units n0 / 8 + 2 p and + 1: n tiles 2 p and 2 p + 1), nt
// ascending as gemm.
template <int NT, bool AT>
__device__ __forceinline__ void gemm_kb16(float (*acc)[4], const unsigned char* a, const unsigned char* kb, int n0, int rt,
                                          int k0, int k1, int lane) {
	const int mq = lane >> 3, jr = (lane & 7) + 8 * (mq & 1), u0 = (n0 >> 3) + (mq >> 1);
	for (int kk = k0; kk < k1; ++kk) {
		unsigned ah[4];
		if (AT)
			tc::ldmatrix_x4_trans(ah, a + g1_pos(16 * kk + (lane & 7) + 8 * (mq >> 1), 2 * rt + (mq & 1)));
		else
			tc::ldmatrix_x4(ah, a + g1_pos(16 * rt + (lane & 7) + 8 * (mq & 1), 2 * kk + (mq >> 1)));
#pragma unroll
		for (int p = 0; p < NT / 2; ++p) {
			unsigned b4[4];
			tc::ldmatrix_x4_trans(b4, kb + kb_pos(16 * kk + jr, u0 + 2 * p));
			mma_t<false, false>(acc[2 * p], ah, ah, b4, b4);
			mma_t<false, false>(acc[2 * p + 1], ah, ah, b4 + 2, b4 + 2);
		}
	}
}

// st_pair16: rn(x0), rn(x1) (columns j, j + 1, j even) of row i into a bf16 [64][64] tile (g1_pos).
__device__ __forceinline__ void st_pair16(unsigned char* dst, int i, int j, float x0, float x1) {
	unsigned h, lo;
	tc::split_bf16x2(x0, x1, h, lo);
	*reinterpret_cast<unsigned*>(dst + g1_pos(i, j >> 3) + 2 * (j & 7)) = h;
}

// GDNKCP_GRADS_BF_LDSM 1 (every grouped entry): the fragments of the exact bf16 tiles, dO's A fragments (1a,
// S3) and v's B fragments (T1), by ldmatrix.x4 (one for an A fragment, one for two n tiles' B fragments) in
// place of four 4-byte loads a fragment (frag_a_bf, frag_bt_bf): their rows (kW words, 272 bytes) are
// 16-byte aligned and 16 bytes apart in the banks. The same words: the same bits. 2: every entry but
// gdn_chunk_grads_mma6 (grads5<true, true, false>), the default on Blackwell, where ptxas 13.0 spills 24
// bytes in mma6 with it (8 without); on the H200 mma6 is 0.3% faster with it (6.625 against 6.651 ms at 32K,
// core + bwd --split-grads) and keeps 244 registers (249 without), no spill.
#ifndef GDNKCP_GRADS_BF_LDSM
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define GDNKCP_GRADS_BF_LDSM 2
#else
#define GDNKCP_GRADS_BF_LDSM 1
#endif
#endif
template <bool TP, bool LO, bool B16>
constexpr bool kBfLdsm = GDNKCP_GRADS_BF_LDSM == 1 || (GDNKCP_GRADS_BF_LDSM == 2 && !(TP && LO && !B16));

// ldsm_a_bf: frag_a_bf(p, ld, ...)'s four registers by one ldmatrix.x4.
__device__ __forceinline__ void ldsm_a_bf(const unsigned* p, int ld, int lane, unsigned a[4]) {
	const int mq = lane >> 3;
	tc::ldmatrix_x4(a, p + ((lane & 7) + 8 * (mq & 1)) * ld + 4 * (mq >> 1));
}

// ldsm_bt_bf2: frag_bt_bf(p, ld, ...)'s two registers (b[0], b[1]) and those of the n tile 8 rows on (b[2],
// b[3]) by one ldmatrix.x4.
__device__ __forceinline__ void ldsm_bt_bf2(const unsigned* p, int ld, int lane, unsigned b[4]) {
	const int mq = lane >> 3;
	tc::ldmatrix_x4(b, p + ((lane & 7) + 8 * (mq >> 1)) * ld + 4 * (mq & 1));
}

// grads5: the body of gdn_chunk_grads_mma5 (TP false: fp32 vnew, dvnew rows, split by split_rows) and of
// gdn_chunk_grads_mma6 (TP true: vnew, dvnew are token-slot blocks, copied by cp.async and split in place). Everything else,
// and every product and its order, is the same code: the two give the same bits on the same values.
// LO false (gdn_chunk_grads_mma7): every product takes the bf16 hi halves of its operands alone (one
// mma.sync where LO runs two or three; the lo halves are neither loaded nor formed, the lo planes not
// written), and the B operands of the plane products come two n tiles an ldmatrix.x4 (mma_b4).
// B16 (gdn_chunk_grads_mma8; TP and not LO): h_state, vnew and dvnew are h16, vnew16 and dvnew16 (bf16,
// passed as float pointers): V' and dV' are copied in S1, into the hi and the lo units of VP (copy_v16; a
// commit group each: barrier 1 waits for dO and V' only), d_chunk is d16 (D^T bf16, the tape walk's): D^T is
// copied whole (copy_dht) into BIG's first 32 KB right after barrier 3 (G1 and E dead; it lands while 1c
// runs), H^T into BIG + 32 KB after barrier 4 (over L), and barrier 5 waits for D^T alone, so H^T lands while
// dKt runs; S3 waits for dV' and H^T, reads <D, H> back from the thread's own copies (dot_dht) and publishes
// them at barrier 7 (no barrier 6: nothing is written between S2's products and S3's); every product sees
// mma7's operands, only <D, H> takes D and H as bf16.
// ---- 1c: A's blocks below the diagonal, A_ij = -D_i X_ij, X_ij = sum_{k=j}^{i-1} L_ik A_kj ----------------
// g1c_term: xt += L_ik A_kj (X^T's two n tiles: m = column in block j, n = row in block i); g1c_finish: A_ij =
// -D_i X_ij from X^T's accumulator tiles split as the A fragment, stored into AF. A warp reads back the
// blocks A_kj it stored, each lane the elements the same lane index wrote (the C layout of A_kj^T is the A
// layout of its next read).
template <bool LO>
__device__ __forceinline__ void g1c_term(const float* AF, const float* LS, int bi, int bj, int bk, int g, int t,
                                         float xt[2][4]) {
	unsigned ah[4], al[4];
	frag_a<true, kQ, true>(AF + (16 * bk) * kQ + 16 * bj, g, t, ah, al);  // (m, k) = A_kj[k][m]
#pragma unroll
	for (int nt = 0; nt < 2; ++nt) {
		unsigned bh[2], bl[2];  // (k, n) = L_ik[n][k]
		frag_b<kQ, false>(LS + (16 * bi + 8 * nt) * kQ + 16 * bk, g, t, bh, bl);
		mma_t<LO, LO>(xt[nt], ah, al, bh, bl);
	}
}
template <bool LO>
__device__ __forceinline__ void g1c_finish(float* AF, int bi, int bj, int g, int t, int rqt, const float xt[2][4]) {
	unsigned ah[4], al[4];  // X^T's accumulator tiles as the A fragment
#pragma unroll
	for (int r = 0; r < 4; ++r) tc::split_bf16x2(xt[r >> 1][2 * (r & 1)], xt[r >> 1][2 * (r & 1) + 1], ah[r], al[r]);
	float res[2][4] = {};
#pragma unroll
	for (int nt = 0; nt < 2; ++nt) {
		unsigned bh[2], bl[2];  // (k, n) = -D_i[n][k]
		frag_b<kQ, false>(AF + (16 * bi + 8 * nt) * kQ + 16 * bi, g, t, bh, bl, -1.f);
		mma_t<LO, LO>(res[nt], ah, al, bh, bl);
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

// GDNKCP_GRADS_1C_HELPERS 1: 1c as gdn_prep_mma's P4 (v5.28): block column 0's three blocks depend on each
// other down the column, so warp 0 walking them alone (6 terms and 3 products with -D_i) was the phase
// while warps 3-7 waited at barrier 4, and one CTA an SM leaves nothing else to fill that wait. Warps 3-5
// compute the terms that need no block of their own column (L_20 A_00; L_30 A_00 and, after named barrier 3
// with warp 0's store of A_10, + L_31 A_10; L_31 A_11) and hand the partial X^T over through shared memory
// (PX: [3][8][32] fp32, exact), and the owning warp goes on in the same k order: the same mma.sync sequence
// on the same values, the same bits. Column 0's chain: 3 terms and 3 products; column 1's: 2 and 2.
// 2: the helpers everywhere but gdn_chunk_grads_mma6 (grads5<true, true, false>: hi / lo products on fp32
// H and V'), which the helpers' registers push from 249 to 255 and a 4-byte spill on sm_90a.
#ifndef GDNKCP_GRADS_1C_HELPERS
#define GDNKCP_GRADS_1C_HELPERS 2
#endif
template <bool TP, bool LO, bool B16>
constexpr bool kHelpers1c = GDNKCP_GRADS_1C_HELPERS == 1 || (GDNKCP_GRADS_1C_HELPERS == 2 && !(TP && LO && !B16));

template <bool LO>
__device__ __forceinline__ void grads_1c(float* AF, const float* LS, float* PX, int w, int lane, int g, int t, int rqt) {
	float xt[2][4] = {};
	auto put = [&](int p) {
#pragma unroll
		for (int v = 0; v < 8; ++v) PX[(8 * p + v) * 32 + lane] = xt[v >> 2][v & 3];
	};
	auto get = [&](int p) {
#pragma unroll
		for (int v = 0; v < 8; ++v) xt[v >> 2][v & 3] = PX[(8 * p + v) * 32 + lane];
	};
	if (w == 0) {
		g1c_term<LO>(AF, LS, 1, 0, 0, g, t, xt);
		g1c_finish<LO>(AF, 1, 0, g, t, rqt, xt);
		tc::bar_arrive(3, 64);  // A_10 stored: warp 4 may read it
		tc::bar_sync(1, 64);    // warp 3's X_20 partial
		get(0);
		g1c_term<LO>(AF, LS, 2, 0, 1, g, t, xt);
		g1c_finish<LO>(AF, 2, 0, g, t, rqt, xt);
		tc::bar_sync(2, 64);  // warp 4's X_30 partial
		get(1);
		g1c_term<LO>(AF, LS, 3, 0, 2, g, t, xt);
		g1c_finish<LO>(AF, 3, 0, g, t, rqt, xt);
	} else if (w == 1) {
		g1c_term<LO>(AF, LS, 2, 1, 1, g, t, xt);
		g1c_finish<LO>(AF, 2, 1, g, t, rqt, xt);
		tc::bar_sync(4, 64);  // warp 5's X_31 partial
		get(2);
		g1c_term<LO>(AF, LS, 3, 1, 2, g, t, xt);
		g1c_finish<LO>(AF, 3, 1, g, t, rqt, xt);
	} else if (w == 2) {
		g1c_term<LO>(AF, LS, 3, 2, 2, g, t, xt);
		g1c_finish<LO>(AF, 3, 2, g, t, rqt, xt);
	} else if (w == 3) {
		g1c_term<LO>(AF, LS, 2, 0, 0, g, t, xt);
		put(0);
		tc::bar_arrive(1, 64);
	} else if (w == 4) {
		g1c_term<LO>(AF, LS, 3, 0, 0, g, t, xt);
		tc::bar_sync(3, 64);  // warp 0 stored A_10
		g1c_term<LO>(AF, LS, 3, 0, 1, g, t, xt);
		put(1);
		tc::bar_arrive(2, 64);
	} else if (w == 5) {
		g1c_term<LO>(AF, LS, 3, 1, 1, g, t, xt);
		put(2);
		tc::bar_arrive(4, 64);
	}
}

// copy_raw: k's and q's raw bf16 rows (row r at src + r stride elements, 16-byte aligned) times their l2norm
// factors (rstd[r HQK]; 1 with l2norm 0) into [64][kP] rowo stages as fp32, zeros in the rows >= n: the product
// x rstd that gdn_l2norm_fwd (fwd::l2norm_lane) writes as qn / kn, so the stages hold the bits copy_f32 copies
// from them. Thread tid owns the 16-byte units tid + 256 x of each. Every load (eight 16-byte units and eight
// factors a thread) is issued before the first store: with the stores through generic pointers a compiler that
// cannot tell them from the loads keeps a load-convert-store loop (the first form) in order, one round trip a
// load on the head's path (the likely cause of mma8r's 20% against mma8 on an H100 with that form).
__device__ __forceinline__ void copy_raw(float* kdst, const __nv_bfloat16* ksrc, const float* krstd, float* qdst,
                                         const __nv_bfloat16* qsrc, const float* qrstd, long long stride, int HQK,
                                         int l2norm, int n) {
	constexpr int kU = kC * 16 / kThreads;
	uint4 w[2][kU];
	float f[2][kU];
#pragma unroll
	for (int x = 0; x < kU; ++x) {
		const int u = threadIdx.x + kThreads * x, r = u >> 4, c8 = 8 * (u & 15);
		w[0][x] = w[1][x] = uint4{0u, 0u, 0u, 0u};  // rows >= n: 0 x 1, +0 as the first form stored
		f[0][x] = f[1][x] = 1.0f;
		if (r < n) {
			w[0][x] = __ldg(reinterpret_cast<const uint4*>(ksrc + r * stride + c8));
			w[1][x] = __ldg(reinterpret_cast<const uint4*>(qsrc + r * stride + c8));
			if (l2norm) {
				f[0][x] = __ldg(krstd + (long long)r * HQK);
				f[1][x] = __ldg(qrstd + (long long)r * HQK);
			}
		}
	}
#pragma unroll
	for (int m = 0; m < 2; ++m) {
#pragma unroll
		for (int x = 0; x < kU; ++x) {
			const int u = threadIdx.x + kThreads * x, r = u >> 4, c8 = 8 * (u & 15);
			const uint4 v = w[m][x];
			const float fx = f[m][x];
			float* d = (m == 0 ? kdst : qdst) + rowo<kP>(r) + c8;
			*reinterpret_cast<float4*>(d) = make_float4(__uint_as_float(v.x << 16) * fx, __uint_as_float(v.x & 0xffff0000u) * fx,
			                                            __uint_as_float(v.y << 16) * fx, __uint_as_float(v.y & 0xffff0000u) * fx);
			*reinterpret_cast<float4*>(d + 4) = make_float4(__uint_as_float(v.z << 16) * fx, __uint_as_float(v.z & 0xffff0000u) * fx,
			                                                __uint_as_float(v.w << 16) * fx, __uint_as_float(v.w & 0xffff0000u) * fx);
		}
	}
}

// RAW (gdn_chunk_grads_mma6r, mma8r): qn and kn are q's and k's raw bf16 rows (raw_stride elements a token, QK
// head qh at element 128 qh), staged through copy_raw with q_rstd / k_rstd: the same stage bits, so the same
// outputs, from half the bytes, and no fp32 qn / kn for the forward to write.
template <bool TP, bool LO = true, bool B16 = false, bool RAW = false>
__device__ __forceinline__ void grads5(float* smem, const float* __restrict__ qn, const float* __restrict__ kn, const __nv_bfloat16* __restrict__ v,
                     int v_stride, const float* __restrict__ gcum, const float* __restrict__ beta,
                     const float* __restrict__ h_state, const float* __restrict__ vnew,
                     const float* __restrict__ d_chunk, const float* __restrict__ dvnew,
                     const __nv_bfloat16* __restrict__ dout, const int* __restrict__ chunk_tok0,
                     const int* __restrict__ chunk_len, const float* __restrict__ q_rstd,
                     const float* __restrict__ k_rstd, float* __restrict__ dq, float* __restrict__ dk, int dq_stride,
                     float* __restrict__ dv, int dv_stride, float* __restrict__ dg, float* __restrict__ dbeta, int HQK,
                     int HV, float scale, int l2norm, __nv_bfloat16* __restrict__ dq16, __nv_bfloat16* __restrict__ dk16,
                     __nv_bfloat16* __restrict__ dv16, int raw_stride = 0) {
	static_assert(!B16 || (TP && !LO), "B16: token slots (dV') and hi products only");
	float* KF = smem;                                       // [64][kP] k, all along
	float* QF = KF + kTP;                                   // [64][kP] q, all along
	float* VF = QF + kTP;  // V' (S1-S2), dV' (S3-S4) as split_rows' bf16 hi / lo planes (32 KB); dKK [64][kQ] (S5-S6)
	unsigned* DOB = reinterpret_cast<unsigned*>(VF + kTP);  // [64][kW] dO bf16 pairs (S1-S3); v (S4)
	float* BIG = VF + kTP + kTW;                            // [128][kP], by phase:
	float* G1S = BIG;                                       //   S1-1c: G1, E, L [64][kQ]
	float* ES = BIG + kTQ;
	float* LS = BIG + 2 * kTQ;
	float* WF = BIG;                                        //   S4: dW [64][kP], dA [64][kQ] after it
	float* DAS = BIG + kTP;
	float* MS = BIG;                                        //   S5: M over dW; F kk over dA (S5-S6)
	float* FKS = DAS;
	unsigned* VB = DOB;
	float* E2S = reinterpret_cast<float*>(DOB);             //   S5-S6: E2 over v
	float* DKK = VF;                                        //   S5-S6: dKK [64][kQ] (LO) over dV'
	constexpr bool S6B = !LO;                               // S6 on bf16 tiles: rn(dKK), rn(K) (S5-S6)
	unsigned char* const DKK16 = reinterpret_cast<unsigned char*>(VF);             // rn(dKK) [64][64], g1_pos
	unsigned char* const KB = reinterpret_cast<unsigned char*>(VF + kTQ);          // rn(K) [64][128], kb_pos
	static_assert(4 * kTQ + kC * kD * 2 <= 4 * kTP, "K's bf16 copy fits in VF past dKK");
	float* AF = BIG + kBig;   // [64][kQ] (I + L)^-1 of the head (zero above the diagonal blocks)
	float* SKK = AF + kTQ;    // [64][kQ] S[i][j] = q_i . k_j at j <= i, (K K^T)[i][j] at [j][i] for j < i
	float* sv = SKK + kTQ;
	float* bet = sv;
	float* gam = sv + kC;
	float* eg = sv + 2 * kC;
	float* tail = sv + 3 * kC;
	float* bg = sv + 4 * kC;
	float* gt = sv + 5 * kC;     // [7][64] dgamma terms (row 0 ends as dgamma)
	float* bt = sv + 12 * kC;    // [3][64] (row 2: sum_j F kk)
	float* part = sv + 15 * kC;  // [4][2][64] row-dot partials: dQg.q, dKt.k, XU.v, XW.k; at the end y.dy of q, k
	float* red = sv + 23 * kC;   // [0, 8) <D, H> warp partials; [8] the last row's extra term

	const int c = blockIdx.x, qh = blockIdx.y, tid = threadIdx.x;
	const int lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3, rt = w & 3, ch = w >> 2;
	const int i0 = 16 * rt + g, i1 = i0 + 8;
	// rowo of rows i0, i1 (kP and kQ tiles) and of row 2t (kQ), spelled so that the lane's part is one term
	const int rp0 = 16 * rt * kP + rowo<kP>(g), rp1 = rp0 + 8 * kP, rq0 = 16 * rt * kQ + rowo<kQ>(g), rq1 = rq0 + 8 * kQ;
	const int rqt = rowo<kQ>(2 * t);
	const bool lower = !(ch == 1 && rt < 2);  // the warp's 16 x 32 tile of a 64 x 64 result touches j <= i
	const int t0 = chunk_tok0[c], n = chunk_len[c];
	const int grp = HV / HQK;
	const long long qrow = (long long)HQK * kD, vrow = (long long)HV * kD;

	// ---- S0: stage k, q once; S = Q K^T and K K^T once, to SKK ----
	if (!RAW) {
		copy_f32<kC>(KF, kn + ((long long)t0 * HQK + qh) * kD, qrow, n);
		copy_f32<kC>(QF, qn + ((long long)t0 * HQK + qh) * kD, qrow, n);
	}
	tc::cp_async_commit();  // (RAW: an empty group, so that the waits below count alike)
	if (B16) {  // head 0's dO, V', dV' land while S0 and head 0's S1 run (DOB, VF are free until then)
		copy_head16(DOB, reinterpret_cast<unsigned char*>(VF), dout, reinterpret_cast<const __nv_bfloat16*>(vnew),
		            reinterpret_cast<const __nv_bfloat16*>(dvnew), c, qh * grp, t0, n, HV, tid);
	}
	if (RAW) {  // under the head's copies
		const long long r0 = (long long)t0 * raw_stride + (long long)qh * kD;
		copy_raw(KF, reinterpret_cast<const __nv_bfloat16*>(kn) + r0, k_rstd + (long long)t0 * HQK + qh, QF,
		         reinterpret_cast<const __nv_bfloat16*>(qn) + r0, q_rstd + (long long)t0 * HQK + qh, raw_stride, HQK, l2norm, n);
	}
	if (B16) {
		tc::cp_async_wait<3>();  // K and Q
	} else {
		tc::cp_async_wait<0>();
	}
	__syncthreads();  // barrier 0
	// v's rows 16-byte aligned (every buffer kcp passes): four 16-byte units a thread (load_v4); mma8 loads
	// them before S3's products and stores them after barrier 8
	const bool vquad = ((reinterpret_cast<unsigned long long>(v) & 15) | (v_stride & 7)) == 0;
	{
		float kk[4][4] = {}, s[4][4] = {};
		if (lower) {
			for (int k8 = 0; k8 < kD / 16; ++k8) {
				unsigned kh[4], kl[4], qa[4], ql[4];
				frag_a<true, kP, false>(KF + 16 * rt * kP + 16 * k8, g, t, kh, kl);
				frag_a<true, kP, false>(QF + 16 * rt * kP + 16 * k8, g, t, qa, ql);
#pragma unroll
				for (int nt = 0; nt < 4; ++nt) {
					unsigned bh[2], bl[2];
					frag_b<kP, false>(KF + (32 * ch + 8 * nt) * kP + 16 * k8, g, t, bh, bl);  // (k, n) = K[j][d]
					mma_t<LO, LO>(kk[nt], kh, kl, bh, bl);
					mma_t<LO, LO>(s[nt], qa, ql, bh, bl);
				}
			}
#pragma unroll
			for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
				for (int r = 0; r < 4; ++r) {
					const int i = i0 + 8 * (r >> 1), j = 32 * ch + 8 * nt + 2 * t + (r & 1);
					if (j <= i) SKK[(r < 2 ? rq0 : rq1) + j] = s[nt][r];
					if (j < i) SKK[(32 * ch + 8 * nt) * kQ + rqt + (r & 1) * (kQ + 4) + i] = kk[nt][r];
				}
			}
		}
	}
	// (head 0's barrier 1 publishes SKK)

	float DQ[8][4] = {}, DK[8][4] = {};  // summed over the value heads, ascending
	for (int hj = 0; hj < grp; ++hj) {
		const int h = qh * grp + hj;
		const float* hs = h_state + ((long long)c * HV + h) * kD * kD;
		const float* ds = d_chunk + ((long long)c * HV + h) * kD * kD;
		const __nv_bfloat16* hts = reinterpret_cast<const __nv_bfloat16*>(h_state) + ((long long)c * HV + h) * kD * kD;
		const __nv_bfloat16* dts = reinterpret_cast<const __nv_bfloat16*>(d_chunk) + ((long long)c * HV + h) * kD * kD;

		// ---- S1: stage V', dO; beta, gamma ----
		unsigned char* const VP = reinterpret_cast<unsigned char*>(VF);  // V' (S1-S2), dV' (S3-S4): bf16 planes
		if (B16) {  // dO, V' into the hi units, dV' into the lo units (head 0's since S0)
			if (hj > 0)
				copy_head16(DOB, VP, dout, reinterpret_cast<const __nv_bfloat16*>(vnew),
				            reinterpret_cast<const __nv_bfloat16*>(dvnew), c, h, t0, n, HV, tid);
		} else {
			copy_dout(DOB, dout, t0, n, h, HV, tid);
			tc::cp_async_commit();
			if (TP) {
				copy_block32k(VP, vnew + ((long long)c * HV + h) * kD * kC, tid);
				tc::cp_async_commit();
			} else {
				split_rows(VP, vnew + ((long long)t0 * HV + h) * kD, vrow, n, tid);  // while dO's copies land
			}
		}
		for (int e = tid; e < kTQ; e += kThreads) AF[e] = 0.f;
		if (tid < kC) {  // both loads issued before either store: one round trip, not two, at the head's start
			float bv = 0.f, gv = 0.f;
			if (tid < n) {
				bv = beta[(long long)(t0 + tid) * HV + h];
				gv = gcum[(long long)(t0 + tid) * HV + h];
			}
			bet[tid] = bv;
			gam[tid] = gv;
		}
		if (B16)
			tc::cp_async_wait<1>();  // dO and V' (dV' may still be in flight: waited for in S3)
		else
			tc::cp_async_wait<0>();
		if (TP && !B16) slots_to_planes<LO>(VP, tid);
		__syncthreads();  // barrier 1
		const float glast = gam[n - 1];
		if (tid < kC) {
			const bool in = tid < n;
			const float e = expf(gam[tid]);
			eg[tid] = in ? e : 0.f;
			tail[tid] = in ? expf(glast - gam[tid]) : 0.f;
			bg[tid] = in ? bet[tid] * e : 0.f;
		}

		// ---- 1a: dP = dO V'^T on the warp's 16 x 32 tile; L, G1, E from SKK ----
		{
			float dp[4][4] = {};
			if (lower) {
				for (int k8 = 0; k8 < kD / 16; ++k8) {
					unsigned oa[4];
					if constexpr (kBfLdsm<TP, LO, B16>)
						ldsm_a_bf(DOB + 16 * rt * kW + 8 * k8, kW, lane, oa);
					else
						frag_a_bf(DOB + 16 * rt * kW + 8 * k8, kW, g, t, oa);
#pragma unroll
					for (int nt = 0; nt < 4; nt += LO ? 1 : 2) {
						unsigned b4[4];  // (k, n) = V'[j][d]: tile nt's hi, lo (LO) or tiles nt, nt + 1's hi
						if (TP)
							tp_b<!LO>(VP, 32 * ch + 8 * nt, k8, lane, b4);
						else
							tc::ldmatrix_x4(b4, h_frag_row<16384, !LO>(VP, 32 * ch + 8 * nt, k8, lane));
						mma_b4<LO, false, 4>(dp, nt, oa, oa, b4);  // dO V'hi (+ dO V'lo)
					}
				}
			}
#pragma unroll
			for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
				for (int r = 0; r < 4; ++r) {
					const int i = i0 + 8 * (r >> 1), j = 32 * ch + 8 * nt + 2 * t + (r & 1);
					const float ge = expf(gam[i] - gam[j]);
					const bool in = j <= i && i < n;
					LS[(r < 2 ? rq0 : rq1) + j] = (j < i && i < n) ? bet[i] * SKK[(32 * ch + 8 * nt) * kQ + rqt + (r & 1) * (kQ + 4) + i] * ge : 0.f;
					const float gv = in ? scale * dp[nt][r] * ge : 0.f;
					G1S[(r < 2 ? rq0 : rq1) + j] = gv;
					ES[i * kQ + j] = in ? gv * SKK[(r < 2 ? rq0 : rq1) + j] : 0.f;  // ES: plain rows (read only by the sums)
				}
			}
		}
		__syncthreads();  // barrier 2: G1, E, L, eg, tail, bg

		// ---- 1b: dq += G1 K, dk += G1^T Q; the diagonal blocks of A; the sums of E ----
		gemm<8, kQ, false, kP, true, LO>(DQ, G1S + 16 * rt * kQ, KF + 64 * ch, 0, rt + 1, g, t);  // G1 lower: j <= i
		gemm<8, kQ, true, kP, true, LO>(DK, G1S + 16 * rt, QF + 64 * ch, rt, kC / 16, g, t);    // (m, k) = G1[i][j], i >= j
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
		// B16: D^T's copy goes out now, into BIG's first 32 KB (G1 and E are dead; 1c reads only L and A), and
		// lands while 1c runs.
		if (B16) {
			copy_dht(reinterpret_cast<unsigned char*>(BIG), dts, tid);
			tc::cp_async_commit();
		}

		// ---- 1c: A_ij = -D_i sum_{k=j}^{i-1} L_ik A_kj (gdn_prep_mma's P4: block columns by warps 0-2, the
		// terms that do not wait for the column's own blocks by warps 3-5, partials over BIG past LS) ----
		if constexpr (kHelpers1c<TP, LO, B16>) {
			grads_1c<LO>(AF, LS, BIG + 3 * kTQ, w, lane, g, t, rqt);
		} else if (w < 3) {
			const int bj = w;
			for (int bi = bj + 1; bi < 4; ++bi) {
				float xt[2][4] = {};
				for (int bk = bj; bk < bi; ++bk) g1c_term<LO>(AF, LS, bi, bj, bk, g, t, xt);
				g1c_finish<LO>(AF, bi, bj, g, t, rqt, xt);
			}
		}
		__syncthreads();  // barrier 4: A complete; G1, E, L dead

		// ---- S2: D; <D, H>; dKt = V' D^T ----
		// D is split once into bf16 hi / lo planes over BIG (split_h's layout), and <D, H> is formed from
		// the same loads in d_dot_h's order; dKt's B fragments are then ldmatrix.x4 loads.
		if (B16) {  // H^T's copy (over L's tile) lands while dKt runs; D^T's (and dV''s) waited for here
			copy_dht(reinterpret_cast<unsigned char*>(BIG) + 32768, hts, tid);
			tc::cp_async_commit();
			tc::cp_async_wait<1>();
		} else {
			const float dh = split_h<true, LO>(reinterpret_cast<unsigned char*>(BIG), ds, hs, tid);
			if (lane == 0) red[w] = dh;
		}
		__syncthreads();  // barrier 5: the D planes written
		{
			float acc[8][4] = {};
			for (int k8 = 0; k8 < kD / 16; ++k8) {  // (k, n) = D[n][k]: gemm's products and order
				unsigned ah[4], al[4];
				if (TP)
					tp_a<LO>(VP, 16 * rt, k8, lane, ah, al);
				else
					plane_a<LO>(VP, 16 * rt, k8, lane, ah, al);
#pragma unroll
				for (int nt = 0; nt < 8; nt += LO ? 1 : 2) {
					unsigned b4[4];
					if (B16)  // D^T's units: (k, n) = D^T[k][n]
						ht_b2(reinterpret_cast<const unsigned char*>(BIG), 64 * ch + 8 * nt, k8, lane, b4);
					else
						tc::ldmatrix_x4(b4, h_frag_row<32768, !LO>(reinterpret_cast<const unsigned char*>(BIG), 64 * ch + 8 * nt, k8, lane));
					mma_b4<LO, true, 8>(acc, nt, ah, al, b4);
				}
			}
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
		if (!B16) __syncthreads();  // barrier 6: D and V' dead (B16: nothing overwrites them before barrier 8)

		// ---- S3: H, dV'; dQg = dO H^T, dW = -dV' H^T ----
		// H is split once into bf16 hi / lo planes over BIG (the B operand of both products, which every
		// warp of a column half reads), each [128 keys][128 columns] with its 16-byte units XOR-swizzled by
		// key % 8, so that the B fragments are ldmatrix.x4 loads (hi and lo of an n tile in one) instead of
		// fp32 loads split again by every warp for every product: the same hi / lo values, the same bits.
		// B16: dV' (VP's lo units, copied in S1) and H^T (BIG + 32 KB, copied in S2) waited for here, <D, H>
		// from the thread's own copies, and barrier 7 publishes them.
		uint4 vq[4];  // mma8 (vquad): v's units, loaded here and stored after barrier 8
		if (B16) {
			if (vquad) load_v4(vq, v, v_stride, t0, h, n, tid);
			tc::cp_async_wait<0>();
			const float dh = dot_dht(reinterpret_cast<const unsigned char*>(BIG), tid);
			if (lane == 0) red[w] = dh;
			__syncthreads();  // barrier 7
		} else {
			if (TP) {  // dV' lands while H is split
				copy_block32k(VP, dvnew + ((long long)c * HV + h) * kD * kC, tid);
				tc::cp_async_commit();
			} else {
				split_rows(VP, dvnew + ((long long)t0 * HV + h) * kD, vrow, n, tid);
			}
			split_h<false, LO>(reinterpret_cast<unsigned char*>(BIG), hs, nullptr, tid);
			if (TP) {
				tc::cp_async_wait<0>();
				slots_to_planes<LO>(VP, tid);
			}
			__syncthreads();  // barrier 7
		}
		float wa[8][4] = {};
		{
			float qg[8][4] = {};
			for (int k8 = 0; k8 < kD / 16; ++k8) {
				unsigned oa[4], ah[4], al[4];
				if constexpr (kBfLdsm<TP, LO, B16>)
					ldsm_a_bf(DOB + 16 * rt * kW + 8 * k8, kW, lane, oa);
				else
					frag_a_bf(DOB + 16 * rt * kW + 8 * k8, kW, g, t, oa);
				if (TP)
					tp_a<LO, B16>(VP, 16 * rt, k8, lane, ah, al);
				else
					plane_a<LO>(VP, 16 * rt, k8, lane, ah, al);
#pragma unroll
				for (int nt = 0; nt < 8; nt += LO ? 1 : 2) {
					unsigned b4[4];  // (k, n) = H[n][k]: hi (k 0-7, 8-15), lo (k 0-7, 8-15); !LO: hi of nt, nt + 1
					if (B16)
						ht_b2(reinterpret_cast<const unsigned char*>(BIG) + 32768, 64 * ch + 8 * nt, k8, lane, b4);
					else
						tc::ldmatrix_x4(b4, h_frag_row<32768, !LO>(reinterpret_cast<const unsigned char*>(BIG), 64 * ch + 8 * nt, k8, lane));
					mma_b4<LO, false, 8>(qg, nt, oa, oa, b4);
					mma_b4<LO, true, 8>(wa, nt, ah, al, b4);
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
			}
			rowpart(part + (0 * 2 + ch) * kC, i0, i1, p0, p1, t);
		}
		__syncthreads();  // barrier 8: every warp done with H and dO
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
			const int col = 64 * ch + 8 * nt + 2 * t;
			st2(WF + rp0 + col, -wa[nt][0], -wa[nt][1]);
			st2(WF + rp1 + col, -wa[nt][2], -wa[nt][3]);
		}
		// v rows as bf16 pairs, zeros past n: where v and v_stride keep rows 16-byte aligned (every buffer kcp
		// passes), a thread's four 16-byte units (8 bf16 each) loaded together, then stored (one round trip;
		// ncu had the 4-byte loads' stores at 6% of mma8's stall samples; mma8 loaded them before S3's
		// products); else one 4-byte load a pair where pairs are 4-byte aligned, else two 2-byte loads; the
		// same words every way.
		const bool vpair = ((reinterpret_cast<unsigned long long>(v) & 3) | (v_stride & 1)) == 0;
		if (vquad) {
			if (!B16) load_v4(vq, v, v_stride, t0, h, n, tid);
			store_v4(VB, vq, tid);
		} else {
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
		}
		__syncthreads();  // barrier 9: dW, v

		// ---- S4: XU = A^T dV', XW = A^T dW; T1 = dV' v^T, T2 = dW K^T -> dA ----
		{  // XU first, then XW: two passes over A's fragments keep 32 accumulators fewer live beside DQ, DK
			float xu[8][4] = {};
			for (int k8 = rt; k8 < kC / 16; ++k8) {  // (m, k) = A[i][j]: i >= j
				unsigned ah[4], al[4];
				frag_a<true, kQ, true>(AF + 16 * rt + 16 * k8 * kQ, g, t, ah, al);
#pragma unroll
				for (int nt = 0; nt < 8; nt += LO ? 1 : 2) {
					unsigned b4[4];  // (k, n) = dV'[j][d]
					if (TP)
						tp_bt<!LO, B16>(VP, 64 * ch + 8 * nt, k8, lane, b4);
					else
						plane_bt<!LO>(VP, 64 * ch + 8 * nt, k8, lane, b4);
					mma_b4<LO, true, 8>(xu, nt, ah, al, b4);
				}
			}
			float p0 = 0.f, p1 = 0.f;
			const float ba = bet[i0], bb = bet[i1];
#pragma unroll
			for (int nt = 0; nt < 8; ++nt) {
				const int col = 64 * ch + 8 * nt + 2 * t;
				const unsigned va = VB[i0 * kW + (col >> 1)], vb = VB[i1 * kW + (col >> 1)];
				p0 = fmaf(xu[nt][0], __uint_as_float(va << 16), p0);
				p0 = fmaf(xu[nt][1], __uint_as_float(va & 0xffff0000u), p0);
				p1 = fmaf(xu[nt][2], __uint_as_float(vb << 16), p1);
				p1 = fmaf(xu[nt][3], __uint_as_float(vb & 0xffff0000u), p1);
				if (i0 < n) {
					const long long e = (long long)(t0 + i0) * dv_stride + h * kD + col;
					out_pair(dv, dv16, e, ba * xu[nt][0], ba * xu[nt][1]);
				}
				if (i1 < n) {
					const long long e = (long long)(t0 + i1) * dv_stride + h * kD + col;
					out_pair(dv, dv16, e, bb * xu[nt][2], bb * xu[nt][3]);
				}
			}
			rowpart(part + (2 * 2 + ch) * kC, i0, i1, p0, p1, t);
		}
		{
			float xw[8][4] = {};
			for (int k8 = rt; k8 < kC / 16; ++k8) {
				unsigned ah[4], al[4];
				frag_a<true, kQ, true>(AF + 16 * rt + 16 * k8 * kQ, g, t, ah, al);
#pragma unroll
				for (int nt = 0; nt < 8; ++nt) {
					unsigned bh[2], bl[2];
					frag_b<kP, true>(WF + 16 * k8 * kP + 64 * ch + 8 * nt, g, t, bh, bl);
					mma_t<LO, LO>(xw[nt], ah, al, bh, bl);
				}
			}
			float p0 = 0.f, p1 = 0.f;
			const float ga = bg[i0], gb = bg[i1];
#pragma unroll
			for (int nt = 0; nt < 8; ++nt) {
				const int col = 64 * ch + 8 * nt + 2 * t;
				DK[nt][0] = fmaf(ga, xw[nt][0], DK[nt][0]);
				DK[nt][1] = fmaf(ga, xw[nt][1], DK[nt][1]);
				DK[nt][2] = fmaf(gb, xw[nt][2], DK[nt][2]);
				DK[nt][3] = fmaf(gb, xw[nt][3], DK[nt][3]);
				{
					const float2 ya = ld2(KF + rp0 + col), yb = ld2(KF + rp1 + col);
					p0 = fmaf(xw[nt][0], ya.x, p0);
					p0 = fmaf(xw[nt][1], ya.y, p0);
					p1 = fmaf(xw[nt][2], yb.x, p1);
					p1 = fmaf(xw[nt][3], yb.y, p1);
				}
			}
			rowpart(part + (3 * 2 + ch) * kC, i0, i1, p0, p1, t);
		}
		{
			float t1[4][4] = {}, t2[4][4] = {};
			if (lower) {
				for (int k8 = 0; k8 < kD / 16; ++k8) {
					unsigned dh[4], dl[4], wh[4], wl[4];
					if (TP)
						tp_a<LO, B16>(VP, 16 * rt, k8, lane, dh, dl);
					else
						plane_a<LO>(VP, 16 * rt, k8, lane, dh, dl);
					frag_a<true, kP, false>(WF + 16 * rt * kP + 16 * k8, g, t, wh, wl);
					unsigned v4[4];  // BF_LDSM: v's B fragments of n tiles nt, nt + 1 (nt even)
#pragma unroll
					for (int nt = 0; nt < 4; ++nt) {
						unsigned vv[2], kh[2], kl[2];
						if constexpr (kBfLdsm<TP, LO, B16>) {
							if ((nt & 1) == 0) ldsm_bt_bf2(VB + (32 * ch + 8 * nt) * kW + 8 * k8, kW, lane, v4);
							vv[0] = v4[2 * (nt & 1)];
							vv[1] = v4[2 * (nt & 1) + 1];
						} else {
							frag_bt_bf(VB + (32 * ch + 8 * nt) * kW + 8 * k8, kW, g, t, vv);  // (k, n) = v[j][d]
						}
						tc::mma_bf16_16816(t1[nt], dh, vv, t1[nt]);
						if (LO) tc::mma_bf16_16816(t1[nt], dl, vv, t1[nt]);
						frag_b<kP, false>(KF + (32 * ch + 8 * nt) * kP + 16 * k8, g, t, kh, kl);  // (k, n) = K[j][d]
						mma_t<LO, LO>(t2[nt], wh, wl, kh, kl);
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
		__syncthreads();  // barrier 10: dA; dW, dV' and v dead

		// ---- S5: M = A^T dA (over dW); dL = -M A^T; F, dKK (over dV'), E2 (over v), F kk (over dA) ----
		{
			float m[4][4] = {};
			gemm<4, kQ, true, kQ, true, LO>(m, AF + 16 * rt, DAS + 32 * ch, rt, kC / 16, g, t);  // (m, k) = A[a][x], a >= x
#pragma unroll
			for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
				for (int r = 0; r < 4; ++r) MS[(r < 2 ? rq0 : rq1) + 32 * ch + 8 * nt + 2 * t + (r & 1)] = m[nt][r];
			}
		}
		if constexpr (S6B) k_to_b16(KB, KF, tid);  // VF past dKK's tile: free since barrier 10
		__syncthreads();  // barrier 11: M; dA dead
		{
			float l[4][4] = {};
			if (lower) gemm<4, kQ, false, kQ, false, LO>(l, MS + 16 * rt * kQ, AF + 32 * ch * kQ, 0, 2 * ch + 2, g, t);  // (k, n) = A[j][b]
#pragma unroll
			for (int nt = 0; nt < 4; ++nt) {
				float xs[4];  // S6B: dKK's values of this tile, stored as bf16 pairs
#pragma unroll
				for (int r = 0; r < 4; ++r) {
					const int i = i0 + 8 * (r >> 1), j = 32 * ch + 8 * nt + 2 * t + (r & 1);
					float x = 0.f, e2 = 0.f, fk = 0.f;
					if (j < i && i < n) {
						const float f = -l[nt][r] * expf(gam[i] - gam[j]);  // F = dL Γ
						const float kkv = SKK[(32 * ch + 8 * nt) * kQ + rqt + (r & 1) * (kQ + 4) + i];
						x = bet[i] * f;
						e2 = x * kkv;
						fk = f * kkv;
					}
					if (S6B)
						xs[r] = x;
					else
						DKK[(r < 2 ? rq0 : rq1) + j] = x;
					E2S[i * kQ + j] = e2;
					FKS[i * kQ + j] = fk;
				}
				if constexpr (S6B) {
					st_pair16(DKK16, i0, 32 * ch + 8 * nt + 2 * t, xs[0], xs[1]);
					st_pair16(DKK16, i1, 32 * ch + 8 * nt + 2 * t, xs[2], xs[3]);
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
		if constexpr (S6B) {
			gemm_kb16<8, false>(DK, DKK16, KB, 64 * ch, rt, 0, rt + 1, lane);       // dKK[i][j], j < i
			gemm_kb16<8, true>(DK, DKK16, KB, 64 * ch, rt, rt, kC / 16, lane);      // dKK[j][i], j > i
		} else {
			gemm<8, kQ, false, kP, true, LO>(DK, DKK + 16 * rt * kQ, KF + 64 * ch, 0, rt + 1, g, t);  // dKK[i][j], j < i
			gemm<8, kQ, true, kP, true, LO>(DK, DKK + 16 * rt, KF + 64 * ch, rt, kC / 16, g, t);      // dKK[j][i], j > i
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
		__syncthreads();  // barrier 14: also the end of the head (every stage above free for the next)
		if (tid == 0) {  // overlaps the next head's S1 / the epilogue: those touch neither gt nor red
			float acc = 0.f;
			for (int i = n - 1; i >= 0; --i) {
				float x = gt[i];
				if (i == n - 1) x += red[8];
				acc += x;
				dg[(long long)(t0 + i) * HV + h] = acc;
			}
		}
	}

	// ---- E: the l2norm backward dx = (dy - y (y . dy)) rstd (dx = dy without l2norm); dq, dk stored ----
	float q0 = 1.f, q1 = 1.f, k0 = 1.f, k1 = 1.f;  // the rows' rstd (rows >= n: never stored)
	if (l2norm) {
		float a0 = 0.f, a1 = 0.f, b0 = 0.f, b1 = 0.f;  // y . dy: a lane's 16 columns, nt ascending
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
			const int col = 64 * ch + 8 * nt + 2 * t;
			a0 = fmaf(QF[rp0 + col], DQ[nt][0], a0);
			a0 = fmaf(QF[rp0 + col + 1], DQ[nt][1], a0);
			a1 = fmaf(QF[rp1 + col], DQ[nt][2], a1);
			a1 = fmaf(QF[rp1 + col + 1], DQ[nt][3], a1);
			b0 = fmaf(KF[rp0 + col], DK[nt][0], b0);
			b0 = fmaf(KF[rp0 + col + 1], DK[nt][1], b0);
			b1 = fmaf(KF[rp1 + col], DK[nt][2], b1);
			b1 = fmaf(KF[rp1 + col + 1], DK[nt][3], b1);
		}
		rowpart(part + (0 * 2 + ch) * kC, i0, i1, a0, a1, t);  // then the 4 lanes of a row, then ch 0 + ch 1
		rowpart(part + (1 * 2 + ch) * kC, i0, i1, b0, b1, t);
		__syncthreads();  // barrier 15
		const float pa0 = part[i0] + part[kC + i0], pa1 = part[i1] + part[kC + i1];
		const float pb0 = part[2 * kC + i0] + part[3 * kC + i0], pb1 = part[2 * kC + i1] + part[3 * kC + i1];
		if (i0 < n) {
			q0 = q_rstd[(long long)(t0 + i0) * HQK + qh];
			k0 = k_rstd[(long long)(t0 + i0) * HQK + qh];
		}
		if (i1 < n) {
			q1 = q_rstd[(long long)(t0 + i1) * HQK + qh];
			k1 = k_rstd[(long long)(t0 + i1) * HQK + qh];
		}
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
			const int col = 64 * ch + 8 * nt + 2 * t;
			DQ[nt][0] = fmaf(-QF[rp0 + col], pa0, DQ[nt][0]) * q0;
			DQ[nt][1] = fmaf(-QF[rp0 + col + 1], pa0, DQ[nt][1]) * q0;
			DQ[nt][2] = fmaf(-QF[rp1 + col], pa1, DQ[nt][2]) * q1;
			DQ[nt][3] = fmaf(-QF[rp1 + col + 1], pa1, DQ[nt][3]) * q1;
			DK[nt][0] = fmaf(-KF[rp0 + col], pb0, DK[nt][0]) * k0;
			DK[nt][1] = fmaf(-KF[rp0 + col + 1], pb0, DK[nt][1]) * k0;
			DK[nt][2] = fmaf(-KF[rp1 + col], pb1, DK[nt][2]) * k1;
			DK[nt][3] = fmaf(-KF[rp1 + col + 1], pb1, DK[nt][3]) * k1;
		}
	}
#pragma unroll
	for (int nt = 0; nt < 8; ++nt) {
		const long long col = (long long)qh * kD + 64 * ch + 8 * nt + 2 * t;
		if (i0 < n) {
			const long long e = (long long)(t0 + i0) * dq_stride + col;
			out_pair(dq, dq16, e, DQ[nt][0], DQ[nt][1]);
			out_pair(dk, dk16, e, DK[nt][0], DK[nt][1]);
		}
		if (i1 < n) {
			const long long e = (long long)(t0 + i1) * dq_stride + col;
			out_pair(dq, dq16, e, DQ[nt][2], DQ[nt][3]);
			out_pair(dk, dk16, e, DK[nt][2], DK[nt][3]);
		}
	}
}

// GDNKCP_GRADS5_OUT_PARAMS: the parameters every chunk-gradient entry of this file ends with (dO, the chunk
// tables, the rstd rows, the outputs and the sizes), and GDNKCP_GRADS5_OUT_ARGS the same names as arguments.
#define GDNKCP_GRADS5_OUT_PARAMS                                                                                       \
	const __nv_bfloat16* __restrict__ dout, const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,     \
	    const float* __restrict__ q_rstd, const float* __restrict__ k_rstd, float* __restrict__ dq,                    \
	    float* __restrict__ dk, int dq_stride, float* __restrict__ dv, int dv_stride, float* __restrict__ dg,          \
	    float* __restrict__ dbeta, int HQK, int HV, float scale, int l2norm, __nv_bfloat16* __restrict__ dq16,         \
	    __nv_bfloat16* __restrict__ dk16, __nv_bfloat16* __restrict__ dv16
#define GDNKCP_GRADS5_OUT_ARGS                                                                                         \
	dout, chunk_tok0, chunk_len, q_rstd, k_rstd, dq, dk, dq_stride, dv, dv_stride, dg, dbeta, HQK, HV, scale, l2norm, \
	    dq16, dk16, dv16

// GDNKCP_GRADS5_F32_ENTRY(NAME, VNEW, DVNEW, ...) defines the chunk-gradient entry NAME on fp32 qn, kn, H, V', D
// and dV' (V' and dV' named VNEW and DVNEW) that runs grads5<...>: gdn_chunk_grads_mma5, mma6 and mma7 differ in
// nothing else.
#define GDNKCP_GRADS5_F32_ENTRY(NAME, VNEW, DVNEW, ...)                                                                \
	extern "C" __global__ void __launch_bounds__(kThreads, 1)                                                          \
	NAME(const float* __restrict__ qn, const float* __restrict__ kn, const __nv_bfloat16* __restrict__ v, int v_stride, \
	     const float* __restrict__ gcum, const float* __restrict__ beta, const float* __restrict__ h_state,             \
	     const float* __restrict__ VNEW, const float* __restrict__ d_chunk, const float* __restrict__ DVNEW,            \
	     GDNKCP_GRADS5_OUT_PARAMS) {                                                                                    \
		extern __shared__ float smem[]; /* C linkage: the one dynamic shared memory of every kernel here */             \
		grads5<__VA_ARGS__>(smem, qn, kn, v, v_stride, gcum, beta, h_state, VNEW, d_chunk, DVNEW,                      \
		                    GDNKCP_GRADS5_OUT_ARGS);                                                                    \
	}

GDNKCP_GRADS5_F32_ENTRY(gdn_chunk_grads_mma5, vnew, dvnew, false)

// gdn_chunk_grads_mma6: gdn_chunk_grads_mma5 with V' and dV' read as token-slot blocks (vnewp from the state
// walk's vnewp, dvnewp from the tape walk's dvnewp: [NC x HV] blocks of 32 KB, tp_pos' comment) instead of
// fp32 rows: the same arguments otherwise, grid, block, shared memory and outputs, and the same bits.
GDNKCP_GRADS5_F32_ENTRY(gdn_chunk_grads_mma6, vnewp, dvnewp, true)

// gdn_chunk_grads_mma7: gdn_chunk_grads_mma6 (the same arguments, grid, block, shared memory and outputs)
// whose products take the bf16 hi halves of their operands alone (grads5<true, false>): a third of the
// mma.sync of the fp32 x fp32 products, half of those with dO or v, no lo planes. Gradients good to bf16
// (the issue's 1e-2 for dq, dk, dv and 5e-3 for dg, dbeta), not to fp32: TestMMA7ChunkGradsOnCPU measures
// them against float64 (the precision section of the header).
GDNKCP_GRADS5_F32_ENTRY(gdn_chunk_grads_mma7, vnewp, dvnewp, true, false)

// gdn_chunk_grads_mma8: gdn_chunk_grads_mma7 on bf16 H^T, D^T, V'^T and dV'^T (grads5<true, false, true>):
// h16 [NC, HV, 128 (column), 128 (key)] and vnew16 [NC, HV, 128 (feature), 64 (token)] as the state walk
// writes them for the output, d16 (D^T, h16's layout) and dvnew16 (dV'^T, vnew16's layout) as the tape walk
// writes them (rn; dV' tokens from chunk_len on 0) in place of h_state, d_chunk, vnewp and dvnewp; the other
// arguments, grid, block, shared memory and outputs are mma7's. Every product sees mma7's operands
// (rn(H), rn(D), rn(V') are mma7's hi halves), so dq, dk, dv, dbeta and the in-chunk dgamma terms are
// mma7's bits; only <D, H>, the last row's dgamma term, takes D and H as bf16 and sums in dot_dht's order.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
gdn_chunk_grads_mma8(const float* __restrict__ qn, const float* __restrict__ kn, const __nv_bfloat16* __restrict__ v,
                     int v_stride, const float* __restrict__ gcum, const float* __restrict__ beta,
                     const __nv_bfloat16* __restrict__ h16, const __nv_bfloat16* __restrict__ vnew16,
                     const __nv_bfloat16* __restrict__ d16, const __nv_bfloat16* __restrict__ dvnew16,
                     GDNKCP_GRADS5_OUT_PARAMS) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	grads5<true, false, true>(smem, qn, kn, v, v_stride, gcum, beta, reinterpret_cast<const float*>(h16),
	                          reinterpret_cast<const float*>(vnew16), reinterpret_cast<const float*>(d16),
	                          reinterpret_cast<const float*>(dvnew16), GDNKCP_GRADS5_OUT_ARGS);
}

// gdn_chunk_grads_mma6r and gdn_chunk_grads_mma8r: gdn_chunk_grads_mma6 / mma8 with q and k as their raw bf16
// rows (q, k: qk_stride elements a token, 16-byte aligned, QK head qh at element 128 qh) and q_rstd, k_rstd in
// place of fp32 qn and kn (grads5's RAW: copy_raw makes qn, kn's bits in the stage): the same outputs, bit for
// bit, where qn, kn are gdn_l2norm_fwd's rows of the same q, k. The other arguments are mma6's / mma8's.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
gdn_chunk_grads_mma6r(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k, int qk_stride,
                      const __nv_bfloat16* __restrict__ v, int v_stride, const float* __restrict__ gcum,
                      const float* __restrict__ beta, const float* __restrict__ h_state, const float* __restrict__ vnewp,
                      const float* __restrict__ d_chunk, const float* __restrict__ dvnewp, GDNKCP_GRADS5_OUT_PARAMS) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	grads5<true, true, false, true>(smem, reinterpret_cast<const float*>(q), reinterpret_cast<const float*>(k), v, v_stride,
	                                gcum, beta, h_state, vnewp, d_chunk, dvnewp, GDNKCP_GRADS5_OUT_ARGS, qk_stride);
}

extern "C" __global__ void __launch_bounds__(kThreads, 1)
gdn_chunk_grads_mma8r(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k, int qk_stride,
                      const __nv_bfloat16* __restrict__ v, int v_stride, const float* __restrict__ gcum,
                      const float* __restrict__ beta, const __nv_bfloat16* __restrict__ h16,
                      const __nv_bfloat16* __restrict__ vnew16, const __nv_bfloat16* __restrict__ d16,
                      const __nv_bfloat16* __restrict__ dvnew16, GDNKCP_GRADS5_OUT_PARAMS) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	grads5<true, false, true, true>(smem, reinterpret_cast<const float*>(q), reinterpret_cast<const float*>(k), v, v_stride,
	                                gcum, beta, reinterpret_cast<const float*>(h16), reinterpret_cast<const float*>(vnew16),
	                                reinterpret_cast<const float*>(d16), reinterpret_cast<const float*>(dvnew16),
	                                GDNKCP_GRADS5_OUT_ARGS, qk_stride);
}

}  // namespace gradmma
}  // namespace gdnkcp
