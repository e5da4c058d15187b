// gdn_tape_planes.cu: the tape walk (#7 tape) on the forward's walk planes (walk_planes.cuh) and the raw
// bf16 q, for every target from one source:
//   gdn_tape_walk_planes     grid (128/vh, NS, HV), block 256, dynamic shared memory tape_planes_smem(vh)
//   gdn_offset_walk_planes   grid (2 x 128/vh, nlist, HV), the same block and shared memory: the offset walk
//                            (P^T's columns from the identity's without dvl, dO or Qg; R's from zero with
//                            them), only the final adjoints stored, as gdn_offset_walk_mma
// gdn_tape_walk_mma's outputs and layouts (d_chunk, dvnew, dstart, dvnewp, dvnew16, d16; any of the per-chunk
// ones may be null), with the prep's -W planes (wp, a value head), k's and q's bf16 rows (k / q, k_stride /
// q_stride elements a token; 16-byte aligned rows) and their l2norm factors k_rstd / q_rstd in place of the
// fp32 W, Kt and qn, which the kept forward then need not write. On sm_90a the products are wgmma with B
// MN-major (wgmma.cuh's _rs_t products, imm-trans-b); elsewhere wgmma.cuh's portable products, the same
// calls, layouts and bits.
//
// ---- The data flow (gdn_bwalk_wgmma.cu's WGBWalker, with its operands as they lie) -------------------
// Warpgroup q holds adjoint columns c0 + 64 q + [0, 64) of D^T as the m64n128 accumulator s (vh 128: both
// groups; vh 64: group 0). Per chunk, in reverse:
//   (1) P = D^T K^T                        m64n64k16 x 8 k steps (keys): A = D^T split to bf16 hi / lo,
//                                          B = k's bf16 rows (token n x key k, keys contiguous: K-major,
//                                          exact), from zero; ah K + al K a k step.
//       dV'^T = dvl^T + P diag(e)          e_i = e^(gamma_last - gamma_i) rstd_i (k's rstd), 0 from token n
//                                          on: one fma an element (Kt_i = e_i kn_i = e_i rstd_i k_i is not
//                                          formed: k's rows serve every value head of their QK head, as in
//                                          the forward's plane walks).
//   (2) D^T = e^gl D^T - dV'^T W           m64n128k16 x 4 k steps (tokens): A = dV'^T split, B = -W's
//             + (dO^T diag(f)) Q            planes (token k x key n, keys contiguous: MN-major), then
//                                          A = dO^T diag(f) split (f_i = fp32(fp32(scale e^gamma_i) rstd_i),
//                                          0 from n on) with B = q's bf16 rows (exact: Qg_i = q_i f_i in
//                                          exact arithmetic, q_i the raw row, qn_i = q_i rstd_i).
// Per k step of (2): -W hi*hi, hi*lo, lo*hi, then dOf hi * q, dOf lo * q, k steps ascending. The bits differ
// from gdn_tape_walk_mma's (Kt_i and Qg_i were rounded products, here the factors are applied to the
// other side); the precision is the same (every fp32 operand split, ~2^-16 a term). vh 64 and vh 128 give
// the same bits: a column's instructions and operands do not depend on vh.
//
// ---- Shared memory (from the first 1024-aligned byte) ------------------------------------------------
//   stage x (x = 0, 1; tape_stage_bytes(vh) each, 1024-aligned):
//     0       -W hi, lo (32 KB, as the prep wrote them: two 64-key blocks of 8192 bytes a plane)
//     32768   k's rows: keys 0-63 in block 0 (8192 bytes), 64-127 in block 1; row i (token) 128 bytes,
//             its unit u at u ^ (i % 8) (-W's hi plane's layout, walkplanes::copy_rows_mn); rows from n
//             on zero
//     49152   q's rows, the same layout
//     65536   dO [64][vh] bf16, 16-byte units XOR row % 8 (WGBWalker::os), rows from n on zero
//     +       e[64], f[64] (fp32)
//   then two buffers of dvl^T's fp32 rows [64][vh] (WGWalker::ur's swizzle): each state warp copies and reads
//   only its own columns; with GDNKCP_TAPE_DVL_AHEAD chunk ci's in buffer ci % 2, the chunk after next's
//   copied into it under (2) once the warp has read it, else buffer 0 only, the next chunk's copied after (1)
//   then, at vh 64, two output buffers (walkp::out_bytes: D^T 16 KB and dV'^T 8 KB each; GDNKCP_TAPE_STAGE)
// tape_planes_smem(64) = 2 * 73 KB + 2 * 16 KB + 48 KB + 1008 = 232432, tape_planes_smem(128) = 2 * 81 KB +
// 2 * 32 KB + 1008 = 232432 (of the 232448 an SM gives a block).
//
// ---- A chunk c (walked in reverse; stage x = chunks from the last % 2) --------------------------------
//   every thread waits for its copies, fences them for the async proxy; __syncthreads (the stage complete;
//   every wgmma of the previous chunk waited, so the other stage is free)
//   copies of the next chunk into the other stage: -W's planes, k's and q's rows by the copiers (vh 64:
//   warpgroup 1, 32 16-byte copies a thread; vh 128: all, 16), dO by each state warp for its own columns; the gates
//   state warps: split D, (1) issued, D stored under it, dvl^T read; wait; dV'^T = dvl^T + P diag(e); (without
//                GDNKCP_TAPE_DVL_AHEAD the next chunk's dvl^T copied;) dO^T diag(f) split; dV'^T split, D
//                decayed, (2) issued; (with it the chunk after next's dvl^T copied;) dV' stored under it; wait
//   copiers: e, f of the next chunk into its stage (read after the next barrier)
// The last chunk walked (the segment's first) copies itself again into the other stage (read by no one), so
// that no branch on the chunk count sits between a wgmma and its wait.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gdn_walk_planes.cu"  // walkp::stage_tile, store_staged, out_bytes
#include "gdn_walk_wgmma.cu"
#include "walk_planes.cuh"

