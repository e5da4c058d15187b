// gdn_walk_planes.cu: the v5 summary and state walks on the prep's walk planes (walk_planes.cuh), for every
// target from one source:
//   gdn_state_walk_planes     grid (128/vh, NS, HV), block 256, dynamic shared memory walk_planes_smem(vh)
//   gdn_summary_walk_planes   grid (2 x 128/vh, |list|, HV), the same block and shared memory
// Their last argument `order` (int32, one entry a block, may be null): block i runs as CTA order[i] of the
// launch order (tc::dispatch_cta), kcp's dispatch order (sched.DispatchOrder), which the GPU, handing CTAs
// out by block index, then follows; the outputs are the same bits.
// gdn_state_walk_mma16's and gdn_summary_walk_mma16's outputs and layouts, with -W's walk planes wp (32 KB a
// chunk and value head: bf16 hi / lo) and k's bf16 rows with their rstd in place of fp32 w, kn. On sm_90a the
// products are wgmma (wgmma.cuh); elsewhere (the other cubins, the compute_80 PTX, the CPU emulator's default
// build) they are wgmma.cuh's portable products on mma.sync, the same calls and layouts.
//
// ---- What changes against gdn_walk_wgmma.cu's WGWalker (whose state, products and stores it reuses) ------
// WGWalker's converters turn a chunk's fp32 W and kn rows into bf16 hi / lo planes in shared memory, 6,700 of
// a chunk's 7,900 cycles on the H200 (the timeline in docs/mma-kernels.md). Here the prep has written -W's
// (in parallel over chunks and heads) and the walk only copies: stage x (x = chunk % 2) holds the chunk's
// 32 KB of -W planes as they lie in global memory (the same 1024-aligned swizzle, so the descriptors read them
// directly), k's 64 bf16 rows of the chunk's QK head (16 KB, the MN-major 128-byte-swizzled tile of (2)'s
// B) and its fp32 U^T rows ([64][vh], WGWalker::ur's swizzle), then 64 factors s_i:
//   stage x  0      -W hi, lo (two 64-key blocks each)
//            32768  k rows (keys 0-63 of the 64 tokens, then keys 64-127)
//            49152  U rows
// then, at vh 64 only, two output buffers (24 KB each: the chunk's bf16 H^T and V'^T tiles, PlaneWalker::
// stage_out): walk_planes_smem(64) = 183280, walk_planes_smem(128) = 166896 bytes (kcp: walkPlanesSmem).
// (2) is S^T = e^gl S^T + (V'^T diag(s)) K with s_i = e_i rstd_i (Kt_i = k_i rstd_i e_i): k is exact bf16,
// so two products (V'^T diag(s) split hi / lo, times K) where K^T's hi / lo planes of the normalised k took
// three, and the walk copies 16 KB of k where those planes were 32 KB.
// A chunk: every thread waits for its own copies of the chunk's stage and fences them for the async proxy;
// __syncthreads (the stage complete; every wgmma of the previous chunk waited, so the other stage is free);
// the copies of the next chunk into the other stage (a whole chunk to land); the state warps run WGWalker's
// (1) and H stores, read U^T, wait for (1), then (2) and the V' stores. At vh 64
// the bf16 H^T and V'^T go into an output buffer (conflict-free 4-byte shared stores) and the copying
// warpgroup stores the previous chunk's buffer to global memory as whole 512-byte runs while the state
// warps compute (the last chunk's after the loop); fp32 h_out / vnew (a backward's) stay direct. -W's planes
// and k's rows are copied by the warps that hold no state (vh 64: warpgroup 1, 24 16-byte copies a thread a
// chunk) or by all (vh 128: 12); each state warp copies its own U^T columns.
// Bits: -W's planes are the converters' values (walk_planes.cuh) and (1)'s products, their order and U^T's
// addition are WGWalker's; (2) rounds V'_i s_i once and multiplies by exact k (other bits than
// gdn_state_walk_mma16's Kt split, within wgmmaWalkTol of it: TestPlaneWalksOnCPU); vh 64 and vh 128 agree
// bitwise (a column's instructions and operands do not depend on vh), as do reruns.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gdn_walk_wgmma.cu"
#include "walk_planes.cuh"

