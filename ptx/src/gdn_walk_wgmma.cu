// gdn_walk_wgmma.cu: the v5 state walk (gdn_state_walk_mma16) on Hopper's wgmma, the sm_90a body of
// that entry (gdn_walk_mma.cu dispatches here when GDNKCP_HAS_WGMMA, wgmma.cuh), and with it the v5
// summary walk (gdn_summary_walk_mma16: summary_walk at the end, the same walk with no per-chunk stores,
// the P columns from the identity and without U). Same arguments,
// grid (128/vh, NS, HV), block 256 and dynamic shared memory (walk_mma_smem(vh)) as the mma.sync
// body, the same outputs and layouts; every other target, the compute_80 PTX and the CPU emulator
// build the mma.sync Walker, which stays the portable path.
//
// ---- Why: the mma.sync walk is bound by instruction issue and its dependent chain ----------------
// The mma.sync walk spends ~2060 warp instructions a warp and chunk (192 mma.sync, ~130 ldmatrix for
// the B fragments, the splits, ~560 address IMAD/LEA) at ~5.7 us a chunk at vh 64 (ncu: issue slots a
// third busy). A wgmma of m64n64k16 does the work of 32 mma.sync m16n8k16 and reads B straight from
// shared memory: the chunk's two products take 36 wgmma a warpgroup (24 + 12) in place of 1536
// mma.sync and ~1000 ldmatrix a CTA.
//
// ---- The data flow (the mma.sync walk's, on a warpgroup) -----------------------------------------
// Warpgroup q (warps 4q..4q+3) holds value columns c0 + 64 q + [0, 64) (vh 128: both groups; vh 64:
// group 0, while group 1 copies and converts): warp w of the group columns 16 (w % 4) + (g, g + 8)
// of S^T (all 128 keys: 64 fp32 registers a lane, s[4 nt + r] = key 8 nt + 2t + (r & 1), column
// g + 8 (r >> 1)), the m64n128 accumulator layout. Per chunk (W, Kt: 64 x 128 fp32 rows):
//   (1) V'^T = U^T + S^T (-W)^T   m64n64k16 x 8 k steps (keys), A = S^T split to bf16 hi/lo in
//                                 registers (k step s: s[8s .. 8s+7] as pairs), B = -W hi / lo
//                                 (token n x key k: W's rows, K-major). The first wgmma starts from
//                                 zero (scale-d 0) and U^T (fp32, exact) is added after the wait
//                                 (U^T as the starting accumulator measured 5% slower).
//   (2) S^T = e^gl S^T + V'^T Kt  m64n128k16 x 4 k steps (tokens), A = V'^T split (the D of (1)),
//                                 B = Kt hi / lo stored transposed (key n x token k, K-major).
// Each k step runs hi*hi, hi*lo, lo*hi into the one accumulator, k steps ascending: the mma.sync
// walk's products and order (the tensor core's internal summation differs, and U^T joins at the end,
// so the bits are not that walk's; they are the same run to run and at both widths: a column's
// instructions and operands do not depend on vh or on the other columns).
//
// ---- Shared memory (from the first 1024-aligned byte of the dynamic allocation) -------------------
//   XW[2]  0 / 32768      -W hi (keys 0-63 block, keys 64-127 block, 8192 B each), then -W lo: rows
//                         = tokens, 128-byte swizzle
//   XK[2]  65536 / 98304  Kt^T hi (128 rows = keys of 64 tokens), then Kt^T lo, 128-byte swizzle
//   R      131072         fp32 W and kn rows of the next chunk as cp.async copied them ([2][64][128])
//   UR     196608         fp32 U of the next chunk, [64][vh], 16-byte units XOR-swizzled by row
// 196608 + 256 vh bytes + up to 1008 of alignment <= walk_mma_smem(vh) = 230400 at both widths.
// The converting warps (vh 128: all eight, 8 tokens each; vh 64: group 1, 16 tokens each) copy and
// convert their own tokens of W and Kt: their own W units (no barrier), the Kt columns of their tokens
// after the copies landed (__syncwarp): a lane converts keys 32 m + lane, m = 0..3, eight tokens at
// once into one 16-byte unit of Kt^T (hi and lo), conflict-free (the eight rows of a quarter warp fall
// on eight different units of the swizzle). The state warps copy their own U columns.
//
// ---- One __syncthreads a chunk -----------------------------------------------------------------
// Chunk ci, stage x = ci % 2:  __syncthreads     XW/XK[x] written and fenced (fence.proxy.async) by
//                                                the converters; every wgmma of chunk ci-1 waited
//                              state groups: split S, (1) issued, H stores under it, wait, + U^T,
//                              split V', e^gl S, (2) issued, V' stores under it, wait
//                              converters: chunk ci+1 into XW/XK[1-x] (at vh 64 while group 0
//                              runs the chunk); state groups: U^T of chunk ci+1 from UR
//                              every warp, once its own reads of R / UR are done (__syncwarp):
//                              chunk ci+2's copies and gate loads (a whole chunk to land)
// After the last chunk the copies and conversion run once more on the same chunk (into the stage no
// one reads again), so that no branch on the chunk count sits between a wgmma and its wait.
//
// ---- Measured: docs/mma-kernels.md ("The state walk on wgmma"), scripts/walk-check.sh -----------
// Tried and slower (ptxas 13.0): (2) left running under the conversion (C7515 serialization, +13%);
// U^T as (1)'s starting accumulator (+5%); at vh 64 every warp converting (+7%, measured with the
// serialized form).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gdn_fwd.cu"
#include "mma.cuh"
#include "wgmma.cuh"

