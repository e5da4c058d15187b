// walk_2cta_skel.cu: a timing and register skeleton of the vh 64 state walk (gdn_walk_planes.cu), built to ask
// what a walk chunk costs and why before anything is built: two walk CTAs an SM (each under ~113 KB of shared
// memory), bulk (TMA) copies, the output staging, and which of the real walk's features cost what. Run by
// scripts/walk-skel.sh on the GPU machine (nvcc there, no Go); not part of the blobs. Its answers are in
// docs/perf-notes.md, "What next (twenty-fourth session's view)": one CTA an SM with four copier warps beats two
// CTAs an SM; bulk copies gain ~5% only when every copy is one; the real walk's shape runs 1.14 ms at 32K where
// v5.31's walk ran 1.37, which led to v5.32 (its U^T reads without a guard on n); the chain alone (no outputs)
// is ~1.5 us a chunk.
//
// What it has, a CTA a (segment, value head, vh half) walking its segment's chunks in order: the state
// (64 values x 128 keys, fp32) in one warpgroup's m64n128 accumulators; per chunk its bf16 H^T and (1) V'^T =
// U^T + H^T (-W^T) as three m64n64k16 products a k step (hi hi, hi lo, lo hi) with the state's hi / lo fragments
// from registers and -W's two planes from shared memory, U^T added from shared memory, V'^T stored as bf16,
// scaled by the chunk's factors, split, and (2) the state = e^gl state + V'^T K as two m64n128k16 products a k
// step with k's rows MN-major from shared memory. CW copier warps move each chunk's -W planes (32 KB), k rows
// (16 KB), U^T (16 KB) and factors into:
//   STAGES 2: two stages (130 KB: one CTA an SM, as the real walk without its output buffers);
//   STAGES 1: one stage (65 KB), the next chunk's copies issued after the chunk's products;
//   STAGES 3: -W and k double-buffered, U^T and the factors single (112 KB: two CTAs an SM).
// by the engine LD picks (0 cp.async; 1 every copy a bulk copy on an mbarrier; 2 -W bulk; 3 -W and k bulk).
// The outputs (OUT): 0 none; 1 4-byte stores from the registers; 2 staged in shared memory (over the chunk's
// dead -W planes, or with F & 4 in buffers of their own) and stored by the copiers as whole rows; 3 staged at
// a padded pitch and stored as one bulk store a row. F adds the real walk's other features (see walk_skel).
// What it does not have: the dispatch order (the CTAs run longest segment first), the real values (garbage,
// nothing checked). Compare its lines with the real walk (`kcp bench`: v5.32 1.15 ms at 32K, 4.17 at 120,908
// tokens; v5.31 1.37 and 4.50).
#include "devtest.cuh"

#include <cuda_bf16.h>

#include "../src/mma.cuh"
#include "../src/wgmma.cuh"

#if defined(__CUDA_ARCH__) && !defined(GDNKCP_HAS_WGMMA)
#error "walk_2cta_skel.cu needs the sm_90a target (-gencode=arch=compute_90a,code=sm_90a)"
#endif

using bf16 = __nv_bfloat16;
using namespace gdnkcp;

