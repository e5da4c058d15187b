// gdn_bwalk_wgmma.cu: the backward walks (gdn_tape_walk_mma, gdn_offset_walk_mma) on Hopper's wgmma, the
// sm_90a bodies of those entries (gdn_bwalk_mma.cu dispatches here when GDNKCP_HAS_WGMMA, wgmma.cuh), after
// the forward state walk's (gdn_walk_wgmma.cu, whose WGWalker they extend). Same arguments, grids, block
// and dynamic shared memory (bwalk_mma_smem(vh)) as the mma.sync bodies, the same outputs; every other
// target, the compute_80 PTX and the CPU emulator's default build keep the mma.sync BWalker. The offset
// walk's P^T columns run WGBWalker<VH, false> (no dvl, dO or Qg: (2) is the three -W products alone), its
// R columns WGBWalker<VH, true> from zero.
//
// ---- The data flow (gdn_bwalk_mma.cu's, on a warpgroup) -----------------------------------------------
// Warpgroup q holds adjoint columns c0 + 64 q + [0, 64) of D^T as the m64n128 accumulator (vh 128: both
// groups; vh 64: group 0). Per chunk, in reverse (Kt, W, q: 64 x 128 fp32 rows; dvl fp32 and dO bf16,
// 64 x vh; rows past a short chunk's end are zero):
//   (1) dV'^T = dvl^T + D^T Kt^T          m64n64k16 x 8 k steps (keys), A = D^T split to bf16 hi/lo,
//                                         B = Kt hi / lo (token n x key k: Kt's rows, K-major); the
//                                         accumulator starts from dvl^T (fp32, exact), loaded from
//                                         global memory into it a phase ahead (after the previous
//                                         chunk's (2) waited), so no register array holds dvl (a
//                                         separate one, added after the wait, spilled 8 bytes).
//   (2) D^T = e^gl D^T - dV'^T W + dO^T Qg m64n128k16 x 4 k steps (tokens): A = dV'^T split with
//                                         B = -W hi / lo stored transposed (key x token), then A = dO^T
//                                         (exact in bf16: ldmatrix.trans of the dO stage) with B = Qg hi /
//                                         lo transposed, Qg_i = q_i fp32(scale e^gamma_i).
// Per k step: -W hi*hi, hi*lo, lo*hi, then dO*Qg hi, dO*Qg lo into the one accumulator, k steps ascending
// (the mma.sync walk's products and order; its bits differ: the tensor core's internal order, and dvl
// is the starting accumulator). vh 64 and vh 128 give the same bits (a column's instructions and operands do not
// depend on vh).
//
// ---- Shared memory (from the first 1024-aligned byte) ------------------------------------------------
//   XK  0       Kt hi (two 64-key blocks of 8192 B), Kt lo: rows = tokens, 128-byte swizzle
//   XW  32768   -W^T hi, lo (128 rows = keys of 64 tokens), 128-byte swizzle
//   XQ  65536   Qg^T hi, lo, 128-byte swizzle
//   R   98304   fp32 Kt, W, q of the next chunk as cp.async copied them ([3][64][128])
//   OS  196608  bf16 dO of the next chunk, [64][vh], 16-byte units XOR-swizzled by row % 8 (conflict-free
//               ldmatrix without the mma.sync walk's padding, which would not fit at vh 128)
// 196608 + 128 vh + up to 1008 of alignment <= bwalk_mma_smem(vh) (231424 / 214016).
// One X stage, as in the mma.sync walk: three operands double-buffered beside their fp32 landing zone
// would exceed the 227 KB an SM has. So the chunk has two __syncthreads and the conversion follows the
// products instead of running beside them.
//
// ---- A chunk c (walked in reverse) -------------------------------------------------------------------
//   __syncthreads (1)  X holds chunk c
//   state groups: split D, (1) issued onto dvl^T, D stored under it, wait, split dV', e^gl D, (2) issued,
//                 dV' stored under it, wait; then dvl^T of chunk c-1 loaded into the (1) accumulator
//                 (global, lands by its use)
//   __syncthreads (2)  every wgmma reading X waited
//   every warp: convert its 8 tokens of chunk c-1 (copied one chunk earlier) into X; the state warps the
//               dO^T fragments of chunk c-1; gamma_last of c-1; then, each warp once its own reads of R /
//               OS are done (__syncwarp), the copies and gate loads of chunk c-2 (a whole chunk to land)
// The last chunk (c = ch0) ends after its products: no branch sits between a wgmma and its wait.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gdn_walk_wgmma.cu"