// GDNKCP_TAPE_MARK(slot, ci): a timeline hook at the phase boundaries of walk() (gdn_bwalk_wgmma.cu's, which
// defines it on sm_90a); empty in every blob.
#ifndef GDNKCP_TAPE_MARK
#define GDNKCP_TAPE_MARK(slot, ci)
#endif

namespace gdnkcp {
// GDNKCP_TAPE_META_AHEAD: the walk loads the next chunk's (t0, n), which issue's addresses and gln's load
// need right after the chunk's barrier, a chunk ahead: under the previous chunk's (2) (the state warps) or
// at its end (the copiers) (1), or after the barrier (0), where they cost the state walk a long-scoreboard
// wait (ncu on v5.25's state walk; gdn_walk_planes.cu's GDNKCP_WP_META_AHEAD).
#ifndef GDNKCP_TAPE_META_AHEAD
#define GDNKCP_TAPE_META_AHEAD 0
#endif
// GDNKCP_TAPE_META_CALC: the walk computes each chunk's (t0, n) from the segment's first chunk (1; see
// gdn_walk_planes.cu's GDNKCP_WP_META_CALC: the same contract on the tables, the same trap) or reads them
// from chunk_tok0 / chunk_len in the loop (0). With 1 no warp loads metadata inside the chunk loop.
#ifndef GDNKCP_TAPE_META_CALC
#define GDNKCP_TAPE_META_CALC 1
#endif
// GDNKCP_TAPE_DVL_ZFILL: issue_dvl zero-fills dvl^T's rows from n on in the buffer (plain 16-byte stores) and
// read_dvl reads without a guard on n (1), or issue_dvl copies only the rows < n and read_dvl tests each
// token against n (0): gdn_walk_planes.cu's GDNKCP_WP_U_ZFILL for the tape walk's dvl^T.
#ifndef GDNKCP_TAPE_DVL_ZFILL
#define GDNKCP_TAPE_DVL_ZFILL 1
#endif
// GDNKCP_TAPE_STAGE: at vh 64 the tape walk's bf16 D^T and dV'^T go through two output buffers (the state walk's
// layout: walkp::stage_tile, by stmatrix on the wgmma path) and the copying warpgroup stores the previous
// chunk's buffer as whole 512-byte runs while the state warps compute (1), or straight from the state warps'
// registers to global memory (0: store_frags16's 8-byte and store_vprime16's 4-byte stores, on the chain; the
// state walk's staging of the same stores took ~2,900 of its chunk's cycles off it, docs/mma-kernels.md).
// The buffers are in tape_planes_smem(64) either way, so kcp's tapePlanesSmem does not depend on the knob.
// GDNKCP_TAPE_DVL_AHEAD: two dvl^T buffers, and each state warp issues the copies of the chunk after next into the
// one it has just read under (2), where it waits on (2) (1), or one buffer, refilled with the next chunk's between
// (1)'s wait and (2)'s issue, on the state warps' chain (0; ncu on v5.33's tape walk: the state warps never wait
// on (1), so every instruction between (1)'s issue and (2)'s is on their chain). With 1 the state warps wait at
// a chunk's top for all but their last commit group (the chunk after next's dvl^T). The second buffer is in
// tape_planes_smem whatever the knob (232,432 bytes at both widths), so kcp's tapePlanesSmem does not depend on it.
#ifndef GDNKCP_TAPE_DVL_AHEAD
#define GDNKCP_TAPE_DVL_AHEAD 1
#endif
// GDNKCP_TAPE_DVL_AHEAD_W128 / GDNKCP_TAPE_ZFILL_W128: GDNKCP_TAPE_DVL_AHEAD / GDNKCP_WALK_CP_ZFILL at vh 128
// too (1) or at vh 64 only (0): the vh 128 walk runs at 255 registers, where either change may cost a spill.
// ptxas 13.0, sm_90a (scripts/walk-regs.sh, twenty-sixth session): the vh 128 tape walk spills 16 bytes with both
// at 1, 20 with the zero fills alone, 4 with neither, none with dvl^T ahead alone; so ZFILL_W128 is 0.
// The same at sm_100a / sm_103a / sm_107a (no wgmma: the warp-level walk): 12 bytes spilled with DVL_AHEAD_W128 1
// (ZFILL_W128 0), so there it is 0 (v5.33's vh 128 walk), like every target but sm_90a that the walks were not
// timed on.
#ifndef GDNKCP_TAPE_DVL_AHEAD_W128
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ != 900
#define GDNKCP_TAPE_DVL_AHEAD_W128 0
#else
#define GDNKCP_TAPE_DVL_AHEAD_W128 1
#endif
#endif
#ifndef GDNKCP_TAPE_ZFILL_W128
#define GDNKCP_TAPE_ZFILL_W128 0
#endif
#ifndef GDNKCP_TAPE_STAGE
#define GDNKCP_TAPE_STAGE 1
#endif
// GDNKCP_TAPE_H_SPLIT_D, GDNKCP_TAPE_H_SPLIT_DOF: the single-product tape walk (TapePlaneWalker's HI) keeps D^T's
// hi / lo split in (1) (16 wgmma m64n64k16 a chunk instead of 8) or dO^T diag(f)'s in (2) (12 m64n128k16 instead
// of 8) where 1. gdnref's TestTapeBF16Model: with a long memory (g in [-0.02, -0.001]) the single products take
// the core stage's gradients from the bf16 hand-over's error to up to 1.4x it (the rounding of the source term
// dO^T diag(f) Q, summed over many chunks, dominates), both splits kept to within 5%; with kcp's test gates
// (g in [-0.32, -0.02]) both are within 5%. 0 and 0 until the H200 says what the splits cost.
#ifndef GDNKCP_TAPE_H_SPLIT_D
#define GDNKCP_TAPE_H_SPLIT_D 0
#endif
#ifndef GDNKCP_TAPE_H_SPLIT_DOF
#define GDNKCP_TAPE_H_SPLIT_DOF 0
#endif

namespace tapep {

using tc::bf16;
using walkwg::kC;
using walkwg::kD;
using walkplanes::KRows;
using walkplanes::kOffLo;
using walkplanes::kWBytes;
constexpr int kQBytes = kC * kD * 2;           // a chunk's bf16 rows of k or q (16 KB)
constexpr int kOffK = kWBytes;                 // k's bf16 rows after -W's planes
constexpr int kOffQ = kWBytes + kQBytes;       // then q's
constexpr int kOffO = kOffQ + kQBytes;         // then dO [64][vh] bf16
__host__ __device__ constexpr int off_ef(int vh) { return kOffO + kC * vh * 2; }  // then e[64], f[64]
__host__ __device__ constexpr int tape_stage_bytes(int vh) { return (off_ef(vh) + 8 * kC + 1023) / 1024 * 1024; }
__host__ __device__ constexpr int dvl_bytes(int vh) { return kC * vh * 4; }
// tape_planes_smem: two stages, two dvl buffers, at vh 64 two output buffers (walkp::out_bytes: D^T 16 KB and
// dV'^T 8 KB each) and up to 1008 bytes of alignment.
__host__ __device__ constexpr int tape_planes_smem(int vh) {
	return 2 * tape_stage_bytes(vh) + 2 * dvl_bytes(vh) + 2 * walkp::out_bytes(vh) + 1008;
}
static_assert(tape_planes_smem(64) == 232432 && tape_planes_smem(128) == 232432, "kcp's tapePlanesSmem");
static_assert(tape_planes_smem(64) <= 232448, "two stages, dvl and two output buffers fit an SM's 227 KB");
static_assert(tape_planes_smem(128) <= 232448, "two stages and dvl fit an SM's 227 KB");

// DO: the walk of the adjoint columns (the tape walk; the offset walk's R columns: dvl, dO and Qg terms);
// without it the offset walk's P^T columns: (1) without dvl, (2) the -W products alone, so neither q's rows
// nor dO nor dvl are copied.
// HI: every product on single bf16 operands (gdn_tape_walk_planes_h, _w128_h): (1) D^T's hi fragments alone
// with k (8 wgmma a chunk instead of 16), (2) dV'^T's hi with -W's hi plane and dO^T diag(f)'s hi with q (8
// instead of 20), no lo parts formed and -W's lo plane not copied (GDNKCP_TAPE_H_SPLIT_D / _DOF keep D^T's /
// dO^T diag(f)'s splits). For the core stage, whose chunk gradients (gdn_chunk_grads_mma8) read D^T and dV'^T
// in bf16 and take bf16 products: gdnref's TestTapeBF16Model puts the walk's own error at ~1.8e-3 of D and the
// gradients from its bf16 hand-over within 5% of those from a float64 tape's with kcp's test gates (the
// hand-over's bf16 dominates), up to 1.4x with a long memory. The module stage's hi / lo chunk gradients (mma6)
// keep the split walk. The same bits at both widths (a column's instructions do not depend on vh).
template <int VH, bool DO = true, bool HI = false>
struct TapePlaneWalker : walkwg::WGWalker<VH> {
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
	using Base::t;
	using Base::ur;
	using Base::uv;
	using Base::warp;
	using Base::wq;
	using Base::X;
	static constexpr int kCopiers = Base::kGroups == 2 ? 256 : 128;  // threads that copy the planes and q
	float ge_i, ge_l, gr_i, gk_i;  // a copier ct < 64: gcum of token ct (or n - 1), of token n - 1, q's and k's rstd of ct
	int ge_n;

