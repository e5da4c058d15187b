// gdn_walk_mma.cu (checked on the CPU emulator and on the H200; docs/perf-notes.md has its times): the
// summary and state walks on mma.sync m16n8k16 (bf16 in, fp32 accumulate), v4 of the walk. Same
// arguments, grids and outputs as gdn_summary_walk / gdn_state_walk of gdn_fwd.cu (block 256):
//   gdn_summary_walk_mma   grid (2*128/vh, nlist, HV)   walk_mma_smem(vh)
//   gdn_state_walk_mma     grid (128/vh, NS, HV)        walk_mma_smem(vh)
//   gdn_state_walk_mma16   grid (128/vh, NS, HV)        walk_mma_smem(vh)   v5 (section at the end): Kt
//   gdn_summary_walk_mma16 grid (2*128/vh, nlist, HV)   walk_mma_smem(vh)   rebuilt from kn and gcum; the state
//                                                                           walk adds bf16 H^T, V'^T
// walk_mma_smem(vh) = 196608 + 256*(vh+4) bytes, plus 16384 at vh 64 for the key-split exchange EX
// (230400 at vh 64, 230400 at vh 128).
//
// ---- The data flow: the state never leaves the registers -------------------------------------------
// A warp owns 16 state columns and all 128 keys of them; it keeps the TRANSPOSED state S^T (16 x 128,
// m = column, n = key) as 16 accumulator tiles of m16n8 (64 fp32 registers a lane) for the whole walk.
// Per chunk (W, Kt: 64 x 128 fp32 rows; U: 64 x vh; rows past a short chunk's end are zero):
//   (1) V'^T = U^T + S^T (-W)^T    A = S^T (m = column, k = key): the accumulator tiles of S^T ARE the
//                                  A fragments (tile 2kk gives a[0], a[1], tile 2kk+1 a[2], a[3]; the
//                                  m16n8 C layout of two adjacent n-tiles is the m16k16 A layout), split
//                                  to bf16 hi/lo in registers; B = (-W)^T (k = key, n = token), i.e. the
//                                  rows of -W: ldmatrix.x4 (not transposed) of the bf16 copies in shared
//                                  memory. C starts as U^T, read as fp32 from the U stage (exact).
//   (2) S^T = e^gl S^T + V'^T Kt   A = V'^T (m = column, k = token): again the accumulator tiles of (1)
//                                  as A fragments, split in registers; B = Kt (k = token, n = key): rows
//                                  of Kt, ldmatrix.x4.trans of the bf16 copies.
// No warp ever needs another warp's columns, so the chunk needs no barrier between (1) and (2), and
// V' never goes to shared memory. Every product of two fp32 quantities runs as three bf16 products of
// hi/lo splits, x = hi + lo (hi = rn(x), lo = rn(x - hi)): a b ~ ah bh + ah bl + al bh, in that order,
// per 16-wide k step, k steps ascending.
// vh 128: warps 0-7 own columns 16w..16w+15 of the tile. vh 64: warps 0-3 own them and warps 4-7
// only copy and convert (they hold no state): every 16-column tile runs the same instructions on the
// same operands in both forms, so vh 64 and vh 128 give the same bits (the tensor core computes each
// D element from its own A row, B column and C element). No atomics; no value crosses columns.
//
// ---- The stages: one __syncthreads per chunk ---------------------------------------------------------
//   R     fp32 W and Kt of the NEXT chunk as cp.async copied them ([2][64][128], 64 KB). Each 16-byte
//         unit is copied and later read by the same thread, so it needs no barrier: the thread's
//         cp.async.wait_group makes its own copies visible to itself.
//   X[2]  bf16 hi/lo of -W and Kt ([4][64][128] each, 64 KB a stage; 16-byte units XOR-swizzled by
//         row % 8 so the 8 rows of an ldmatrix 8x8 fall in different banks without padding).
//   UR    fp32 U of the next chunk, [64][vh+4]: each warp copies and reads only its own 16 columns
//         (cp.async, wait, then __syncwarp so that every lane sees the others' copies).
// Chunk ci of the segment,     __syncthreads                  X[x] complete; everyone done with X[1-x],
// stage x = ci % 2:                                           with R and with UR
//                              issue chunk ci+1's cp.async into R and UR
//                              [state walk: store H(ci) from the registers]
//                              (1), [state walk: store V'], (2) from X[x] and the registers
//                              wait for chunk ci+1's copies, convert own R units -> X[1-x] (zero rows
//                              past n, -W), __syncwarp, U(ci+1) -> the V' accumulators, gamma_last(ci+1)
// So the copies of chunk ci+1 have the compute of chunk ci to land, the conversion of chunk ci+1
// overlaps the other warps' compute of chunk ci, and a chunk costs one block barrier and one warp
// barrier. Shared memory: 2 x 64 KB (X) + 64 KB (R) + 256 (vh+4) (UR).
//
// ---- Precision --------------------------------------------------------------------------------------
// bf16 keeps 8 significant bits (unit roundoff 2^-8); hi + lo keeps about 16 (|x - hi - lo| <= 2^-16
// |x|). Dropping al bl and the two residuals leaves at most ~3 * 2^-16 |a||b| per product term, random
// in sign. U enters as the fp32 accumulator (exact, no split); e^gamma_last multiplies in fp32. W and Kt
// are split by the same function as the state: doing it once per chunk into shared memory (X) instead
// of in each warp's registers gives the same bits and an eighth of the split work. Measured on the
// emulator (TestMMAWalksOnCPU, segments of 1..200 tokens, non-zero start states; normwise relative error
// against internal/gdnref in float64 fed the same fp32 W, U, Kt, gamma): final states 2.1e-6, chunk
// states 8.4e-7, V' 6.0e-7, P 2.8e-7, Q 4.6e-6 (the test allows 3e-5). Without the lo parts of W and Kt
// (bf16 hi alone, one product fewer per term) it is 7.7e-4 final, 1.7e-3 Q; without those of S and V',
// 7.6e-4 / 1.7e-3: both far beyond the 1e-4 that issue 5 allows, so all three products stay.
//
// ---- Cost per chunk and CTA, predicted for an H200 (132 SMs, ~1 PFLOP/s dense bf16, ~4 TB/s) --------
// Tensor FLOPs: (1) 2*64*128*vh and (2) 2*128*64*vh, each three times (hi/lo): 98304 vh = 12.6 MFLOP at
// vh 128 (3072 mma.sync), 6.3 MFLOP at vh 64 (1536); a third of that is the math itself.
// Global bytes: W, Kt 64 KB, U 256 vh (32 / 16 KB); the state walk also writes H (512 vh: 64 / 32 KB)
// and V' (256 vh). Shared-memory traffic: every state warp reads all of -W and Kt as hi + lo (64 KB a
// warp: 128 ldmatrix.x4), 512 KB at vh 128, 256 KB at vh 64, plus the copy/convert passes (cp.async
// writes 64 KB + 256 vh, R reads 64 KB, X writes 64 KB, U reads 256 vh): ~770 KB / ~480 KB.
// Barriers: 1 __syncthreads + 1 __syncwarp (v3: 8 __syncthreads).
// At 128 B/clk of shared-memory bandwidth an SM needs ~6100 clk (vh 128) / ~3800 clk (vh 64) per chunk
// for that traffic; the tensor cores need 3072 / 1536 m16n8k16 at ~1 per clock per SM at the dense
// peak, ~1.6x that at mma.sync's rate on Hopper (~60% of peak): ~5000 / ~2500 clk. So the walk is bound
// by shared memory (m = 16 per warp: each B fragment serves only 16 state columns), with the tensor
// cores close behind at vh 128. Predicted at ~1.8 GHz: ~3.3 us a chunk at vh 128, ~2.1 us at vh 64, for
// one CTA on its SM (v3: 16 us). At 32K tokens (96 CTAs of vh 64, 512 chunks each) the state walk also
// moves ~192 KB of unique HBM traffic per chunk and head (W, Kt, U read once from DRAM, the sibling
// CTA's copy from L2; H 64 KB and V' 32 KB written): 48 heads x 192 KB / ~4 TB/s = 2.3 us per chunk
// step, so there it is bound by HBM at ~2.3-2.5 us a chunk: state walk ~1.2-1.3 ms (v3 8.4 ms), a third
// of the bytes being the fp32 H stores that the ABI keeps (bf16 H for the output would save it).
// Registers (estimate): S^T 64 + V'^T 32 + A hi/lo 8 + B hi/lo 8 + ~25 addresses and indices: ~140 a
// thread (~170 if ptxas hoists the splits of a whole k loop), below the 255 of __launch_bounds__(256) at
// one CTA per SM (the shared memory allows only one anyway): no spills expected. Every register array is
// indexed by constants after unrolling, and every Walker method is forced inline.
//
// ---- Key split (the forward walks, Walker<..., KS = true>), 2026-12-01 -----------------------------
// Measured on the H200 the single-chain walk took 7.6 us a chunk at vh 64 (3.9 ms at 32K), not ~2.1:
// with four state warps each SM sub-partition had one warp issuing a 384-mma chain (tensor pipe 14% busy,
// warps stalled on barrier / fixed-latency waits / shared-memory loads, ncu). Now (1) runs as two chains,
// keys 0-63 onto U^T and keys 64-127 from zero, V'^T = acc0 + acc1 (one fp32 add), the same at both
// widths. vh 64: warp w holds columns 16 (w % 4).. and keys 64 (w / 4).. of S^T (32 registers), so all
// eight warps hold state: each runs its half of (1) (96 mma), the key-64 warp posts its partial to EX
// [column group][32 regs][32 lanes] (16 KB, conflict-free), named barrier 1 + (w % 4) for the pair's 64
// threads, the key-0 warp adds and posts the sum, the barrier again, the other reads it: both hold all of
// V'^T and run (2) on their own keys (96 mma). vh 128: each warp runs both chains and adds them; the
// forward walks park the first chain's sums in the warp's own U columns of UR (free between land and the
// next chunk's U copies, which these walks therefore issue after (1)), so the second runs in v; BWalker,
// without a free stage, holds it in v2. Parking took ptxas 11.8's sm_90 count for gdn_state_walk_mma
// from 254 to 184 registers and gdn_state_walk_mma16 from 248 to 228.
// (2) is untouched (each S^T element's chain is the same at both widths), and every output stays bitwise
// equal between the widths and between the Kt-reading and the kn-reading (v5) entries. V' stores are
// split between the pair's warps by token halves. EX is reused every chunk: a warp's next post follows
// the next __syncthreads, which its partner reaches only after reading. The backward walks (BWalker,
// gdn_bwalk_mma.cu) take the same split. ptxas 11.8, sm_90: every walk entry 214-254 registers, no
// spill; ptxas 13.0 spills the two state walks on the Blackwell targets (ptx/manifest_test.go).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gdn_fwd.cu"
#include "gdn_walk_wgmma.cu"
#include "mma.cuh"

