// gdn_bwalk_mma.cu (checked on the CPU emulator and on the H200; docs/perf-notes.md has its times): the
// backward walks (offset, tape) on mma.sync m16n8k16 (bf16 in, fp32 accumulate), the tensor-core
// form of gdn_offset_walk / gdn_tape_walk (gdn_bwd.cu), after the forward walks v4 (gdn_walk_mma.cu,
// whose Walker it extends). Same arguments, grids and outputs (block 256):
//   gdn_offset_walk_mma   grid (2*128/vh, nlist, HV)   bwalk_mma_smem(vh)
//   gdn_tape_walk_mma     grid (128/vh, NS, HV)        bwalk_mma_smem(vh)
// bwalk_mma_smem(vh) = 196608 + 128*(vh+8) bytes, at vh 64 plus a second dO stage and the 16 KB key-split
// exchange (231424 at vh 64, 214016 at vh 128).
//
// Key split (2026-12-01, after the forward walks' v5.1): BWalker is Walker<VH, false, true>, so (1) runs
// as the forward's two key-half chains (dvl^T + keys 0-63, plus keys 64-127, added), and at vh 64 all
// eight warps hold D^T (warp w: columns 16 (w % 4).., keys 64 (w / 4)..) and run (2) on their own keys;
// each warp of a column group fills and reads its own copy of the dO stage (cp.async copies are visible
// to other warps only after a block barrier, which the stage's reuse does not leave room for). (2) runs
// over all four token blocks, its mma.sync product-major per group of key tiles (-W hi*hi, hi*lo, lo*hi,
// then dO*Qg hi, lo: each accumulator's order as before). vh 64 and vh 128 stay bitwise equal. The
// sections below describe the single-chain form it grew from; "warps 0-3 hold them" is now all eight.
//
// ---- The data flow: D never leaves the registers ---------------------------------------------------
// A warp owns 16 adjoint columns and all 128 keys of them; it keeps D^T (16 x 128, m = column,
// n = key) in the forward Walker's s[16][4] accumulator tiles for the whole walk, and dV'^T in v[8][4].
// Per chunk, in reverse (Kt, W, q: 64 x 128 fp32 rows; dvl: fp32, dO: bf16, 64 x vh; rows past a
// short chunk's end are zero):
//   (1) dV'^T = dvl^T + D^T Kt^T       A = D^T (the accumulator tiles as A fragments, split to bf16
//                                      hi/lo in registers); B = Kt^T (k = key, n = token): rows of
//                                      Kt, ldmatrix.x4 (not transposed). C starts as dvl^T (fp32, exact).
//   (2) D^T = e^gl D^T - dV'^T W       A = dV'^T (the accumulator tiles of (1), split); B = -W (k =
//             + dO^T Qg                token, n = key): rows of -W, ldmatrix.x4.trans. A = dO^T, exact
//                                      in bf16 (no lo part), from the dO stage by ldmatrix.x4.trans;
//                                      B = Qg = scale e^(gamma_i) q_i rows, ldmatrix.x4.trans.
// The Pᵀ form (offset walk, blockIdx.x >= 128/vh) starts from the identity's columns and has no dvl,
// dO or Qg terms. As in the forward, no warp needs another warp's columns: (1) and (2) need no
// barrier between them and dV' stays in registers. fp32 x fp32 products run as ah bh + ah bl + al bh,
// dO x Qg as o Qgh + o Qgl, per 16-wide k step, k ascending; per (token tile, key tile) the -W
// products come before the Qg ones.
// vh 128: warps 0-7 hold columns 16w..16w+15; vh 64: warps 0-3 hold them, warps 4-7 only copy and
// convert. Every 16-column tile runs the same instructions on the same operands in both forms, so
// vh 64 and vh 128 give the same bits. No atomics; no value crosses columns.
//
// ---- The stages: two __syncthreads per chunk ---------------------------------------------------------
//   X   bf16 hi/lo of Kt, -W and Qg of the chunk ([6][64][128], 96 KB; 16-byte units XOR-swizzled by
//       row % 8 as in the forward). ONE stage: three operands double-buffered (192 KB) plus their fp32
//       landing zone (96 KB) exceed the 227 KB an SM has, so X is rewritten only after every warp has
//       finished the chunk (barrier 2) and published before the next one starts (barrier 1).
//   R   fp32 Kt, W, q of the NEXT chunk as cp.async copied them ([3][64][128], 96 KB). Each 16-byte
//       unit is copied and later converted by the same thread (its own wait_group makes it visible).
//   OS  bf16 dO of the next chunk, [64][vh+8] (padded: conflict-free ldmatrix): each warp copies and
//       reads only its own 16 columns (cp.async; rows past n zeroed by plain stores; __syncwarp).
//   dvl goes from global memory straight into the dV' accumulators (C layout), no stage: an fp32
//       [64][vh+4] stage would not fit beside X and R at vh 128.
// Chunk c (walked in reverse)  __syncthreads (1)              X holds chunk c; R and OS free
//                              issue chunk c-1's cp.async into R and OS
//                              [tape: store D as d_chunk[c]]
//                              (1), [tape: store dV'], (2) from X and the registers
//                              global loads of chunk c-1: gamma_last, the q rows' gcum, dvl^T ->
//                              the dV' accumulators (registers only; dead since (2))
//                              __syncthreads (2)              every warp done with X
//                              wait for chunk c-1's copies, convert own R units -> X (-W, Qg = q
//                              scale e^gamma_i, zero rows past n), __syncwarp, dO^T A fragments
//                              (ldmatrix.trans of OS)
// The copies of chunk c-1 have the compute of chunk c to land; the conversion does not overlap the
// compute (it needs X, and there is one). Barriers: 2 __syncthreads + 1 __syncwarp a chunk
// (gdn_bwd.cu's fp32 walk: 6).
//
// ---- Precision --------------------------------------------------------------------------------------
// As the forward's: hi + lo keeps ~16 bits, a product term is off by at most ~3 * 2^-16 |a||b|
// (random in sign); dO is bf16 already, so dO Qg loses only Qg's split residual (2^-16 |Qg|). dvl enters
// as the fp32 accumulator (exact), e^gamma_last multiplies in fp32. Qg is rounded once to fp32 (q *
// fp32(scale e^gamma_i), as gdn_bwd.cu) before its split. Measured on the emulator
// (TestMMABackwardWalksOnCPU, the cases of TestBackwardKernelsOnCPU, random terminal adjoints;
// normwise relative error against internal/gdnref in float64 fed the same fp32 W, Kt, qn, gamma, dvl,
// the bf16 dO): Pᵀ 2.8e-6, R 4.7e-6, d_chunk 5.1e-6, dV' 4.9e-6, DStart 6.0e-6 (worst element 1.7e-4
// of the rms, no_l2norm; 1.1e-5 with l2norm); the test allows 3e-5 normwise, 1e-3 of the rms an
// element. Without a lo part: D or W ~1.7e-3 / 1.9e-3, Qg 4.1e-4, all beyond the 1e-4 of bwdTol.
//
// ---- Cost per chunk and CTA, predicted for an H200 (132 SMs, ~1 PFLOP/s dense bf16, ~4 TB/s) --------
// Tensor FLOPs: (1) 2*64*128*vh x 3, (2) 2*128*64*vh x 3 (-W) + x 2 (Qg): 131072 vh = 16.8 MFLOP at vh
// 128 (4096 mma.sync m16n8k16), 8.4 MFLOP at vh 64 (2048); the math itself is 3/8 of that (6.3 MFLOP
// at vh 128, as gdn_bwd.cu counts it). The Pᵀ form: 98304 vh (3072 / 1536 mma).
// Global bytes: Kt, W, q 96 KB; dvl 256 vh (32 / 16 KB), dO 128 vh (16 / 8 KB); the tape walk also
// writes d_chunk (512 vh: 64 / 32 KB) and dV' (256 vh).
// Shared-memory traffic: every state warp reads all of X by ldmatrix (96 KB a warp: 192 ldmatrix.x4):
// 768 KB at vh 128, 384 KB at vh 64; the copy/convert pass (cp.async writes 96 KB + 128 vh, R reads
// 96 KB, X writes 96 KB, dO ldmatrix 128 vh): ~290 KB + 256 vh. ~1090 KB / ~690 KB a chunk.
// Time: the compute phase (barrier 1 to 2) is bound by shared memory and the tensor cores together:
// 768 / 384 KB at 128 B/clk = 6000 / 3000 clk, 4096 / 2048 mma at ~1 per clock per SM x ~1.6 for
// mma.sync on Hopper = 6600 / 3300 clk; the convert phase (2 to 1) ~1500 clk (192 KB of shared
// traffic, 24 float4 units a thread) plus what is left of the dvl loads' latency (~500 clk). So
// ~8600 clk (vh 128) / ~5300 clk (vh 64) a chunk: ~4.8 us / ~2.9 us at ~1.8 GHz for one CTA on its
// SM (gdn_bwd.cu's fp32 tape walk: 68 us a chunk step at 32K tokens, 34.8 ms). At 32K tokens (96
// CTAs of vh 64, 512 chunks each) a chunk step of all 48 heads also moves ~240 KB of unique HBM traffic
// per head (Kt, W, q, dvl, dO read; d_chunk, dV' written): 11.5 MB / ~4 TB/s = 2.9 us. Predicted: tape
// walk ~2.9-3.2 us a chunk step, ~1.5-1.7 ms at 32K tokens (~20x the fp32 walk), bound equally by
// the SM (vh 64) and HBM; the offset walk (no stores, half its CTAs in the Pᵀ form) less.
// Registers (estimate): D^T 64 + dV'^T 32 + dO fragments 16 + A hi/lo 8 + B hi/lo 8 (16 in the Qg
// step) + ~25 addresses and indices: ~160 a thread, below the 255 of __launch_bounds__(256) at one
// CTA per SM (the shared memory allows only one): no spills expected.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gdn_bwalk_wgmma.cu"
#include "gdn_walk_mma.cu"