namespace gdnkcp {
namespace walkp {

using tc::bf16;
using walkwg::kC;
using walkwg::kD;
using walkplanes::KRows;
using walkplanes::kWBytes;
constexpr int kKRowBytes = kC * kD * 2;     // the chunk's bf16 k rows (16 KB)
constexpr int kOffK = kWBytes;              // k's rows after -W's planes in a stage
constexpr int kOffU = kWBytes + kKRowBytes;  // then U^T's fp32 rows
__host__ __device__ constexpr int off_e(int vh) { return kOffU + kC * vh * 4; }  // then the 64 factors e_i
// Compile-time knobs (defaults: what was measured on the H200, 2026-12-02): GDNKCP_WP_STAGE_H / _V: at vh
// 64 the bf16 H^T / V'^T go through the output buffers (1) or straight to global memory from the state
// warps (0); GDNKCP_WP_U_LATE: U^T read after (1)'s issue and the H stores (1) or after the barrier (0);
// GDNKCP_WP_OUT_UNROLL below.
// scripts/planes-variants.sh prints ptxas's registers and spills of each combination.
#ifndef GDNKCP_WP_STAGE_H
#define GDNKCP_WP_STAGE_H 1
#endif
#ifndef GDNKCP_WP_STAGE_V
#define GDNKCP_WP_STAGE_V 1
#endif
#ifndef GDNKCP_WP_U_LATE
#define GDNKCP_WP_U_LATE 1
#endif
// GDNKCP_WP_OUT_UNROLL: how far the copying warps' output-store loops unroll (8: fully, every load ahead of
// the stores; 1: a load and its store at a time, fewer registers).
#ifndef GDNKCP_WP_OUT_UNROLL
#define GDNKCP_WP_OUT_UNROLL 8
#endif
constexpr int kOutUnroll = GDNKCP_WP_OUT_UNROLL;
// GDNKCP_WP_XOR_ADDR: the output buffers' swizzled store addresses as an XOR of the row's (stage_out).
#ifndef GDNKCP_WP_XOR_ADDR
#define GDNKCP_WP_XOR_ADDR 1
#endif
constexpr bool kXorAddr = GDNKCP_WP_XOR_ADDR != 0;
// GDNKCP_WP_META_AHEAD: the walk reads each chunk's (t0, n) a chunk ahead, under the previous chunk's (2)
// (1), or right after the chunk's barrier, where the state warps waited on them (0; ncu on v5.25: ~11% of
// the state warps' stall samples, one long-scoreboard wait after issue's U copies).
#ifndef GDNKCP_WP_META_AHEAD
#define GDNKCP_WP_META_AHEAD 1
#endif
constexpr bool kMetaAhead = GDNKCP_WP_META_AHEAD != 0;
// GDNKCP_WP_META_CALC: the walk computes each chunk's (t0, n) from the segment's first chunk, t0 = t0_first +
// 64 i and n = min(64, len - 64 i) for the segment's chunk i (1; kcp's tables and the emulator's lay a
// segment's chunks out so: 64 tokens each from its start, the last one shorter, and the walk traps on tables
// whose last chunk does not start where that puts it), or reads them from chunk_tok0 / chunk_len in the loop
// (0, as GDNKCP_WP_META_AHEAD says). With 1 no warp loads metadata inside the chunk loop.
#ifndef GDNKCP_WP_META_CALC
#define GDNKCP_WP_META_CALC 1
#endif
constexpr bool kMetaCalc = GDNKCP_WP_META_CALC != 0;
// GDNKCP_WP_U_ZFILL: issue zero-fills U^T's rows from n on in the stage (plain 16-byte stores, as
// copy_rows_mn zeroes k's rows) and the state warps read U^T without a guard on n (1, load_u_full), or
// issue copies only the rows < n and the reads test each token against n (0, WGWalker::load_u). ncu on v5.31's
// state walk (32K, vh 64; docs/perf-notes.md, twenty-fourth session): load_u's 32 guarded loads, which
// ptxas compiles as branches, took ~15% of the kernel's stall samples, between (1)'s issue and its wait,
// where the state warps never waited on (1): they were the chain.
#ifndef GDNKCP_WP_U_ZFILL
#define GDNKCP_WP_U_ZFILL 1
#endif
constexpr bool kUZfill = GDNKCP_WP_U_ZFILL != 0;
// GDNKCP_WP_U_AHEAD: each state warp issues the copies of U^T of the chunk after next into the stage it has just
// read U^T from, under (2), where it waits on (2), and waits at a chunk's top for all but that last commit group
// (1); or issues the next chunk's with the copiers' at the chunk's top, before (1)'s issue, on its chain (0).
// The stage's U^T slot is free once read_u has read it (before (1)'s wait), and the copiers refill only the
// stage's planes and factors. No shared memory added.
#ifndef GDNKCP_WP_U_AHEAD
#define GDNKCP_WP_U_AHEAD 1
#endif
constexpr bool kUAhead = GDNKCP_WP_U_AHEAD != 0;
// GDNKCP_WP_STMATRIX: where the walks run on wgmma (sm_90a, and the emulator's wgmma runner), stage_out writes
// a state warp's H^T and V'^T into the output buffer with stmatrix (1: 8 + 4 stmatrix.x4, one row address a
// lane) or with 4-byte stores (0; the portable path always). ncu on v5.31's state walk: the 32 stores of H^T
// and their swizzled addresses (~270 LOP3 / IMAD a chunk, short-scoreboard stalls on registers reused under
// a pending store) between (1)'s issue and its wait, on the state warps' chain. The same bytes either way.
#ifndef GDNKCP_WP_STMATRIX
#define GDNKCP_WP_STMATRIX 1
#endif

// A stage: the planes (64 KB), U^T (64 x vh fp32), e (256 bytes), rounded up to 1024 bytes.
__host__ __device__ constexpr int stage_bytes(int vh) { return (off_e(vh) + 4 * kC + 1023) / 1024 * 1024; }
// At vh 64 the bf16 H^T and V'^T of a chunk go through shared memory (out_bytes: 16 KB + 8 KB, two
// buffers after the stages) and the copying warpgroup stores them; at vh 128 every warp holds state and the
// state warps store them directly.
__host__ __device__ constexpr int out_bytes(int vh) { return vh == 64 ? vh * kD * 2 + vh * kC * 2 : 0; }
// walk_planes_smem: two stages, two output buffers at vh 64 and up to 1008 bytes of alignment (the stages
// are 1024-aligned).
__host__ __device__ constexpr int walk_planes_smem(int vh) { return 2 * stage_bytes(vh) + 2 * out_bytes(vh) + 1008; }
static_assert(walk_planes_smem(128) <= 232448, "two stages fit an SM's 227 KB");

// ---- The staged bf16 output tiles (vh 64: H^T and V'^T here, D^T and dV'^T in gdn_tape_planes.cu) -----------
// An output buffer holds a tile of 64 rows (the CTA's columns) of RB bytes (256: 128 keys; 128: 64 tokens),
// 16-byte unit u of row r at u ^ (r % 8), so that a state warp's 4-byte stores (rows g, units nt) fall on 32
// different banks and its stmatrix rows on whole 16-byte units.

// stage_tile writes a state warp's words into the buffer tile at buf: the warp holds rows row0 .. row0 + 15
// (row0 a multiple of 16), word(nt, hf) the packed bf16 pair of its row g + 8 hf over columns 8 nt + 2t, + 1
// (lane = 4 g + t), for NT 8-column tiles. With stmatrix (GDNKCP_WP_STMATRIX on the wgmma path) four matrices
// an instruction, (0, 2j), (1, 2j), (0, 2j + 1), (1, 2j + 1): lane L gives the address of row L % 8 of matrix
// L / 8, i.e. of row r = row0 + 8 ((L / 8) % 2) + L % 8, unit 2j + L / 16 at that XOR r % 8; else one 4-byte
// store a word. The same bytes either way.
template <int NT, int RB, class Word>
__device__ __forceinline__ void stage_tile(unsigned char* buf, int row0, int lane, Word word) {
#if defined(GDNKCP_HAS_WGMMA)
	if constexpr (GDNKCP_WP_STMATRIX != 0) {
		const int mi = lane >> 3, i = lane & 7;
		unsigned char* row = buf + (row0 + 8 * (mi & 1) + i) * RB;
#pragma unroll
		for (int j = 0; j < NT / 2; ++j) {
			const unsigned q[4] = {word(2 * j, 0), word(2 * j, 1), word(2 * j + 1, 0), word(2 * j + 1, 1)};
			wg::stmatrix_x4(row + (((2 * j + (mi >> 1)) ^ i) << 4), q);
		}
	} else
#endif
	{
		const int g = lane >> 2, t = lane & 3;
#pragma unroll
		for (int hf = 0; hf < 2; ++hf) {
			const int r = row0 + g + 8 * hf;
#pragma unroll
			for (int nt = 0; nt < NT; ++nt) *reinterpret_cast<unsigned*>(buf + r * RB + ((nt ^ (r & 7)) << 4) + 4 * t) = word(nt, hf);
		}
	}
}

// store_staged (the copying warps, ct = 0..127): output buffer hb (its first tile, 64 rows of 256 bytes, then
// the second, 64 rows of 128, at vb) to chunk blk's tiles in global memory (rows c0 ..; h16: [128][128],
// vnew16: [128][64] bf16 a chunk and head), 16 bytes a thread and unit, a warp's 32 units contiguous.
template <int VH>
__device__ __forceinline__ void store_staged(const unsigned char* hb, long long blk, int c0, int ct, bf16* h16, bf16* vnew16) {
	const unsigned char* vb = hb + VH * kD * 2;
	if (h16 != nullptr) {
		unsigned char* g = reinterpret_cast<unsigned char*>(h16 + blk * kD * kD + (long long)c0 * kD);
		// Unit ct % 16 of rows ct / 16 + 8 j: the swizzle (row % 8) is the same for every j.
		const int r0 = ct / 16, u0 = ct % 16;
		const unsigned char* src = hb + r0 * 256 + ((u0 ^ (r0 & 7)) << 4);
#pragma unroll(kOutUnroll)
		for (int j = 0; j < VH * 16 / 128; ++j)
			*reinterpret_cast<float4*>(g + 16 * ct + 2048 * j) = *reinterpret_cast<const float4*>(src + 2048 * j);
	}
	if (vnew16 != nullptr) {
		unsigned char* g = reinterpret_cast<unsigned char*>(vnew16 + blk * kD * kC + (long long)c0 * kC);
		// Unit ct % 8 of rows ct / 8 + 16 j: the swizzle (row % 8) is the same for every j.
		const int r0 = ct / 8, u0 = ct % 8;
		const unsigned char* src = vb + r0 * 128 + ((u0 ^ (r0 & 7)) << 4);
#pragma unroll(kOutUnroll)
		for (int j = 0; j < VH * 8 / 128; ++j)
			*reinterpret_cast<float4*>(g + 16 * ct + 2048 * j) = *reinterpret_cast<const float4*>(src + 2048 * j);
	}
}

template <int VH>
struct PlaneWalker : walkwg::WGWalker<VH> {
	using Base = walkwg::WGWalker<VH>;
	using Base::col;
	using Base::converts;
	using Base::d;
	using Base::gl;
	using Base::gln;
	using Base::grp;
	using Base::holds;
	using Base::lane;
	using Base::s;
	using Base::ur;
	using Base::UR;
	using Base::warp;
	using Base::wq;
	using Base::X;
	static constexpr int kCopiers = Base::kGroups == 2 ? 256 : 128;  // threads that copy the planes

