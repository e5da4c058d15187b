// walk_out_skel.cu: a timing and register skeleton of the vh 64 state walk with a third warpgroup that computes the
// chunk's output on wgmma (thirty-ninth session). The question it answers before anything is built: can the
// output (today a kernel of its own, gdn_output_mma16gn: 0.82-0.84 ms at 32K, 27% of the core forward) run on
// the walk's SM beside the state chain without lengthening the chain's chunk? The thirteenth session's fused
// output (parked walk_output.patch) put it on the copying warpgroup with mma.sync and scalar operand work and
// took the chunk from 2.7 to 10.3 us; here every product is a wgmma with its B operand in shared memory and
// the warpgroup does nothing else. Run by scripts/walk-out-skel.sh on the GPU machine (nvcc there, no Go); not
// part of the blobs. Garbage values, nothing checked: times, registers and spills only.
//
// The base is walk_2cta_skel.cu's "real walk's shape" (two 65 KB stages by cp.async from four copier warps,
// U^T copied by the state warps, the factors computed, H^T and V'^T staged in buffers of their own under (1)'s
// second batch, the copiers storing the previous chunk's buffer as whole rows: 1.146 ms at 32K against
// gdn_state_walk_planes' 1.149 on v5.32, H200), restructured as one loop a role (as warp-specialised kernels
// are, so that setmaxnreg can give each role its own register budget):
//   OWG 0: warps 0-3 the state chain, warps 4-7 the copiers (256 threads): today's walk.
//   OWG 1: + warps 8-11, the output warpgroup (384 threads). At chunk i it computes chunk i - 1's output
//          O [64 tokens][64 columns] = Q' H + P V' from that chunk's staged H^T and V'^T (the state warps'
//          buffer, now in the 128-byte-swizzle tile layout that wgmma's B reads), with
//            Q' = q rstd_q e^gamma (q's bf16 rows loaded a chunk ahead into registers, normalised there),
//            S = Q' K^T     8 m64n64k16 (B = k's rows, K-major, copied a chunk ahead into its own buffer),
//            O = Q' H       8 m64n64k16 (B = H^T),
//            P = S (.) e^-gamma_j rstd_k_j, j <= i, as bf16 A fragments from S's accumulators,
//            O += P V'      4 m64n64k16 (B = V'^T),
//          and stores O as bf16 from its accumulators (4-byte stores).
//   OWG 2-15: OWG 1 with one change each, to find what its time is (main's labels): 2 the column factors loaded
//          a chunk ahead; 3 no products; 4 the warpgroup at the barriers only; 5 its loads only; 6, 7, 11, 12 O
//          consumed by an empty asm instead of stored (ptxas then drops the work, so these time nothing but the
//          rest; 11, 12 store constants); 8 O staged over the dead k rows and stored as whole 16-byte units; 9 the
//          same without the proxy fence at the loop's top; 10 O staged in a buffer of its own and stored after
//          the next chunk's barrier; 13 as 10 with q's raw bf16 fragments as the A operand (O's rows scaled by
//          rstd_q e^gamma at the end); 15 as 13 with every chunk reading one chunk's q rows (cache hits); 16 as
//          13 with k's and q's rows copied by cp.async into single buffers as soon as S has read the previous
//          chunk's, q's fragments from shared memory (milestone (b) of docs/perf-notes.md's fused forward; written
//          in the thirty-ninth session after its device time was spent: not yet compiled, nor the s_qh and
//          p_pv helpers that output and output16 share, moved out of output after its last compile).
//   OWG 20-24: the third warpgroup forms the backward's dV'_local instead (dvl_side, below; fortieth session, no
//          device lent: not yet compiled): this walk stands in for the tape walk, its U^T for dvl^T. 22 is the
//          base (q's rows and dO copied as the tape walk copies them, the warpgroup idle), 21 the former's work
//          with nothing waiting on it, 20 the state warps waiting for the chunk's dvl^T formed after its
//          barrier, 23 dvl^T formed a chunk ahead, 24 the same by the copying warpgroup (no third). Compare 20 and 23 with 22 (their copies of U^T gone, as the
//          fused tape walk's dvl^T reads would be) against dV'_local's own 0.53 ms at 32K.
//   STOREHV 1: the copiers still store H^T and V'^T (the kept forward, whose backward reads them); 0: they
//          do not (the forward alone).
//   REGS 1: setmaxnreg: state warps 232, copiers 56, output 216 registers (at 384 threads the launch gives 168).
// Compare OWG 1 with OWG 0 plus the output kernel's time. Measured on an H200 (thirty-ninth session): the output
// warpgroup's own dependent path (~3.5 us a chunk) outlasts the chain's 1.8, so the fused chunk takes about what
// the two kernels take apart (docs/perf-notes.md, "The H200 on v5.41, and the output on a third warpgroup").
#define main walk_2cta_skel_main
#include "walk_2cta_skel.cu"
#undef main