	__device__ __forceinline__ explicit TapePlaneWalker(float* smem) : Base(smem) {}

	__device__ __forceinline__ unsigned char* stage(int x) const { return X + x * tape_stage_bytes(VH); }
	// dvl^T buffer b (GDNKCP_TAPE_DVL_AHEAD: chunk ci's in buffer ci % 2; else buffer 0 only).
	static constexpr bool kDvlAhead = GDNKCP_TAPE_DVL_AHEAD != 0 && DO && (VH == 64 || GDNKCP_TAPE_DVL_AHEAD_W128 != 0);
	// The zero-filling copies (walk_planes.cuh's GDNKCP_WALK_CP_ZFILL), at vh 128 only with GDNKCP_TAPE_ZFILL_W128.
	static constexpr bool kZfill = GDNKCP_WALK_CP_ZFILL != 0 && (VH == 64 || GDNKCP_TAPE_ZFILL_W128 != 0);
	__device__ __forceinline__ float* dvl_buf(int b) const {
		return reinterpret_cast<float*>(X + 2 * tape_stage_bytes(VH) + (kDvlAhead ? b : 0) * dvl_bytes(VH));
	}
	// Output buffer x (kStaged): D^T's 64 rows of 256 bytes, then dV'^T's of 128 (walkp::stage_tile's layout).
	static constexpr bool kStaged = VH == 64 && GDNKCP_TAPE_STAGE != 0;
	__device__ __forceinline__ unsigned char* outbuf(int x) const {
		return X + 2 * tape_stage_bytes(VH) + 2 * dvl_bytes(VH) + x * walkp::out_bytes(VH);
	}
	// stage_d: this state warp's D^T rows into output buffer x from (1)'s hi fragments, store_frags16's words
	// (ah[k][q]: key tile 2k + q / 2, row half q % 2).
	__device__ __forceinline__ void stage_d(int x, const unsigned (&ah)[8][4]) const {
		walkp::stage_tile<16, 256>(outbuf(x), 16 * wq, lane, [&](int nt, int hf) { return ah[nt >> 1][2 * (nt & 1) + hf]; });
	}
	// stage_dv: this state warp's dV'^T rows (d, tokens from n on zero: store_vprime16's words) into buffer x.
	__device__ __forceinline__ void stage_dv(int x, int n) const {
		walkp::stage_tile<8, 128>(outbuf(x) + VH * kD * 2, 16 * wq, lane, [&](int nt, int hf) {
			const int tok = 8 * nt + 2 * t;
			return tc::pack_bf16x2(tok < n ? d[4 * nt + 2 * hf] : 0.f, tok + 1 < n ? d[4 * nt + 2 * hf + 1] : 0.f);
		});
	}
	__device__ __forceinline__ int copier() const {
		return Base::kGroups == 2 ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x) - 128;
	}
	// os: the swizzled element offset in a stage's dO of (token i, column cc); 16-byte units XOR i % 8.
	__device__ __forceinline__ int os(int i, int cc) const { return i * VH + ((((cc >> 3) ^ (i & 7))) << 3) + (cc & 7); }