namespace gdnkcp {
namespace bwalkmma {

using tc::bf16;
using walkmma::kC;
using walkmma::kD;
using walkmma::kThreads;
using walkmma::kTile;
using walkmma::swz;
using walkmma::ctaid_y;
using walkmma::ctaid_z;
using walkmma::U32x2;

// At vh 64 (key split) each of a column group's two warps keeps its own dO stage, and the walk adds the
// Walker's exchange EX.
__host__ __device__ constexpr int bwalk_mma_smem(int vh) {
	return 6 * kTile * 2 + 3 * kTile * 4 + kC * (vh + 8) * 2 * (vh == 64 ? 2 : 1) + (vh == 64 ? walkmma::kEx : 0);
}
static_assert(bwalk_mma_smem(64) == 231424 && bwalk_mma_smem(128) == 214016,
              "bwalk_mma_smem: keep the header and docs/mma-kernels.md in step");

// BWalker reuses the forward Walker's registers and fragment bookkeeping: s holds D^T (the adjoint
// columns 16 warp + (g, g+8) x keys), v holds dV'^T, and init_state / store_state / store_vprime
// read and write them exactly as for S^T and V'^T. Its shared memory is laid out anew (X, R, OS
// below; the Walker's UR is unused).
template <int VH>
struct BWalker : walkmma::Walker<VH, false, true> {
	using Base = walkmma::Walker<VH, false, true>;
	using Base::cw;
	using Base::EX;
	using Base::kh;
	using Base::kNT;
	using Base::kPG;
	using Base::kTwoChains;
	using Base::v2;
	using Base::g;
	using Base::gl;
	using Base::holds;
	using Base::lane;
	using Base::mma_rows;
	using Base::R;
	using Base::s;
	using Base::t;
	using Base::v;
	using Base::warp;
	using Base::X;
	static constexpr int kLO = VH + 8;  // padded bf16 row of the dO stage (conflict-free ldmatrix)
	bf16* OS;                           // [kSplit][64][kLO]: dO columns [c0, c0 + VH) of the next chunk, one copy
	                                    // a key half (each warp reads only the copy it filled)
	unsigned o[4][4];                   // dO^T as A fragments (column x token tile j), exact in bf16
	float gq[8];                        // gcum of rows warp + 8k of the chunk being landed (withDO; past n unused)