// GDNKCP_WALK_PG128: how many B fragment pairs rows_all / update load at once at vh 128. ptxas 13.0 keeps
// the summary walks spill-free on Blackwell only with 1 (8 bytes with 2); Hopper takes 2.
#ifndef GDNKCP_WALK_PG128
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define GDNKCP_WALK_PG128 1
#else
#define GDNKCP_WALK_PG128 2
#endif
#endif

namespace gdnkcp {
namespace walkmma {

using tc::bf16;
constexpr int kD = fwd::kD, kC = fwd::kC, kThreads = fwd::kThreads;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = kC * kD;  // elements of one [64][128] array
constexpr int kEx = 4 * 32 * 32 * 4;  // bytes of the key-split exchange (vh 64): 4 column groups x 32 lanes x 32 fp32
static_assert(kThreads == 256 && kD == 128 && kC == 64, "the fragment bookkeeping below assumes these");

__host__ __device__ constexpr int walk_mma_smem(int vh) {
	return 2 * 4 * kTile * 2 + 2 * kTile * 4 + kC * (vh + 4) * 4 + (vh == 64 ? kEx : 0);
}

// swz: the element offset of (row, col) in a swizzled [64][128] bf16 array: the 16-byte unit col / 8
// of a row is stored at unit (col / 8) ^ (row % 8).
__device__ __forceinline__ int swz(int row, int col) { return row * kD + (((col >> 3) ^ (row & 7)) << 3) + (col & 7); }

// ctaid_y, ctaid_z: blockIdx.y and .z read afresh (volatile asm, never merged with an earlier read), so
// that the address of the final store is computed after the walk instead of being held in registers
// across it: at 255 registers that held offset was the state walk's one spill (8 bytes, ptxas 11.8).
__device__ __forceinline__ int ctaid_y() {
#if defined(GDNKCP_CPU_EMULATOR)
	return blockIdx.y;
#else
	unsigned r;
	asm volatile("mov.u32 %0, %%ctaid.y;\n" : "=r"(r));
	return static_cast<int>(r);
#endif
}
__device__ __forceinline__ int ctaid_z() {
#if defined(GDNKCP_CPU_EMULATOR)
	return blockIdx.z;
#else
	unsigned r;
	asm volatile("mov.u32 %0, %%ctaid.z;\n" : "=r"(r));
	return static_cast<int>(r);
#endif
}

struct alignas(8) U32x2 {
	unsigned x, y;
};

// KN (gdn_summary_walk_mma16, gdn_state_walk_mma16): the kt argument of issue / land / walk is kn
// [T, HQK, 128] (value head h reads QK head h / (HV / HQK)) and land rebuilds Kt from it, row i of the
// chunk times e^(gcum[t0 + n - 1] - gcum[t0 + i]): gdn_prep_mma's (and gdn_prep_fwd's) fp32 Kt
// expression, so the rebuilt rows are the bits those preps write (see the section at the end).
// KN = false (the v4 entries, BWalker) compiles to the code the Walker had before the flag existed
// (same SASS, sm_90 and sm_80). The flag is tested with a plain `if (KN)`: with `if constexpr` in land's
// unrolled loop nvcc 11.8 stopped unrolling v4's conversion loop.
// KS (every walk: the forward walks and BWalker): product (1) runs as two chains, keys 0-63 onto U^T and keys 64-127 from zero,
// added at the end (V'^T = acc0 + acc1; see "Key split" at the end of this header comment). At vh 64 the
// two chains of a column group run on two warps (warp w: columns 16 (w % 4).., keys 64 (w / 4)..), so all
// eight warps hold state and multiply; at vh 128 each warp runs both chains itself (v and v2). KS = false
// is the single chain over all 128 keys, with warps 4-7 idle at vh 64 (no entry uses it any more).
template <int VH, bool KN = false, bool KS = false>
struct Walker {
	static constexpr int kCW = VH / 16;                    // column groups of 16 state columns
	static constexpr int kSplit = (KS && VH == 64) ? 2 : 1;  // warps a column group (key halves)
	static constexpr int kNT = 16 / kSplit;                // key n-tiles of 8 a warp holds
	static constexpr bool kTwoChains = KS && VH == 128;    // one warp runs both halves of (1)
	// kPG: B fragments loaded at once (pairs of n-tiles); fewer at vh 128, whose accumulators fill the
	// registers (GDNKCP_WALK_PG128: 2 on Hopper, 1 on Blackwell, where ptxas allocates differently).
	static constexpr int kPG = kTwoChains ? GDNKCP_WALK_PG128 : 4;
	static constexpr bool kDeferU = kTwoChains;            // U copies after (1): UR is (1)'s scratch (mma_rows)
	static constexpr int kLU = VH + 4;                     // padded fp32 row of the U stage (conflict-free C loads)
	bf16* X;                                               // [2][4][kTile]: -W hi, -W lo, Kt hi, Kt lo (swizzled)
	float* R;                                              // [2][kTile]: W, Kt of the next chunk as copied
	float* UR;                                             // [64][kLU]: U columns [c0, c0 + VH) of the next chunk
	float* EX;                                             // kSplit 2: [4 column groups][32 regs][32 lanes]
	int lane, warp, g, t;
	int cw, kh;             // column group (columns 16 cw..) and key half (keys 64 kh.., kSplit 2 only)
	float s[kNT][4];        // S^T: columns 16 cw + (g, g+8) x keys 64 kh + 8 nt + (2t, 2t+1)
	float v[8][4];          // V'^T (U^T before (1)): the same columns x tokens 8 nt + (2t, 2t+1)
	float v2[8][4];         // kTwoChains: the chain of keys 64-127 in (1) (otherwise unused, no registers)
	float gl;               // gamma_last of the chunk whose U is in v
	// KN at vh 64 (kPrefetchK; vh 128 has no registers to spare): the next chunk's gamma_last and one Kt
	// row factor a lane (row warp + 8 (lane % 8)), computed a chunk ahead by prefetch_factors; land
	// takes row warp + 8k's from lane k with a shuffle (eight factors a lane spilled 16 bytes with
	// ptxas 13.0 on sm_90a).
	static constexpr bool kPrefetchK = KN && kSplit == 2;
	float ef, gln;