namespace wskel {

constexpr int C = 64, D = 128, VH = 64, HQK = 16, HV = 48, G = HV / HQK;
constexpr int KB = 1024;
constexpr int kW = 32 * KB, kK = 16 * KB, kU = 16 * KB, kE = 256;  // a chunk's bytes of each
constexpr int kStage = kW + kK + kU + KB;                          // 65 KB

template <int STAGES>
__host__ __device__ constexpr int smem_bytes() {
	return STAGES == 1 ? kStage : STAGES == 2 ? 2 * kStage : 2 * (kW + kK) + kU + kE;
}
// Regions of stage x: -W's hi and lo planes, k's rows; U^T and the factors (single where STAGES 3).
template <int STAGES>
__device__ __forceinline__ unsigned char* wreg(unsigned char* sm, int x) {
	return STAGES == 3 ? sm + x * (kW + kK) : sm + x * kStage;
}
template <int STAGES>
__device__ __forceinline__ unsigned char* ureg(unsigned char* sm, int x) {
	return STAGES == 3 ? sm + 2 * (kW + kK) : sm + x * kStage + kW + kK;
}

struct Args {
	const unsigned char *w, *k, *u, *e;  // [chunk][HV] -W planes, [chunk][HQK] k rows, [chunk][HV][2] U^T, [chunk][HV] factors
	bf16 *hout, *vout;                   // [chunk][HV][2] H^T (64 x 128) and V'^T (64 x 64)
	const float *gcum, *rstd;            // F & 2: [token][HV] gates, [token][HQK] k's rstd (the factors computed)
	const int *seg_c0, *seg_n;           // a segment's first chunk and its chunks
	int* smid;                           // null, or where each CTA writes the SM it ran on
};

// bk: a K-major B operand's descriptor at k step k0 (rows = n, 64 of them a 64-column block); bmn: an
// MN-major one (rows = k, R of them; lbo from one 64-column block of n to the next).
__device__ __forceinline__ unsigned long long bk(const unsigned char* t, int k0) {
	return wg::desc_sw128(t + (k0 >> 6) * 64 * 128 + ((k0 & 63) >> 3) * 16);
}
__device__ __forceinline__ unsigned long long bmn(const unsigned char* t, int R, int k0) {
	return wg::desc_sw128_mn(t + k0 * 128, R * 128);
}

// chain_v_issue: (1)'s k steps b .. b + FR - 1 (k = keys) issued and committed, not waited: the state's hi / lo
// fragments split from st, three m64n64k16 a step (hi hi, hi lo, lo hi) into a1 with -W's planes at W (hi) and
// W + 16 KB (lo); step 0 starts a1 afresh.
template <int FR>
__device__ __forceinline__ void chain_v_issue(float (&a1)[32], const float (&st)[64], const unsigned char* W, int b) {
	unsigned fh[FR][4], fl[FR][4];
#pragma unroll
	for (int s = 0; s < FR; ++s)
#pragma unroll
		for (int q = 0; q < 4; ++q) tc::split_bf16x2(st[8 * (b + s) + 2 * q], st[8 * (b + s) + 2 * q + 1], fh[s][q], fl[s][q]);
	wg::fence();
#pragma unroll
	for (int s = 0; s < FR; ++s) {
		const unsigned long long dh = bk(W, 16 * (b + s)), dl = bk(W + 16 * KB, 16 * (b + s));
		wg::mma_m64n64k16_rs(a1, fh[s], dh, b + s > 0 ? 1 : 0);
		wg::mma_m64n64k16_rs(a1, fh[s], dl);
		wg::mma_m64n64k16_rs(a1, fl[s], dh);
	}
	wg::commit();
}

// stage_h: this warp's 16 rows of the state as bf16 H^T (128 keys) into hs by 4-byte stores, key unit j (8 keys)
// of row r at hs + off(r, j) + 4 (lane % 4): the layout is off's.
template <class Off>
__device__ __forceinline__ void stage_h(unsigned char* hs, const float (&st)[64], int m0, int lane, Off off) {
	const int g = lane >> 2, t = lane & 3;
#pragma unroll
	for (int j = 0; j < 16; ++j)
#pragma unroll
		for (int hh = 0; hh < 2; ++hh) {
			const int r = m0 + g + 8 * hh;
			*reinterpret_cast<unsigned*>(hs + off(r, j) + 4 * t) = tc::pack_bf16x2(st[4 * j + 2 * hh], st[4 * j + 2 * hh + 1]);
		}
}

// finish_v: V'^T = (1)'s a1 + U^T (rows: this warp's 16 values, columns: the 64 tokens; U^T fp32 [64][64] at U),
// each bf16 pair of it handed to put(row, token, packed pair), then a1 scaled by the chunk's factors E (token-wise:
// V'^T diag(s), (2)'s operand).
template <class Put>
__device__ __forceinline__ void finish_v(float (&a1)[32], const float* U, const float* E, int m0, int lane, Put put) {
	const int g = lane >> 2, t = lane & 3;
#pragma unroll
	for (int j = 0; j < 8; ++j)
#pragma unroll
		for (int hh = 0; hh < 2; ++hh) {
			const int r = m0 + g + 8 * hh, col = 8 * j + 2 * t;
			a1[4 * j + 2 * hh] += U[r * C + col];
			a1[4 * j + 2 * hh + 1] += U[r * C + col + 1];
			put(r, col, tc::pack_bf16x2(a1[4 * j + 2 * hh], a1[4 * j + 2 * hh + 1]));
			a1[4 * j + 2 * hh] *= E[col];
			a1[4 * j + 2 * hh + 1] *= E[col + 1];
		}
}

// chain_update: (2), the state = e^gl state + (V'^T diag(s)) K from the scaled V'^T in a1 (k = tokens, 4 steps,
// V'^T's hi and lo halves) and k's rows MN-major at K, waited.
__device__ __forceinline__ void chain_update(float (&st)[64], const float (&a1)[32], const unsigned char* K) {
	unsigned vh[4][4], vl[4][4];
#pragma unroll
	for (int s = 0; s < 4; ++s)
#pragma unroll
		for (int q = 0; q < 4; ++q) tc::split_bf16x2(a1[8 * s + 2 * q], a1[8 * s + 2 * q + 1], vh[s][q], vl[s][q]);
#pragma unroll
	for (int q = 0; q < 64; ++q) st[q] *= 0.99f;
	wg::fence();
#pragma unroll
	for (int s = 0; s < 4; ++s) {
		const unsigned long long dk = bmn(K, C, 16 * s);
		wg::mma_m64n128k16_rs_t(st, vh[s], dk, C * 128);
		wg::mma_m64n128k16_rs_t(st, vl[s], dk, C * 128);
	}
	wg::commit();
	wg::wait<0>();
	wg::fence_operand(st);
}

// ---- the bulk-copy engine (TMA, sm_90): LD 1's loads and OUT 3's stores ----
__device__ __forceinline__ unsigned sa(const void* q) { return (unsigned)__cvta_generic_to_shared(q); }
__device__ __forceinline__ void mb_init(unsigned long long* b, unsigned n) {
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void mb_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mb_expect(unsigned long long* b, unsigned tx) {
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(b)), "r"(tx) : "memory");
}
__device__ __forceinline__ void mb_wait(unsigned long long* b, unsigned par) {
	asm volatile(
	    "{\n\t.reg .pred P1;\n\tWAIT:\n\tmbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n\t@!P1 bra WAIT;\n\t}" ::"r"(sa(b)),
	    "r"(par)
	    : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* b) {
	asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(sa(dst)), "l"(src),
	             "r"(bytes), "r"(sa(b))
	             : "memory");
}
__device__ __forceinline__ void bulk_store(void* dst, const void* src, unsigned bytes) {
	asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(sa(src)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read0() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait0() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// issue_bulk: lane 0 of the copier's LD 1 loads of chunk c's parts (1: -W and k into stage x, completing
// on bar[x]; 2: U^T and the factors, on bar[x] where STAGES 2, on bar[2] (the single region's) where 3).
template <int STAGES>
__device__ __forceinline__ void issue_bulk(const Args& p, unsigned char* sm, unsigned long long* bar, int c, int x, int h, int half, int parts) {
	if (parts & 1) {
		unsigned char* dw = wreg<STAGES>(sm, x);
		unsigned long long* b = bar + x;
		mb_expect(b, kW + kK + (STAGES == 2 && (parts & 2) ? kU + kE : 0));
		bulk_load(dw, p.w + ((size_t)c * HV + h) * kW, kW, b);
		bulk_load(dw + kW, p.k + ((size_t)c * HQK + h / G) * kK, kK, b);
	}
	if (parts & 2) {
		unsigned char* du = ureg<STAGES>(sm, x);
		unsigned long long* b = STAGES == 3 ? bar + 2 : bar + x;
		if (STAGES == 3) mb_expect(b, kU + kE);
		bulk_load(du, p.u + (((size_t)c * HV + h) * 2 + half) * kU, kU, b);
		bulk_load(du + kU, p.e + ((size_t)c * HV + h) * kE, kE, b);
	}
}

// issue_any: the copier warps' (ct = 0 .. NC - 1) copies of chunk c's parts (1: -W and k into stage x; 2:
// U^T and the factors) by the engine LD picks for each: LD 0 all cp.async; 1 all bulk (issue_bulk); 2 -W
// bulk, the rest cp.async; 3 -W and k bulk, U^T and the factors cp.async. One cp.async commit group.
template <int STAGES, int LD, int NC, int F = 0>
__device__ __forceinline__ void issue_any(const Args& p, unsigned char* sm, unsigned long long* bar, int c, int x, int h, int half, int parts, int ct) {
	constexpr bool wb = LD >= 1, kb = LD == 1 || LD == 3;
	if (LD == 1) {
		if (ct == 0) issue_bulk<STAGES>(p, sm, bar, c, x, h, half, parts);
		return;
	}
	if (parts & 1) {
		unsigned char* dw = wreg<STAGES>(sm, x);
		const unsigned char* sw = p.w + ((size_t)c * HV + h) * kW;
		const unsigned char* sk = p.k + ((size_t)c * HQK + h / G) * kK;
		if (ct == 0 && wb) {
			mb_expect(bar + x, kW + (kb ? kK : 0));
			bulk_load(dw, sw, kW, bar + x);
			if (kb) bulk_load(dw + kW, sk, kK, bar + x);
		}
		if (!wb)
			for (int i = ct; i < kW / 16; i += NC) tc::cp_async16(dw + 16 * i, sw + 16 * i);
		if (!kb)
			for (int i = ct; i < kK / 16; i += NC) tc::cp_async16(dw + kW + 16 * i, sk + 16 * i);
	}
	if (parts & 2) {
		unsigned char* du = ureg<STAGES>(sm, x);
		const unsigned char* su = p.u + (((size_t)c * HV + h) * 2 + half) * kU;
		const unsigned char* se = p.e + ((size_t)c * HV + h) * kE;
		if (!(F & 1))  // (F & 1: the state warps copy U^T)
			for (int i = ct; i < kU / 16; i += NC) tc::cp_async16(du + 16 * i, su + 16 * i);
		if (!(F & 2) && ct < kE / 16) tc::cp_async16(du + kU + 16 * ct, se + 16 * ct);  // (F & 2: computed)
	}
	tc::cp_async_commit();
}

// OUT 3's staging: H^T rows of 256 bytes at a 272-byte pitch, then V'^T rows of 128 at 144 (the pads make a
// state warp's 4-byte stores conflict-free: rows g = 0..7 start 4 banks apart), each row a bulk store.
constexpr int kHP = 272, kVP = 144, kVOff = VH * kHP;
static_assert(kVOff + VH * kVP <= kW, "OUT 3's staging fits the -W planes");

// FR: (1)'s state fragments made FR k steps at a time (8: all 64 registers first, one commit; 4: two
// batches of 32, each committed and waited before the next is made: fewer registers, one more wait).
// OUT: 1, H^T and V'^T stored straight from the state warps' registers (4-byte stores); 0, not stored (what
// the chain and the copies cost without the outputs' traffic); 2 (STAGES 2 or 3), staged as the real walk
// stages them (stage_out) but over the chunk's -W planes, dead once (1) has read them and until the copies
// of the chunk after next: the state warps write H^T (16 KB) and V'^T (8 KB) there after (1), 16-byte units
// XOR-swizzled by the row (conflict-free 4-byte stores), arrive at named barrier 1, and the copier warp
// (bar.sync 1) stores them as whole rows of 16-byte units (512-byte runs a warp) while (2) runs.
// F (with STAGES 2, OUT 2, LD 0, CW 4: the real walk's shape), what the real walk does that the rest of the
// skeleton does not, one bit each: 1, the state warps copy their own U^T rows (the copiers do not); 2, the
// factors are computed (copiers ct < 64 load the gates and rstd at issue, write e^(gl - g_i) rstd_i into
// the next stage at the chunk's end) instead of copied; 4, H^T and V'^T go into two output buffers of their
// own (48 KB more), H^T written under (1)'s last batch of products, and the copiers store the previous
// chunk's buffer after their issue (the last one after the loop), as the real walk's stage_out / store_out;
// with 4 also, H^T written after (1)'s wait (8) or before (1) is issued (16) instead.
template <int STAGES, int MINB, int FR, int OUT = 1, int LD = 0, int CW = 1, int F = 0>
__global__ void __launch_bounds__(128 + 32 * CW, MINB) walk_skel(Args p) {
	constexpr int NT = 128 + 32 * CW;  // CW copier warps (more than one: OUT 2 and LD 1 only)
	static_assert(CW == 1 || OUT == 2, "more copier warps: staged outputs");
	static_assert(F == 0 || (STAGES == 2 && OUT == 2 && LD == 0 && CW == 4), "F: the real walk's shape only");
	static_assert(!(F & 24) || (F & 4), "F & 8, 16: where F & 4 writes H^T");
	constexpr bool kUst = (F & 1) != 0, kEcalc = (F & 2) != 0, kPrev = (F & 4) != 0;
	static_assert(OUT < 2 || STAGES != 1, "staged outputs need the -W planes of a double-buffered stage");
	static_assert(LD == 0 || STAGES != 1, "bulk loads: two stages or the hybrid");
	extern __shared__ __align__(1024) unsigned char sm[];
	unsigned long long* bar = reinterpret_cast<unsigned long long*>(sm + smem_bytes<STAGES>());  // LD 1: stage 0, 1, U^T
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5 > 4 ? 4 : tid >> 5, ct = tid - 128;
	const int half = blockIdx.x & 1, h = (blockIdx.x >> 1) % HV, seg = (blockIdx.x >> 1) / HV;
	const int c0 = p.seg_c0[seg], n = p.seg_n[seg];
	const int m0 = 16 * warp, g = lane >> 2, t = lane & 3;
	unsigned char* outb = sm + smem_bytes<STAGES>() + 1024;  // F & 4: two output buffers of 24 KB
	float ge_i = 0.f, ge_l = 0.f, ge_r = 0.f;               // F & 2: a copier ct < 64's gates and rstd
	// ucopy (F & 1): a state warp's cp.async of its 16 U^T rows (4 KB) of chunk cc into stage xx.
	auto ucopy = [&](int cc, int xx) {
		const unsigned char* su = p.u + (((size_t)cc * HV + h) * 2 + half) * kU + m0 * 256;
		unsigned char* du = ureg<STAGES>(sm, xx) + m0 * 256;
#pragma unroll
		for (int j = 0; j < 8; ++j) tc::cp_async16(du + 16 * (lane + 32 * j), su + 16 * (lane + 32 * j));
		tc::cp_async_commit();
	};
	// gates (F & 2): copier ct < 64 loads chunk cc's gates and rstd; efin writes its factor into stage xx.
	auto gates = [&](int cc) {
		if (ct >= 0 && ct < C) {
			const int t0 = cc * C;
			ge_i = p.gcum[(size_t)(t0 + ct) * HV + h];
			ge_l = p.gcum[(size_t)(t0 + C - 1) * HV + h];
			ge_r = p.rstd[(size_t)(t0 + ct) * HQK + h / G];
		}
	};
	auto efin = [&](int xx) {
		if (ct >= 0 && ct < C) reinterpret_cast<float*>(ureg<STAGES>(sm, xx) + kU)[ct] = expf(ge_l - ge_i) * ge_r;
	};
	// store_buf: the copiers' stores of a staged H^T / V'^T (at stg) of output block o, whole rows.
	auto store_buf = [&](const unsigned char* stg, size_t o) {
		uint4* ho = reinterpret_cast<uint4*>(p.hout + o * VH * D);
		uint4* vo = reinterpret_cast<uint4*>(p.vout + o * VH * C);
#pragma unroll 4
		for (int e = ct; e < VH * D / 8; e += 32 * CW) {  // H^T: 64 rows of 16 units
			const int r = e >> 4, u = e & 15;
			ho[e] = *reinterpret_cast<const uint4*>(stg + r * 256 + ((u ^ (r & 7)) << 4));
		}
#pragma unroll 4
		for (int e = ct; e < VH * C / 8; e += 32 * CW) {  // V'^T: 64 rows of 8 units
			const int r = e >> 3, u = e & 7;
			vo[e] = *reinterpret_cast<const uint4*>(stg + 16 * KB + r * 128 + ((u ^ (r & 7)) << 4));
		}
	};
	// STAGES 3 with staged outputs: the next chunk's U^T is issued as soon as the state warps have arrived at
	// barrier 1 (they have read U^T and the factors by then), not after a second __syncthreads.
	constexpr bool kUEarly = STAGES == 3 && OUT >= 2;
	if (tid == 0 && p.smid) {
		unsigned id;
		asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
		p.smid[blockIdx.x] = (int)id;
	}
	if (LD >= 1) {
		if (tid == 0) {
			mb_init(bar, 1), mb_init(bar + 1, 1), mb_init(bar + 2, 1);
			mb_init_fence();
		}
		__syncthreads();
	}
	float st[64];  // the state: rows = this warp's 16 values, 128 keys (m64n128 accumulators)
#pragma unroll
	for (int i = 0; i < 64; ++i) st[i] = 0.01f * (i & 7);
	if (warp == 4) {
		issue_any<STAGES, LD, 32 * CW, F>(p, sm, bar, c0, 0, h, half, 3, ct);
		if (kEcalc) {
			gates(c0);
			efin(0);
		}
	} else if (kUst) {
		ucopy(c0, 0);
	}
#pragma unroll 1
	for (int i = 0; i < n; ++i) {
		const int c = c0 + i, x = STAGES == 1 ? 0 : (i & 1);
		if (LD >= 1) mb_wait(bar + x, (i >> 1) & 1);
		if (LD == 1 && STAGES == 3) mb_wait(bar + 2, i & 1);
		if (LD != 1) {
			tc::cp_async_wait<0>();
			wg::fence_proxy_async();
		}
		__syncthreads();  // A: chunk c's stage has landed; every product of chunk c - 1 waited
		if (warp == 4) {
			if (OUT == 3) {  // chunk c - 1's bulk stores have read their staging (stage x ^ 1's -W planes)
				bulk_wait_read0();
				__syncwarp();
			}
			if (STAGES != 1 && i + 1 < n) {  // the next chunk's -W and k (and U^T) into the other stage
				issue_any<STAGES, LD, 32 * CW, F>(p, sm, bar, c + 1, x ^ 1, h, half, STAGES == 2 ? 3 : 1, ct);
				if (kEcalc) gates(c + 1);
			}
			if constexpr (kPrev) {  // the previous chunk's buffer
				if (i > 0) store_buf(outb + (x ^ 1) * 24 * KB, ((size_t)(c - 1) * HV + h) * 2 + half);
			} else if constexpr (OUT >= 2) {
				tc::bar_sync(1, NT);
				if (kUEarly && i + 1 < n) {
					issue_any<STAGES, LD, 32 * CW>(p, sm, bar, c + 1, x ^ 1, h, half, 2, ct);
				}
				const unsigned char* stg = wreg<STAGES>(sm, x);
				const size_t o = ((size_t)c * HV + h) * 2 + half;
				if constexpr (OUT == 2) {  // this chunk's staged H^T and V'^T to global memory, 16-byte units, whole rows
					store_buf(stg, o);
				} else {  // OUT 3: a bulk store a row, two H^T and two V'^T rows a lane
#pragma unroll
					for (int j = 0; j < 2; ++j) {
						const int r = lane + 32 * j;
						bulk_store(p.hout + (o * VH + r) * D, stg + r * kHP, D * 2);
						bulk_store(p.vout + (o * VH + r) * C, stg + kVOff + r * kVP, C * 2);
					}
					bulk_commit();
				}
			}
			if (kEcalc && i + 1 < n) efin(x ^ 1);  // the next chunk's factors, read after the next barrier
		} else {
			if (kUst && i + 1 < n) ucopy(c + 1, x ^ 1);
			const size_t o = ((size_t)c * HV + h) * 2 + half;
			bf16* ho = p.hout + o * VH * D;
#pragma unroll
			for (int j = 0; j < 16; ++j)
#pragma unroll
				for (int hh = 0; hh < 2; ++hh)
					if (OUT == 1) *reinterpret_cast<unsigned*>(ho + (m0 + g + 8 * hh) * D + 8 * j + 2 * t) =
					    tc::pack_bf16x2(st[4 * j + 2 * hh], st[4 * j + 2 * hh + 1]);
			unsigned char* W = wreg<STAGES>(sm, x);
			const unsigned char* K = W + kW;
			const float* U = reinterpret_cast<const float*>(ureg<STAGES>(sm, x));
			const float* E = U + kU / 4;
			// hwrite (F & 4): H^T (the state before (2)) into an output buffer, 4-byte stores, units XOR row % 8.
			auto hwrite = [&](unsigned char* hs) {
				stage_h(hs, st, m0, lane, [](int r, int j) { return r * 256 + ((j ^ (r & 7)) << 4); });
			};
			if (kPrev && (F & 16)) hwrite(outb + x * 24 * KB);  // F & 16: before (1)
			// (1) V'^T = U^T + H^T (-W^T): k = keys (8 steps), n = tokens; the state's fragments all made first.
			float a1[32];
#pragma unroll
			for (int b = 0; b < 8; b += FR) {
				chain_v_issue<FR>(a1, st, W, b);
				if (kPrev && !(F & 24) && b + FR == 8) hwrite(outb + x * 24 * KB);  // H^T under (1)'s last batch
				wg::wait<0>();
				wg::fence_operand(a1);
			}
			if (kPrev && (F & 8)) hwrite(outb + x * 24 * KB);  // F & 8: after (1)
			if constexpr (OUT >= 2 && !kPrev) {  // H^T (the state before (2)) over the -W planes, which every state warp is done with
				tc::bar_sync(2, 128);
				unsigned char* hs = W;
#pragma unroll
				for (int j = 0; j < 16; ++j)
#pragma unroll
					for (int hh = 0; hh < 2; ++hh) {
						const int r = m0 + g + 8 * hh;
						unsigned* q = OUT == 2 ? reinterpret_cast<unsigned*>(hs + r * 256 + (((j ^ (r & 7))) << 4) + 4 * t)
						                       : reinterpret_cast<unsigned*>(hs + r * kHP + 16 * j + 4 * t);
						*q = tc::pack_bf16x2(st[4 * j + 2 * hh], st[4 * j + 2 * hh + 1]);
					}
			}
			bf16* vo = p.vout + o * VH * C;
			finish_v(a1, U, E, m0, lane, [&](int r, int col, unsigned v) {
				if (OUT == 1) *reinterpret_cast<unsigned*>(vo + r * C + col) = v;
				if (OUT == 2) *reinterpret_cast<unsigned*>((kPrev ? outb + x * 24 * KB : W) + 16 * KB + r * 128 + ((((col >> 3) ^ (r & 7))) << 4) + (col & 7) * 2) = v;
				if (OUT == 3) *reinterpret_cast<unsigned*>(W + kVOff + r * kVP + 2 * col) = v;
			});
			if constexpr (OUT == 3) wg::fence_proxy_async();  // the staging's generic stores, before the bulk stores read them
			if constexpr (OUT >= 2 && !kPrev) tc::bar_arrive(1, NT);    // the copier may store this chunk's H^T and V'^T
			// (2) the state = e^gl state + (V'^T diag(s)) K: k = tokens (4 steps), n = keys, two products a step.
			chain_update(st, a1, K);
		}
		if (STAGES != 2 && !kUEarly) {
			__syncthreads();  // B: the chunk's single-buffered regions are read
			if (warp == 4 && i + 1 < n) {
				issue_any<STAGES, LD, 32 * CW>(p, sm, bar, c + 1, STAGES == 1 ? 0 : x ^ 1, h, half, STAGES == 1 ? 3 : 2, ct);
			}
		}
	}
	if constexpr (kPrev) {  // the last chunk's buffer
		__syncthreads();
		if (warp == 4) store_buf(outb + ((n - 1) & 1) * 24 * KB, ((size_t)(c0 + n - 1) * HV + h) * 2 + half);
	}
	if (OUT == 3 && warp == 4) bulk_wait0();  // the last chunk's bulk stores, before the CTA's shared memory goes
	if (OUT == 0 && warp < 4) {  // the final state only, so that nothing the chain computes is dead
		bf16* ho = p.hout + (((size_t)c0 * HV + h) * 2 + half) * VH * D;
#pragma unroll
		for (int j = 0; j < 16; ++j)
#pragma unroll
			for (int hh = 0; hh < 2; ++hh)
				*reinterpret_cast<unsigned*>(ho + (m0 + g + 8 * hh) * D + 8 * j + 2 * t) =
				    tc::pack_bf16x2(st[4 * j + 2 * hh], st[4 * j + 2 * hh + 1]);
	}
}

__global__ void fill(unsigned* x, size_t n, unsigned seed);

// SkelPack: a pack the walk skeletons time, its segments' chunks longest first; skel_packs: 32K in one document
// and 120,908 tokens in three.
struct SkelPack {
	const char* name;
	std::vector<int> segs;
};
inline std::vector<SkelPack> skel_packs() { return {{"32K (1 x 512)", {512}}, {"120,908 (3 docs)", {704, 625, 562}}}; }
// seg_tables: pk's segments' first chunks (c0) and lengths (nn); returns its chunks in all.
inline int seg_tables(const SkelPack& pk, std::vector<int>& c0, std::vector<int>& nn) {
	int total = 0;
	for (int s : pk.segs) c0.push_back(total), nn.push_back(s), total += s;
	return total;
}

// alloc_filled: bytes of device memory filled by fill (finite garbage, ~±0.008 read as fp32).
inline unsigned char* alloc_filled(size_t bytes, unsigned seed) {
	unsigned* p;
	CK(cudaMalloc(&p, bytes));
	fill<<<2048, 256>>>(p, bytes / 4, seed);
	return reinterpret_cast<unsigned char*>(p);
}

__global__ void fill(unsigned* x, size_t n, unsigned seed) {
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		unsigned v = (unsigned)i * 2654435761u ^ seed;
		v ^= v >> 13;
		// two bf16 of magnitude 2^-7 .. 2^-6 with random signs and mantissas (read as fp32: ~±0.008): finite
		x[i] = 0x3c003c00u | (v & 0x807f807fu);
	}
}

}  // namespace wskel