// Compiled for every target: the plane walks (gdn_walk_planes.cu) build on WGWalker with wgmma.cuh's
// portable products where the target has no wgmma; the entries of this file's walks take this body only
// where GDNKCP_HAS_WGMMA (gdn_walk_mma.cu).
namespace gdnkcp {
namespace walkwg {

using tc::bf16;
constexpr int kD = fwd::kD, kC = fwd::kC;
constexpr int kOffXK = 65536, kOffR = 131072, kOffUR = 196608;
// kRowBatch: rows whose fp32 loads the converters issue together before splitting them (rows_to_planes).
#ifndef GDNKCP_WG_ROW_BATCH
#define GDNKCP_WG_ROW_BATCH 4
#endif
constexpr int kRowBatch = GDNKCP_WG_ROW_BATCH;
// kDecayEarly: the state's decay e^gl S^T under (1) rather than on the chain between (1) and (2)
// (decay_state; the same products, the same bits).
#ifndef GDNKCP_WG_DECAY_EARLY
#define GDNKCP_WG_DECAY_EARLY 0
#endif
constexpr bool kDecayEarly = GDNKCP_WG_DECAY_EARLY != 0;
// kStore16: how WGWalker::store_state16 writes bf16 S^T. 0: one 4-byte store a lane, key tile and row half
// (a warp's store covers half of each 32-byte sector); 1: tile pairs exchanged in the quad
// (tc::quad_pair16), one 8-byte store a pair and row half, pairs outer; 2: the same, row halves outer;
// 3: as 1 with a compiler barrier after each pair's stores (ptxas may not hoist the next pair's packs and
// shuffles above them: fewer live registers). The same bytes at the same addresses in all four.
#ifndef GDNKCP_WG_STORE16
#define GDNKCP_WG_STORE16 1
#endif
constexpr int kStore16 = GDNKCP_WG_STORE16;
static_assert(kStore16 >= 0 && kStore16 <= 3, "GDNKCP_WG_STORE16: 0, 1, 2 or 3");
// GDNKCP_WALK_MARK(slot, ci): a timeline hook at the phase boundaries of walk() (slots in walk's body);
// ptx/devtest/walk_check.cu built with -DGDNKCP_WALK_TIMELINE defines it to record clock64() without a
// branch. Empty in every blob.
#ifndef GDNKCP_WALK_MARK
#define GDNKCP_WALK_MARK(slot, ci)
#endif

__host__ __device__ constexpr int wg_walk_smem(int vh) { return kOffUR + kC * vh * 4 + 1008; }

struct alignas(16) U32x4 {
	unsigned x, y, z, w;
};
struct alignas(8) U32x2 {
	unsigned x, y;
};

template <int VH>
struct WGWalker {
	static constexpr int kGroups = VH / 64;  // warpgroups that hold state
	unsigned char* X;                        // 1024-aligned: XW[2], XK[2]
	float* R;
	float* UR;
	int lane, warp, g, t, grp, wq;
	float s[64];  // S^T: column 64 grp + 16 wq + g + 8 (r >> 1), key 8 nt + 2t + (r & 1) at s[4 nt + r]
	float d[32];  // V'^T (U^T before (1)): the same columns, token 8 nt + 2t + (r & 1) at d[4 nt + r]
	float uv[32];  // U^T of the chunk, added to (1)'s product after its wait
	float gl, gln, gi;