	__device__ __forceinline__ explicit Walker(float* smem) {
		X = reinterpret_cast<bf16*>(smem);
		R = smem + 2 * 4 * kTile / 2;
		UR = R + 2 * kTile;
		EX = UR + kC * kLU;
		lane = threadIdx.x % 32;
		warp = threadIdx.x / 32;
		g = lane / 4;
		t = lane % 4;
		cw = warp % kCW;
		kh = kSplit == 2 ? warp / kCW : 0;
	}

	__device__ __forceinline__ bool holds() const { return warp < kCW * kSplit; }

	// init_state sets S^T from global fp32 rows of 128 (src, columns c0..), or to the identity's
	// columns c0.. (identity), or to zero.
	__device__ __forceinline__ void init_state(const float* src, bool identity, int c0) {
#pragma unroll
		for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
			for (int r = 0; r < 4; ++r) {
				const int key = 64 * kh + 8 * nt + 2 * t + (r & 1), col = c0 + 16 * cw + g + 8 * (r >> 1);
				if (src != nullptr)
					s[nt][r] = holds() ? src[key * kD + col] : 0.f;
				else
					s[nt][r] = (identity && key == col) ? 1.f : 0.f;
			}
		}
	}

	// store_state writes S (fp32 rows of 128, columns c0..) from the registers.
	__device__ __forceinline__ void store_state(float* dst, int c0) const {
		if (!holds()) return;
		float* base = dst + (64 * kh + 2 * t) * kD + c0 + 16 * cw + g;  // constant offsets below
#pragma unroll
		for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
			for (int r = 0; r < 4; ++r) base[(8 * nt + (r & 1)) * kD + 8 * (r >> 1)] = s[nt][r];
		}
	}

	// issue starts the copies of chunk (t0, n): this thread's 16-byte units of W and Kt (rows warp +
	// 8 x, unit lane) into R and, when u is set, this warp's 16 U columns into UR; one commit group.
	// KN: kt is kn [T, HQK, 128] and the Kt rows are copied from kn's QK head qh = h / (HV / HQK).
	__device__ __forceinline__ void issue(const float* w, const float* u, const float* kt, int t0, int n, int h, int HV,
	                                      int c0, int HQK = 0, int qh = 0, bool withU = true) {
#pragma unroll
		for (int x = 0; x < 16; ++x) {
			const int a = x / 8, i = warp + 8 * (x % 8);
			if (KN) {
				if (i < n)
					tc::cp_async16(R + a * kTile + i * kD + 4 * lane,
					               (a ? kt + ((long long)(t0 + i) * HQK + qh) * kD
					                  : w + ((long long)(t0 + i) * HV + h) * kD) +
					                   4 * lane);
			} else {
				if (i < n)
					tc::cp_async16(R + a * kTile + i * kD + 4 * lane, (a ? kt : w) + ((long long)(t0 + i) * HV + h) * kD + 4 * lane);
			}
		}
		if (withU) issue_u(u, t0, n, h, HV, c0);
		tc::cp_async_commit();
	}