// kernel_setup: kernel k's dynamic shared memory raised to smem; its attributes (registers, local bytes) and how
// many CTAs of nt threads fit an SM.
template <class Kernel>
static void kernel_setup(Kernel k, int nt, int smem, cudaFuncAttributes& fa, int& per_sm) {
	CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
	CK(cudaFuncGetAttributes(&fa, k));
	per_sm = 0;
	CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, nt, smem));
}

template <int STAGES, int MINB, int FR = 8, int OUT = 1, int LD = 0, int CW = 1, int F = 0>
static void run(const wskel::Args& a, int ncta, int nlong, const char* pack, const char* name) {
	auto k = wskel::walk_skel<STAGES, MINB, FR, OUT, LD, CW, F>;
	constexpr int nt = 128 + 32 * CW;
	// and LD 1's three mbarriers (1024 bytes kept), F & 4's two output buffers
	constexpr int smem = wskel::smem_bytes<STAGES>() + ((F & 4) ? 1024 + 48 * 1024 : 64);
	cudaFuncAttributes fa;
	int per_sm;
	kernel_setup(k, nt, smem, fa, per_sm);
	float med, lo, hi;
	devtest::time_ms([&] { k<<<ncta, nt, smem>>>(a); }, 10, med, lo, hi);
	wskel::Args b = a;  // once more, recording where the CTAs ran
	CK(cudaMalloc(&b.smid, ncta * sizeof(int)));
	k<<<ncta, nt, smem>>>(b);
	std::vector<int> ids(ncta);
	CK(cudaMemcpy(ids.data(), b.smid, ncta * sizeof(int), cudaMemcpyDeviceToHost));
	CK(cudaFree(b.smid));
	std::sort(ids.begin(), ids.end());
	const int sms = (int)(std::unique(ids.begin(), ids.end()) - ids.begin());
	printf("%-18s %-50s %3d CTAs on %3d SMs, %6d B smem, %3d regs, %3zu B local, %d CTA(s) an SM: %.3f ms (%.2f us a chunk of the longest)\n",
	       pack, name, ncta, sms, smem, fa.numRegs, fa.localSizeBytes, per_sm, med, 1000.f * med / nlong);
}