	// X: [6][kTile] Kt hi, Kt lo, -W hi, -W lo, Qg hi, Qg lo (swizzled); R: [3][kTile] Kt, W, q fp32.
	__device__ __forceinline__ explicit BWalker(float* smem) : Base(smem) {
		X = reinterpret_cast<bf16*>(smem);
		R = smem + 6 * kTile / 2;
		OS = reinterpret_cast<bf16*>(R + 3 * kTile);
		EX = reinterpret_cast<float*>(OS + Base::kSplit * kC * kLO);
	}

	// issue starts the copies of chunk (t0, n): this thread's 16-byte units of Kt, W and (withDO) q
	// into R (rows warp + 8 x, unit lane: the units it converts in land) and, withDO, this warp's 16
	// dO columns into OS (rows past n zeroed by plain stores); one commit group.
	__device__ __forceinline__ void issue(const float* w, const float* kt, const float* qn, const bf16* dout, int t0,
	                                      int n, int h, int HQK, int HV, int c0, bool withDO) {
		const int qh = h / (HV / HQK);
#pragma unroll
		for (int x = 0; x < 24; ++x) {
			const int a = x / 8, i = warp + 8 * (x % 8);
			if (a == 2 && !withDO) continue;
			if (i < n) {
				const float* src = a == 0 ? kt + ((long long)(t0 + i) * HV + h) * kD
				                   : a == 1 ? w + ((long long)(t0 + i) * HV + h) * kD
				                            : qn + ((long long)(t0 + i) * HQK + qh) * kD;
				tc::cp_async16(R + a * kTile + i * kD + 4 * lane, src + 4 * lane);
			}
		}
		if (withDO && holds()) {
#pragma unroll
			for (int y = 0; y < 4; ++y) {
				const int q = lane + 32 * y, i = q / 2, col = 16 * cw + 8 * (q % 2);
				bf16* dst = OS + kh * kC * kLO + i * kLO + col;
				if (i < n)
					tc::cp_async16(dst, dout + ((long long)(t0 + i) * HV + h) * kD + c0 + col);
				else
					reinterpret_cast<U32x2*>(dst)[0] = reinterpret_cast<U32x2*>(dst)[1] = U32x2{0u, 0u};
			}
		}
		tc::cp_async_commit();
	}