	// prefetch_factors (KN) reads, a chunk ahead, what land needs to rebuild Kt: gamma_last of chunk
	// (t0, n) and the factor e^(gamma_last - gcum[t0 + i]) of row i = warp + 8 (lane % 8) (rows past n
	// take row n - 1's, any finite factor: their kn is zero), the expression land used to evaluate itself,
	// so the rebuilt Kt keeps its bits while its global loads and expf leave the chunk's critical path.
	__device__ __forceinline__ void prefetch_factors(const float* gcum, int t0, int n, int h, int HV) {
		gln = gcum[(long long)(t0 + n - 1) * HV + h];
		const int i = warp + 8 * (lane % 8), ir = i < n ? i : n - 1;
		ef = expf(gln - gcum[(long long)(t0 + ir) * HV + h]);
	}

	// issue_u starts the copies of this warp's 16 U columns of chunk (t0, n) into UR (no commit).
	__device__ __forceinline__ void issue_u(const float* u, int t0, int n, int h, int HV, int c0) {
		if (u != nullptr && holds() && kh == 0) {
#pragma unroll
			for (int y = 0; y < 8; ++y) {
				const int q = lane + 32 * y, i = q / 4, col = 16 * cw + 4 * (q % 4);
				if (i < n) tc::cp_async16(UR + i * kLU + col, u + ((long long)(t0 + i) * HV + h) * kD + c0 + col);
			}
		}
	}