namespace wout {

using namespace wskel;
constexpr int kHV = 24 * KB;  // a staged H^T (16 KB, two 64-key tiles) and V'^T (8 KB)

struct OArgs {
	Args a;           // -W planes, k rows, U^T, gates, rstd, H^T / V'^T outputs, segments
	const bf16* q;    // [chunk][HQK][64 tokens][128 keys] bf16
	bf16* o;          // [chunk][HV][2 halves][64 tokens][64 columns] bf16
	const bf16* dout; // OWG 20-22: dO [chunk][HV][2 halves][64 tokens][64 columns] bf16 (O's layout)
};

template <int N>
__device__ __forceinline__ void regs_inc() {
	asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_dec() {
	asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// The shared memory: two stages (65 KB each: -W hi, lo, k rows, U^T, factors), 1 KB, two H^T / V'^T buffers
// (48 KB), and with the output warpgroup two k-row buffers (32 KB) and two rows of column factors (512 B).
// OWG 20-22 (the dV'_local former): two q-row and dO buffers (24 KB each) in place of the output's: 232,448 bytes,
// all an SM gives a block.
constexpr int kQD = 24 * KB;
template <int OWG>
constexpr int smem_total() {
	return OWG >= 20 ? 2 * kStage + KB + 2 * kHV + 2 * kQD
	                 : 2 * kStage + KB + 2 * kHV + (OWG ? 2 * kK + 2 * C * 4 : 0) + (OWG == 10 || OWG >= 13 ? 8 * KB : 0);
}
static_assert(smem_total<20>() == 232448, "OWG 20's shared memory is all an SM gives a block");

// H^T's 16-byte unit u (8 keys) of row r in the tile layout: 64-key tiles of 8 KB, units XOR r % 8.
__device__ __forceinline__ int hoff(int r, int u) { return (u >> 3) * 8 * KB + r * 128 + (((u & 7) ^ (r & 7)) << 4); }

// acc_frags: an m64n64 accumulator's 64 columns (this thread's rows r0 = 16 warp + lane / 4 and r1 = r0 + 8) as the
// bf16 A fragments of four k16 steps, each element through v(value, row, column).
template <class V>
__device__ __forceinline__ void acc_frags(const float (&acc)[32], unsigned (&pf)[4][4], int r0, int r1, int t, V v) {
#pragma unroll
	for (int s2 = 0; s2 < 4; ++s2)
#pragma unroll
		for (int q = 0; q < 4; ++q) {
			const int jj = 2 * s2 + (q >> 1), hh = q & 1, col = 8 * jj + 2 * t, row = hh ? r1 : r0;
			pf[s2][q] = tc::pack_bf16x2(v(acc[4 * jj + 2 * hh], row, col), v(acc[4 * jj + 2 * hh + 1], row, col + 1));
		}
}

// dvl_side: OWG 20-23's third warpgroup, the tape walk's dV'_local formed beside the chain (docs/perf-notes.md,
// "dV'_local beside the tape walk"), on this skeleton of the forward's walk as the proxy: its U^T, read after (1)'s
// wait, stands where the tape walk reads dvl^T. A chunk's dvl is formed from the stage's k rows and the q rows and
// this column half's dO (copied by the copiers a chunk ahead, as the tape walk copies both today):
//   S^T = K Q^T          8 m64n64k16 (A: k's rows as fragments from shared memory; B: q's rows, K-major)
//   P^T = S^T (.) f_i e^(gamma_i - gamma_j) rstd_j for i >= j, else 0 (bf16 A fragments from the accumulators,
//                        one exp an element, as gdn_dvlocal_mma_gr's decays)
//   dvl = P^T dO         4 m64n64k16 (B: dO's rows, MN-major)
// then dvl^T (value row f, token column j) into the stage's U^T region, fp32 [64][64] in finish_v's layout.
//   OWG 20: chunk i's dvl formed after chunk i's barrier A; the state warps copy no U^T and wait for it at named
//           barrier 3 before finish_v.
//   OWG 21: the same work, dvl^T written over the chunk's q rows (dead by then); the state warps copy U^T as today
//           and never wait: the side work's contention alone.
//   OWG 22: the warpgroup at the barriers only, q's rows and dO still copied: the base the others are compared with.
//   OWG 23: chunk i + 1's dvl formed during chunk i, as soon as the copiers have seen its stage land (they wait for
//           their copies mid-chunk and arrive at named barrier 5); the state warps wait at barrier 3 + (i & 1) (two
//           ids, since the former arrives for chunk i + 1 before the state warps may have waited for chunk i).
//   OWG 24: 23's former run by the copying warpgroup itself once its copies have landed, after its stores: no third
//           warpgroup (256 threads, no setmaxnreg, the launch as today's tape walk's).
// DvlFormer: the former's state for warpgroup thread ot (0..127) of a CTA: prefetch(cc) loads chunk cc's gates and
// rstd into registers; form(cc, x) forms chunk cc's dvl from stage x and writes dvl^T, then tells the state warps
// (OWG 20: barrier 3; 23, 24: barrier 3 + the chunk's parity within the segment).
template <int OWG>
struct DvlFormer {
	const OArgs& P;
	unsigned char* sm;
	int ot, c0, n, h;
	float cg = 0.f, cr = 0.f, gn0 = 0.f, gn1 = 0.f, rn0 = 0.f, rn1 = 0.f;  // the next chunk's, loaded a chunk ahead

	__device__ __forceinline__ void prefetch(int cc) {
		const Args& p = P.a;
		const int g = (ot & 31) >> 2, r0 = 16 * (ot >> 5) + g, r1 = r0 + 8, t0 = cc * C;
		if (ot < C) cg = p.gcum[(size_t)(t0 + ot) * HV + h], cr = p.rstd[(size_t)(t0 + ot) * HQK + h / G];
		gn0 = p.gcum[(size_t)(t0 + r0) * HV + h], gn1 = p.gcum[(size_t)(t0 + r1) * HV + h];
		rn0 = p.rstd[(size_t)(t0 + r0) * HQK + h / G], rn1 = p.rstd[(size_t)(t0 + r1) * HQK + h / G];
	}

	__device__ __forceinline__ void form(int cc, int x) {
		const int lane = ot & 31, g = lane >> 2, t = lane & 3, r0 = 16 * (ot >> 5) + g, r1 = r0 + 8;
		unsigned char* qd = sm + 2 * kStage + KB + 2 * kHV;
		float* sg = reinterpret_cast<float*>(sm + kW + kK + kU + 256);  // the chunk's gamma_i, a column each (past E)
		float* sf = sg + C;                                             // and f_i = scale rstd_i
		if (ot < C) sg[ot] = cg, sf[ot] = 0.088f * cr;
		const float g0 = gn0, g1 = gn1, k0 = rn0, k1 = rn1;
		tc::bar_sync(1, 128);  // the column values written
		if (cc + 1 < c0 + n) prefetch(cc + 1);
		const unsigned char* ks = sm + x * kStage + kW;  // k's rows (K-major, two 64-key blocks)
		const unsigned char* qs = qd + x * kQD;          // q's rows, the same layout
		const unsigned char* ds = qs + kK;               // dO [64 tokens][64 columns], MN-major
		unsigned kf[8][4];
#pragma unroll
		for (int s2 = 0; s2 < 8; ++s2)
#pragma unroll
			for (int q = 0; q < 4; ++q) {
				const int r = q & 1 ? r1 : r0, u = 2 * (s2 & 3) + (q >> 1);
				kf[s2][q] = *reinterpret_cast<const unsigned*>(ks + (s2 >> 2) * 8 * KB + r * 128 + ((u ^ (r & 7)) << 4) + 4 * t);
			}
		float sacc[32], dacc[32];
		wg::fence();
#pragma unroll
		for (int s2 = 0; s2 < 8; ++s2) wg::mma_m64n64k16_rs(sacc, kf[s2], bk(qs, 16 * s2), s2 > 0 ? 1 : 0);
		wg::commit();
		wg::wait<0>();
		wg::fence_operand(sacc);
		unsigned pf[4][4];
		acc_frags(sacc, pf, r0, r1, t, [&](float a, int row, int col) {
			const bool hi = row == r1;
			return col >= row ? a * sf[col] * __expf(sg[col] - (hi ? g1 : g0)) * (hi ? k1 : k0) : 0.f;
		});
		wg::fence();
#pragma unroll
		for (int s2 = 0; s2 < 4; ++s2) wg::mma_m64n64k16_rs_t(dacc, pf[s2], bmn(ds, C, 16 * s2), C * 128, s2 > 0 ? 1 : 0);
		wg::commit();
		wg::wait<0>();
		wg::fence_operand(dacc);
		float* U = OWG == 21 ? reinterpret_cast<float*>(qd + x * kQD) : reinterpret_cast<float*>(sm + x * kStage + kW + kK);
		if (OWG == 21) tc::bar_sync(2, 128);  // every warp's S^T has read the q rows it overwrites
#pragma unroll
		for (int jj = 0; jj < 8; ++jj)
#pragma unroll
			for (int hh = 0; hh < 2; ++hh) {
				const int j = hh ? r1 : r0, f = 8 * jj + 2 * t;
				U[f * C + j] = dacc[4 * jj + 2 * hh];
				U[(f + 1) * C + j] = dacc[4 * jj + 2 * hh + 1];
			}
		if (OWG == 20) tc::bar_arrive(3, 256);  // the state warps may read chunk cc's U^T
		if (OWG >= 23) tc::bar_arrive(3 + ((cc - c0) & 1), 256);
	}
};

// dvl_side: OWG 20-23's third warpgroup (thread ot) runs the former beside the chain, to the chunk barriers.
template <int OWG>
__device__ __forceinline__ void dvl_side(const OArgs& P, unsigned char* sm, int ot, int c0, int n, int h) {
	DvlFormer<OWG> f{P, sm, ot, c0, n, h};
	f.prefetch(c0);
	if (OWG == 23) {
		tc::bar_sync(5, 256);  // the first chunk's stage landed
		f.form(c0, 0);
	}
#pragma unroll 1
	for (int i = 0; i < n; ++i) {
		const int x = i & 1;
		__syncthreads();  // A: chunk i's stage landed (the copiers waited for and fenced their copies)
		if (OWG == 20 || OWG == 21) f.form(c0 + i, x);
		if (OWG == 23 && i + 1 < n) {
			tc::bar_sync(5, 256);  // chunk i + 1's stage landed
			f.form(c0 + i + 1, x ^ 1);
		}
	}
	__syncthreads();  // E
}

template <int OWG, int STOREHV, int REGS>
__global__ void __launch_bounds__(OWG && OWG != 24 ? 384 : 256, 1) walk_out(OArgs P) {
	constexpr int NT = OWG && OWG != 24 ? 384 : 256;
	extern __shared__ __align__(1024) unsigned char sm[];
	const Args& p = P.a;
	const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3;
	const int half = blockIdx.x & 1, h = (blockIdx.x >> 1) % HV, seg = (blockIdx.x >> 1) / HV;
	const int c0 = p.seg_c0[seg], n = p.seg_n[seg];
	unsigned char* outb = sm + 2 * kStage + KB;
	unsigned char* okb = outb + 2 * kHV;                          // OWG: two k-row buffers
	float* cf = reinterpret_cast<float*>(okb + 2 * kK);           // OWG: two rows of 64 column factors
	auto obase = [&](int cc) { return ((size_t)cc * HV + h) * 2 + half; };

	if (tid < 128) {  // ---- the state warps ----
		if (REGS) regs_inc<232>();
		const int warp = tid >> 5, m0 = 16 * warp;
		auto ucopy = [&](int cc, int xx) {
			const unsigned char* su = p.u + obase(cc) * kU + m0 * 256;
			unsigned char* du = sm + xx * kStage + kW + kK + m0 * 256;
#pragma unroll
			for (int j = 0; j < 8; ++j) tc::cp_async16(du + 16 * (lane + 32 * j), su + 16 * (lane + 32 * j));
			tc::cp_async_commit();
		};
		float st[64];
#pragma unroll
		for (int i = 0; i < 64; ++i) st[i] = 0.01f * (i & 7);
		if (OWG != 20 && OWG < 23) ucopy(c0, 0);  // (OWG 20, 23, 24: U^T is the dvl former's)
#pragma unroll 1
		for (int i = 0; i < n; ++i) {
			const int x = i & 1;
			tc::cp_async_wait<0>();
			wg::fence_proxy_async();
			__syncthreads();  // A
			if (OWG != 20 && OWG < 23 && i + 1 < n) ucopy(c0 + i + 1, x ^ 1);
			unsigned char* W = sm + x * kStage;
			const unsigned char* K = W + kW;
			const float* U = reinterpret_cast<const float*>(W + kW + kK);
			const float* E = U + kU / 4;
			unsigned char* hs = outb + x * kHV;
			float a1[32];
#pragma unroll
			for (int b = 0; b < 8; b += 4) {  // (1) in two batches of four k steps
				chain_v_issue<4>(a1, st, W, b);
				if (b == 4) stage_h(hs, st, m0, lane, hoff);  // H^T (the state before (2)) under (1)'s second batch
				wg::wait<0>();
				wg::fence_operand(a1);
			}
			if (OWG == 20) tc::bar_sync(3, 256);  // the dvl former's U^T of this chunk
			if (OWG >= 23) tc::bar_sync(3 + (i & 1), 256);
			finish_v(a1, U, E, m0, lane, [&](int r, int col, unsigned v) {  // V'^T staged in its tile layout
				*reinterpret_cast<unsigned*>(hs + 16 * KB + r * 128 + (((col >> 3) ^ (r & 7)) << 4) + (col & 7) * 2) = v;
			});
			if (OWG) wg::fence_proxy_async();  // the staged tiles are read by the output warpgroup's wgmma
			chain_update(st, a1, K);  // (2) the state = e^gl state + (V'^T diag(s)) K
		}
		__syncthreads();  // E: the last chunk's buffer is staged
		if (!STOREHV) {  // the final state, so that nothing the chain computes is dead
			bf16* ho = p.hout + obase(c0) * VH * D;
#pragma unroll
			for (int j = 0; j < 16; ++j)
#pragma unroll
				for (int hh = 0; hh < 2; ++hh)
					*reinterpret_cast<unsigned*>(ho + (m0 + g + 8 * hh) * D + 8 * j + 2 * t) =
					    tc::pack_bf16x2(st[4 * j + 2 * hh], st[4 * j + 2 * hh + 1]);
		}
	} else if (tid < 256) {  // ---- the copiers ----
		if (REGS) regs_dec<56>();
		const int ct = tid - 128;
		float ge_i = 0.f, ge_l = 0.f, ge_r = 0.f;
		auto gates = [&](int cc) {
			if (ct < C) {
				const int t0 = cc * C;
				ge_i = p.gcum[(size_t)(t0 + ct) * HV + h];
				ge_l = p.gcum[(size_t)(t0 + C - 1) * HV + h];
				ge_r = p.rstd[(size_t)(t0 + ct) * HQK + h / G];
			}
		};
		auto efin = [&](int xx) {
			if (ct < C) reinterpret_cast<float*>(sm + xx * kStage + kW + kK + kU)[ct] = expf(ge_l - ge_i) * ge_r;
		};
		auto store_buf = [&](const unsigned char* stg, size_t o) {
			uint4* ho = reinterpret_cast<uint4*>(p.hout + o * VH * D);
			uint4* vo = reinterpret_cast<uint4*>(p.vout + o * VH * C);
#pragma unroll 4
			for (int e = ct; e < VH * D / 8; e += 128) ho[e] = *reinterpret_cast<const uint4*>(stg + hoff(e >> 4, e & 15));
#pragma unroll 4
			for (int e = ct; e < VH * C / 8; e += 128) {
				const int r = e >> 3, u = e & 7;
				vo[e] = *reinterpret_cast<const uint4*>(stg + 16 * KB + r * 128 + ((u ^ (r & 7)) << 4));
			}
		};
		// OWG 20-22: q's rows (swizzled as k's) and this half's dO of chunk cc into buffer xx, a commit group
		auto qdcopy = [&](int cc, int xx) {
			unsigned char* dq = sm + 2 * kStage + KB + 2 * kHV + xx * kQD;
			const unsigned char* sq = reinterpret_cast<const unsigned char*>(P.q + ((size_t)cc * HQK + h / G) * C * D);
			const unsigned char* sd = reinterpret_cast<const unsigned char*>(P.dout + obase(cc) * C * VH);
#pragma unroll 4
			for (int e = ct; e < C * D / 8; e += 128) {
				const int r = e >> 4, u = e & 15;
				tc::cp_async16(dq + (u >> 3) * 8 * KB + r * 128 + (((u & 7) ^ (r & 7)) << 4), sq + 16 * e);
			}
#pragma unroll 4
			for (int e = ct; e < C * VH / 8; e += 128) {
				const int r = e >> 3, u = e & 7;
				tc::cp_async16(dq + kK + r * 128 + ((u ^ (r & 7)) << 4), sd + 16 * e);
			}
			tc::cp_async_commit();
		};
		issue_any<2, 0, 128, 7>(p, sm, nullptr, c0, 0, h, half, 3, ct);
		if (OWG >= 20) qdcopy(c0, 0);
		DvlFormer<OWG> former{P, sm, ct, c0, n, h};  // OWG 24: the copiers form dvl themselves
		if (OWG == 23 || OWG == 24) {  // the dvl former starts on the first chunk before the loop
			tc::cp_async_wait<0>();
			wg::fence_proxy_async();
			if (OWG == 23) tc::bar_arrive(5, 256);
			if (OWG == 24) {
				former.prefetch(c0);
				former.form(c0, 0);
			}
		}
		gates(c0);
		efin(0);
#pragma unroll 1
		for (int i = 0; i < n; ++i) {
			const int c = c0 + i, x = i & 1;
			tc::cp_async_wait<0>();
			wg::fence_proxy_async();
			__syncthreads();  // A
			if (i + 1 < n) {
				issue_any<2, 0, 128, 7>(p, sm, nullptr, c + 1, x ^ 1, h, half, 3, ct);
				if (OWG >= 20) qdcopy(c + 1, x ^ 1);
				gates(c + 1);
			}
			if (STOREHV && i > 0) store_buf(outb + (x ^ 1) * kHV, obase(c - 1));
			if (i + 1 < n) efin(x ^ 1);
			if ((OWG == 23 || OWG == 24) && i + 1 < n) {  // the next chunk's stage landed: the former may start on it
				tc::cp_async_wait<0>();
				wg::fence_proxy_async();
				if (OWG == 23) tc::bar_arrive(5, 256);
				if (OWG == 24) former.form(c + 1, x ^ 1);
			}
		}
		__syncthreads();  // E
		if (STOREHV) store_buf(outb + ((n - 1) & 1) * kHV, obase(c0 + n - 1));
	} else if (OWG >= 20 && OWG <= 23) {  // ---- the dvl former ----
		if (REGS) regs_inc<216>();
		dvl_side<OWG>(P, sm, tid - 256, c0, n, h);
	} else if (OWG && OWG < 20) {  // ---- the output warpgroup ----
		if (REGS) regs_inc<216>();
		const int ot = tid - 256, ow = ot >> 5, r0 = 16 * ow + g, r1 = r0 + 8;
		unsigned char* osb = reinterpret_cast<unsigned char*>(cf + 2 * C);  // OWG 10: O's staging
		size_t opend = ~(size_t)0;                                        // OWG 10: the staged O's block
		auto oflush = [&]() {  // OWG 10: the staged O to global memory, whole 16-byte units
			if (opend == ~(size_t)0) return;
			tc::bar_sync(2, 128);
			uint4* o = reinterpret_cast<uint4*>(P.o + opend * C * VH);
#pragma unroll
			for (int e = ot; e < C * VH / 8; e += 128) {
				const int r = e >> 3, u = e & 7;
				o[e] = *reinterpret_cast<const uint4*>(osb + r * 128 + ((u ^ (r & 7)) << 4));
			}
			tc::bar_sync(2, 128);  // osb free for the next chunk's O
			opend = ~(size_t)0;
		};
		unsigned qn[8][4], qf[8][4];  // q's raw bf16 fragments (the chunk ahead), Q' (the chunk being output)
		float gq0 = 0.f, gq1 = 0.f, gn0 = 0.f, gn1 = 0.f, cg = 0.f, cr = 0.f;
		float of0 = 1.f, of1 = 1.f, rn0 = 1.f, rn1 = 1.f;  // OWG 13: O's row factors rstd_q e^gamma; q's rstd ahead
		// fetch: chunk cc's k rows into okb[xx] (cp.async), its column factors into cf[xx], q's fragments and
		// the rows' gates into registers.
		auto fetch = [&](int cc, int xx) {
			const unsigned char* sk = p.k + ((size_t)cc * HQK + h / G) * kK;
#pragma unroll
			for (int j = 0; j < 8; ++j) tc::cp_async16(okb + xx * kK + 16 * (ot + 128 * j), sk + 16 * (ot + 128 * j));
			tc::cp_async_commit();
			const int t0 = cc * C;
			if (OWG == 1 && ot < C) cf[xx * C + ot] = expf(-p.gcum[(size_t)(t0 + ot) * HV + h]) * p.rstd[(size_t)(t0 + ot) * HQK + h / G];
			if (OWG >= 2 && ot < C) cg = p.gcum[(size_t)(t0 + ot) * HV + h], cr = p.rstd[(size_t)(t0 + ot) * HQK + h / G];
			const unsigned* q = reinterpret_cast<const unsigned*>(P.q + ((size_t)(OWG == 15 ? 0 : cc) * HQK + h / G) * C * D);
#pragma unroll
			for (int s = 0; s < 8; ++s) {
				qn[s][0] = q[(r0 * D + 16 * s + 2 * t) / 2];
				qn[s][1] = q[(r1 * D + 16 * s + 2 * t) / 2];
				qn[s][2] = q[(r0 * D + 16 * s + 2 * t + 8) / 2];
				qn[s][3] = q[(r1 * D + 16 * s + 2 * t + 8) / 2];
			}
			gn0 = p.gcum[(size_t)(t0 + r0) * HV + h];
			gn1 = p.gcum[(size_t)(t0 + r1) * HV + h];
			if (OWG == 13 || OWG == 15) rn0 = p.rstd[(size_t)(t0 + r0) * HQK + h / G], rn1 = p.rstd[(size_t)(t0 + r1) * HQK + h / G];
		};
		// convert: qf = q rstd_q e^gamma from qn (the rows' sums of squares over the quad).
		auto convert = [&]() {
			if (OWG == 13 || OWG == 15) {  // raw bf16 q as the A operand (exact); rstd_q e^gamma applied to O's rows at the end
				of0 = rn0 * expf(gn0), of1 = rn1 * expf(gn1);
#pragma unroll
				for (int s = 0; s < 8; ++s)
#pragma unroll
					for (int q = 0; q < 4; ++q) qf[s][q] = qn[s][q];
				return;
			}
			float s0 = 0.f, s1 = 0.f;
#pragma unroll
			for (int s = 0; s < 8; ++s)
#pragma unroll
				for (int q = 0; q < 4; ++q) {
					const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&qn[s][q]));
					(q & 1 ? s1 : s0) += f.x * f.x + f.y * f.y;
				}
			s0 += __shfl_xor_sync(0xffffffffu, s0, 1), s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
			s0 += __shfl_xor_sync(0xffffffffu, s0, 2), s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
			const float f0 = rsqrtf(s0 + 1e-6f) * expf(gn0), f1 = rsqrtf(s1 + 1e-6f) * expf(gn1);
			gq0 = gn0, gq1 = gn1;
#pragma unroll
			for (int s = 0; s < 8; ++s)
#pragma unroll
				for (int q = 0; q < 4; ++q) {
					const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&qn[s][q]));
					const float m = q & 1 ? f1 : f0;
					qf[s][q] = tc::pack_bf16x2(f.x * m, f.y * m);
				}
		};
		// s_qh: S = Q' K^T (B: k's rows at ks) and O = Q' H (B: the staged H^T at hs) from qf, waited.
		auto s_qh = [&](float(&sacc)[32], float(&oacc)[32], const unsigned char* ks, const unsigned char* hs) {
			wg::fence();
#pragma unroll
			for (int s = 0; s < 8; ++s) wg::mma_m64n64k16_rs(sacc, qf[s], bk(ks, 16 * s), s > 0 ? 1 : 0);
#pragma unroll
			for (int s = 0; s < 8; ++s) wg::mma_m64n64k16_rs(oacc, qf[s], bk(hs, 16 * s), s > 0 ? 1 : 0);
			wg::commit();
			wg::wait<0>();
			wg::fence_operand(sacc);
			wg::fence_operand(oacc);
		};
		// p_pv: P = S's accumulators masked (j <= i) and times the column factors cfx, as bf16 A fragments, then
		// O += P V' (B: the staged V'^T at hs + 16 KB), waited.
		auto p_pv = [&](const float(&sacc)[32], float(&oacc)[32], const float* cfx, const unsigned char* hs) {
			unsigned pf[4][4];
			acc_frags(sacc, pf, r0, r1, t, [&](float a, int row, int col) { return col <= row ? a * cfx[col] : 0.f; });
			wg::fence();
#pragma unroll
			for (int s2 = 0; s2 < 4; ++s2) wg::mma_m64n64k16_rs(oacc, pf[s2], bk(hs + 16 * KB, 16 * s2));
			wg::commit();
			wg::wait<0>();
			wg::fence_operand(oacc);
		};
		// output: chunk cc's O from okb[xx], cf[xx] and the staged buffer outb[xx], stored as bf16.
		auto output = [&](int cc, int xx) {
			const unsigned char* hs = outb + xx * kHV;
			const unsigned char* ks = okb + xx * kK;
			const float* cfx = cf + xx * C;
			float sacc[32], oacc[32];
			if (OWG == 3 || OWG == 6) {  // no products: O from Q' alone (what the warpgroup's other work costs)
#pragma unroll
				for (int s = 0; s < 8; ++s)
#pragma unroll
					for (int q = 0; q < 4; ++q) {
						const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&qf[s][q]));
						oacc[4 * s + q] = f.x + f.y * cfx[q];
					}
			} else {
			s_qh(sacc, oacc, ks, hs);
			p_pv(sacc, oacc, cfx, hs);
			}
			if (OWG == 6 || OWG == 7 || OWG == 11 || OWG == 12) {  // O consumed, not stored (what its stores cost)
#pragma unroll
				for (int j = 0; j < 32; ++j) asm volatile("" ::"f"(oacc[j]));
				if (OWG >= 11) {  // constants stored instead: 11 one 16-byte unit a thread (2 KB), 12 four (8 KB)
					uint4* o = reinterpret_cast<uint4*>(P.o + obase(cc) * C * VH);
#pragma unroll
					for (int e = ot; e < (OWG == 11 ? 128 : C * VH / 8); e += 128) o[e] = make_uint4(e, 1, 2, 3);
				}
				return;
			}
			bf16* o = P.o + obase(cc) * C * VH;
			if (OWG == 13 || OWG == 15)