	// land (land_loads, then land_convert; the walk calls the halves on either side of its second
	// barrier) waits for this thread's copies of chunk (t0, n) and converts its units of R into X: Kt,
	// -W and Qg = scale e^gamma_i q_i as bf16 hi/lo, zero rows from n on; then the dO^T A fragments from
	// OS. Its global loads come first, before the wait: gamma_last, the gcum of the thread's q rows and
	// dvl^T (zero past n; zero without withDO) into the dV' accumulators (dead since dupdate), so that
	// their latency passes under the conversion instead of stalling the chunk's first mma (ncu had long
	// scoreboard first in the tape walk). Same values, same bits. Call it only when no warp reads X any
	// more (after the chunk's second barrier).
	// land_loads is land's first half: the global loads of chunk (t0, n) into registers (gl, gq, and
	// dvl^T into v), no shared memory touched, so the walk issues it before the chunk's second barrier
	// and the loads' latency also passes under the wait at that barrier. Call it only once dupdate has
	// read gl and v (they are dead from then on).
	__device__ __forceinline__ void land_loads(const float* dvl, const float* gcum, int t0, int n, int h, int HV,
	                                           int c0, bool withDO) {
		gl = gcum[(long long)(t0 + n - 1) * HV + h];
#pragma unroll
		for (int k = 0; k < 8; ++k) {
			const int i = warp + 8 * k;
			gq[k] = withDO && i < n ? gcum[(long long)(t0 + i) * HV + h] : 0.f;
		}
		if (holds()) {
#pragma unroll
			for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
				for (int r = 0; r < 4; ++r) {
					const int i = 8 * nt + 2 * t + (r & 1);
					v[nt][r] = (withDO && kh == 0 && i < n)
					               ? dvl[((long long)(t0 + i) * HV + h) * kD + c0 + 16 * cw + g + 8 * (r >> 1)]
					               : 0.f;
					if (kTwoChains) v2[nt][r] = 0.f;
				}
			}
		}
	}