	// land waits for this thread's copies of chunk (t0, n), converts its units of R into stage x of X
	// (-W and Kt as bf16 hi/lo, zero rows from n on), loads U^T (zero past n) into the V'
	// accumulators and reads gamma_last. R and UR may be refilled after the next __syncthreads.
	// KN: R holds kn rows; each is multiplied by its factor e^(gamma_last - gcum[t0 + i]) (at vh 64
	// computed a chunk ahead by prefetch_factors, one a lane, and shuffled in; at vh 128 read here)
	// before the split: kn_i * e as one rounded fp32 product (__fmul_rn, never fused with the split's
	// subtraction), exactly the Kt element the prep stores.
	__device__ __forceinline__ void land(int x, const float* u, const float* gcum, int t0, int n, int h, int HV) {
		// The global loads first, before the wait (their latency passes under the conversion): gamma_last
		// and, KN at vh 128, the gcum of the thread's Kt rows warp + 8k (rows past n: row n - 1's).
		gl = KN && kPrefetchK ? gln : gcum[(long long)(t0 + n - 1) * HV + h];
		float gk[8];
#pragma unroll
		for (int k = 0; k < 8; ++k) {
			const int i = warp + 8 * k, ir = i < n ? i : n - 1;
			gk[k] = KN && !kPrefetchK ? gcum[(long long)(t0 + ir) * HV + h] : 0.f;
		}
		tc::cp_async_wait<0>();
		bf16* xs = X + x * 4 * kTile;
#pragma unroll
		for (int y = 0; y < 16; ++y) {
			const int a = y / 8, i = warp + 8 * (y % 8);
			float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
			if (i < n) f = *reinterpret_cast<const float4*>(R + a * kTile + i * kD + 4 * lane);
			if (KN && a == 1) {  // gdn_prep_mma P1: k * expf(glast - gam[i]), glast = gam[n - 1]
				// Rows past n: f = 0, and any finite factor (row n - 1's) keeps +0. kPrefetchK: lane y % 8
				// computed the same expression for row i = warp + 8 (y % 8) (land runs on whole warps: the
				// shuffle's lanes all take part).
				const float e = kPrefetchK ? __shfl_sync(0xffffffffu, ef, y % 8) : expf(gl - gk[y % 8]);
				f = make_float4(__fmul_rn(f.x, e), __fmul_rn(f.y, e), __fmul_rn(f.z, e), __fmul_rn(f.w, e));
			}
			const float sg = a ? 1.f : -1.f;  // -W: the sign is exact in the split
			U32x2 hi, lo;
			tc::split_bf16x2(sg * f.x, sg * f.y, hi.x, lo.x);
			tc::split_bf16x2(sg * f.z, sg * f.w, hi.y, lo.y);
			const int e = swz(i, 4 * lane);
			*reinterpret_cast<U32x2*>(xs + (2 * a) * kTile + e) = hi;
			*reinterpret_cast<U32x2*>(xs + (2 * a + 1) * kTile + e) = lo;
		}
		if (!holds()) return;
		__syncwarp();  // the warp's U copies, each visible to its own lane after the wait, to the warp
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
			for (int r = 0; r < 4; ++r) {
				const int i = 8 * nt + 2 * t + (r & 1);
				v[nt][r] = (u != nullptr && kh == 0 && i < n) ? UR[i * kLU + 16 * cw + g + 8 * (r >> 1)] : 0.f;
				if (kTwoChains) v2[nt][r] = 0.f;
			}
		}
	}

	// rows_step adds key tile kg (keys 16 kg ..; the warp's tiles s[2 kl], s[2 kl + 1]) of S^T B^T to acc:
	// A = those tiles split to hi/lo in registers, B = the rows of the bf16 hi/lo pair at Bh (Bh + kTile
	// holds the lo parts; swizzled, ldmatrix not transposed), hi*hi + hi*lo + lo*hi; token blocks of 16
	// from n on skipped (they stay as they are).
	__device__ __forceinline__ void rows_step(float (&acc)[8][4], const bf16* Bh, int kl, int kg, int n) {
		const bf16* Bl = Bh + kTile;
		const int brow = (lane & 7) + 8 * (lane >> 4), bcol = 8 * ((lane >> 3) & 1);
		unsigned ah[4], al[4];
		tc::split_bf16x2(s[2 * kl][0], s[2 * kl][1], ah[0], al[0]);
		tc::split_bf16x2(s[2 * kl][2], s[2 * kl][3], ah[1], al[1]);
		tc::split_bf16x2(s[2 * kl + 1][0], s[2 * kl + 1][1], ah[2], al[2]);
		tc::split_bf16x2(s[2 * kl + 1][2], s[2 * kl + 1][3], ah[3], al[3]);
#pragma unroll
		for (int p = 0; p < 4; ++p) {
			if (16 * p >= n) continue;
			const int e = swz(16 * p + brow, 16 * kg + bcol);
			unsigned bh[4], bl[4];
			tc::ldmatrix_x4(bh, Bh + e);  // b of token tile 2p in [0..1], of 2p+1 in [2..3]
			tc::ldmatrix_x4(bl, Bl + e);
#pragma unroll
			for (int q = 0; q < 2; ++q) {
				float* a = acc[2 * p + q];
				tc::mma_bf16_16816(a, ah, bh + 2 * q, a);
				tc::mma_bf16_16816(a, ah, bl + 2 * q, a);
				tc::mma_bf16_16816(a, al, bh + 2 * q, a);
			}
		}
	}

	// mma_group adds hi*hi, then hi*lo, then lo*hi to the 2 kPG accumulators acc[2 p0 ..] (A = ah / al,
	// B = bh[p] / bl[p], two n-tiles each): consecutive mma.sync are independent, and each accumulator
	// gets the three products in rows_step's order.
	template <int N>
	__device__ __forceinline__ void mma_group(float (&acc)[N][4], int p0, const unsigned (&ah)[4], const unsigned (&al)[4],
	                                          const unsigned (&bh)[kPG][4], const unsigned (&bl)[kPG][4]) {
#pragma unroll
		for (int m = 0; m < 3; ++m) {
#pragma unroll
			for (int p = 0; p < kPG; ++p) {
#pragma unroll
				for (int q = 0; q < 2; ++q) {
					float* a = acc[2 * (p0 + p) + q];
					tc::mma_bf16_16816(a, m == 2 ? al : ah, (m == 1 ? bl[p] : bh[p]) + 2 * q, a);
				}
			}
		}
	}

	// rows_all is rows_step over all four token blocks (KS): rows from n on are zero in X (land writes
	// them so) and add nothing. The B fragments of kPG token blocks first, then the hi*hi products of
	// their 2 kPG accumulators, the hi*lo ones, the lo*hi ones: each accumulator's chain is rows_step's,
	// and no mma.sync waits on the one just before it.
	__device__ __forceinline__ void rows_all(float (&acc)[8][4], const bf16* Bh, int kl, int kg) {
		const bf16* Bl = Bh + kTile;
		const int brow = (lane & 7) + 8 * (lane >> 4), bcol = 8 * ((lane >> 3) & 1);
		unsigned ah[4], al[4];
		tc::split_bf16x2(s[2 * kl][0], s[2 * kl][1], ah[0], al[0]);
		tc::split_bf16x2(s[2 * kl][2], s[2 * kl][3], ah[1], al[1]);
		tc::split_bf16x2(s[2 * kl + 1][0], s[2 * kl + 1][1], ah[2], al[2]);
		tc::split_bf16x2(s[2 * kl + 1][2], s[2 * kl + 1][3], ah[3], al[3]);
#pragma unroll
		for (int p0 = 0; p0 < 4; p0 += kPG) {
			unsigned bh[kPG][4], bl[kPG][4];
#pragma unroll
			for (int p = 0; p < kPG; ++p) {
				const int e = swz(16 * (p0 + p) + brow, 16 * kg + bcol);
				tc::ldmatrix_x4(bh[p], Bh + e);  // b of token tile 2p in [0..1], of 2p+1 in [2..3]
				tc::ldmatrix_x4(bl[p], Bl + e);
			}
			mma_group<8>(acc, p0, ah, al, bh, bl);
		}
	}

	// mma_rows adds S^T B^T to the v accumulators (B = the rows at Bh, as in rows_step), k steps
	// ascending. The forward's V' and the backward's dV' both run it. KS: two chains, keys 0-63 onto v
	// and keys 64-127 from zero, then v = acc0 + acc1: at vh 64 the second chain is the other warp of the
	// column group, whose partial comes through EX (named barrier 1 + cw, the group's 64 threads): it
	// posts its chain, the first warp adds and posts the sum, the second reads it; at vh 128 it is v2.
	// SCRATCH (the forward walks at vh 128): instead of v2, the first chain's sums wait in this warp's
	// own U columns of UR (64 rows x 16 columns: 1024 floats, each lane rereading only what it wrote)
	// while the second chain runs in v; the walk then issues the next chunk's U copies only after (1)
	// (walk(): kDeferU). Same bits as the v2 form, 32 registers fewer.
	template <bool SCRATCH = false>
	__device__ __forceinline__ void mma_rows(const bf16* Bh, int n) {
		if (!KS) {
#pragma unroll
			for (int kk = 0; kk < 8; ++kk) rows_step(v, Bh, kk, kk, n);
		} else if (kTwoChains && SCRATCH) {
#pragma unroll
			for (int kk = 0; kk < 4; ++kk) rows_all(v, Bh, kk, kk);
			float* sc = UR + 16 * cw + (lane >> 4) * kLU + (lane & 15);  // slot i: row 2i + lane / 16
#pragma unroll
			for (int i = 0; i < 32; ++i) {
				sc[2 * i * kLU] = v[i / 4][i % 4];
				v[i / 4][i % 4] = 0.f;
			}
#pragma unroll
			for (int kk = 0; kk < 4; ++kk) rows_all(v, Bh, kk + 4, kk + 4);
#pragma unroll
			for (int i = 0; i < 32; ++i) v[i / 4][i % 4] = sc[2 * i * kLU] + v[i / 4][i % 4];
		} else if (kTwoChains) {
#pragma unroll
			for (int kk = 0; kk < 4; ++kk) {
				rows_all(v, Bh, kk, kk);
				rows_all(v2, Bh, kk + 4, kk + 4);
			}
#pragma unroll
			for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
				for (int r = 0; r < 4; ++r) v[nt][r] = v[nt][r] + v2[nt][r];
			}
		} else {
#pragma unroll
			for (int kk = 0; kk < 4; ++kk) rows_all(v, Bh, kk, 4 * kh + kk);
			float* ex = EX + cw * 1024 + lane;
			if (kh == 1) {
#pragma unroll
				for (int i = 0; i < 32; ++i) ex[32 * i] = v[i / 4][i % 4];
			}
			tc::bar_sync(1 + cw, 64);
			if (kh == 0) {
#pragma unroll
				for (int i = 0; i < 32; ++i) {
					v[i / 4][i % 4] = v[i / 4][i % 4] + ex[32 * i];
					ex[32 * i] = v[i / 4][i % 4];
				}
			}
			tc::bar_sync(1 + cw, 64);
			if (kh == 1) {
#pragma unroll
				for (int i = 0; i < 32; ++i) v[i / 4][i % 4] = ex[32 * i];
			}
		}
	}

	// vprime runs (1) on stage x: V'^T = U^T + S^T (-W)^T, token blocks of 16 from n on skipped
	// (they stay zero).
	__device__ __forceinline__ void vprime(int x, int n) { mma_rows<kTwoChains>(X + x * 4 * kTile, n); }

	// update runs (2) on stage x: S^T = e^gl S^T + V'^T Kt over all 64 tokens (rows from n on are zero).
	__device__ __forceinline__ void update(int x, int n) {
		const bf16* Kh = X + x * 4 * kTile + 2 * kTile;
		const bf16* Kl = Kh + kTile;
		const float decay = expf(gl);
#pragma unroll
		for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
			for (int r = 0; r < 4; ++r) s[nt][r] *= decay;
		}
		const int brow = (lane & 7) + 8 * ((lane >> 3) & 1), bcol = 8 * (lane >> 4);
		// All four token blocks (KS; rows from n on are zero in X and add nothing), the warp's key
		// tiles in groups of eight accumulators: B fragments first, then hi*hi, hi*lo, lo*hi over the
		// group, so that no mma.sync waits on the one before it (each chain as before).