#pragma unroll
				for (int j = 0; j < 8; ++j) oacc[4 * j] *= of0, oacc[4 * j + 1] *= of0, oacc[4 * j + 2] *= of1, oacc[4 * j + 3] *= of1;
			if (OWG == 8 || OWG == 9 || OWG == 10 || OWG >= 13) {  // O staged (8, 9: over the chunk's dead k rows)
				unsigned char* os = OWG >= 10 ? osb : okb + xx * kK;
#pragma unroll
				for (int j = 0; j < 8; ++j)
#pragma unroll
					for (int hh = 0; hh < 2; ++hh) {
						const int r = hh ? r1 : r0;
						*reinterpret_cast<unsigned*>(os + r * 128 + ((j ^ (r & 7)) << 4) + 4 * t) =
						    tc::pack_bf16x2(oacc[4 * j + 2 * hh], oacc[4 * j + 2 * hh + 1]);
					}
				if (OWG == 10 || OWG >= 13) {  // stored at the next iteration's start, after the barrier (and its proxy fence)
					opend = obase(cc);
					return;
				}
				tc::bar_sync(2, 128);
#pragma unroll
				for (int e = ot; e < C * VH / 8; e += 128) {
					const int r = e >> 3, u = e & 7;
					reinterpret_cast<uint4*>(o)[e] = *reinterpret_cast<const uint4*>(os + r * 128 + ((u ^ (r & 7)) << 4));
				}
				return;
			}