	// issue starts the copies of chunk c (t0, n) into stage x: a copier's share of the 64 KB of planes (-W's
	// of value head h, K^T's of QK head qh) and of q's 64 rows (zero from n on, by plain stores), a state
	// warp's 16 dO columns (zero from n on); one commit group. A copier ct < 64 loads the gates and rstd of
	// e_ct, f_ct (finish_ef), a state warp gamma_last of the chunk into gln.
	__device__ __forceinline__ void issue(const unsigned char* wp, const KRows& kr, const bf16* q, long long q_stride,
	                                      const float* q_rstd, const float* gcum, const bf16* dout, int c, int t0, int n, int h,
	                                      int HV, int qh, int HQK, int c0, int x) {
		unsigned char* st = stage(x);
		if (converts()) {
			const int ct = copier();
			walkplanes::copy_wplanes<kCopiers, HI ? walkplanes::kOffLo : walkplanes::kWBytes>(st, wp, c, h, HV, ct);
			walkplanes::copy_rows_mn<kCopiers, kZfill>(st + kOffK, kr.k + (long long)t0 * kr.stride + (long long)qh * kD, kr.stride,
			                                   n, ct);
			if (DO) walkplanes::copy_rows_mn<kCopiers, kZfill>(st + kOffQ, q + (long long)t0 * q_stride + (long long)qh * kD, q_stride, n, ct);
			if (ct < kC) {
				const int i = ct < n ? ct : n - 1;
				ge_n = n;
				ge_i = gcum[(long long)(t0 + i) * HV + h];
				ge_l = gcum[(long long)(t0 + n - 1) * HV + h];
				if (DO) gr_i = q_rstd[(long long)(t0 + i) * HQK + qh];
				gk_i = kr.rstd[(long long)(t0 + i) * HQK + qh];
			}
		}
		if (DO && holds()) {
			// Lane: 8 columns (unit cc / 8) of tokens lane / 2 + 16 y (WGBWalker::issue's dO copies).
			const int cc = 64 * grp + 16 * wq + 8 * (lane % 2);
			bf16* ob = reinterpret_cast<bf16*>(st + kOffO);
			// Row t0 (the chunk's first token: it exists) is the source the zero-filling copies do not read.
			const bf16* o0 = dout + ((long long)t0 * HV + h) * kD + c0 + cc;
			const long long os16 = 16LL * HV * kD;  // 16 tokens
#pragma unroll
			for (int y = 0; y < 4; ++y) {
				const int i = lane / 2 + 16 * y;
				bf16* dst = ob + os(i, cc);
				if (kZfill) {
					const bool full = i < n;
					tc::cp_async16_zfill(dst, full ? o0 + (long long)(lane / 2) * HV * kD + y * os16 : o0, full);
				} else if (i < n) {
					tc::cp_async16(dst, dout + ((long long)(t0 + i) * HV + h) * kD + c0 + cc);
				} else {
					*reinterpret_cast<walkwg::U32x4*>(dst) = walkwg::U32x4{0u, 0u, 0u, 0u};
				}
			}
		}
		if (holds()) gln = gcum[(long long)(t0 + n - 1) * HV + h];
		tc::cp_async_commit();
	}

	// issue_dvl (state warps): the copies of dvl^T of chunk (t0, n), this warp's 16 columns of the rows < n,
	// into the dvl buffer (WGWalker::issue's U copies); one commit group. Rows from n on: zeros by plain
	// stores with GDNKCP_TAPE_DVL_ZFILL (read_dvl reads every row), else left as they are (not read).
	__device__ __forceinline__ void issue_dvl(const float* dvl, int t0, int n, int h, int HV, int c0, int b) {
		if (!DO) return;
		const int i0 = lane / 4, cc = 64 * grp + 16 * wq + 4 * (lane % 4);
		const long long vs = 8LL * HV * kD;
		const float* v0 = dvl + ((long long)t0 * HV + h) * kD + c0 + cc;  // row t0: the zero fills' valid source
		const float* vp = v0 + i0 * (vs / 8);
		float* dst = dvl_buf(b) + ur(i0, cc);
#pragma unroll
		for (int y = 0; y < 8; ++y) {
			const bool full = i0 + 8 * y < n;
			if (kZfill)  // the rows from n on zeroed by the copies (src-size 0)
				tc::cp_async16_zfill(dst + 8 * y * VH, full ? vp : v0, full);
			else if (full)
				tc::cp_async16(dst + 8 * y * VH, vp);
			else if (GDNKCP_TAPE_DVL_ZFILL)  // read by read_dvl, unguarded
				*reinterpret_cast<walkwg::U32x4*>(dst + 8 * y * VH) = walkwg::U32x4{0u, 0u, 0u, 0u};
			vp += vs;
		}
		tc::cp_async_commit();
	}

	// finish_ef (copiers ct < 64): e_ct = fp32(e^(gamma_last - gamma_ct) krstd_ct) and f_ct = fp32(fp32(scale
	// e^gamma_ct) qrstd_ct) of the chunk last issued (both zero from token n on) into stage x: read after the
	// next barrier.
	__device__ __forceinline__ void finish_ef(int x, float scale) const {
		const int ct = copier();
		if (converts() && ct < kC) {
			float* ef = reinterpret_cast<float*>(stage(x) + off_ef(VH));
			ef[ct] = ct < ge_n ? expf(ge_l - ge_i) * gk_i : 0.f;
			if (DO) ef[kC + ct] = ct < ge_n ? __fmul_rn(scale * expf(ge_i), gr_i) : 0.f;
		}
	}