	__device__ __forceinline__ explicit PlaneWalker(float* smem) : Base(smem) {}

	__device__ __forceinline__ unsigned char* stage(int x) const { return X + x * stage_bytes(VH); }

	// ---- vh 64: the chunk's bf16 H^T and V'^T through shared memory ----
	// Output buffer x: H^T rows (columns c0 + r, 128 keys, 256 bytes) then V'^T rows (64 tokens, 128 bytes),
	// 16-byte unit u of row r at u ^ (r % 8): a state warp's 4-byte stores (rows g, units nt) fall on 32
	// different banks. The copying warps store them a chunk later as whole 512-byte runs of a warp (the
	// direct 4-byte global stores, eight rows a warp store, took ~2,900 of a chunk's cycles on the state
	// warps' chain: the timeline in docs/mma-kernels.md).
	static constexpr bool kStagedH = VH == 64 && GDNKCP_WP_STAGE_H != 0, kStagedV = VH == 64 && GDNKCP_WP_STAGE_V != 0;
	static constexpr bool kStaged = kStagedH || kStagedV;
	__device__ __forceinline__ unsigned char* outbuf(int x) const { return X + 2 * stage_bytes(VH) + x * out_bytes(VH); }

	// stage_out writes this state warp's H^T (from s) and V'^T (from d, zero past n) into output buffer x,
	// the values and packing of store_state16 / store_vprime16.
	__device__ __forceinline__ void stage_out(int x, int n, bool hasH, bool hasV) const {
		unsigned char* hb = outbuf(x);
		unsigned char* vb = hb + VH * kD * 2;
#if defined(GDNKCP_HAS_WGMMA)
		if constexpr (GDNKCP_WP_STMATRIX != 0) {  // stage_tile's stmatrix; the 4-byte stores below otherwise
			const int row0 = 64 * grp + 16 * wq;
			if (hasH)
				stage_tile<16, 256>(hb, row0, lane, [&](int nt, int hf) { return tc::pack_bf16x2(s[4 * nt + 2 * hf], s[4 * nt + 2 * hf + 1]); });
			if (hasV)
				stage_tile<8, 128>(vb, row0, lane, [&](int nt, int hf) {
					const int tok = 8 * nt + 2 * this->t;  // tokens from n on zero
					return tc::pack_bf16x2(tok < n ? d[4 * nt + 2 * hf] : 0.f, tok + 1 < n ? d[4 * nt + 2 * hf + 1] : 0.f);
				});
		} else
#endif
		{  // 4-byte stores
#pragma unroll
			for (int hf = 0; hf < 2; ++hf) {
				const int r = col(0) + 8 * hf;
				// With GDNKCP_WP_XOR_ADDR the unit's swizzle is an XOR of the row's offset from X (the buffers
				// lie at multiples of 1024 from X, so bits 4-7 of the offset are the unit's), and the offset
				// depends on x: the 16 swizzled offsets are no loop invariants for ptxas to keep in registers
				// across the chunk loop (nvcc 11.8, sm_80: 249 -> 232 registers).
				const int hrow = static_cast<int>(hb - X) + r * 256 + 4 * this->t + ((r & 7) << 4);
				const int vrow = static_cast<int>(vb - X) + r * 128 + 4 * this->t + ((r & 7) << 4);
				if (hasH) {
#pragma unroll
					for (int nt = 0; nt < 16; ++nt) {
						unsigned* p = kXorAddr ? reinterpret_cast<unsigned*>(X + (hrow ^ (nt << 4)))
						                       : reinterpret_cast<unsigned*>(hb + r * 256 + ((nt ^ (r & 7)) << 4) + 4 * this->t);
						*p = tc::pack_bf16x2(s[4 * nt + 2 * hf], s[4 * nt + 2 * hf + 1]);
					}
				}
				if (hasV) {
#pragma unroll
					for (int nt = 0; nt < 8; ++nt) {
						const int i = 8 * nt + 2 * this->t;
						const float a = i < n ? d[4 * nt + 2 * hf] : 0.f, b = i + 1 < n ? d[4 * nt + 2 * hf + 1] : 0.f;
						unsigned* p = kXorAddr ? reinterpret_cast<unsigned*>(X + (vrow ^ (nt << 4)))
						                       : reinterpret_cast<unsigned*>(vb + r * 128 + ((nt ^ (r & 7)) << 4) + 4 * this->t);
						*p = tc::pack_bf16x2(a, b);
					}
				}
			}
		}
	}