	__device__ __forceinline__ explicit WGWalker(float* smem) {
		const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
		X = reinterpret_cast<unsigned char*>(smem) + ((1024u - (a & 1023u)) & 1023u);
		R = reinterpret_cast<float*>(X + kOffR);
		UR = reinterpret_cast<float*>(X + kOffUR);
		lane = threadIdx.x % 32;
		// The warp index through a shuffle: provably warp-uniform for ptxas, so that the branches on the
		// warpgroup are not divergent paths (a wgmma in one is serialized: ptxas C7518).
		warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 32), 0);
		g = lane / 4;
		t = lane % 4;
		grp = warp / 4;
		wq = warp % 4;
	}

	__device__ __forceinline__ bool holds() const { return kGroups == 2 || grp == 0; }
	// col: the column (relative to the CTA's first, c0) of accumulator element r of this lane.
	__device__ __forceinline__ int col(int r) const { return 64 * grp + 16 * wq + g + 8 * (r >> 1); }
	// ur: the swizzled offset in UR of (token i, column cc): 4-float units XOR 2 ((i >> 1) & 3).
	__device__ __forceinline__ int ur(int i, int cc) const { return i * VH + (cc ^ (8 * ((i >> 1) & 3))); }

	// init_state sets S^T from fp32 rows of 128 (src, columns c0..), or, with src null, to the identity's
	// columns c0.. (identity) or to zero.
	__device__ __forceinline__ void init_state(const float* src, int c0, bool identity = false) {
#pragma unroll
		for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
			for (int r = 0; r < 4; ++r) {
				const int key = 8 * nt + 2 * t + (r & 1);
				if (!holds())
					s[4 * nt + r] = 0.f;
				else if (src != nullptr)
					s[4 * nt + r] = src[key * kD + c0 + col(r)];
				else
					s[4 * nt + r] = (identity && key == c0 + col(r)) ? 1.f : 0.f;
			}
		}
	}

	__device__ __forceinline__ void store_state(float* dst, int c0) const {
		if (!holds()) return;
		float* base = dst + 2 * t * kD + c0 + col(0);
#pragma unroll
		for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
			for (int r = 0; r < 4; ++r) base[(8 * nt + (r & 1)) * kD + 8 * (r >> 1)] = s[4 * nt + r];
		}
	}

	// store_state16 writes S^T as bf16 (rn) into dst ([128 (column)][128 (key)]): a lane holds keys 8 nt + 2t,
	// + 1 of its rows; with kStore16 > 0 the quad exchanges one word a tile pair (tc::quad_pair16) and each
	// lane stores 8 bytes: a warp's store covers 8 rows of 32 bytes (whole sectors), not 8 rows of 16.
	__device__ __forceinline__ void store_state16(bf16* dst, int c0) const {
		if (kStore16 == 0) {
			bf16* base = dst + (c0 + col(0)) * kD + 2 * t;
#pragma unroll
			for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
				for (int hf = 0; hf < 2; ++hf)
					*reinterpret_cast<unsigned*>(base + 8 * hf * kD + 8 * nt) = tc::pack_bf16x2(s[4 * nt + 2 * hf], s[4 * nt + 2 * hf + 1]);
			}
			return;
		}
		bf16* base = dst + (c0 + col(0)) * kD + tc::quad_pair16_key(t);