#pragma unroll
		for (int j = 0; j < 4; ++j) {
			unsigned ah[4], al[4];
			tc::split_bf16x2(v[2 * j][0], v[2 * j][1], ah[0], al[0]);
			tc::split_bf16x2(v[2 * j][2], v[2 * j][3], ah[1], al[1]);
			tc::split_bf16x2(v[2 * j + 1][0], v[2 * j + 1][1], ah[2], al[2]);
			tc::split_bf16x2(v[2 * j + 1][2], v[2 * j + 1][3], ah[3], al[3]);
#pragma unroll
			for (int p0 = 0; p0 < kNT / 2; p0 += kPG) {
				unsigned bh[kPG][4], bl[kPG][4];
#pragma unroll
				for (int p = 0; p < kPG; ++p) {
					const int e = swz(16 * j + brow, 64 * kh + 16 * (p0 + p) + bcol);
					tc::ldmatrix_x4_trans(bh[p], Kh + e);  // b of key tile 2p in [0..1], of 2p+1 in [2..3]
					tc::ldmatrix_x4_trans(bl[p], Kl + e);
				}
				mma_group<kNT>(s, p0, ah, al, bh, bl);
			}
		}
		(void)n;
	}

	// store_vprime writes V' rows [0, n) of the chunk (fp32 [T, HV, 128], columns c0..).
	__device__ __forceinline__ void store_vprime(float* vnew, int t0, int n, int h, int HV, int c0) const {
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
			if (kSplit == 2 && nt / 4 != kh) continue;  // both warps hold V'^T: each stores half the tokens
#pragma unroll
			for (int r = 0; r < 4; ++r) {
				const int i = 8 * nt + 2 * t + (r & 1);
				if (i < n) vnew[((long long)(t0 + i) * HV + h) * kD + c0 + 16 * cw + g + 8 * (r >> 1)] = v[nt][r];
			}
		}
	}

	// store_state16 writes S^T as bf16 (round to nearest even) into dst, one chunk's [128 (column)]
	// [128 (key)] block of h16: keys 8 nt + 2t, 2t+1 of a column are this lane's s[nt][0..1] (column g) and
	// s[nt][2..3] (column g + 8); the quad exchanges one word a tile pair (tc::quad_pair16) and each lane
	// stores 8 bytes, so a warp's store covers 8 rows of 32 bytes (whole sectors).
	__device__ __forceinline__ void store_state16(bf16* dst, int c0) const {
		if (!holds()) return;
		static_assert(kNT % 2 == 0, "store_state16 pairs the key tiles");
		bf16* base = dst + (c0 + 16 * cw + g) * kD + 64 * kh + tc::quad_pair16_key(t);  // constant offsets below
#pragma unroll
		for (int q = 0; q < kNT / 2; ++q) {
#pragma unroll
			for (int hf = 0; hf < 2; ++hf)
				*reinterpret_cast<uint2*>(base + 8 * hf * kD + 16 * q) =
				    tc::quad_pair16(tc::pack_bf16x2(s[2 * q][2 * hf], s[2 * q][2 * hf + 1]),
				                    tc::pack_bf16x2(s[2 * q + 1][2 * hf], s[2 * q + 1][2 * hf + 1]), t);
		}
	}

	// store_vprime_slots writes V'^T (the tape walk: dV'^T) of the chunk as one token-slot block at dst
	// (WGWalker::store_vprime_slots' layout and values; row f = c0 + 16 cw + g + 8 hf, f % 8 = g).
	__device__ __forceinline__ void store_vprime_slots(float* dst, int n, int c0) const {
		float* base = dst + (c0 + 16 * cw + g) * kC + 2 * t;
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
			if (kSplit == 2 && nt / 4 != kh) continue;  // both warps hold V'^T: each stores half the tokens
#pragma unroll
			for (int hf = 0; hf < 2; ++hf) {
				const int i = 8 * nt + 2 * t;
				const float a = i < n ? v[nt][2 * hf] : 0.f, b = i + 1 < n ? v[nt][2 * hf + 1] : 0.f;
				*reinterpret_cast<float2*>(base + 8 * hf * kC + 8 * (nt ^ (g >> 1))) = make_float2(a, b);
			}
		}
	}

	// store_vprime16 writes V'^T as bf16 into dst, one chunk's [128 (column)][64 (token)] block of
	// vnew16, tokens from n on as 0: packed 4-byte stores of tokens 2t, 2t+1 as in store_state16.
	__device__ __forceinline__ void store_vprime16(bf16* dst, int n, int c0) const {
		bf16* base = dst + (c0 + 16 * cw + g) * kC + 2 * t;  // constant offsets below
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
			if (kSplit == 2 && nt / 4 != kh) continue;
#pragma unroll
			for (int hf = 0; hf < 2; ++hf) {
				const int i = 8 * nt + 2 * t;
				const float a = i < n ? v[nt][2 * hf] : 0.f, b = i + 1 < n ? v[nt][2 * hf + 1] : 0.f;
				*reinterpret_cast<unsigned*>(base + 8 * hf * kC + 8 * nt) = tc::pack_bf16x2(a, b);
			}
		}
	}

	// walk runs the chunks [ch0, ch0 + nch) from the state in the registers; with h_out set (the state
	// walk) it writes each chunk's start state and V'; with h16 / vnew16 set (gdn_state_walk_mma16)
	// also their bf16 copies for the output, H^T and V'^T, each where set. The arithmetic does not
	// depend on which outputs are set: the fp32 results are the same bits, and the entries that pass
	// no bf16 pointers compile to the code they had before these stores existed. KN: kt is kn with
	// HQK QK heads (Kt rebuilt in land, the same bits).
	__device__ __forceinline__ void walk(const float* w, const float* u, const float* kt, const float* gcum,
	                                     const int* chunk_tok0, const int* chunk_len, int ch0, int nch, int h, int HV,
	                                     int c0, float* h_out, float* vnew, bf16* h16 = nullptr,
	                                     bf16* vnew16 = nullptr, int HQK = 0) {
		if (nch <= 0) return;
		const int qh = KN ? h / (HV / HQK) : 0;
		issue(w, u, kt, chunk_tok0[ch0], chunk_len[ch0], h, HV, c0, HQK, qh);
		if (kPrefetchK) prefetch_factors(gcum, chunk_tok0[ch0], chunk_len[ch0], h, HV);
		land(0, u, gcum, chunk_tok0[ch0], chunk_len[ch0], h, HV);
		for (int ci = 0; ci < nch; ++ci) {
			const int c = ch0 + ci, x = ci & 1, n = chunk_len[c];
			// Stage x converted by every thread; every warp done with stage 1 - x; every thread done
			// reading R and UR (its land of chunk c), so the copies of chunk c + 1 may start.
			__syncthreads();
			if (ci + 1 < nch) {
				issue(w, u, kt, chunk_tok0[c + 1], chunk_len[c + 1], h, HV, c0, HQK, qh, !kDeferU);
				if (kPrefetchK) prefetch_factors(gcum, chunk_tok0[c + 1], chunk_len[c + 1], h, HV);
			}
			if (holds()) {
				const long long blk = (long long)c * HV + h;
				if (h_out != nullptr) store_state(h_out + blk * kD * kD, c0);
				if (h16 != nullptr) store_state16(h16 + blk * kD * kD, c0);
				vprime(x, n);
				if (kDeferU && ci + 1 < nch) {  // the scratch in UR is read: the next chunk's U may land there
					__syncwarp();
					issue_u(u, chunk_tok0[c + 1], chunk_len[c + 1], h, HV, c0);
					tc::cp_async_commit();
				}
				if (vnew != nullptr) store_vprime(vnew, chunk_tok0[c], n, h, HV, c0);
				if (vnew16 != nullptr) store_vprime16(vnew16 + blk * kD * kC, n, c0);
				update(x, n);
			}
			if (ci + 1 < nch) land(1 - x, u, gcum, chunk_tok0[c + 1], chunk_len[c + 1], h, HV);
		}
	}
};