	// store_out (the copying warps, ct = 0..127): output buffer x to chunk blk's H^T and V'^T (store_staged).
	__device__ __forceinline__ void store_out(int x, long long blk, int c0, int ct, bf16* h16, bf16* vnew16) const {
		store_staged<VH>(outbuf(x), blk, c0, ct, h16, vnew16);
	}

	float ge_i, ge_l, ge_r;  // a copier ct < 64: gcum of token ct (or n - 1) and of token n - 1, ct's k rstd
	int ge_n;

	// issue starts the copies of chunk c (t0, n) into stage x: a copier's share of -W's 32 KB of planes (value
	// head h; 16-byte units ct, ct + kCopiers, ...: a warp's 32 units contiguous) and of k's 64 bf16 rows
	// (QK head qh, as they lie, into the MN-major 128-byte-swizzled tile that (2) reads: keys 0-63 of every
	// token in the first 8 KB, keys 64-127 in the next; zero from row n on, by plain stores), a state warp's
	// 16 U columns of the rows < n (and zeros in the rows from n on, kUZfill); one commit group. A state
	// warp also loads gamma_last of the chunk into gln, a copier ct < 64 the gates and k's rstd of s_ct
	// (finish_e).
	__device__ __forceinline__ void issue(const unsigned char* wp, const KRows& kr, const float* u, const float* gcum, int c,
	                                      int t0, int n, int h, int HV, int qh, int HQK, int c0, int x) {
		unsigned char* st = stage(x);
		if (converts()) {
			const int ct = copier();
			walkplanes::copy_wplanes<kCopiers>(st, wp, c, h, HV, ct);
			walkplanes::copy_rows_mn<kCopiers>(st + kOffK, kr.k + (long long)t0 * kr.stride + (long long)qh * kD, kr.stride,
			                                   n, ct);
			if (ct < kC) {
				const int i = ct < n ? ct : n - 1;
				ge_n = n;
				ge_i = gcum[(long long)(t0 + i) * HV + h];
				ge_l = gcum[(long long)(t0 + n - 1) * HV + h];
				ge_r = kr.rstd[(long long)(t0 + i) * HQK + qh];
			}
		}
		if (holds()) {
			if (!kUAhead) copy_u(u, t0, n, h, HV, c0, x);
			gln = gcum[(long long)(t0 + n - 1) * HV + h];
		}
		tc::cp_async_commit();
	}