#pragma unroll
		for (int i = 0; i < 16; ++i) {
			const int q = kStore16 == 2 ? i % 8 : i / 2, hf = kStore16 == 2 ? i / 8 : i % 2;
			*reinterpret_cast<uint2*>(base + 8 * hf * kD + 16 * q) =
			    tc::quad_pair16(tc::pack_bf16x2(s[8 * q + 2 * hf], s[8 * q + 2 * hf + 1]),
			                    tc::pack_bf16x2(s[8 * q + 4 + 2 * hf], s[8 * q + 4 + 2 * hf + 1]), t);
			if (kStore16 == 3 && i % 2 == 1) asm volatile("" ::: "memory");
		}
	}


	// store_frags16: store_state16's bytes (kStore16 1's stores) from split_frags<8>(s, ah, al)'s hi
	// fragments, for a caller that holds them anyway: ah[k][q] packs rn(s[8k + 2q]), rn(s[8k + 2q + 1]),
	// the word store_state16 packs for key tile 2k + q / 2, row half q % 2.
	__device__ __forceinline__ void store_frags16(bf16* dst, int c0, const unsigned (&ah)[8][4]) const {
		bf16* base = dst + (c0 + col(0)) * kD + tc::quad_pair16_key(t);
#pragma unroll
		for (int q = 0; q < 8; ++q) {
#pragma unroll
			for (int hf = 0; hf < 2; ++hf)
				*reinterpret_cast<uint2*>(base + 8 * hf * kD + 16 * q) = tc::quad_pair16(ah[q][hf], ah[q][2 + hf], t);
		}
	}

	__device__ __forceinline__ void store_vprime(float* vnew, int t0, int n, int h, int HV, int c0) const {
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
			for (int r = 0; r < 4; ++r) {
				const int i = 8 * nt + 2 * t + (r & 1);
				if (i < n) vnew[((long long)(t0 + i) * HV + h) * kD + c0 + col(r)] = d[4 * nt + r];
			}
		}
	}

	// store_vprime_slots writes V'^T (the tape walk: dV'^T) of the chunk as one token-slot block at dst
	// (gdn_chunk_grads_mma6's input: fp32 [128 features][64 tokens], row f of 256 bytes, the 32-byte slot of
	// tokens 8 u .. at u ^ ((f % 8) / 2)), tokens from n on as +0: tokens 2t, 2t + 1 of a column in one
	// 8-byte store (row f = c0 + col(r), f % 8 = g).
	__device__ __forceinline__ void store_vprime_slots(float* dst, int n, int c0) const {
		float* base = dst + (c0 + col(0)) * kC + 2 * t;
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
			for (int hf = 0; hf < 2; ++hf) {
				const int i = 8 * nt + 2 * t;
				const float a = i < n ? d[4 * nt + 2 * hf] : 0.f, b = i + 1 < n ? d[4 * nt + 2 * hf + 1] : 0.f;
				*reinterpret_cast<float2*>(base + 8 * hf * kC + 8 * (nt ^ (g >> 1))) = make_float2(a, b);
			}
		}
	}

	__device__ __forceinline__ void store_vprime16(bf16* dst, int n, int c0) const {
		bf16* base = dst + (c0 + col(0)) * kC + 2 * t;
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
			for (int hf = 0; hf < 2; ++hf) {
				const int i = 8 * nt + 2 * t;
				const float a = i < n ? d[4 * nt + 2 * hf] : 0.f, b = i + 1 < n ? d[4 * nt + 2 * hf + 1] : 0.f;
				*reinterpret_cast<unsigned*>(base + 8 * hf * kC + 8 * nt) = tc::pack_bf16x2(a, b);
			}
		}
	}

	// Converters: at vh 128 every warp (tokens 8 warp .. + 7); at vh 64 the warps of group 1 (which hold
	// no state), tokens 16 (warp - 4) .. + 15, so that group 0's chain carries no conversion.
	static constexpr int kBlocks = kGroups == 2 ? 1 : 2;  // 8-token blocks a converting warp owns
	__device__ __forceinline__ bool converts() const { return kGroups == 2 || grp == 1; }
	__device__ __forceinline__ int block0() const { return kBlocks * (warp % (8 / kBlocks)); }

	// issue starts the copies of chunk (t0, n): a converter's W and kn rows (unit lane of each) into R,
	// a state warp's 16 U columns into UR; one commit group.
	__device__ __forceinline__ void issue(const float* w, const float* u, const float* kn, int t0, int n, int h, int HV,
	                                      int c0, int HQK, int qh) {
		// Row pointers stepped by a row's stride (the per-copy 64-bit index arithmetic was a third of
		// the converters' instructions).
		if (converts()) {
			const int i0 = 8 * block0();
			const long long ws = (long long)HV * kD, ks = (long long)HQK * kD;
			const float* wp = w + ((long long)(t0 + i0) * HV + h) * kD + 4 * lane;
			const float* kp = kn + ((long long)(t0 + i0) * HQK + qh) * kD + 4 * lane;
			float* rp = R + i0 * kD + 4 * lane;
#pragma unroll
			for (int j = 0; j < 8 * kBlocks; ++j) {
				if (i0 + j < n) {
					tc::cp_async16(rp + j * kD, wp);
					tc::cp_async16(rp + kC * kD + j * kD, kp);
				}
				wp += ws;
				kp += ks;
			}
		}
		if (holds() && u != nullptr) {
			// Lane copies column unit cc of tokens lane / 4 + 8 y; the swizzle of those rows does not
			// depend on y.
			const int i0 = lane / 4, cc = 64 * grp + 16 * wq + 4 * (lane % 4);
			const long long us = 8LL * HV * kD;
			const float* up = u + ((long long)(t0 + i0) * HV + h) * kD + c0 + cc;
			float* dst = UR + ur(i0, cc);
#pragma unroll
			for (int y = 0; y < 8; ++y) {
				if (i0 + 8 * y < n) tc::cp_async16(dst + 8 * y * VH, up);
				up += us;
			}
		}
		tc::cp_async_commit();
	}

	// prefetch_gates reads gamma_last of chunk (t0, n) and, in a converter, gcum of token 8 block0() +
	// lane % (8 kBlocks) (tokens past n: row n - 1's, finite; their kn is taken as zero). The factors
	// are formed in convert, where these loads have long landed.
	__device__ __forceinline__ void prefetch_gates(const float* gcum, int t0, int n, int h, int HV) {
		gln = gcum[(long long)(t0 + n - 1) * HV + h];
		if (converts()) {
			const int i = 8 * block0() + lane % (8 * kBlocks), ir = i < n ? i : n - 1;
			gi = gcum[(long long)(t0 + ir) * HV + h];
		}
	}

	// rows_to_planes converts rows i0 .. i0 + ROWS - 1 of an fp32 stage (row stride kD), keys 4 lane ..
	// 4 lane + 3 of each (the thread's own copies), zero from row n on, negated with NEG (the sign is
	// exact in the split), into the bf16 hi / lo planes at x and x + 16384: keys 0-63 in block 0 and
	// 64-127 in block 1 (8192 bytes each), rows of 128 bytes, 16-byte units XOR row % 8 (the 128-byte
	// swizzle the descriptors read). The loads go out kRowBatch rows at a time ahead of their splits: one
	// row at a time, each split waited for its own load (ncu, 2026-12-01: a fifth of the state walk's
	// stall samples sat on the first use of those loads).
	template <int ROWS, bool NEG>
	__device__ __forceinline__ static void rows_to_planes(unsigned char* x, const float* src, int i0, int n, int lane) {
		constexpr int kB = ROWS < kRowBatch ? ROWS : kRowBatch;
		static_assert(ROWS % kB == 0, "whole batches of rows");
		const int kb = lane / 16, unit = (lane % 16) / 2, half = lane % 2;
#pragma unroll
		for (int j0 = 0; j0 < ROWS; j0 += kB) {
			float4 f[kB];
#pragma unroll
			for (int j = 0; j < kB; ++j) {
				const int i = i0 + j0 + j;
				f[j] = i < n ? *reinterpret_cast<const float4*>(src + i * kD + 4 * lane) : make_float4(0.f, 0.f, 0.f, 0.f);
			}
#pragma unroll
			for (int j = 0; j < kB; ++j) {
				const int i = i0 + j0 + j;
				const float sg = NEG ? -1.f : 1.f;
				U32x2 hi, lo;
				tc::split_bf16x2(sg * f[j].x, sg * f[j].y, hi.x, lo.x);
				tc::split_bf16x2(sg * f[j].z, sg * f[j].w, hi.y, lo.y);
				const int off = kb * 8192 + i * 128 + ((unit ^ (i & 7)) << 4) + 8 * half;
				*reinterpret_cast<U32x2*>(x + off) = hi;
				*reinterpret_cast<U32x2*>(x + 16384 + off) = lo;
			}
		}
	}

	// convert waits for this thread's copies of chunk n's rows and converts the warp's tokens into stage
	// x (-W and Kt^T as bf16 hi/lo, zero past n), fenced for the async proxy. Kt_i = kn_i e_i with
	// e_i = expf(gamma_last - gcum_i), one rounded product (gdn_prep_mma's P1 expression).
	__device__ __forceinline__ void convert(int x, int n) {
		tc::cp_async_wait<0>();
		if (!converts()) return;
		__syncwarp();  // the Kt columns read other lanes' copies
		unsigned char* xw = X + x * 32768;
		unsigned char* xk = X + kOffXK + x * 32768;
		const float ef = expf(gln - gi);
		// -W: rows 8 block0() + j, keys 4 lane .. 4 lane + 3 (this thread's own copies).
		rows_to_planes<8 * kBlocks, true>(xw, R, 8 * block0(), n, lane);
		// Kt^T: key kk = 32 m + lane, the eight tokens of block b into one 16-byte unit (hi and lo).
#pragma unroll
		for (int bb = 0; bb < kBlocks; ++bb) {
			const int b = block0() + bb;
			float e[8];
#pragma unroll
			for (int j = 0; j < 8; ++j) e[j] = __shfl_sync(0xffffffffu, ef, 8 * bb + j);
#pragma unroll
			for (int m = 0; m < 4; ++m) {
				const int kk = 32 * m + lane;
				float xv[8];
#pragma unroll
				for (int j = 0; j < 8; ++j) {
					const int i = 8 * b + j;
					xv[j] = i < n ? __fmul_rn(R[kC * kD + i * kD + kk], e[j]) : 0.f;
				}
				U32x4 hi, lo;
				tc::split_bf16x2(xv[0], xv[1], hi.x, lo.x);
				tc::split_bf16x2(xv[2], xv[3], hi.y, lo.y);
				tc::split_bf16x2(xv[4], xv[5], hi.z, lo.z);
				tc::split_bf16x2(xv[6], xv[7], hi.w, lo.w);
				const int off = kk * 128 + ((b ^ (kk & 7)) << 4);
				*reinterpret_cast<U32x4*>(xk + off) = hi;
				*reinterpret_cast<U32x4*>(xk + 16384 + off) = lo;
			}
		}
		wg::fence_proxy_async();
	}

	// load_u (state warps, after convert's wait): U^T of chunk n into uv (zero past n, and zero without
	// U: the summary walk's P columns) from this warp's own columns of UR, and (setGl) gamma_last.
	__device__ __forceinline__ void load_u(int n, bool hasU, bool setGl = true) {
		if (setGl) gl = gln;
		__syncwarp();  // the warp's U copies, each visible to its own lane after the wait, to the warp
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
			for (int r = 0; r < 4; ++r) {
				const int i = 8 * nt + 2 * t + (r & 1);
				uv[4 * nt + r] = hasU && i < n ? UR[ur(i, col(r))] : 0.f;
			}
		}
	}

	// split_frags: the A fragments of K k steps from accumulators acc (k step k: acc[8k .. 8k+7] as
	// bf16 pairs), hi and lo parts.
	template <int K>
	__device__ __forceinline__ static void split_frags(const float* acc, unsigned (&ah)[K][4], unsigned (&al)[K][4]) {
#pragma unroll
		for (int k = 0; k < K; ++k) {
#pragma unroll
			for (int q = 0; q < 4; ++q) tc::split_bf16x2(acc[8 * k + 2 * q], acc[8 * k + 2 * q + 1], ah[k][q], al[k][q]);
		}
	}

	// vprime_issue issues (1) on stage x: d = S^T (-W)^T (from zero; vprime_wait adds U^T). ah, al
	// must live until the wait.
	__device__ __forceinline__ void vprime_issue(int x, unsigned (&ah)[8][4], unsigned (&al)[8][4]) {
		vprime_issue_at(X + x * 32768, ah, al);
	}

	// vprime_issue_at: vprime_issue on the -W hi / lo planes at xw (1024-aligned, lo 16384 bytes on).
	__device__ __forceinline__ void vprime_issue_at(const unsigned char* xw, unsigned (&ah)[8][4], unsigned (&al)[8][4]) {
		split_frags<8>(s, ah, al);
		wg::fence();
#pragma unroll
		for (int k = 0; k < 8; ++k) {
			const unsigned char* b = xw + (k / 4) * 8192 + (k % 4) * 32;
			const unsigned long long bh = wg::desc_sw128(b), bl = wg::desc_sw128(b + 16384);
			wg::mma_m64n64k16_rs(d, ah[k], bh, k == 0 ? 0 : 1);  // k step 0 starts from zero
			wg::mma_m64n64k16_rs(d, ah[k], bl);
			wg::mma_m64n64k16_rs(d, al[k], bh);
		}
		wg::commit();
	}

	// vprime_wait waits for (1) and adds U^T: d = V'^T.
	__device__ __forceinline__ void vprime_wait() {
		wg::wait<0>();
		wg::fence_operand(d);
#pragma unroll
		for (int i = 0; i < 32; ++i) d[i] = uv[i] + d[i];
	}

	// decay_state: S^T = e^gl S^T, (2)'s first term. With kDecayEarly the walks call it under (1), after
	// the chunk's state stores (which read S^T before it), instead of between (1)'s wait and (2)'s issue.
	__device__ __forceinline__ void decay_state() {
		const float decay = expf(gl);
#pragma unroll
		for (int i = 0; i < 64; ++i) s[i] *= decay;
	}

	// update_issue issues (2) on stage x: S^T = e^gl S^T + V'^T Kt. ah, al must live until the wait.
	__device__ __forceinline__ void update_issue(int x, unsigned (&ah)[4][4], unsigned (&al)[4][4]) {
		update_issue_at(X + kOffXK + x * 32768, ah, al);
	}

	// update_issue_at: update_issue on the Kt^T hi / lo planes at xk (1024-aligned, lo 16384 bytes on).
	__device__ __forceinline__ void update_issue_at(const unsigned char* xk, unsigned (&ah)[4][4], unsigned (&al)[4][4]) {
		split_frags<4>(d, ah, al);
		if (!kDecayEarly) decay_state();
		wg::fence();
#pragma unroll
		for (int k = 0; k < 4; ++k) {
			const unsigned long long bh = wg::desc_sw128(xk + 32 * k), bl = wg::desc_sw128(xk + 16384 + 32 * k);
			wg::mma_m64n128k16_rs(s, ah[k], bh);
			wg::mma_m64n128k16_rs(s, ah[k], bl);
			wg::mma_m64n128k16_rs(s, al[k], bh);
		}
		wg::commit();
	}

	__device__ __forceinline__ void walk(const float* w, const float* u, const float* kn, const float* gcum,
	                                     const int* chunk_tok0, const int* chunk_len, int ch0, int nch, int h, int HV,
	                                     int c0, float* h_out, float* vnew, bf16* h16, bf16* vnew16, int HQK) {
		if (nch <= 0) return;
		const int qh = h / (HV / HQK);
		const int last = ch0 + nch - 1;
		issue(w, u, kn, chunk_tok0[ch0], chunk_len[ch0], h, HV, c0, HQK, qh);
		prefetch_gates(gcum, chunk_tok0[ch0], chunk_len[ch0], h, HV);
		convert(0, chunk_len[ch0]);
		if (holds()) load_u(chunk_len[ch0], u != nullptr);
		{
			const int c1 = ch0 + 1 < last ? ch0 + 1 : last;
			__syncwarp();
			issue(w, u, kn, chunk_tok0[c1], chunk_len[c1], h, HV, c0, HQK, qh);
			prefetch_gates(gcum, chunk_tok0[c1], chunk_len[c1], h, HV);
		}
		for (int ci = 0; ci < nch; ++ci) {
			const int c = ch0 + ci, x = ci & 1, n = chunk_len[c];
			// The next chunk and the one after (or the last again): the copies, gates and conversion run
			// unconditionally (a stage filled past the end is not read again), so that no branch on nch
			// separates (2) from its wait.
			const int cn = c + 1 < last ? c + 1 : last, cn2 = c + 2 < last ? c + 2 : last;
			__syncthreads();
			GDNKCP_WALK_MARK(0, ci);  // every warp: past the chunk's barrier
			if (holds()) {
				const long long blk = (long long)c * HV + h;
				unsigned ah[8][4], al[8][4];
				vprime_issue(x, ah, al);
				GDNKCP_WALK_MARK(1, ci);  // state: S split, (1) issued
				// The chunk's stores are issued while its products run: H (read from s, which (1) does
				// not write) under (1), V' (read from d, which (2) does not write) under (2).
				if (h_out != nullptr) store_state(h_out + blk * kD * kD, c0);
				if (h16 != nullptr) store_state16(h16 + blk * kD * kD, c0);
				if (kDecayEarly) decay_state();
				GDNKCP_WALK_MARK(2, ci);  // state: H stores issued
				vprime_wait();
				GDNKCP_WALK_MARK(3, ci);  // state: (1) done, U^T added
				unsigned bh[4][4], bl[4][4];
				update_issue(x, bh, bl);
				GDNKCP_WALK_MARK(4, ci);  // state: V' split, S decayed, (2) issued
				if (vnew != nullptr) store_vprime(vnew, chunk_tok0[c], n, h, HV, c0);
				if (vnew16 != nullptr) store_vprime16(vnew16 + blk * kD * kC, n, c0);
				GDNKCP_WALK_MARK(5, ci);  // state: V' stores issued
				// (2) is waited for here, before the conversion: with the wait after it (the conversion
				// under (2)), ptxas 13.0 serialized every wgmma of the kernel (C7515) and the walk was
				// 13% slower; a wait outside the state branch was needed then too (C7517).
				wg::wait<0>();
				wg::fence_operand(s);
				GDNKCP_WALK_MARK(6, ci);  // state: (2) done
			}
			convert(1 - x, chunk_len[cn]);  // copies issued an iteration ago
			GDNKCP_WALK_MARK(7, ci);  // every warp: the conversion done (state warps: their copies waited)
			if (holds()) load_u(chunk_len[cn], u != nullptr);
			// R and UR are free again as soon as their warp has read them (each warp copies only what
			// its own lanes read): chunk cn2's copies start now and have a whole chunk to land.
			__syncwarp();
			issue(w, u, kn, chunk_tok0[cn2], chunk_len[cn2], h, HV, c0, HQK, qh);
			prefetch_gates(gcum, chunk_tok0[cn2], chunk_len[cn2], h, HV);
			GDNKCP_WALK_MARK(8, ci);  // every warp: the next copies and gates issued
		}
		tc::cp_async_wait<0>();  // the copies issued past the end land before the CTA exits
	}
};