#pragma unroll
			for (int j = 0; j < 8; ++j)
#pragma unroll
				for (int hh = 0; hh < 2; ++hh)
					*reinterpret_cast<unsigned*>(o + (hh ? r1 : r0) * VH + 8 * j + 2 * t) =
					    tc::pack_bf16x2(oacc[4 * j + 2 * hh], oacc[4 * j + 2 * hh + 1]);
		};
		// OWG 16: k's and q's rows of the chunk to output next in single buffers (okb: k as it lies; okb + kK: q,
		// 16-byte unit u of row r at unit u ^ (r % 8), so the fragments' 4-byte loads are conflict-free), copied by
		// cp.async as soon as S has read the previous chunk's (fetch16, from output16), waited at the next barrier.
		auto fetch16 = [&](int cc) {
			const unsigned char* sk = p.k + ((size_t)cc * HQK + h / G) * kK;
			const unsigned char* sq = reinterpret_cast<const unsigned char*>(P.q + ((size_t)cc * HQK + h / G) * C * D);
#pragma unroll
			for (int j = 0; j < 8; ++j) {
				const int e = ot + 128 * j, r = e >> 4, u = e & 15;
				tc::cp_async16(okb + 16 * e, sk + 16 * e);
				tc::cp_async16(okb + kK + r * 256 + ((u ^ (r & 7)) << 4), sq + 16 * e);
			}
			tc::cp_async_commit();
			const int t0 = cc * C;
			if (ot < C) cg = p.gcum[(size_t)(t0 + ot) * HV + h], cr = p.rstd[(size_t)(t0 + ot) * HQK + h / G];
			gn0 = p.gcum[(size_t)(t0 + r0) * HV + h], gn1 = p.gcum[(size_t)(t0 + r1) * HV + h];
			rn0 = p.rstd[(size_t)(t0 + r0) * HQK + h / G], rn1 = p.rstd[(size_t)(t0 + r1) * HQK + h / G];
		};
		auto convert16 = [&]() {  // q's raw fragments from shared memory; O's row factors
			const unsigned char* qs = okb + kK;
#pragma unroll
			for (int s = 0; s < 8; ++s)
#pragma unroll
				for (int q = 0; q < 4; ++q) {
					const int r = q & 1 ? r1 : r0, u = 2 * s + (q >> 1);
					qf[s][q] = *reinterpret_cast<const unsigned*>(qs + r * 256 + ((u ^ (r & 7)) << 4) + 4 * t);
				}
			of0 = rn0 * expf(gn0), of1 = rn1 * expf(gn1);
		};
		// output16: chunk cc's O as OWG 13's, with k's and q's rows from the single buffers, the next chunk's
		// copies issued (more) once every warp's S has read them; O staged for oflush.
		auto output16 = [&](int cc, int xx, bool more) {
			const unsigned char* hs = outb + xx * kHV;
			const float* cfx = cf + xx * C;
			float sacc[32], oacc[32];
			s_qh(sacc, oacc, okb, hs);
			tc::bar_sync(2, 128);  // every warp's S has read k's and q's buffers
			if (more) fetch16(cc + 1);
			p_pv(sacc, oacc, cfx, hs);
#pragma unroll
			for (int j = 0; j < 8; ++j) {
				oacc[4 * j] *= of0, oacc[4 * j + 1] *= of0, oacc[4 * j + 2] *= of1, oacc[4 * j + 3] *= of1;
#pragma unroll
				for (int hh = 0; hh < 2; ++hh) {
					const int r = hh ? r1 : r0;
					*reinterpret_cast<unsigned*>(osb + r * 128 + ((j ^ (r & 7)) << 4) + 4 * t) =
					    tc::pack_bf16x2(oacc[4 * j + 2 * hh], oacc[4 * j + 2 * hh + 1]);
				}
			}
			opend = obase(cc);
		};