	// read_dvl (state warps): dvl^T of the chunk (n rows) from buffer bi into uv, zero from n on (nothing
	// without DO): with GDNKCP_TAPE_DVL_ZFILL the buffer's own zeros, read without a test on n.
	__device__ __forceinline__ void read_dvl(int n, int bi) {
		if (!DO) return;
		__syncwarp();  // the warp's dvl copies, each visible to its own lane after the wait, to the warp
		const float* b = dvl_buf(bi);
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
			for (int r = 0; r < 4; ++r) {
				const int i = 8 * nt + 2 * t + (r & 1);
				uv[4 * nt + r] = GDNKCP_TAPE_DVL_ZFILL || i < n ? b[ur(i, col(r))] : 0.f;
			}
		}
	}

	// dvprime_issue issues (1) on k's rows at kb (K-major: token n x key k): d = D^T K^T from zero (k exact,
	// its rstd in e). ah, al must live until the wait.
	__device__ __forceinline__ void dvprime_issue(const unsigned char* kb, unsigned (&ah)[8][4], unsigned (&al)[8][4]) {
		Base::template split_frags<8>(s, ah, al);
		wg::fence();
#pragma unroll
		for (int k = 0; k < 8; ++k) {
			// Keys 16 k ..: 32 bytes into the rows of the 64-key block k / 4 (WGWalker::vprime_issue_at's B).
			const unsigned long long kd = wg::desc_sw128(kb + (k / 4) * 8192 + (k % 4) * 32);
			wg::mma_m64n64k16_rs(d, ah[k], kd, k == 0 ? 0 : 1);  // k step 0 starts from zero
			if (!HI || GDNKCP_TAPE_H_SPLIT_D) wg::mma_m64n64k16_rs(d, al[k], kd);
		}
		wg::commit();
	}

	// dvprime_finish waits for (1) and forms dV'^T = dvl^T + P diag(e) (uv holds dvl^T, E the 64 factors;
	// without DO, P diag(e)).
	__device__ __forceinline__ void dvprime_finish(const float* E) {
		wg::wait<0>();
		wg::fence_operand(d);
#pragma unroll
		for (int nt = 0; nt < 8; ++nt) {
			// d[4 nt + r]: token 8 nt + 2t + (r & 1)
			const float2 e = *reinterpret_cast<const float2*>(E + 8 * nt + 2 * t);
			if (DO) {
				d[4 * nt] = __fmaf_rn(d[4 * nt], e.x, uv[4 * nt]);
				d[4 * nt + 1] = __fmaf_rn(d[4 * nt + 1], e.y, uv[4 * nt + 1]);
				d[4 * nt + 2] = __fmaf_rn(d[4 * nt + 2], e.x, uv[4 * nt + 2]);
				d[4 * nt + 3] = __fmaf_rn(d[4 * nt + 3], e.y, uv[4 * nt + 3]);
			} else {
				d[4 * nt] = __fmul_rn(d[4 * nt], e.x);
				d[4 * nt + 1] = __fmul_rn(d[4 * nt + 1], e.y);
				d[4 * nt + 2] = __fmul_rn(d[4 * nt + 2], e.x);
				d[4 * nt + 3] = __fmul_rn(d[4 * nt + 3], e.y);
			}
		}
	}

	// dof_frags: the A fragments of dO^T diag(f) of k step j (tokens 16 j ..), split to hi / lo, from the
	// stage's dO (ldmatrix.x4.trans of the warp's 16 columns: bf16, exact) and F.
	__device__ __forceinline__ void dof_frags(const unsigned char* st, const float* F, unsigned (&oh)[4][4],
	                                          unsigned (&ol)[4][4]) const {
		const bf16* ob = reinterpret_cast<const bf16*>(st + kOffO);
		const int orow = (lane & 7) + 8 * (lane >> 4), ocol = 64 * grp + 16 * wq + 8 * ((lane >> 3) & 1);
#pragma unroll
		for (int j = 0; j < 4; ++j) {
			unsigned o[4];
			tc::ldmatrix_x4_trans(o, ob + os(16 * j + orow, ocol));
			// o[0], o[1]: tokens 16 j + 2t, + 1; o[2], o[3]: tokens 16 j + 8 + 2t, + 1 (A's k layout).
			const float2 f0 = *reinterpret_cast<const float2*>(F + 16 * j + 2 * t);
			const float2 f1 = *reinterpret_cast<const float2*>(F + 16 * j + 8 + 2 * t);
#pragma unroll
			for (int q = 0; q < 4; ++q) {
				const float2 f = q < 2 ? f0 : f1;
				const float2 v = make_float2(__uint_as_float(o[q] << 16), __uint_as_float(o[q] & 0xffff0000u));  // exact
				tc::split_bf16x2(__fmul_rn(v.x, f.x), __fmul_rn(v.y, f.y), oh[j][q], ol[j][q]);
			}
		}
	}