	// land_convert is land's second half: the wait for this thread's copies and the conversion (needs the
	// gq of land_loads of the same chunk).
	__device__ __forceinline__ void land_convert(int n, float scale, bool withDO) {
		tc::cp_async_wait<0>();
#pragma unroll
		for (int y = 0; y < 24; ++y) {
			const int a = y / 8, i = warp + 8 * (y % 8);
			if (a == 2 && !withDO) continue;
			float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
			float sg = a == 1 ? -1.f : 1.f;  // -W: the sign is exact in the split
			if (i < n) {
				f = *reinterpret_cast<const float4*>(R + a * kTile + i * kD + 4 * lane);
				if (a == 2) sg = scale * expf(gq[y % 8]);
			}
			U32x2 hi, lo;
			tc::split_bf16x2(f.x * sg, f.y * sg, hi.x, lo.x);
			tc::split_bf16x2(f.z * sg, f.w * sg, hi.y, lo.y);
			const int e = swz(i, 4 * lane);
			*reinterpret_cast<U32x2*>(X + (2 * a) * kTile + e) = hi;
			*reinterpret_cast<U32x2*>(X + (2 * a + 1) * kTile + e) = lo;
		}
		if (!holds() || !withDO) return;
		__syncwarp();  // the warp's dO copies (and zero rows), each visible to its own lane, to the warp
		const int orow = (lane & 7) + 8 * (lane >> 4), ocol = 16 * cw + 8 * ((lane >> 3) & 1);
#pragma unroll
		for (int j = 0; j < 4; ++j) tc::ldmatrix_x4_trans(o[j], OS + kh * kC * kLO + (16 * j + orow) * kLO + ocol);
	}

	__device__ __forceinline__ void land(const float* dvl, const float* gcum, int t0, int n, int h, int HV, int c0,
	                                     float scale, bool withDO) {
		land_loads(dvl, gcum, t0, n, h, HV, c0, withDO);
		land_convert(n, scale, withDO);
	}

	// dvprime: dV'^T = dvl^T + D^T Kt^T (A = D^T split in registers, B = rows of Kt: ldmatrix, not
	// transposed), token blocks of 16 from n on skipped (they stay zero).
	__device__ __forceinline__ void dvprime(int n) { mma_rows(X, n); }