#pragma unroll 1
		for (int i = 0; i < n; ++i) {
			const int x = i & 1;
			tc::cp_async_wait<0>();
			if (OWG != 9) wg::fence_proxy_async();  // (9: left out, to see what it costs after O's stores)
			__syncthreads();  // A: chunk i - 1's buffer staged, its k rows and factors landed
			if (OWG == 10 || OWG >= 13) oflush();
			if (OWG >= 2 && i > 0) {  // chunk i - 1's column factors from the registers its fetch loaded
				if (ot < C) cf[(x ^ 1) * C + ot] = expf(-cg) * cr;
				tc::bar_sync(1, 128);
			}
			if (OWG == 4) continue;  // the warpgroup at the barriers only
			if constexpr (OWG == 16) {
				if (i == 0) {
					fetch16(c0);
				} else {
					convert16();
					output16(c0 + i - 1, x ^ 1, true);
				}
				continue;
			}
			if (i > 0 && OWG != 5) convert();
			if (i > 0 && OWG == 5)  // the loads' values consumed where convert would
#pragma unroll
				for (int s = 0; s < 8; ++s)
#pragma unroll
					for (int q = 0; q < 4; ++q) asm volatile("" ::"r"(qn[s][q]));
			fetch(c0 + i, x);
			if (i > 0 && OWG != 5) output(c0 + i - 1, x ^ 1);
		}
		tc::cp_async_wait<0>();
		wg::fence_proxy_async();
		__syncthreads();  // E
		if (OWG == 10 || OWG >= 13) oflush();  // the chunk before the last one's O
		if (OWG >= 2) {
			if (ot < C) cf[((n - 1) & 1) * C + ot] = expf(-cg) * cr;
			tc::bar_sync(1, 128);
		}
		if constexpr (OWG == 16) {
			convert16();
			output16(c0 + n - 1, (n - 1) & 1, false);
			oflush();
		} else if (OWG < 4 || OWG >= 8) {
			convert();
			output(c0 + n - 1, (n - 1) & 1);
			if (OWG == 10 || OWG >= 13) oflush();
		}
		(void)gq0, (void)gq1;
	}
	(void)NT;
}

