// walk_planes.cuh: the walk planes, the bf16 hi / lo operands of the v5 forward walks' two products as the
// prep writes them once (gdn_prep_mma, gdn_prep_mma_g with wp and wk given) and the plane walks
// (gdn_walk_planes.cu) copy them into shared memory as they lie, with no conversion on the walk's chain.
//
// ---- Layout -----------------------------------------------------------------------------------------
// -W, 32 KB a chunk c and value head h, at wp + (c HV + h) 32768:
//   [0, 16384)       hi: keys 0-63 in block 0 (8192 bytes), keys 64-127 in block 1; row i (token) of a
//                    block is 128 bytes, its 16-byte unit u (keys 8u .. 8u + 7 of the block) at unit
//                    u ^ (i % 8) of the row: the K-major 128-byte swizzle wgmma's descriptors read
//   [16384, 32768)   lo, the same
// K^T, 32 KB a chunk c and QK head qh, at wk + (c HQK + qh) 32768:
//   [0, 16384)       hi: row kk (key) 128 bytes, its unit b (tokens 8b .. 8b + 7) at unit b ^ (kk % 8)
//   [16384, 32768)   lo, the same
// Rows of -W from token n (the chunk's length) on and K^T's columns from token n on are zero, so a walk
// copies whole planes whatever n is. hi = rn(x), lo = rn(x - hi) (tc::split_bf16x2) of -W (the negation
// exact, -0 past n as the converters' -1 x 0) and of the normalised k. The decay of Kt_i = k_i e^(gamma_last -
// gamma_i) is not in the planes: its readers scale the other operand's token columns by e_i (V'^T Kt = (V'^T
// diag(e)) K), so K^T serves the HV / HQK value heads of its QK head and the prep forms it once a QK head,
// without an exp. The tape walk, dV'_local and the outputs read K^T's planes; the forward's state and summary
// walks read k's bf16 rows instead, with rstd_i folded into the same factor (V'^T diag(e rstd) K: k exact, two
// products where these planes take three; gdn_walk_planes.cu).
//
// ---- Why ----------------------------------------------------------------------------------------------
// The state walk's timeline (docs/mma-kernels.md, "Landed (2026-12-02)"): the converting warpgroup took
// ~6,700 of a chunk's ~7,900 cycles turning 64 fp32 rows of W and of kn into these planes, the longest
// path of the chunk, every chunk, for every column block; the state warps' own chain was ~5,000. The prep
// runs in parallel over chunks and heads, and writes W anyway (fp32 W is then needed only by a backward).
// A first version kept Kt^T's planes a value head (64 KB a chunk and head, the decay in the planes): its
// prep took 1.11 -> 1.68 ms at 32K (ptx/staging/README.md).
#pragma once

#include "mma.cuh"