	// copy_u (state warps): this warp's 16 U^T columns of chunk (t0, n), rows < n, into stage x's U^T slot
	// (zeros in the rows from n on, kUZfill: by the copies themselves with GDNKCP_WALK_CP_ZFILL, row t0 the
	// valid source they do not read); no commit (issue's, or issue_u's). Nothing without u.
	__device__ __forceinline__ void copy_u(const float* u, int t0, int n, int h, int HV, int c0, int x) {
		if (u == nullptr) return;
		// Lane copies column unit cc of tokens lane / 4 + 8 y (WGWalker::issue's U copies).
		const int i0 = lane / 4, cc = 64 * grp + 16 * wq + 4 * (lane % 4);
		const long long us = 8LL * HV * kD;
		const float* u0 = u + ((long long)t0 * HV + h) * kD + c0 + cc;
		const float* up = u0 + i0 * (us / 8);
		float* dst = reinterpret_cast<float*>(stage(x) + kOffU) + ur(i0, cc);
#pragma unroll
		for (int y = 0; y < 8; ++y) {
			const bool full = i0 + 8 * y < n;
			if (GDNKCP_WALK_CP_ZFILL)
				tc::cp_async16_zfill(dst + 8 * y * VH, full ? up : u0, full);
			else if (full)
				tc::cp_async16(dst + 8 * y * VH, up);
			else if (kUZfill)  // read by load_u_full after the next barrier
				*reinterpret_cast<walkwg::U32x4*>(dst + 8 * y * VH) = walkwg::U32x4{0u, 0u, 0u, 0u};
			up += us;
		}
	}

	// issue_u (kUAhead; state warps): copy_u of chunk (t0, n) into stage x as one commit group (committed even
	// without u, so that every state warp's groups are the same in number).
	__device__ __forceinline__ void issue_u(const float* u, int t0, int n, int h, int HV, int c0, int x) {
		copy_u(u, t0, n, h, HV, c0, x);
		tc::cp_async_commit();
	}

	__device__ __forceinline__ int copier() const {
		return Base::kGroups == 2 ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x) - 128;
	}

	// load_u_full (kUZfill; state warps): WGWalker::load_u's values without its test on n: U^T's rows from n
	// on are the zeros issue stored there. Zero without U (the summary walk's P columns).
	__device__ __forceinline__ void load_u_full(bool hasU) {
		__syncwarp();  // the warp's U copies and zero stores, each visible to its own lane, to the warp
		if (hasU) {
#pragma unroll
			for (int nt = 0; nt < 8; ++nt)
#pragma unroll
				for (int r = 0; r < 4; ++r) this->uv[4 * nt + r] = this->UR[ur(8 * nt + 2 * this->t + (r & 1), col(r))];
		} else {
#pragma unroll
			for (int i = 0; i < 32; ++i) this->uv[i] = 0.f;
		}
	}
	__device__ __forceinline__ void read_u(int n, bool hasU) {
		if (kUZfill)
			load_u_full(hasU);
		else
			Base::load_u(n, hasU, false);
	}