#if defined(GDNKCP_HAS_WGMMA)
namespace gdnkcp {
namespace bwalkwg {

using tc::bf16;
using walkwg::kC;
using walkwg::kD;
using walkwg::U32x2;
using walkwg::U32x4;
constexpr int kOffXW = 32768, kOffXQ = 65536, kOffR = 98304, kOffOS = 196608;

__host__ __device__ constexpr int wg_bwalk_smem(int vh) { return kOffOS + kC * vh * 2 + 1008; }

// kD16: how the tape walk stores D^T as bf16 (d16). 0: store_state16 under (1), beside the fp32 D store,
// packing D again while (1)'s A fragments of it are live (ptxas 13.0 spilled 4 bytes on sm_90a); 1: the
// same after (1)'s wait, when the fragments are dead (no spill, but on the chain between (1) and (2)); 2:
// under (1) from (1)'s own hi fragments (store_frags16: rn(D) is split_frags' hi half, the words
// store_state16 packs), no packing and no extra live words. The state is not yet decayed at any of them
// (kDecayEarly off); the same bytes at the same addresses in all three.
#ifndef GDNKCP_TAPE_D16
#define GDNKCP_TAPE_D16 2
#endif
constexpr int kD16 = GDNKCP_TAPE_D16;
static_assert(kD16 >= 0 && kD16 <= 2, "GDNKCP_TAPE_D16: 0, 1 or 2");
static_assert(!(kD16 == 1 && walkwg::kDecayEarly), "GDNKCP_TAPE_D16 1 needs the decay after (1)'s wait");
// GDNKCP_TAPE_MARK(slot, ci): a timeline hook at the phase boundaries of WGBWalker::walk (ci: chunks from the
// segment's last); ptx/devtest/tape_check.cu built with -DGDNKCP_WALK_TIMELINE records clock64() there.
// Empty in every blob.
#ifndef GDNKCP_TAPE_MARK
#define GDNKCP_TAPE_MARK(slot, ci)
#endif

// DO: the walk of the adjoint columns (the tape walk, the offset walk's R columns: dvl, dO and Qg terms);
// without it the offset walk's P^T columns (neither dvl nor dO, so no Qg operand either).
template <int VH, bool DO = true>
struct WGBWalker : walkwg::WGWalker<VH> {
	using Base = walkwg::WGWalker<VH>;
	using Base::col;
	using Base::d;
	using Base::g;
	using Base::gl;
	using Base::gln;
	using Base::holds;
	using Base::lane;
	using Base::R;
	using Base::s;
	using Base::t;
	using Base::warp;
	using Base::wq;
	using Base::X;
	using Base::grp;
	bf16* OS;
	unsigned o[4][4];  // dO^T as A fragments (k step j: tokens 16 j ..), exact in bf16
	float gq;          // gcum of token 8 warp + lane % 8 of the chunk being converted (Qg's factor)

	__device__ __forceinline__ explicit WGBWalker(float* smem) : Base(smem) {
		R = reinterpret_cast<float*>(X + kOffR);
		OS = reinterpret_cast<bf16*>(X + kOffOS);
	}

	// os: the swizzled element offset in OS of (token i, column cc); 16-byte units XOR i % 8.
	__device__ __forceinline__ int os(int i, int cc) const { return i * VH + ((((cc >> 3) ^ (i & 7))) << 3) + (cc & 7); }