namespace gdnkcp {
namespace walkplanes {

constexpr int kWBytes = 32768;  // -W's planes: a chunk and value head
constexpr int kKBytes = 32768;  // K^T's planes: a chunk and QK head
constexpr int kOffLo = 16384;   // lo plane after its hi plane

struct alignas(16) U32x4 {
	unsigned x, y, z, w;
};

// copy_wplanes issues copier ct's share of the cp.async copies of chunk c's -W planes (value head h, 32 KB)
// into dst as they lie, a warp's 32 units contiguous; BYTES kOffLo: the hi plane alone.
template <int COPIERS, int BYTES = kWBytes>
__device__ __forceinline__ void copy_wplanes(unsigned char* dst, const unsigned char* wp, int c, int h, int HV, int ct) {
	static_assert(BYTES == kWBytes || BYTES == kOffLo, "both planes or the hi plane");
	const unsigned char* sw = wp + ((long long)c * HV + h) * kWBytes + 16 * ct;
	unsigned char* d = dst + 16 * ct;
	constexpr int kJ = BYTES / 16 / COPIERS;
#pragma unroll
	for (int j = 0; j < kJ; ++j) tc::cp_async16(d + 16 * COPIERS * j, sw + 16 * COPIERS * j);
}

// KRows: k's bf16 rows (QK head qh at element 128 qh of a row; stride in elements, rows 16-byte aligned)
// and their l2norm factors rstd ([T, HQK]: kn = k rstd), which the walks read as K with the normalisation
// folded into the factors of the other operand's token columns.
struct KRows {
	const tc::bf16* k;
	long long stride;
	const float* rstd;
};

// copy_rows_mn issues copier ct's share (of COPIERS, a multiple of 128) of the cp.async copies of a chunk's
// 64 bf16 rows of 128 (row i at src + i stride elements, 16-byte aligned) into dst as the MN-major,
// 128-byte-swizzled tile that wgmma.cuh's _t products read with lbo 8192: columns 0-63 of every row in the
// first 8 KB, columns 64-127 in the next, row i's 16-byte unit u of a half at u ^ (i % 8); unit ct % 16 of
// rows ct / 16 + (COPIERS / 16) j. Rows from n on are zeroed: by the copies themselves (src-size 0, row 0's
// address as the valid source they do not read) with GDNKCP_WALK_CP_ZFILL, else by plain stores (visible
// after the barrier that publishes the copies).
#ifndef GDNKCP_WALK_CP_ZFILL
#define GDNKCP_WALK_CP_ZFILL 1
#endif
template <int COPIERS, bool ZFILL = GDNKCP_WALK_CP_ZFILL != 0>
__device__ __forceinline__ void copy_rows_mn(unsigned char* dst, const tc::bf16* src, long long stride, int n, int ct) {
	constexpr int kJ = 64 * 16 / COPIERS, kRowStep = COPIERS / 16;
	static_assert(kRowStep % 8 == 0, "a row step keeps the swizzle phase");
	const int uu = ct % 16, i0 = ct / 16;
	const tc::bf16* sp = src + (long long)i0 * stride + 8 * uu;
	unsigned char* d = dst + (uu / 8) * 8192 + i0 * 128 + (((uu % 8) ^ (i0 & 7)) << 4);
#pragma unroll
	for (int j = 0; j < kJ; ++j) {
		unsigned char* dj = d + j * kRowStep * 128;
		const bool full = i0 + kRowStep * j < n;
		if (ZFILL)
			tc::cp_async16_zfill(dj, full ? sp + (long long)kRowStep * j * stride : src + 8 * uu, full);
		else if (full)
			tc::cp_async16(dj, sp + (long long)kRowStep * j * stride);
		else
			*reinterpret_cast<U32x4*>(dj) = U32x4{0u, 0u, 0u, 0u};
	}
}

// neg_w_off: the byte offset of -W's (token i, key d) in its hi plane.
__device__ __forceinline__ int neg_w_off(int i, int d) {
	const int dc = d & 63;
	return (d >> 6) * 8192 + i * 128 + (((dc >> 3) ^ (i & 7)) << 4) + 2 * (dc & 7);
}

// store_neg_w2 stores -W at (token i, keys d, d + 1) (d even) as its hi / lo pairs into the planes at wpc.
__device__ __forceinline__ void store_neg_w2(unsigned char* wpc, int i, int d, float w0, float w1) {
	unsigned hi, lo;
	tc::split_bf16x2(-w0, -w1, hi, lo);
	const int off = neg_w_off(i, d);
	*reinterpret_cast<unsigned*>(wpc + off) = hi;
	*reinterpret_cast<unsigned*>(wpc + kOffLo + off) = lo;
}

// store_neg_w_pair16 stores -W at token i for the two 8-key tiles of keys d0 .. d0 + 15 (d0 a multiple of
// 16) from an accumulator-shaped fragment: this lane (t = lane % 4 of its quad) holds keys d0 + 2t, + 1 as
// (x0, x1) and d0 + 8 + 2t, + 1 as (y0, y1). The quad swaps one word a plane (tc::quad_pair16) and each lane
// stores 8 bytes of the hi and of the lo plane: the quad's stores fill the row's two units, one whole
// 32-byte sector (the units 2m, 2m + 1 of a row stay adjacent under the swizzle u ^ (i % 8)). Every lane of
// the warp must call it (shuffles); the bytes are store_neg_w2's.
__device__ __forceinline__ void store_neg_w_pair16(unsigned char* wpc, int i, int d0, int t, float x0, float x1, float y0,
                                                   float y1) {
	unsigned h0, l0, h1, l1;
	tc::split_bf16x2(-x0, -x1, h0, l0);
	tc::split_bf16x2(-y0, -y1, h1, l1);
	const uint2 hh = tc::quad_pair16(h0, h1, t), ll = tc::quad_pair16(l0, l1, t);
	const int off = neg_w_off(i, d0 + tc::quad_pair16_key(t));
	*reinterpret_cast<uint2*>(wpc + off) = hh;
	*reinterpret_cast<uint2*>(wpc + kOffLo + off) = ll;
}

// store_t8 stores K^T's unit (key kk, tokens 8b .. 8b + 7), values x0 .. x7 in token order, as hi / lo
// into the planes at kc.
__device__ __forceinline__ void store_t8(unsigned char* kc, int kk, int b, float x0, float x1, float x2, float x3,
                                         float x4, float x5, float x6, float x7) {
	U32x4 hi, lo;
	tc::split_bf16x2(x0, x1, hi.x, lo.x);
	tc::split_bf16x2(x2, x3, hi.y, lo.y);
	tc::split_bf16x2(x4, x5, hi.z, lo.z);
	tc::split_bf16x2(x6, x7, hi.w, lo.w);
	const int off = kk * 128 + ((b ^ (kk & 7)) << 4);
	*reinterpret_cast<U32x4*>(kc + off) = hi;
	*reinterpret_cast<U32x4*>(kc + kOffLo + off) = lo;
}

}  // namespace walkplanes
}  // namespace gdnkcp