// summary_walk_mma: KN (gdn_summary_walk_mma16) reads kn with HQK QK heads in place of kt.
template <int VH, bool KN = false>
__device__ __forceinline__ void summary_walk_mma(float* smem, const float* w, const float* u, const float* kt,
                                                 const float* gcum, const int* chunk_tok0, const int* chunk_len,
                                                 const int* seg_chunk0, const int* seg_nchunk, const int* list,
                                                 float* out_p, float* out_q, int HV, int HQK = 0) {
	Walker<VH, KN, true> wk(smem);
	const int tiles = kD / VH;
	const bool isP = blockIdx.x >= tiles;
	const int c0 = (isP ? blockIdx.x - tiles : blockIdx.x) * VH;
	const int li = blockIdx.y, h = blockIdx.z, seg = list[li];
	wk.init_state(nullptr, isP, c0);
	wk.walk(w, isP ? nullptr : u, kt, gcum, chunk_tok0, chunk_len, seg_chunk0[seg], seg_nchunk[seg], h, HV, c0,
	        nullptr, nullptr, nullptr, nullptr, HQK);
	wk.store_state((isP ? out_p : out_q) + ((long long)ctaid_y() * HV + ctaid_z()) * kD * kD, c0);
}

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_summary_walk_mma(const float* __restrict__ w, const float* __restrict__ u, const float* __restrict__ kt,
                     const float* __restrict__ gcum, const int* __restrict__ chunk_tok0,
                     const int* __restrict__ chunk_len, const int* __restrict__ seg_chunk0,
                     const int* __restrict__ seg_nchunk, const int* __restrict__ list,
                     float* __restrict__ out_p, float* __restrict__ out_q, int HV, int vh) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	if (vh == 64)
		summary_walk_mma<64>(smem, w, u, kt, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list, out_p, out_q, HV);
	else
		summary_walk_mma<128>(smem, w, u, kt, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list, out_p, out_q, HV);
}

template <int VH>
__device__ __forceinline__ void state_walk_mma(float* smem, const float* w, const float* u, const float* kt,
                                               const float* gcum, const int* chunk_tok0, const int* chunk_len,
                                               const int* seg_chunk0, const int* seg_nchunk, const float* start,
                                               float* h_out, float* vnew, float* final_state, int HV) {
	Walker<VH, false, true> wk(smem);
	const int c0 = blockIdx.x * VH, seg = blockIdx.y, h = blockIdx.z;
	wk.init_state(start + ((long long)seg * HV + h) * kD * kD, false, c0);
	wk.walk(w, u, kt, gcum, chunk_tok0, chunk_len, seg_chunk0[seg], seg_nchunk[seg], h, HV, c0, h_out, vnew);
	wk.store_state(final_state + ((long long)ctaid_y() * HV + ctaid_z()) * kD * kD, c0);
}

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_state_walk_mma(const float* __restrict__ w, const float* __restrict__ u, const float* __restrict__ kt,
                   const float* __restrict__ gcum, const int* __restrict__ chunk_tok0,
                   const int* __restrict__ chunk_len, const int* __restrict__ seg_chunk0,
                   const int* __restrict__ seg_nchunk, const float* __restrict__ start,
                   float* __restrict__ h_out, float* __restrict__ vnew, float* __restrict__ final_state,
                   int HV, int vh) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	if (vh == 64)
		state_walk_mma<64>(smem, w, u, kt, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start, h_out, vnew,
		                   final_state, HV);
	else
		state_walk_mma<128>(smem, w, u, kt, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start, h_out, vnew,
		                    final_state, HV);
}