	// finish_e writes s_i = e_i rstd_i (e_i = e^(gamma_last - gamma_i), WGWalker::convert's expression; rstd_i
	// k's of token i: Kt_i = k_i rstd_i e_i) of the chunk last issued (zero from token n on) into stage x, one
	// token a copier ct < 64: read after the next barrier.
	__device__ __forceinline__ void finish_e(int x) const {
		const int ct = copier();
		if (converts() && ct < kC)
			reinterpret_cast<float*>(stage(x) + off_e(VH))[ct] = ct < ge_n ? expf(ge_l - ge_i) * ge_r : 0.f;
	}

	// update_issue_scaled issues (2) on k's bf16 rows at kb (the MN-major tile issue copies): S^T = e^gl S^T +
	// (V'^T diag(s)) K, s from E (the stage's 64 factors s_i = e_i rstd_i): V'^T's token columns scaled (one
	// rounded product each) and split hi / lo; k's rows are exact bf16, so two products (hi K, lo K) where
	// the normalised k's hi / lo planes took three. d itself keeps V'^T for the V' stores. ah, al must live
	// until the wait.
	__device__ __forceinline__ void update_issue_scaled(const unsigned char* kb, const float* E, unsigned (&ah)[4][4],
	                                                    unsigned (&al)[4][4]) {
		const int t = this->t;
#pragma unroll
		for (int k = 0; k < 4; ++k) {
			// d[8k + 2q], d[8k + 2q + 1]: tokens 16k + 8 (q / 2) + 2t, + 1
			const float2 e0 = *reinterpret_cast<const float2*>(E + 16 * k + 2 * t);
			const float2 e1 = *reinterpret_cast<const float2*>(E + 16 * k + 8 + 2 * t);
			tc::split_bf16x2(d[8 * k] * e0.x, d[8 * k + 1] * e0.y, ah[k][0], al[k][0]);
			tc::split_bf16x2(d[8 * k + 2] * e0.x, d[8 * k + 3] * e0.y, ah[k][1], al[k][1]);
			tc::split_bf16x2(d[8 * k + 4] * e1.x, d[8 * k + 5] * e1.y, ah[k][2], al[k][2]);
			tc::split_bf16x2(d[8 * k + 6] * e1.x, d[8 * k + 7] * e1.y, ah[k][3], al[k][3]);
		}
		if (!walkwg::kDecayEarly) this->decay_state();
		wg::fence();
#pragma unroll
		for (int k = 0; k < 4; ++k) {
			// Tokens 16 k ..: two 8-token atoms from 2048 k on; keys 64-127 8192 bytes on (lbo).
			const unsigned long long kd = wg::desc_sw128_mn(kb + 2048 * k, 8192);
			wg::mma_m64n128k16_rs_t(s, ah[k], kd, 8192);
			wg::mma_m64n128k16_rs_t(s, al[k], kd, 8192);
		}
		wg::commit();
	}