int main() {
	using namespace wskel;
	for (const SkelPack& pk : skel_packs()) {
		std::vector<int> c0, nn;
		const int total = seg_tables(pk, c0, nn);
		const size_t nw = (size_t)total * HV * kW, nk = (size_t)total * HQK * kK, nu = (size_t)total * HV * 2 * kU,
		             ne = (size_t)total * HV * kE;
		auto alloc = alloc_filled;
		Args a{};
		a.w = alloc(nw, 1), a.k = alloc(nk, 2), a.u = alloc(nu, 3), a.e = alloc(ne, 4);
		CK(cudaMalloc(&a.hout, (size_t)total * HV * 2 * VH * D * sizeof(bf16)));
		CK(cudaMalloc(&a.vout, (size_t)total * HV * 2 * VH * C * sizeof(bf16)));
		a.seg_c0 = devtest::up(c0), a.seg_n = devtest::up(nn);
		a.gcum = reinterpret_cast<const float*>(alloc((size_t)total * C * HV * 4, 5));
		a.rstd = reinterpret_cast<const float*>(alloc((size_t)total * C * HQK * 4, 6));
		CK(cudaDeviceSynchronize());
		const int ncta = (int)pk.segs.size() * HV * 2, nlong = pk.segs[0];
		// The rows of docs/perf-notes.md's table ("What next (twenty-fourth session's view)").
		run<2, 1, 4, 2, 0, 1>(a, ncta, nlong, pk.name, "staged over -W, 1 copier, cp.async");
		run<3, 2, 4, 2, 0, 1>(a, ncta, nlong, pk.name, "  two CTAs an SM (112 KB)");
		run<2, 1, 4, 2, 0, 4>(a, ncta, nlong, pk.name, "staged over -W, 4 copiers, cp.async");
		run<2, 1, 4, 2, 2, 4>(a, ncta, nlong, pk.name, "  -W bulk");
		run<2, 1, 4, 2, 1, 4>(a, ncta, nlong, pk.name, "  every copy bulk");
		run<3, 2, 4, 2, 1, 1>(a, ncta, nlong, pk.name, "two CTAs an SM, every copy bulk, 1 copier");
		run<3, 2, 4, 2, 1, 2>(a, ncta, nlong, pk.name, "  2 copiers");
		run<2, 1, 4, 0, 1, 1>(a, ncta, nlong, pk.name, "no outputs, every copy bulk (the chain)");
		run<2, 1, 4, 2, 0, 4, 7>(a, ncta, nlong, pk.name, "the real walk's shape, H^T under (1)'s 2nd half");
		run<2, 1, 8, 2, 0, 4, 15>(a, ncta, nlong, pk.name, "  (1) in one batch, H^T after its wait");
		run<2, 1, 8, 2, 0, 4, 7>(a, ncta, nlong, pk.name, "  (1) in one batch, H^T under it (C7518)");
		run<2, 1, 4, 3, 0, 1>(a, ncta, nlong, pk.name, "one bulk store a row (OUT 3)");
		CK(cudaDeviceSynchronize());
		CK(cudaFree((void*)a.w));
		CK(cudaFree((void*)a.k));
		CK(cudaFree((void*)a.u));
		CK(cudaFree((void*)a.e));
		CK(cudaFree((void*)a.gcum));
		CK(cudaFree((void*)a.rstd));
		CK(cudaFree(a.hout));
		CK(cudaFree(a.vout));
	}
	printf("skeleton ok (compare: gdn_state_walk_planes at vh 64, 1.15 ms at 32K and 4.17 ms at 120,908 tokens, v5.32)\n");
	return 0;
}