	// dupdate_issue issues (2) on stage st: D^T = e^gl D^T - dV'^T W + (dO^T diag(f)) Q. All four fragment
	// arrays must live until the wait.
	__device__ __forceinline__ void dupdate_issue(const unsigned char* st, unsigned (&ah)[4][4], unsigned (&al)[4][4],
	                                              const unsigned (&oh)[4][4], const unsigned (&ol)[4][4]) {
		Base::template split_frags<4>(d, ah, al);
		this->decay_state();
		wg::fence();
#pragma unroll
		for (int k = 0; k < 4; ++k) {
			// Tokens 16 k ..: two 8-token atoms from 2048 k on; keys 64-127 8192 bytes on (lbo).
			const unsigned long long wh = wg::desc_sw128_mn(st + 2048 * k, 8192);
			const unsigned long long wl = wg::desc_sw128_mn(st + kOffLo + 2048 * k, 8192);
			const unsigned long long qd = wg::desc_sw128_mn(st + kOffQ + 2048 * k, 8192);
			wg::mma_m64n128k16_rs_t(s, ah[k], wh, 8192);
			if (!HI) {
				wg::mma_m64n128k16_rs_t(s, ah[k], wl, 8192);
				wg::mma_m64n128k16_rs_t(s, al[k], wh, 8192);
			}
			if (DO) {
				wg::mma_m64n128k16_rs_t(s, oh[k], qd, 8192);
				if (!HI || GDNKCP_TAPE_H_SPLIT_DOF) wg::mma_m64n128k16_rs_t(s, ol[k], qd, 8192);
			}
		}
		wg::commit();
	}

	__device__ __forceinline__ void walk(const unsigned char* wp, const KRows& kr, const bf16* q, long long q_stride,
	                                     const float* q_rstd, const float* gcum, const float* dvl, const bf16* dout,
	                                     const int* chunk_tok0, const int* chunk_len, int ch0, int nch, int h, int HQK,
	                                     int HV, int c0, float scale, float* d_chunk, float* dvnew, float* dvnewp,
	                                     bf16* dvnew16, bf16* d16) {
		if (nch <= 0) return;
		const int last = ch0 + nch - 1, qh = h / (HV / HQK);
		constexpr bool kCalc = GDNKCP_TAPE_META_CALC != 0;
		const int t00 = chunk_tok0[ch0], tl = chunk_tok0[last], nl = chunk_len[last];
		// kCalc: the segment's tokens, from which chunk ch0 + i's n follows (min(64, slen - 64 i)).
		const int slen = (nch - 1) * kC + nl;
		if (kCalc && tl != t00 + (nch - 1) * kC) __trap();  // not the tables kcp builds
		issue(wp, kr, q, q_stride, q_rstd, gcum, dout, last, tl, nl, h, HV, qh, HQK, c0, 0);
		if (holds()) {
			issue_dvl(dvl, tl, nl, h, HV, c0, 0);
			if (kDvlAhead) {  // the second chunk walked (or the segment's first again) into buffer 1
				const int c1 = last - 1 > ch0 ? last - 1 : ch0;
				if (kCalc)
					issue_dvl(dvl, t00 + kC * (c1 - ch0), min(kC, slen - kC * (c1 - ch0)), h, HV, c0, 1);
				else
					issue_dvl(dvl, chunk_tok0[c1], chunk_len[c1], h, HV, c0, 1);
			}
		}
		finish_ef(0, scale);
		constexpr bool kAhead = GDNKCP_TAPE_META_AHEAD != 0 && !kCalc;
		int t0n = 0, nn = 0;  // the next chunk's (t0, n) for issue, loaded a chunk ahead (kAhead)
		if (kAhead) {
			const int c1 = last - 1 > ch0 ? last - 1 : ch0;
			t0n = chunk_tok0[c1], nn = chunk_len[c1];
		}
		for (int ci = 0; ci < nch; ++ci) {
			const int c = last - ci, x = ci & 1, n = kCalc ? min(kC, slen - kC * (c - ch0)) : chunk_len[c];
			// The next chunk (or the segment's first again, into the stage no one reads), and the one after.
			const int cn = c - 1 > ch0 ? c - 1 : ch0, cnn = cn - 1 > ch0 ? cn - 1 : ch0;
			if (kDvlAhead && holds())
				tc::cp_async_wait<1>();  // all but the chunk after next's dvl^T, committed last (under (2))
			else
				tc::cp_async_wait<0>();
			wg::fence_proxy_async();
			__syncthreads();
			GDNKCP_TAPE_MARK(0, ci);  // every warp: past the chunk's barrier
			if (holds()) gl = gln;  // chunk c's gamma_last (issue loads the next chunk's into gln)
			if (kCalc)
				t0n = t00 + kC * (cn - ch0), nn = min(kC, slen - kC * (cn - ch0));
			else if (!kAhead)
				t0n = chunk_tok0[cn], nn = chunk_len[cn];
			issue(wp, kr, q, q_stride, q_rstd, gcum, dout, cn, t0n, nn, h, HV, qh, HQK, c0, 1 - x);
			GDNKCP_TAPE_MARK(7, ci);  // every warp: the next chunk's copies issued (state warps: dO's)
			if (kStaged && !holds() && ci > 0) {  // the previous chunk's (c + 1) D^T and dV'^T, staged by the state warps
				walkp::store_staged<VH>(outbuf(1 - x), (long long)(c + 1) * HV + h, c0, static_cast<int>(threadIdx.x) - 128, d16,
				                        dvnew16);
				GDNKCP_TAPE_MARK(8, ci);  // copiers: the previous chunk's outputs stored
			}
			if (holds()) {
				const long long blk = (long long)c * HV + h;
				const unsigned char* st = stage(x);
				const float* ef = reinterpret_cast<const float*>(st + off_ef(VH));
				{
					unsigned ah[8][4], al[8][4];
					dvprime_issue(st + kOffK, ah, al);
					GDNKCP_TAPE_MARK(1, ci);  // state: D split, (1) issued
					if (d_chunk != nullptr) this->store_state(d_chunk + blk * kD * kD, c0);
					if (kStaged) {
						if (d16 != nullptr) stage_d(x, ah);
					} else if (d16 != nullptr) {
						this->store_frags16(d16 + blk * kD * kD, c0, ah);
					}
					read_dvl(n, x);
					GDNKCP_TAPE_MARK(2, ci);  // state: D stores issued, dvl read
					dvprime_finish(ef);
				}
				GDNKCP_TAPE_MARK(3, ci);  // state: (1) done, dV' formed
				__syncwarp();  // every lane's dvl reads are done before the next chunk's copies overwrite them
				if (!kDvlAhead) {
					if (kCalc)  // recomputed rather than kept live across (1)
						issue_dvl(dvl, t00 + kC * (cn - ch0), min(kC, slen - kC * (cn - ch0)), h, HV, c0, 0);
					else
						issue_dvl(dvl, chunk_tok0[cn], chunk_len[cn], h, HV, c0, 0);
				}
				unsigned oh[4][4], ol[4][4], bh[4][4], bl[4][4];
				if (DO) dof_frags(st, ef + kC, oh, ol);
				dupdate_issue(st, bh, bl, oh, ol);
				GDNKCP_TAPE_MARK(4, ci);  // state: dV' split, D decayed, (2) issued
				if (kDvlAhead) {  // the chunk after next's dvl^T into the buffer read above, under (2)
					if (kCalc)
						issue_dvl(dvl, t00 + kC * (cnn - ch0), min(kC, slen - kC * (cnn - ch0)), h, HV, c0, x);
					else
						issue_dvl(dvl, chunk_tok0[cnn], chunk_len[cnn], h, HV, c0, x);
				}
				if (dvnew != nullptr) this->store_vprime(dvnew, kCalc ? t00 + kC * (c - ch0) : chunk_tok0[c], n, h, HV, c0);
				if (dvnewp != nullptr) this->store_vprime_slots(dvnewp + blk * kD * kC, n, c0);
				if (kStaged) {
					if (dvnew16 != nullptr) stage_dv(x, n);
				} else if (dvnew16 != nullptr) {
					this->store_vprime16(dvnew16 + blk * kD * kC, n, c0);
				}
				GDNKCP_TAPE_MARK(5, ci);  // state: dV' stores issued
				if (kAhead) t0n = chunk_tok0[cnn], nn = chunk_len[cnn];  // land under (2)
				wg::wait<0>();
				wg::fence_operand(s);
				GDNKCP_TAPE_MARK(6, ci);  // state: (2) done
			}
			finish_ef(1 - x, scale);  // the next chunk's factors (their gates loaded by issue)
			if (kAhead && !holds()) t0n = chunk_tok0[cnn], nn = chunk_len[cnn];
			GDNKCP_TAPE_MARK(9, ci);  // every warp: the chunk's work done (then its wait for the next barrier)
		}
		tc::cp_async_wait<0>();  // the copies issued past the end land before the CTA exits
		if (kStaged) {
			__syncthreads();  // the last chunk's (ch0's) D^T and dV'^T staged
			if (!holds())
				walkp::store_staged<VH>(outbuf((nch - 1) & 1), (long long)ch0 * HV + h, c0, static_cast<int>(threadIdx.x) - 128, d16,
				                        dvnew16);
		}
	}
};