	// issue starts the copies of chunk (t0, n): the warp's Kt, W and q rows 8 warp .. + 7 (unit lane of
	// each) into R and, in the state groups, this warp's 16 dO columns into OS (rows past n zeroed by plain
	// stores); one commit group.
	__device__ __forceinline__ void issue(const float* w, const float* kt, const float* qn, const bf16* dout, int t0,
	                                      int n, int h, int HQK, int HV, int c0) {
		const int qh = h / (HV / HQK), i0 = 8 * warp;
		const long long vs = (long long)HV * kD, qs = (long long)HQK * kD;
		const float* kp = kt + ((long long)(t0 + i0) * HV + h) * kD + 4 * lane;
		const float* wp = w + ((long long)(t0 + i0) * HV + h) * kD + 4 * lane;
		const float* qp = qn + ((long long)(t0 + i0) * HQK + qh) * kD + 4 * lane;
		float* rp = R + i0 * kD + 4 * lane;
#pragma unroll
		for (int j = 0; j < 8; ++j) {
			if (i0 + j < n) {
				tc::cp_async16(rp + j * kD, kp);
				tc::cp_async16(rp + kC * kD + j * kD, wp);
				if (DO) tc::cp_async16(rp + 2 * kC * kD + j * kD, qp);
			}
			kp += vs;
			wp += vs;
			qp += qs;
		}
		if (DO && holds()) {
			// Lane: 8 columns (unit cc / 8) of tokens lane / 2 + 16 y.
			const int cc = 64 * grp + 16 * wq + 8 * (lane % 2);
#pragma unroll
			for (int y = 0; y < 4; ++y) {
				const int i = lane / 2 + 16 * y;
				bf16* dst = OS + os(i, cc);
				if (i < n)
					tc::cp_async16(dst, dout + ((long long)(t0 + i) * HV + h) * kD + c0 + cc);
				else
					reinterpret_cast<U32x2*>(dst)[0] = reinterpret_cast<U32x2*>(dst)[1] = U32x2{0u, 0u};
			}
		}
		tc::cp_async_commit();
	}

	// prefetch_gates reads gamma_last of chunk (t0, n) and the gcum of token 8 warp + lane % 8 (tokens past
	// n: row n - 1's; their q is taken as zero) for convert.
	__device__ __forceinline__ void prefetch_gates(const float* gcum, int t0, int n, int h, int HV) {
		gln = gcum[(long long)(t0 + n - 1) * HV + h];
		const int i = 8 * warp + lane % 8, ir = i < n ? i : n - 1;
		gq = gcum[(long long)(t0 + ir) * HV + h];
	}

	// load_dvl (state warps): dvl^T of chunk (t0, n) into d, (1)'s starting accumulator, zero past n (and
	// zero without DO: the offset walk's P^T columns).
	__device__ __forceinline__ void load_dvl(const float* dvl, int t0, int n, int h, int HV, int c0) {
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
			for (int r = 0; r < 4; ++r) {
				const int i = 8 * nt + 2 * t + (r & 1);
				d[4 * nt + r] = DO && i < n ? dvl[((long long)(t0 + i) * HV + h) * kD + c0 + col(r)] : 0.f;
			}
		}
	}