template <int VH>
__device__ __forceinline__ void state_walk(float* smem, const float* w, const float* u, const float* kn,
                                           const float* gcum, const int* chunk_tok0, const int* chunk_len,
                                           const int* seg_chunk0, const int* seg_nchunk, const float* start,
                                           float* h_out, float* vnew, float* final_state, bf16* h16, bf16* vnew16,
                                           int HQK, int HV) {
	WGWalker<VH> wk(smem);
	const int c0 = blockIdx.x * VH, seg = blockIdx.y, h = blockIdx.z;
	wk.init_state(start + ((long long)seg * HV + h) * kD * kD, c0);
	wk.walk(w, u, kn, gcum, chunk_tok0, chunk_len, seg_chunk0[seg], seg_nchunk[seg], h, HV, c0, h_out, vnew, h16,
	        vnew16, HQK);
	wk.store_state(final_state + ((long long)seg * HV + h) * kD * kD, c0);
}

// summary_walk: gdn_summary_walk_mma16's sm_90a body. Blocks x < 128 / vh walk the Q columns (U read, from
// a zero state), the others the P columns (no U, from the identity's columns); nothing is stored per chunk.
template <int VH>
__device__ __forceinline__ void summary_walk(float* smem, const float* w, const float* u, const float* kn,
                                             const float* gcum, const int* chunk_tok0, const int* chunk_len,
                                             const int* seg_chunk0, const int* seg_nchunk, const int* list,
                                             float* out_p, float* out_q, int HV, int HQK) {
	WGWalker<VH> wk(smem);
	const int tiles = kD / VH;
	const bool isP = (int)blockIdx.x >= tiles;
	const int c0 = (isP ? (int)blockIdx.x - tiles : (int)blockIdx.x) * VH;
	const int li = blockIdx.y, h = blockIdx.z, seg = list[li];
	wk.init_state(nullptr, c0, isP);
	wk.walk(w, isP ? nullptr : u, kn, gcum, chunk_tok0, chunk_len, seg_chunk0[seg], seg_nchunk[seg], h, HV, c0,
	        nullptr, nullptr, nullptr, nullptr, HQK);
	wk.store_state((isP ? out_p : out_q) + ((long long)li * HV + h) * kD * kD, c0);
}

}  // namespace walkwg
}  // namespace gdnkcp