template <int VH, bool HI = false>
__device__ __forceinline__ void tape_walk(float* smem, const unsigned char* wp, const KRows& kr, const bf16* q,
                                          long long q_stride, const float* q_rstd, const float* gcum, const float* dvl,
                                          const bf16* dout, const int* chunk_tok0, const int* chunk_len,
                                          const int* seg_chunk0, const int* seg_nchunk, const float* dend, float* d_chunk,
                                          float* dvnew, float* dstart, int HQK, int HV, float scale, float* dvnewp,
                                          bf16* dvnew16, bf16* d16, const int* order) {
	TapePlaneWalker<VH, true, HI> wk_(smem);
	int x, seg, h;
	tc::dispatch_cta(order, x, seg, h);
	const int c0 = x * VH;
	wk_.init_state(dend + ((long long)seg * HV + h) * kD * kD, c0);
	wk_.walk(wp, kr, q, q_stride, q_rstd, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0[seg], seg_nchunk[seg], h, HQK,
	         HV, c0, scale, d_chunk, dvnew, dvnewp, dvnew16, d16);
	wk_.store_state(dstart + ((long long)seg * HV + h) * kD * kD, c0);
}

// offset_walk: gdn_offset_walk_planes's body. Blocks x < 128 / vh walk R's columns (from zero, with dvl, dO
// and Qg), the others P^T's (from the identity's columns, without them); only the final adjoints are stored.
template <int VH, bool DO, bool HI = false>
__device__ __forceinline__ void offset_walk_form(float* smem, const unsigned char* wp, const KRows& kr,
                                                 const bf16* q, long long q_stride, const float* q_rstd,
                                                 const float* gcum, const float* dvl, const bf16* dout,
                                                 const int* chunk_tok0, const int* chunk_len, int ch0, int nch, int h,
                                                 int HQK, int HV, int c0, float scale, float* out) {
	TapePlaneWalker<VH, DO, HI> wk_(smem);
	wk_.init_state(nullptr, c0, !DO);
	wk_.walk(wp, kr, q, q_stride, q_rstd, gcum, dvl, dout, chunk_tok0, chunk_len, ch0, nch, h, HQK, HV, c0, scale,
	         nullptr, nullptr, nullptr, nullptr, nullptr);
	wk_.store_state(out, c0);
}

template <int VH, bool HI = false>
__device__ __forceinline__ void offset_walk(float* smem, const unsigned char* wp, const KRows& kr, const bf16* q,
                                            long long q_stride, const float* q_rstd, const float* gcum, const float* dvl,
                                            const bf16* dout, const int* chunk_tok0, const int* chunk_len,
                                            const int* seg_chunk0, const int* seg_nchunk, const int* list, float* out_pt,
                                            float* out_r, int HQK, int HV, float scale, const int* order) {
	const tc::PairCTA b = tc::pair_cta(order, list, VH, HV);
	if (b.isP)
		offset_walk_form<VH, false, HI>(smem, wp, kr, q, q_stride, q_rstd, gcum, dvl, dout, chunk_tok0, chunk_len,
		                            seg_chunk0[b.seg], seg_nchunk[b.seg], b.h, HQK, HV, b.c0, scale, out_pt + b.blk);
	else
		offset_walk_form<VH, true, HI>(smem, wp, kr, q, q_stride, q_rstd, gcum, dvl, dout, chunk_tok0, chunk_len,
		                           seg_chunk0[b.seg], seg_nchunk[b.seg], b.h, HQK, HV, b.c0, scale, out_r + b.blk);
}