	// dupdate: D^T = e^gl D^T + dV'^T (-W) [+ dO^T Qg] (A = dV'^T split in registers, and the exact
	// dO^T; B = rows of -W and Qg: ldmatrix.trans) on the warp's keys, all four token blocks (rows from
	// n on are zero in X and in the dO stage). Per group of kPG key-tile pairs: the -W fragments, then
	// hi*hi, hi*lo, lo*hi over the group's accumulators, then the Qg fragments and dO*Qg hi, dO*Qg lo:
	// each accumulator's chain is the single-warp order (-W products, then Qg, per token block).
	__device__ __forceinline__ void dupdate(int n, bool withDO) {
		const bf16* Wh = X + 2 * kTile;
		const bf16* Wl = Wh + kTile;
		const bf16* Qh = Wh + 2 * kTile;
		const bf16* Ql = Wh + 3 * kTile;
		const float decay = expf(gl);
#pragma unroll
		for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
			for (int r = 0; r < 4; ++r) s[nt][r] *= decay;
		}
		const int brow = (lane & 7) + 8 * ((lane >> 3) & 1), bcol = 8 * (lane >> 4);
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
					tc::ldmatrix_x4_trans(bh[p], Wh + e);  // b of key tile 2p in [0..1], of 2p+1 in [2..3]
					tc::ldmatrix_x4_trans(bl[p], Wl + e);
				}
				Base::template mma_group<kNT>(s, p0, ah, al, bh, bl);
				if (!withDO) continue;
#pragma unroll
				for (int p = 0; p < kPG; ++p) {
					const int e = swz(16 * j + brow, 64 * kh + 16 * (p0 + p) + bcol);
					tc::ldmatrix_x4_trans(bh[p], Qh + e);
					tc::ldmatrix_x4_trans(bl[p], Ql + e);
				}
#pragma unroll
				for (int m = 0; m < 2; ++m) {
#pragma unroll
					for (int p = 0; p < kPG; ++p) {
#pragma unroll
						for (int q = 0; q < 2; ++q) {
							float* acc = s[2 * (p0 + p) + q];
							tc::mma_bf16_16816(acc, o[j], (m == 1 ? bl[p] : bh[p]) + 2 * q, acc);
						}
					}
				}
			}
		}
		(void)n;
	}

	// walk runs the chunks [ch0, ch0 + nch) in reverse from D in the registers; with d_chunk set (the
	// tape walk) it writes D at each chunk's end (with d16, D^T as bf16) and dV'.
	__device__ __forceinline__ void walk(const float* w, const float* kt, const float* qn, const float* gcum,
	                                     const float* dvl, const bf16* dout, const int* chunk_tok0,
	                                     const int* chunk_len, int ch0, int nch, int h, int HQK, int HV, int c0,
	                                     float scale, bool withDO, float* d_chunk, float* dvnew,
	                                     float* dvnewp = nullptr, bf16* dvnew16 = nullptr, bf16* d16 = nullptr) {
		if (nch <= 0) return;
		int c = ch0 + nch - 1;
		issue(w, kt, qn, dout, chunk_tok0[c], chunk_len[c], h, HQK, HV, c0, withDO);
		land(dvl, gcum, chunk_tok0[c], chunk_len[c], h, HV, c0, scale, withDO);
		for (; c >= ch0; --c) {
			const int n = chunk_len[c];
			const bool next = c > ch0;
			// Barrier 1: X holds chunk c, converted by every thread; every thread done reading R and OS
			// (its land of chunk c), so the copies of chunk c - 1 may start.
			__syncthreads();
			if (next) issue(w, kt, qn, dout, chunk_tok0[c - 1], chunk_len[c - 1], h, HQK, HV, c0, withDO);
			if (holds()) {
				if (d_chunk != nullptr) this->store_state(d_chunk + ((long long)c * HV + h) * kD * kD, c0);
				if (d16 != nullptr) this->store_state16(d16 + ((long long)c * HV + h) * kD * kD, c0);
				dvprime(n);
				if (dvnew != nullptr) this->store_vprime(dvnew, chunk_tok0[c], n, h, HV, c0);
				if (dvnewp != nullptr) this->store_vprime_slots(dvnewp + ((long long)c * HV + h) * kD * kC, n, c0);
				if (dvnew16 != nullptr) this->store_vprime16(dvnew16 + ((long long)c * HV + h) * kD * kC, n, c0);
				dupdate(n, withDO);
			}
			if (!next) break;
			land_loads(dvl, gcum, chunk_tok0[c - 1], chunk_len[c - 1], h, HV, c0, withDO);
			// Barrier 2: every warp done reading X (one stage: X of three operands, R and OS fill the
			// rest of the 227 KB), so it may be overwritten with chunk c - 1.
			__syncthreads();
			land_convert(chunk_len[c - 1], scale, withDO);
		}
	}
};

template <int VH>
__device__ __forceinline__ void offset_walk_mma(float* smem, const float* w, const float* kt, const float* qn,
                                                const float* gcum, const float* dvl, const bf16* dout,
                                                const int* chunk_tok0, const int* chunk_len, const int* seg_chunk0,
                                                const int* seg_nchunk, const int* list, float* out_pt, float* out_r,
                                                int HQK, int HV, float scale, const int* order) {
	BWalker<VH> wk(smem);
	const tc::PairCTA b = tc::pair_cta(order, list, VH, HV);
	wk.init_state(nullptr, b.isP, b.c0);
	wk.walk(w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0[b.seg], seg_nchunk[b.seg], b.h, HQK, HV, b.c0,
	        scale, !b.isP, nullptr, nullptr);
	wk.store_state((b.isP ? out_pt : out_r) + b.blk, b.c0);
}

extern "C" __global__ void __launch_bounds__(kThreads)
gdn_offset_walk_mma(const float* __restrict__ w, const float* __restrict__ kt, const float* __restrict__ qn,
                    const float* __restrict__ gcum, const float* __restrict__ dvl,
                    const __nv_bfloat16* __restrict__ dout, const int* __restrict__ chunk_tok0,
                    const int* __restrict__ chunk_len, const int* __restrict__ seg_chunk0,
                    const int* __restrict__ seg_nchunk, const int* __restrict__ list, float* __restrict__ out_pt,
                    float* __restrict__ out_r, int HQK, int HV, int vh, float scale, const int* __restrict__ order) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