// ---- v5: gdn_state_walk_mma16 (bf16 H^T, V'^T for the output) and gdn_summary_walk_mma16 -------------
// Both read kn [T, HQK, 128] (value head h: QK head h / (HV / HQK)) and gcum in place of the prep's
// per-value-head Kt [T, HV, 128], and rebuild Kt in land (Walker<VH, true, true>):
//   Kt_i = kn_i * expf(gcum[t0 + n - 1] - gcum[t0 + i])   (fp32; one rounded product, __fmul_rn)
// gdn_prep_mma's P1 expression on the same fp32 operands (glast = gam[n - 1] and gam[i] are the values
// it writes to gcum; gdn_prep_fwd computes the same), so the rows split into X are the bits the prep
// would have written to kt, and every output is bitwise what gdn_state_walk_mma / gdn_summary_walk_mma
// give when fed that kt. The prep then need not write Kt at all (gdn_prep_mma takes kt = null) in a
// forward that no backward follows. The factors (8 rows a thread, one gcum load and one expf each) are
// computed in land at vh 128; at vh 64, where the key split left registers, a chunk ahead by
// prefetch_factors right after the chunk's copies are issued (one row a lane: gamma_last and the factor
// in two registers, eight loads and expf a warp instead of a thread), and land shuffles each row's factor
// from its lane (off the critical path). Either way the chunk keeps its one __syncthreads and one
// __syncwarp. kn is shared by the HV / HQK value
// heads of a QK head: the walks' CTAs of sibling heads run at the same time, so most of those rows come
// from L2.
//   gdn_summary_walk_mma16(w, u, kn, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list, out_p,
//                          out_q, HQK, HV, vh)                 grid (2*128/vh, nlist, HV), walk_mma_smem(vh)
//   gdn_state_walk_mma16(w, u, kn, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start, h_out,
//                        vnew, final_state, h16, vnew16, HQK, HV, vh)
//                                                              grid (128/vh, NS, HV), walk_mma_smem(vh)
// block 256. The state walk's two bf16 outputs after final_state:
//   h16     [NC, HV, 128 (column), 128 (key)]: chunk c's start state TRANSPOSED, element (key, col) of H
//           at h16[((c HV + h) 128 + col) 128 + key], rounded to nearest even;
//   vnew16  [NC, HV, 128 (column), 64 (token)]: chunk c's V'^T, token i of column col at
//           vnew16[((c HV + h) 128 + col) 64 + i], tokens from chunk_len[c] on stored as 0.
// Any of h_out, vnew, h16, vnew16 may be null (that store is skipped); final_state may not. h_out, vnew
// and final_state are gdn_state_walk_mma's bits (the same instructions on the same operand bits; the
// bf16 stores only read the registers), and vh 64 and vh 128 give the same bits in all five outputs.
// The layouts are the accumulators' own: a lane holds keys (tokens) 2t, 2t+1 of columns g and g + 8,
// so every bf16 store is one packed 4-byte word; a warp instruction fills 16 contiguous bytes of 8
// columns, the next nt the other half of those 32-byte sectors. gdn_output_mma16 (gdn_output_mma.cu)
// reads both tiles by cp.async as they lie (32 KB and 16 KB contiguous a chunk and head) and ldmatrix
// without .trans.
// Bytes a chunk and head: h16 32 KB, vnew16 16 KB against h_out 64 KB and vnew 32 KB (fp32); with h_out
// and vnew null (what the forward needs when nothing else reads fp32 H) the walk writes half as much.
// Kt: 32 KB a chunk and head from HBM (kt) become 32 KB a chunk and QK head (kn, the sibling value heads'
// reads hitting L2) plus 256 bytes of gcum. Predicted at 32K tokens (96 CTAs of vh 64, 512 chunks
// each; H200 ~4 TB/s): per chunk step 48 heads x (W, U 64 KB + h16, vnew16 48 KB) + 16 QK heads x kn
// 32 KB = 5.9 MB, ~1.5 us of HBM, under the ~2.1 us a chunk that shared memory costs at vh 64: ~1.1 ms,
// bound by the SM. Writing h_out and vnew as well costs 96 KB more a chunk and head.
// Registers (ptxas 11.8): both entries 255 on sm_90 and on sm_80 (compute_80 PTX), no spill, no stack;
// the final-state address is read after the walk through ctaid_y / ctaid_z, as in gdn_state_walk_mma.
template <int VH>
__device__ __forceinline__ void state_walk_mma16(float* smem, const float* w, const float* u, const float* kn,
                                                 const float* gcum, const int* chunk_tok0, const int* chunk_len,
                                                 const int* seg_chunk0, const int* seg_nchunk, const float* start,
                                                 float* h_out, float* vnew, float* final_state, bf16* h16,
                                                 bf16* vnew16, int HQK, int HV) {
	Walker<VH, true, true> wk(smem);
	const int c0 = blockIdx.x * VH, seg = blockIdx.y, h = blockIdx.z;
	wk.init_state(start + ((long long)seg * HV + h) * kD * kD, false, c0);
	wk.walk(w, u, kn, gcum, chunk_tok0, chunk_len, seg_chunk0[seg], seg_nchunk[seg], h, HV, c0, h_out, vnew, h16,
	        vnew16, HQK);
	wk.store_state(final_state + ((long long)ctaid_y() * HV + ctaid_z()) * kD * kD, c0);
}

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_state_walk_mma16(const float* __restrict__ w, const float* __restrict__ u, const float* __restrict__ kn,
                     const float* __restrict__ gcum, const int* __restrict__ chunk_tok0,
                     const int* __restrict__ chunk_len, const int* __restrict__ seg_chunk0,
                     const int* __restrict__ seg_nchunk, const float* __restrict__ start,
                     float* __restrict__ h_out, float* __restrict__ vnew, float* __restrict__ final_state,
                     __nv_bfloat16* __restrict__ h16, __nv_bfloat16* __restrict__ vnew16, int HQK, int HV, int vh) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
#if defined(GDNKCP_HAS_WGMMA)
	// sm_90a: the wgmma body (gdn_walk_wgmma.cu), same arguments, grid, block and shared memory.
	static_assert(walkwg::wg_walk_smem(64) <= walk_mma_smem(64) && walkwg::wg_walk_smem(128) <= walk_mma_smem(128),
	              "the wgmma walk must fit the mma.sync walk's shared memory");
	if (vh == 64)
		walkwg::state_walk<64>(smem, w, u, kn, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start, h_out, vnew,
		                       final_state, h16, vnew16, HQK, HV);
	else
		walkwg::state_walk<128>(smem, w, u, kn, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start, h_out, vnew,
		                        final_state, h16, vnew16, HQK, HV);
#else
	if (vh == 64)
		state_walk_mma16<64>(smem, w, u, kn, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start, h_out, vnew,
		                     final_state, h16, vnew16, HQK, HV);
	else
		state_walk_mma16<128>(smem, w, u, kn, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start, h_out, vnew,
		                      final_state, h16, vnew16, HQK, HV);
#endif
}

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_summary_walk_mma16(const float* __restrict__ w, const float* __restrict__ u, const float* __restrict__ kn,
                       const float* __restrict__ gcum, const int* __restrict__ chunk_tok0,
                       const int* __restrict__ chunk_len, const int* __restrict__ seg_chunk0,
                       const int* __restrict__ seg_nchunk, const int* __restrict__ list,
                       float* __restrict__ out_p, float* __restrict__ out_q, int HQK, int HV, int vh) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
#if defined(GDNKCP_HAS_WGMMA)
	// sm_90a: the wgmma body (gdn_walk_wgmma.cu), same arguments, grid, block and shared memory.
	if (vh == 64)
		walkwg::summary_walk<64>(smem, w, u, kn, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list, out_p,
		                         out_q, HV, HQK);
	else
		walkwg::summary_walk<128>(smem, w, u, kn, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list, out_p,
		                          out_q, HV, HQK);
#else
	if (vh == 64)
		summary_walk_mma<64, true>(smem, w, u, kn, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list, out_p,
		                           out_q, HV, HQK);
	else
		summary_walk_mma<128, true>(smem, w, u, kn, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list, out_p,
		                            out_q, HV, HQK);
#endif
}

}  // namespace walkmma
}  // namespace gdnkcp