	__device__ __forceinline__ void walk(const unsigned char* wp, const KRows& kr, const float* u, const float* gcum,
	                                     const int* chunk_tok0, const int* chunk_len, int ch0, int nch, int h, int HV,
	                                     int HQK, int c0, float* h_out, float* vnew, bf16* h16, bf16* vnew16,
	                                     float* vnewp = nullptr) {
		if (nch <= 0) return;
		const int last = ch0 + nch - 1, qh = h / (HV / HQK);
		const int t00 = chunk_tok0[ch0];
		// kMetaCalc: the segment's tokens (its chunks' lengths summed), from which every chunk's n follows.
		const int slen = kMetaCalc ? (nch - 1) * kC + chunk_len[last] : 0;
		if (kMetaCalc && chunk_tok0[last] != t00 + (nch - 1) * kC) __trap();  // not the tables kcp builds
		issue(wp, kr, u, gcum, ch0, t00, chunk_len[ch0], h, HV, qh, HQK, c0, 0);
		if (kUAhead && holds()) {  // U^T of the first two chunks (the second: the last again where nch is 1)
			const int c1 = ch0 + 1 < last ? ch0 + 1 : last;
			issue_u(u, t00, chunk_len[ch0], h, HV, c0, 0);
			issue_u(u, chunk_tok0[c1], chunk_len[c1], h, HV, c0, 1);
		}
		finish_e(0);
		// The chunks' (t0, n) are computed (kMetaCalc) or read a chunk ahead (kAhead): n is chunk c's length,
		// t0n / nn the next chunk's, loaded under the previous chunk's (2) (the state warps) or at its end
		// (the copiers), so that no warp waits on a global load between the barrier and issue.
		constexpr bool kAhead = kMetaAhead && !kMetaCalc;
		int n = chunk_len[ch0], t0n = 0, nn = 0;
		if (kAhead) {
			const int c1 = ch0 + 1 < last ? ch0 + 1 : last;
			t0n = chunk_tok0[c1], nn = chunk_len[c1];
		}
		for (int ci = 0; ci < nch; ++ci) {
			const int c = ch0 + ci, x = ci & 1;
			if (kMetaCalc)
				n = min(kC, slen - kC * ci);
			else if (!kMetaAhead)
				n = chunk_len[c];
			// The next chunk (or the last again: copied into the stage no one reads, so that no branch
			// on nch sits between a wgmma and its wait), and the one after it.
			const int cn = c + 1 < last ? c + 1 : last, cnn = cn + 1 < last ? cn + 1 : last;
			if (kUAhead && holds())
				tc::cp_async_wait<1>();  // all but the chunk after next's U^T, committed last (under (2))
			else
				tc::cp_async_wait<0>();
			wg::fence_proxy_async();
			__syncthreads();
			GDNKCP_WALK_MARK(0, ci);  // every warp: past the chunk's barrier
			if (holds()) gl = gln;  // chunk c's gamma_last (issue loads the next chunk's into gln)
			if (kMetaCalc)
				t0n = t00 + kC * (cn - ch0), nn = min(kC, slen - kC * (cn - ch0));
			else if (!kMetaAhead)
				t0n = chunk_tok0[cn], nn = chunk_len[cn];
			issue(wp, kr, u, gcum, cn, t0n, nn, h, HV, qh, HQK, c0, 1 - x);
			const int n_next = nn;  // chunk cn's length: the next iteration's n
			if (kStaged && !holds() && ci > 0)  // the previous chunk's H^T and V'^T, staged by the state warps
				store_out(1 - x, (long long)(c - 1) * HV + h, c0, static_cast<int>(threadIdx.x) - 128, kStagedH ? h16 : nullptr,
				          kStagedV ? vnew16 : nullptr);
			if (!GDNKCP_WP_U_LATE && holds()) {
				UR = reinterpret_cast<float*>(stage(x) + kOffU);
				read_u(n, u != nullptr);
			}
			GDNKCP_WALK_MARK(7, ci);  // every warp: U read, the next copies issued
			if (holds()) {
				const long long blk = (long long)c * HV + h;
				unsigned ah[8][4], al[8][4];
				this->vprime_issue_at(stage(x), ah, al);
				GDNKCP_WALK_MARK(1, ci);  // state: S split, (1) issued
				if (h_out != nullptr) this->store_state(h_out + blk * kD * kD, c0);
				if (kStagedH)
					stage_out(x, n, h16 != nullptr, false);
				else if (h16 != nullptr)
					this->store_state16(h16 + blk * kD * kD, c0);
				if (walkwg::kDecayEarly) this->decay_state();
				GDNKCP_WALK_MARK(2, ci);  // state: H stores issued
				// U^T of the chunk, read only now: its 32 registers are not live beside S, (1)'s operands
				// and the H stores (read before (1)'s issue, ptxas 13.0 spilled 12 bytes at vh 64 with the
				// output buffers); the loads land under (1)'s wait.
				if (GDNKCP_WP_U_LATE) {
					UR = reinterpret_cast<float*>(stage(x) + kOffU);
					read_u(n, u != nullptr);
				}
				this->vprime_wait();
				GDNKCP_WALK_MARK(3, ci);  // state: (1) done, U^T added
				unsigned bh[4][4], bl[4][4];
				update_issue_scaled(stage(x) + kOffK, reinterpret_cast<const float*>(stage(x) + off_e(VH)), bh, bl);
				GDNKCP_WALK_MARK(4, ci);  // state: V' split, S decayed, (2) issued
				if (kUAhead) {  // the chunk after next's U^T into this stage's slot, read above, under (2)
					__syncwarp();  // every lane's U^T reads are done before the copies overwrite them
					if (kMetaCalc)
						issue_u(u, t00 + kC * (cnn - ch0), min(kC, slen - kC * (cnn - ch0)), h, HV, c0, x);
					else
						issue_u(u, chunk_tok0[cnn], chunk_len[cnn], h, HV, c0, x);
				}
				if (vnew != nullptr) this->store_vprime(vnew, kMetaCalc ? t00 + kC * ci : chunk_tok0[c], n, h, HV, c0);
				if (vnewp != nullptr) this->store_vprime_slots(vnewp + blk * kD * kC, n, c0);
				if (kStagedV)
					stage_out(x, n, false, vnew16 != nullptr);
				else if (vnew16 != nullptr)
					this->store_vprime16(vnew16 + blk * kD * kC, n, c0);
				GDNKCP_WALK_MARK(5, ci);  // state: V' stores issued
				if (kAhead) t0n = chunk_tok0[cnn], nn = chunk_len[cnn];  // land under (2)
				wg::wait<0>();
				wg::fence_operand(s);
				GDNKCP_WALK_MARK(6, ci);  // state: (2) done
			}
			finish_e(1 - x);  // the next chunk's factors (their gates loaded by issue)
			if (kAhead) {
				if (!holds()) t0n = chunk_tok0[cnn], nn = chunk_len[cnn];
				n = n_next;
			}
			GDNKCP_WALK_MARK(8, ci);  // every warp: the chunk's work done (then its wait for the next barrier)
		}
		tc::cp_async_wait<0>();  // the copies issued past the end land before the CTA exits
		if (kStaged) {
			__syncthreads();  // the last chunk's H^T and V'^T staged
			if (!holds())
				store_out((nch - 1) & 1, (long long)last * HV + h, c0, static_cast<int>(threadIdx.x) - 128,
				          kStagedH ? h16 : nullptr, kStagedV ? vnew16 : nullptr);
		}
	}
};

template <int VH>
__device__ __forceinline__ void state_walk(float* smem, const unsigned char* wp, const KRows& kr, const float* u,
                                           const float* gcum, const int* chunk_tok0, const int* chunk_len,
                                           const int* seg_chunk0, const int* seg_nchunk, const float* start, float* h_out,
                                           float* vnew, float* final_state, bf16* h16, bf16* vnew16, int HQK, int HV,
                                           float* vnewp, const int* order) {
	PlaneWalker<VH> wk(smem);
	int x, seg, h;
	tc::dispatch_cta(order, x, seg, h);
	const int c0 = x * VH;
	wk.init_state(start + ((long long)seg * HV + h) * kD * kD, c0);
	wk.walk(wp, kr, u, gcum, chunk_tok0, chunk_len, seg_chunk0[seg], seg_nchunk[seg], h, HV, HQK, c0, h_out, vnew, h16,
	        vnew16, vnewp);
	wk.store_state(final_state + ((long long)seg * HV + h) * kD * kD, c0);
}

// summary_walk: blocks x < 128 / vh walk the Q columns (U read, from a zero state), the others the P
// columns (no U, from the identity's columns); nothing is stored per chunk.
template <int VH>
__device__ __forceinline__ void summary_walk(float* smem, const unsigned char* wp, const KRows& kr,
                                             const float* u, const float* gcum, const int* chunk_tok0,
                                             const int* chunk_len, const int* seg_chunk0, const int* seg_nchunk,
                                             const int* list, float* out_p, float* out_q, int HQK, int HV,
                                             const int* order) {
	PlaneWalker<VH> wk(smem);
	const tc::PairCTA b = tc::pair_cta(order, list, VH, HV);
	wk.init_state(nullptr, b.c0, b.isP);
	wk.walk(wp, kr, b.isP ? nullptr : u, gcum, chunk_tok0, chunk_len, seg_chunk0[b.seg], seg_nchunk[b.seg], b.h, HV, HQK,
	        b.c0, nullptr, nullptr, nullptr, nullptr);
	wk.store_state((b.isP ? out_p : out_q) + b.blk, b.c0);
}

// The entries take k's bf16 rows (k, row stride k_stride elements, QK head qh at qh 128; rows 16-byte
// aligned) and their rstd (k_rstd [T, HQK]: gdn_l2norm_fwd's, or the prep's where it normalises k) for (2).
extern "C" __global__ void __launch_bounds__(256)
gdn_state_walk_planes(const __nv_bfloat16* __restrict__ wp, const __nv_bfloat16* __restrict__ k, int k_stride,
                      const float* __restrict__ k_rstd, const float* __restrict__ u, const float* __restrict__ gcum,
                      const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
                      const int* __restrict__ seg_chunk0, const int* __restrict__ seg_nchunk, const float* __restrict__ start,
                      float* __restrict__ h_out, float* __restrict__ vnew, float* __restrict__ final_state,
                      __nv_bfloat16* __restrict__ h16, __nv_bfloat16* __restrict__ vnew16, int HQK, int HV, int vh,
                      float* __restrict__ vnewp, const int* __restrict__ order) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	const unsigned char* p = reinterpret_cast<const unsigned char*>(wp);
	const KRows kr{k, k_stride, k_rstd};
	if (vh == 64)
		state_walk<64>(smem, p, kr, u, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start, h_out, vnew, final_state,
		               h16, vnew16, HQK, HV, vnewp, order);
	else
		state_walk<128>(smem, p, kr, u, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start, h_out, vnew,
		                final_state, h16, vnew16, HQK, HV, vnewp, order);
}

extern "C" __global__ void __launch_bounds__(256)
gdn_summary_walk_planes(const __nv_bfloat16* __restrict__ wp, const __nv_bfloat16* __restrict__ k, int k_stride,
                        const float* __restrict__ k_rstd, const float* __restrict__ u, const float* __restrict__ gcum,
                        const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
                        const int* __restrict__ seg_chunk0, const int* __restrict__ seg_nchunk,
                        const int* __restrict__ list, float* __restrict__ out_p, float* __restrict__ out_q, int HQK,
                        int HV, int vh, const int* __restrict__ order) {
	extern __shared__ float smem[];  // C linkage: the one dynamic shared memory of every kernel here
	const unsigned char* p = reinterpret_cast<const unsigned char*>(wp);
	const KRows kr{k, k_stride, k_rstd};
	if (vh == 64)
		summary_walk<64>(smem, p, kr, u, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list, out_p, out_q, HQK, HV,
		                 order);
	else
		summary_walk<128>(smem, p, kr, u, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list, out_p, out_q, HQK, HV,
		                  order);
}

}  // namespace walkp
}  // namespace gdnkcp