#if defined(GDNKCP_HAS_WGMMA)
	// sm_90a: the wgmma body (gdn_bwalk_wgmma.cu), same arguments, grid, block and shared memory.
	if (vh == 64)
		bwalkwg::offset_walk<64>(smem, w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list,
		                         out_pt, out_r, HQK, HV, scale, order);
	else
		bwalkwg::offset_walk<128>(smem, w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list,
		                          out_pt, out_r, HQK, HV, scale, order);
#else
	if (vh == 64)
		offset_walk_mma<64>(smem, w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list,
		                    out_pt, out_r, HQK, HV, scale, order);
	else
		offset_walk_mma<128>(smem, w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list,
		                     out_pt, out_r, HQK, HV, scale, order);
#endif
}

template <int VH>
__device__ __forceinline__ void tape_walk_mma(float* smem, const float* w, const float* kt, const float* qn,
                                              const float* gcum, const float* dvl, const bf16* dout,
                                              const int* chunk_tok0, const int* chunk_len, const int* seg_chunk0,
                                              const int* seg_nchunk, const float* dend, float* d_chunk, float* dvnew, float* dvnewp,
                                              bf16* dvnew16, bf16* d16, float* dstart, int HQK, int HV, float scale,
                                              const int* order) {
	BWalker<VH> wk(smem);
	int x, seg, h;
	tc::dispatch_cta(order, x, seg, h);
	const int c0 = x * VH;
	wk.init_state(dend + ((long long)seg * HV + h) * kD * kD, false, c0);
	wk.walk(w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0[seg], seg_nchunk[seg], h, HQK, HV, c0,
	        scale, true, d_chunk, dvnew, dvnewp, dvnew16, d16);
	wk.store_state(dstart + ((long long)seg * HV + h) * kD * kD, c0);
}

// gdn_tape_walk_mma: gdn_tape_walk's arguments, then dvnewp (dV'^T token slots), dvnew16 (dV'^T bf16, the state
// walk's vnew16 layout), d16 (each chunk's end adjoint D transposed as bf16, rounded to nearest even: [NC, HV,
// 128 (column)][128 (key)], the state walk's h16 layout) and order (sched's dispatch order). Any of d_chunk,
// dvnew, dvnewp, dvnew16, d16 may be null (that store is skipped).
extern "C" __global__ void __launch_bounds__(kThreads)
gdn_tape_walk_mma(const float* __restrict__ w, const float* __restrict__ kt, const float* __restrict__ qn,
                  const float* __restrict__ gcum, const float* __restrict__ dvl,
                  const __nv_bfloat16* __restrict__ dout, const int* __restrict__ chunk_tok0,
                  const int* __restrict__ chunk_len, const int* __restrict__ seg_chunk0,
                  const int* __restrict__ seg_nchunk, const float* __restrict__ dend, float* __restrict__ d_chunk,
                  float* __restrict__ dvnew, float* __restrict__ dstart, int HQK, int HV, int vh, float scale,
                  float* __restrict__ dvnewp, __nv_bfloat16* __restrict__ dvnew16, __nv_bfloat16* __restrict__ d16,
                  const int* __restrict__ order) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
#if defined(GDNKCP_HAS_WGMMA)
	// sm_90a: the wgmma body (gdn_bwalk_wgmma.cu), same arguments, grid, block and shared memory.
	static_assert(bwalkwg::wg_bwalk_smem(64) <= bwalk_mma_smem(64) && bwalkwg::wg_bwalk_smem(128) <= bwalk_mma_smem(128),
	              "the wgmma tape walk must fit the mma.sync walk's shared memory");
	if (vh == 64)
		bwalkwg::tape_walk<64>(smem, w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, dend,
		                       d_chunk, dvnew, dvnewp, dvnew16, d16, dstart, HQK, HV, scale, order);
	else
		bwalkwg::tape_walk<128>(smem, w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, dend,
		                        d_chunk, dvnew, dvnewp, dvnew16, d16, dstart, HQK, HV, scale, order);
#else
	if (vh == 64)
		tape_walk_mma<64>(smem, w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, dend,
		                  d_chunk, dvnew, dvnewp, dvnew16, d16, dstart, HQK, HV, scale, order);
	else
		tape_walk_mma<128>(smem, w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, dend,
		                   d_chunk, dvnew, dvnewp, dvnew16, d16, dstart, HQK, HV, scale, order);
#endif
}

}  // namespace bwalkmma
}  // namespace gdnkcp