	// convert waits for this thread's copies of a chunk of n rows and converts the warp's eight tokens
	// into X (Kt rows, -W^T and Qg^T as bf16 hi/lo, zero past n), fenced for the async proxy; the state
	// warps then load the dO^T fragments of that chunk from OS; gamma_last becomes the chunk's.
	__device__ __forceinline__ void convert(int n, float scale) {
		tc::cp_async_wait<0>();
		__syncwarp();  // the transposed operands and dO read other lanes' copies
		gl = gln;
		unsigned char* xk = X;
		unsigned char* xw = X + kOffXW;
		unsigned char* xq = X + kOffXQ;
		const int i0 = 8 * warp;
		// Kt: rows i0 + j, keys 4 lane .. 4 lane + 3 (this thread's own copies).
		Base::template rows_to_planes<8, false>(xk, R, i0, n, lane);
		// -W^T and Qg^T: key kk = 32 m + lane, the warp's eight tokens into one 16-byte unit each.
		// Qg's factor of token i0 + j: fp32(scale e^gamma) from lane j (the mma.sync walk's expression).
		const float qf = scale * expf(gq);
		float e[8];
#pragma unroll
		for (int j = 0; j < 8; ++j) e[j] = __shfl_sync(0xffffffffu, qf, j);
#pragma unroll
		for (int a = 0; a < (DO ? 2 : 1); ++a) {
			unsigned char* xo = a ? xq : xw;
			const float* ra = R + (1 + a) * kC * kD;
#pragma unroll
			for (int m = 0; m < 4; ++m) {
				const int kk = 32 * m + lane;
				float xv[8];
#pragma unroll
				for (int j = 0; j < 8; ++j) {
					const float sg = a ? e[j] : -1.f;  // -W: the sign is exact in the split
					xv[j] = i0 + j < n ? ra[(i0 + j) * kD + kk] * sg : 0.f;
				}
				U32x4 hi, lo;
				tc::split_bf16x2(xv[0], xv[1], hi.x, lo.x);
				tc::split_bf16x2(xv[2], xv[3], hi.y, lo.y);
				tc::split_bf16x2(xv[4], xv[5], hi.z, lo.z);
				tc::split_bf16x2(xv[6], xv[7], hi.w, lo.w);
				const int off = kk * 128 + ((warp ^ (kk & 7)) << 4);
				*reinterpret_cast<U32x4*>(xo + off) = hi;
				*reinterpret_cast<U32x4*>(xo + 16384 + off) = lo;
			}
		}
		wg::fence_proxy_async();
		if (!DO || !holds()) return;
		// dO^T (column x token) A fragments of k step j: ldmatrix.x4.trans of the warp's 16 columns.
		const int orow = (lane & 7) + 8 * (lane >> 4), ocol = 64 * grp + 16 * wq + 8 * ((lane >> 3) & 1);
#pragma unroll
		for (int j = 0; j < 4; ++j) tc::ldmatrix_x4_trans(o[j], OS + os(16 * j + orow, ocol));
	}

	// dvprime_issue issues (1): d = dvl^T + D^T Kt^T (d holds dvl^T from load_dvl).
	__device__ __forceinline__ void dvprime_issue(unsigned (&ah)[8][4], unsigned (&al)[8][4]) {
		Base::template split_frags<8>(s, ah, al);
		wg::fence();
#pragma unroll
		for (int k = 0; k < 8; ++k) {
			const unsigned char* b = X + (k / 4) * 8192 + (k % 4) * 32;
			const unsigned long long bh = wg::desc_sw128(b), bl = wg::desc_sw128(b + 16384);
			wg::mma_m64n64k16_rs(d, ah[k], bh);
			wg::mma_m64n64k16_rs(d, ah[k], bl);
			wg::mma_m64n64k16_rs(d, al[k], bh);
		}
		wg::commit();
	}

	__device__ __forceinline__ void dvprime_wait() {
		wg::wait<0>();
		wg::fence_operand(d);
	}

	// dupdate_issue issues (2): D^T = e^gl D^T - dV'^T W + dO^T Qg.
	__device__ __forceinline__ void dupdate_issue(unsigned (&ah)[4][4], unsigned (&al)[4][4]) {
		Base::template split_frags<4>(d, ah, al);
		if (!walkwg::kDecayEarly) this->decay_state();
		wg::fence();
#pragma unroll
		for (int k = 0; k < 4; ++k) {
			const unsigned long long wh = wg::desc_sw128(X + kOffXW + 32 * k), wl = wg::desc_sw128(X + kOffXW + 16384 + 32 * k);
			const unsigned long long qh = wg::desc_sw128(X + kOffXQ + 32 * k), ql = wg::desc_sw128(X + kOffXQ + 16384 + 32 * k);
			wg::mma_m64n128k16_rs(s, ah[k], wh);
			wg::mma_m64n128k16_rs(s, ah[k], wl);
			wg::mma_m64n128k16_rs(s, al[k], wh);
			if (DO) {
				wg::mma_m64n128k16_rs(s, o[k], qh);
				wg::mma_m64n128k16_rs(s, o[k], ql);
			}
		}
		wg::commit();
	}