// GDNKCP_BWALK_PLANES_PARAMS: the parameters every offset and tape walk entry opens with.
#define GDNKCP_BWALK_PLANES_PARAMS                                                                                     \
	const __nv_bfloat16* __restrict__ wp, const __nv_bfloat16* __restrict__ k, int k_stride,                           \
	    const float* __restrict__ k_rstd, const __nv_bfloat16* __restrict__ q, int q_stride,                           \
	    const float* __restrict__ q_rstd, const float* __restrict__ gcum, const float* __restrict__ dvl,               \
	    const __nv_bfloat16* __restrict__ dout, const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len, \
	    const int* __restrict__ seg_chunk0, const int* __restrict__ seg_nchunk

// gdn_offset_walk_planes: gdn_offset_walk_mma's walks (grid (2 x 128/vh, nlist, HV), out_pt and out_r as
// there) on the walk planes and q's bf16 rows, as gdn_tape_walk_planes reads them in place of w, kt and qn;
// dynamic shared memory tape_planes_smem(vh). gdn_offset_walk_planes_h: the same arguments on single bf16
// products (TapePlaneWalker's HI): the offset walk of the core stage with gdn_tape_walk_planes_h (kcp's
// GPUOptions.TapeBF16). GDNKCP_OFFSET_PLANES_ENTRY(NAME, HI) defines the offset walk entry NAME of product
// form HI (both widths, by vh); the two entries differ in nothing else.
#define GDNKCP_OFFSET_PLANES_ENTRY(NAME, HI)                                                                          \
	extern "C" __global__ void __launch_bounds__(256)                                                                 \
	NAME(GDNKCP_BWALK_PLANES_PARAMS, const int* __restrict__ list, float* __restrict__ out_pt,                        \
	     float* __restrict__ out_r, int HQK, int HV, int vh, float scale, const int* __restrict__ order) {            \
		extern __shared__ float smem[]; /* C linkage: the one dynamic shared memory of every kernel here */            \
		const unsigned char* p = reinterpret_cast<const unsigned char*>(wp);                                          \
		const KRows kr{k, k_stride, k_rstd};                                                                          \
		if (vh == 64)                                                                                                 \
			offset_walk<64, HI>(smem, p, kr, q, q_stride, q_rstd, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0,  \
			                    seg_nchunk, list, out_pt, out_r, HQK, HV, scale, order);                              \
		else                                                                                                          \
			offset_walk<128, HI>(smem, p, kr, q, q_stride, q_rstd, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0, \
			                     seg_nchunk, list, out_pt, out_r, HQK, HV, scale, order);                             \
	}

GDNKCP_OFFSET_PLANES_ENTRY(gdn_offset_walk_planes, false)
GDNKCP_OFFSET_PLANES_ENTRY(gdn_offset_walk_planes_h, true)

// gdn_tape_walk_planes (vh 64) and gdn_tape_walk_planes_w128 (vh 128): gdn_tape_walk_mma's walk on the walk
// planes: wp (-W, 32 KB a chunk and value head), k and q (bf16 rows of k_stride / q_stride elements, 16-byte
// aligned, QK head qh at element 128 qh of a row) and k_rstd, q_rstd ([T, HQK]: kn = k rstd, qn = q rstd) in
// place of w, kt and qn; the other arguments and outputs are gdn_tape_walk_mma's (any of d_chunk, dvnew,
// dvnewp, dvnew16, d16 may be null), vh included (it must be the entry's width: a trap otherwise). One
// entry a width: ptxas 13.0 fits each alone in 255 / 254 registers on sm_90a without a spill, the two
// bodies in one entry spilled 4-8 bytes. gdn_tape_walk_planes_h and gdn_tape_walk_planes_w128_h: the same
// arguments, every product on single bf16 operands (TapePlaneWalker's HI; wp's lo plane is not read).
// GDNKCP_TAPE_PLANES_ENTRY(NAME, VH, HI) defines the tape walk entry NAME of width VH (vh must be VH: kcp
// launches the entry of the width, kernelSet.tapeEntry) and product form HI; the four entries differ in nothing
// else.
#define GDNKCP_TAPE_PLANES_ENTRY(NAME, VH, HI)                                                                                \
	extern "C" __global__ void __launch_bounds__(256)                                                                        \
	NAME(GDNKCP_BWALK_PLANES_PARAMS, const float* __restrict__ dend, float* __restrict__ d_chunk,                            \
	     float* __restrict__ dvnew, float* __restrict__ dstart, int HQK, int HV, int vh, float scale,                        \
	     float* __restrict__ dvnewp, __nv_bfloat16* __restrict__ dvnew16, __nv_bfloat16* __restrict__ d16,                   \
	     const int* __restrict__ order) {                                                                                    \
		extern __shared__ float smem[]; /* C linkage: the one dynamic shared memory of every kernel here */                   \
		if (vh != VH) __trap();                                                                                              \
		tape_walk<VH, HI>(smem, reinterpret_cast<const unsigned char*>(wp), KRows{k, k_stride, k_rstd}, q, q_stride, q_rstd, \
		                  gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, dend, d_chunk, dvnew, dstart, HQK, \
		                  HV, scale, dvnewp, dvnew16, d16, order);                                                           \
	}

GDNKCP_TAPE_PLANES_ENTRY(gdn_tape_walk_planes, 64, false)
GDNKCP_TAPE_PLANES_ENTRY(gdn_tape_walk_planes_w128, 128, false)
GDNKCP_TAPE_PLANES_ENTRY(gdn_tape_walk_planes_h, 64, true)
GDNKCP_TAPE_PLANES_ENTRY(gdn_tape_walk_planes_w128_h, 128, true)

}  // namespace tapep
}  // namespace gdnkcp