template <int OWG, int STOREHV, int REGS>
static void run(const OArgs& a, int ncta, int nlong, const char* pack, const char* name) {
	auto k = walk_out<OWG, STOREHV, REGS>;
	constexpr int nt = OWG && OWG != 24 ? 384 : 256, smem = smem_total<OWG>();
	cudaFuncAttributes fa;
	int per_sm;
	kernel_setup(k, nt, smem, fa, per_sm);
	float med, lo, hi;
	devtest::time_ms([&] { k<<<ncta, nt, smem>>>(a); }, 10, med, lo, hi);
	CK(cudaGetLastError());
	printf("%-18s %-52s %3d CTAs, %6d B smem, %3d regs, %3zu B local, %d CTA(s) an SM: %.3f ms (%.2f us a chunk; min %.3f max %.3f)\n",
	       pack, name, ncta, smem, fa.numRegs, fa.localSizeBytes, per_sm, med, 1000.f * med / nlong, lo, hi);
}

}  // namespace wout

int main() {
	using namespace wskel;
	for (const SkelPack& pk : skel_packs()) {
		std::vector<int> c0, nn;
		const int total = seg_tables(pk, c0, nn);
		auto alloc = alloc_filled;
		wout::OArgs o{};
		Args& a = o.a;
		a.w = alloc((size_t)total * HV * kW, 1), a.k = alloc((size_t)total * HQK * kK, 2);
		a.u = alloc((size_t)total * HV * 2 * kU, 3), a.e = alloc((size_t)total * HV * kE, 4);
		CK(cudaMalloc(&a.hout, (size_t)total * HV * 2 * VH * D * sizeof(bf16)));
		CK(cudaMalloc(&a.vout, (size_t)total * HV * 2 * VH * C * sizeof(bf16)));
		a.seg_c0 = devtest::up(c0), a.seg_n = devtest::up(nn);
		// gates in (-1, 0) and rstd near 1 (fill's bf16 pairs read as fp32 are ~±0.008: made small and negative)
		a.gcum = reinterpret_cast<const float*>(alloc((size_t)total * C * HV * 4, 5));
		a.rstd = reinterpret_cast<const float*>(alloc((size_t)total * C * HQK * 4, 6));
		o.q = reinterpret_cast<const bf16*>(alloc((size_t)total * HQK * C * D * 2, 7));
		o.dout = reinterpret_cast<const bf16*>(alloc((size_t)total * HV * 2 * C * VH * 2, 8));
		CK(cudaMalloc(&o.o, (size_t)total * HV * 2 * C * VH * sizeof(bf16)));
		CK(cudaDeviceSynchronize());
		const int ncta = (int)pk.segs.size() * HV * 2, nlong = pk.segs[0];
		wout::run<0, 1, 0>(o, ncta, nlong, pk.name, "walk (today's shape: H^T, V'^T stored)");
		wout::run<1, 0, 1>(o, ncta, nlong, pk.name, "walk + output wg (setmaxnreg), O stored only");
		wout::run<2, 0, 1>(o, ncta, nlong, pk.name, "  column factors a chunk ahead");
		wout::run<3, 0, 1>(o, ncta, nlong, pk.name, "  the same without the output's products");
		wout::run<8, 0, 1>(o, ncta, nlong, pk.name, "  O staged, stored as whole 16-byte units");
		wout::run<8, 1, 1>(o, ncta, nlong, pk.name, "  O staged, H^T and V'^T stored too");
		wout::run<9, 0, 1>(o, ncta, nlong, pk.name, "  O staged, no proxy fence at the loop's top");
		wout::run<10, 0, 1>(o, ncta, nlong, pk.name, "  O staged, stored after the next barrier");
		wout::run<10, 1, 1>(o, ncta, nlong, pk.name, "  the same, H^T and V'^T stored too");
		wout::run<13, 0, 1>(o, ncta, nlong, pk.name, "  raw q as A, O's rows scaled; O staged, stored after");
		wout::run<13, 1, 1>(o, ncta, nlong, pk.name, "  the same, H^T and V'^T stored too");
		wout::run<15, 0, 1>(o, ncta, nlong, pk.name, "  raw q as A, one chunk's q rows for all (L1 / L2)");
		wout::run<16, 0, 1>(o, ncta, nlong, pk.name, "  raw q and k rows staged by cp.async a chunk ahead");
		wout::run<16, 1, 1>(o, ncta, nlong, pk.name, "  the same, H^T and V'^T stored too");
		wout::run<11, 0, 1>(o, ncta, nlong, pk.name, "  the products, 2 KB of constants stored");
		wout::run<12, 0, 1>(o, ncta, nlong, pk.name, "  the products, 8 KB of constants stored");
		wout::run<6, 0, 1>(o, ncta, nlong, pk.name, "  no products, O not stored");
		wout::run<7, 0, 1>(o, ncta, nlong, pk.name, "  the products, O not stored");
		wout::run<4, 0, 1>(o, ncta, nlong, pk.name, "  the warpgroup at the barriers only");
		wout::run<5, 0, 1>(o, ncta, nlong, pk.name, "  the warpgroup's loads (k, q, factors) only");
		wout::run<4, 0, 0>(o, ncta, nlong, pk.name, "  at the barriers only, no setmaxnreg");
		wout::run<22, 1, 1>(o, ncta, nlong, pk.name, "walk + q rows, dO copied; 3rd wg at the barriers");
		wout::run<21, 1, 1>(o, ncta, nlong, pk.name, "  + dvl formed beside, not waited (contention)");
		wout::run<20, 1, 1>(o, ncta, nlong, pk.name, "  + dvl formed beside as U^T, the chain waits");
		wout::run<23, 1, 1>(o, ncta, nlong, pk.name, "  + dvl formed a chunk ahead as U^T");
		wout::run<24, 1, 0>(o, ncta, nlong, pk.name, "  the same formed by the copiers (256 threads)");
		wout::run<0, 1, 0>(o, ncta, nlong, pk.name, "walk (today's shape) again");
		CK(cudaDeviceSynchronize());
		for (const void* ptr : {(const void*)a.w, (const void*)a.k, (const void*)a.u, (const void*)a.e, (const void*)a.gcum,
		                        (const void*)a.rstd, (const void*)o.q, (const void*)o.dout})
			CK(cudaFree((void*)ptr));
		CK(cudaFree(a.hout));
		CK(cudaFree(a.vout));
		CK(cudaFree(o.o));
	}
	printf("walk_out_skel ok\n");
	return 0;
}