	__device__ __forceinline__ void walk(const float* w, const float* kt, const float* qn, const float* gcum,
	                                     const float* dvl, const bf16* dout, const int* chunk_tok0,
	                                     const int* chunk_len, int ch0, int nch, int h, int HQK, int HV, int c0,
	                                     float scale, float* d_chunk, float* dvnew,
	                                     float* dvnewp = nullptr, bf16* dvnew16 = nullptr, bf16* d16 = nullptr) {
		if (nch <= 0) return;
		const int last = ch0 + nch - 1;
		issue(w, kt, qn, dout, chunk_tok0[last], chunk_len[last], h, HQK, HV, c0);
		prefetch_gates(gcum, chunk_tok0[last], chunk_len[last], h, HV);
		convert(chunk_len[last], scale);
		if (holds()) load_dvl(dvl, chunk_tok0[last], chunk_len[last], h, HV, c0);
		{
			const int c1 = last - 1 > ch0 ? last - 1 : ch0;
			__syncwarp();
			issue(w, kt, qn, dout, chunk_tok0[c1], chunk_len[c1], h, HQK, HV, c0);
			prefetch_gates(gcum, chunk_tok0[c1], chunk_len[c1], h, HV);
		}
		for (int c = last; c >= ch0; --c) {
			const int n = chunk_len[c];
			__syncthreads();  // (1): X holds chunk c
			GDNKCP_TAPE_MARK(0, last - c);  // every warp: past barrier (1)
			if (holds()) {
				const long long blk = (long long)c * HV + h;
				unsigned ah[8][4], al[8][4];
				dvprime_issue(ah, al);
				GDNKCP_TAPE_MARK(1, last - c);  // state: D split, (1) issued
				if (d_chunk != nullptr) this->store_state(d_chunk + blk * kD * kD, c0);  // D under (1)
				if (kD16 == 0 && d16 != nullptr) this->store_state16(d16 + blk * kD * kD, c0);  // or D^T as bf16
				if (kD16 == 2 && d16 != nullptr) this->store_frags16(d16 + blk * kD * kD, c0, ah);
				if (walkwg::kDecayEarly) this->decay_state();
				GDNKCP_TAPE_MARK(2, last - c);  // state: D stores issued
				dvprime_wait();
				if (kD16 == 1 && d16 != nullptr) this->store_state16(d16 + blk * kD * kD, c0);
				GDNKCP_TAPE_MARK(3, last - c);  // state: (1) done
				unsigned bh[4][4], bl[4][4];
				dupdate_issue(bh, bl);
				GDNKCP_TAPE_MARK(4, last - c);  // state: dV' split, D decayed, (2) issued
				if (dvnew != nullptr) this->store_vprime(dvnew, chunk_tok0[c], n, h, HV, c0);  // dV' under (2)
				if (dvnewp != nullptr) this->store_vprime_slots(dvnewp + blk * kD * kC, n, c0);
				if (dvnew16 != nullptr) this->store_vprime16(dvnew16 + blk * kD * kC, n, c0);
				GDNKCP_TAPE_MARK(5, last - c);  // state: dV' stores issued
				wg::wait<0>();
				wg::fence_operand(s);
				GDNKCP_TAPE_MARK(6, last - c);  // state: (2) done
			}
			if (c == ch0) break;
			if (holds()) load_dvl(dvl, chunk_tok0[c - 1], chunk_len[c - 1], h, HV, c0);
			GDNKCP_TAPE_MARK(7, last - c);  // every warp: the next dvl loaded (state warps)
			__syncthreads();  // (2): every wgmma reading X waited
			GDNKCP_TAPE_MARK(8, last - c);  // every warp: past barrier (2)
			convert(chunk_len[c - 1], scale);
			GDNKCP_TAPE_MARK(9, last - c);  // every warp: the conversion done
			const int c2 = c - 2 > ch0 ? c - 2 : ch0;
			__syncwarp();
			issue(w, kt, qn, dout, chunk_tok0[c2], chunk_len[c2], h, HQK, HV, c0);
			prefetch_gates(gcum, chunk_tok0[c2], chunk_len[c2], h, HV);
			GDNKCP_TAPE_MARK(10, last - c);  // every warp: the next copies and gates issued
		}
		tc::cp_async_wait<0>();  // the copies issued past the end land before the CTA exits
	}
};

template <int VH>
__device__ __forceinline__ void tape_walk(float* smem, const float* w, const float* kt, const float* qn,
                                          const float* gcum, const float* dvl, const bf16* dout,
                                          const int* chunk_tok0, const int* chunk_len, const int* seg_chunk0,
                                          const int* seg_nchunk, const float* dend, float* d_chunk, float* dvnew, float* dvnewp,
                                          bf16* dvnew16, bf16* d16, float* dstart, int HQK, int HV, float scale,
                                          const int* order) {
	WGBWalker<VH, true> wk(smem);
	int x, seg, h;
	tc::dispatch_cta(order, x, seg, h);
	const int c0 = x * VH;
	wk.init_state(dend + ((long long)seg * HV + h) * kD * kD, c0);
	wk.walk(w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0[seg], seg_nchunk[seg], h, HQK, HV, c0,
	        scale, d_chunk, dvnew, dvnewp, dvnew16, d16);
	wk.store_state(dstart + ((long long)seg * HV + h) * kD * kD, c0);
}

// offset_walk: gdn_offset_walk_mma's sm_90a body. Blocks x < 128 / vh walk R's columns (from zero, with
// dvl, dO and Qg), the others P^T's (from the identity's columns, without them); only the final adjoints are
// stored.
template <int VH, bool DO>
__device__ __forceinline__ void offset_walk_form(float* smem, const float* w, const float* kt, const float* qn,
                                                 const float* gcum, const float* dvl, const bf16* dout,
                                                 const int* chunk_tok0, const int* chunk_len, int ch0, int nch, int h,
                                                 int HQK, int HV, int c0, float scale, float* out) {
	WGBWalker<VH, DO> wk(smem);
	wk.init_state(nullptr, c0, !DO);
	wk.walk(w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, ch0, nch, h, HQK, HV, c0, scale, nullptr, nullptr);
	wk.store_state(out, c0);
}

template <int VH>
__device__ __forceinline__ void offset_walk(float* smem, const float* w, const float* kt, const float* qn,
                                            const float* gcum, const float* dvl, const bf16* dout,
                                            const int* chunk_tok0, const int* chunk_len, const int* seg_chunk0,
                                            const int* seg_nchunk, const int* list, float* out_pt, float* out_r,
                                            int HQK, int HV, float scale, const int* order) {
	const tc::PairCTA b = tc::pair_cta(order, list, VH, HV);
	if (b.isP)
		offset_walk_form<VH, false>(smem, w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0[b.seg],
		                            seg_nchunk[b.seg], b.h, HQK, HV, b.c0, scale, out_pt + b.blk);
	else
		offset_walk_form<VH, true>(smem, w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0[b.seg],
		                           seg_nchunk[b.seg], b.h, HQK, HV, b.c0, scale, out_r + b.blk);
}

}  // namespace bwalkwg
}  // namespace gdnkcp
#endif  // GDNKCP_HAS_WGMMA
