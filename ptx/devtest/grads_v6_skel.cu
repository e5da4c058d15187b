// grads_v6_skel.cu: a timing and register skeleton of docs/grads-v6.md's options B (one CTA a (chunk, value
// head), two CTAs an SM, two consumer warpgroups splitting every product's n in halves, products on wgmma)
// and B' (a CTA a (chunk, QK head), its value heads in turn), to answer milestone 1 before the kernel is
// written: does the structure fit in 128 registers a thread and ~110 KB of shared memory, and how fast do its
// loads, products and barriers run at 32K (512 chunks x 48 value heads = 24,576 CTAs) with one and with two
// CTAs an SM? Run by scripts/v6-skel.sh on the GPU machine (nvcc there, no Go). Not part of the blobs.
// Measured in the twenty-third session (docs/grads-v6.md, "Milestone 1, measured"): B 2.41 ms at two CTAs an
// SM, 3.25 ms with the cluster reduction, B' 3.00 ms: the plan stopped there.
//
// What it has: every product of the design with its shape, operand orientation (A and B both from shared
// memory, each K-major or MN-major: the transposed operands) and place in the phase order; the loads of q, k
// (by QK head), dO, V', dV', v, D^T, H^T by cp.async into 128-byte-swizzled tiles at the tally's offsets; bf16
// tile stores of the intermediates (G1, A, dW, dA, M, dKK) from the accumulators; the causal decay
// e^(g_r - g_c) in 1a and S4; DK live from 1b to S6; the DQ chain in S3; dv stored by every CTA. dq and dk:
// stored by one CTA of three (RED 0: B without its reduction, standing for a free one), reduced over the
// three value heads' CTAs as a 3-CTA cluster through distributed shared memory in rank order (RED 1:
// cluster_reduce, DQ's at the end of S3 over H^T's region, DK's at the end), or stored by every CTA as its
// value head's partial in global memory (RED 2 bf16, RED 3 fp32) for reduce_partials, a second kernel, to sum
// in head order with a stand-in for the l2norm backward. 16 block barriers a head. What it
// does not have: the rest of the elementwise work (a multiply by a per-row scalar stands for it), 1c's
// substitution (a 64-step dependent chain a column stands for it), the l2norm backward, the sums' serial
// loops. So its time is a lower bound on the options', and its registers a lower bound too.
// The values are garbage (the operand layouts are only approximately the right ones); nothing is checked
// but that the launches succeed.
#include "devtest.cuh"

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include "../src/mma.cuh"
#include "../src/wgmma.cuh"

#if defined(__CUDA_ARCH__) && !defined(GDNKCP_HAS_WGMMA)
#error "grads_v6_skel.cu needs the sm_90a target (-gencode=arch=compute_90a,code=sm_90a)"
#endif

using bf16 = __nv_bfloat16;
using namespace gdnkcp;

namespace skel {

constexpr int C = 64, D = 128, HQK = 16, HV = 48, G = HV / HQK;
constexpr int KB = 1024;
// Shared memory regions (bytes), the tally of docs/grads-v6.md:
constexpr int oK = 0;            // K [64][128] bf16, all along
constexpr int oKK = oK + 16 * KB;   // K K^T (fp32, 8 KB standing for the packed lower triangle)
constexpr int oG1 = oKK + 8 * KB;   // G1 [64][64] (1a -> S3)
constexpr int oA = oG1 + 8 * KB;    // A [64][64] (1c -> S5)
constexpr int oQ = oA + 8 * KB;     // Q (S0-1b); A fp32 (1c); D^T (S2) and H^T (S3) over Q + S; v, dA, M (S4-S5)
constexpr int oS = oQ + 16 * KB;    // S fp32 (S0-1a)
constexpr int oDO = oS + 16 * KB;   // dO (1a-S3); dW (S3-S4)
constexpr int oV = oDO + 16 * KB;   // V' (1a-S2); dV' (S3-S4); E2 / F kk fp32 (S5-S6)
constexpr int oScal = oV + 16 * KB; // beta, gamma, row scalars
constexpr int kSmem = oScal + 6 * KB;  // 110 KB

// sw: the byte offset of element (r, c) of a bf16 tile of R rows stored as 64-column blocks of [R][128 B],
// the 16-byte unit XOR-swizzled by the row (wgmma's 128-byte swizzle).
__device__ __forceinline__ int sw(int r, int c, int R) {
	return (c >> 6) * R * 128 + r * 128 + ((((c & 63) >> 3) ^ (r & 7)) << 4) + (c & 7) * 2;
}

// load: a [R][Cols] bf16 row-major global tile into a swizzled shared tile by cp.async (all 256 threads).
__device__ __forceinline__ void load(unsigned char* s, const bf16* g, int R, int Cols, int tid) {
	const int units = R * Cols / 8;
	for (int i = tid; i < units; i += 256) {
		const int r = i / (Cols / 8), c = (i % (Cols / 8)) * 8;
		tc::cp_async16(s + sw(r, c, R), g + (size_t)r * Cols + c);
	}
}

// mma_ss: d (m64nN, fp32, N / 2 accumulators a thread) += A (m64k16) B (k16nN), both bf16 from shared
// memory behind descriptors (128-byte swizzle); A K-major (TA 0: its rows are m) or MN-major (TA 1: its rows
// are k, the transposed operand), B K-major (TB 0: rows are n) or MN-major (TB 1: rows are k). A from shared
// memory keeps the products free of the register hazards of the A-from-registers form (ptxas serialises
// those, C7515), as the real kernel would want.
template <int TA, int TB>
__device__ __forceinline__ void mma_ss(float (&d)[16], unsigned long long ad, unsigned long long bd, int scale_d) {
	asm volatile(
	    "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
	    "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
	    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, %19, %20;\n}\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
	      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
	    : "l"(ad), "l"(bd), "r"(scale_d), "n"(TA), "n"(TB));
}
template <int TA, int TB>
__device__ __forceinline__ void mma_ss(float (&d)[32], unsigned long long ad, unsigned long long bd, int scale_d) {
	asm volatile(
	    "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
	    "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
	    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
	    "%32, %33, p, 1, 1, %35, %36;\n}\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
	      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
	      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
	      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
	    : "l"(ad), "l"(bd), "r"(scale_d), "n"(TA), "n"(TB));
}

// Descriptors at k step k0: K-major (rows = the non-k dimension, R of them; n0 the warpgroup's first row), or
// MN-major (rows = k, R of them; n0 the warpgroup's first column within the 64-column block it lies in).
__device__ __forceinline__ unsigned long long bk(const unsigned char* tile, int R, int n0, int k0) {
	return wg::desc_sw128(tile + (k0 >> 6) * R * 128 + n0 * 128 + ((k0 & 63) >> 3) * 16);
}
__device__ __forceinline__ unsigned long long bmn(const unsigned char* tile, int R, int n0, int k0) {
	return wg::desc_sw128_mn(tile + (n0 >> 6) * R * 128 + k0 * 128 + (n0 & 63) * 2, R * 128);
}

// chain: acc (this warpgroup's n half: NH columns from n0) (+)= A B over k steps [k0, k1): A the whole
// [64][k] operand (AT: stored transposed, rows = k), B K-major (TB 0) or MN-major (TB 1); one commit group,
// waited for before it returns.
template <int NH, int AT, int TB>
__device__ __forceinline__ void chain(float (&acc)[NH / 2], const unsigned char* a, int Ra, const unsigned char* b, int Rb,
                                      int n0, int k0, int k1, bool accumulate) {
	wg::fence();
	for (int k = k0; k < k1; k += 16) {
		const unsigned long long ad = AT ? bmn(a, Ra, 0, k) : bk(a, Ra, 0, k);
		const unsigned long long bd = TB ? bmn(b, Rb, n0, k) : bk(b, Rb, n0, k);
		mma_ss<AT, TB>(acc, ad, bd, (accumulate || k > k0) ? 1 : 0);
	}
	wg::commit();
	wg::wait<0>();
	wg::fence_operand(acc);
}

// put: acc (n half from n0, D layout: d[4j + 0..1] row g, columns 8j + 2t..; d[4j + 2..3] row g + 8) times
// the row's scalar, as bf16 pairs into a swizzled [64][*] tile.
template <int N>
__device__ __forceinline__ void put(unsigned char* tile, const float (&acc)[N], const float* rowsc, int m0, int n0, int lane) {
	const int g = lane >> 2, t = lane & 3;
#pragma unroll
	for (int j = 0; j < N / 4; ++j)
#pragma unroll
		for (int h = 0; h < 2; ++h) {
			const int r = m0 + g + 8 * h, c = n0 + 8 * j + 2 * t;
			const __nv_bfloat162 p = __floats2bfloat162_rn(acc[4 * j + 2 * h] * rowsc[r], acc[4 * j + 2 * h + 1] * rowsc[r]);
			*reinterpret_cast<__nv_bfloat162*>(tile + sw(r, c, 64)) = p;
		}
}

// store: acc as bf16 pairs into a global [64][ld] tile at column n0 (rows < 64).
template <int N>
__device__ __forceinline__ void store(bf16* g, int ld, const float (&acc)[N], int m0, int n0, int lane) {
	const int gg = lane >> 2, t = lane & 3;
#pragma unroll
	for (int j = 0; j < N / 4; ++j)
#pragma unroll
		for (int h = 0; h < 2; ++h) {
			const int r = m0 + gg + 8 * h, c = n0 + 8 * j + 2 * t;
			*reinterpret_cast<__nv_bfloat162*>(g + (size_t)r * ld + c) = __floats2bfloat162_rn(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
		}
}

// cluster_reduce: the cluster's G CTAs (the value heads of one QK head) sum their [64][128] fp32 partials of
// DQ or DK in rank order: each writes its accumulators (this warpgroup's n half) into buf (32 KB of dead
// shared memory), the cluster syncs, rank r sums rows [22 r, 22 r + 22) of all G buffers over DSMEM in the
// order 0, 1, 2 (one order whichever rank does it: deterministic) and stores them as bf16, and the cluster
// syncs again before any buffer is reused or its CTA exits. The real kernel's l2norm backward would run on
// those rows there.
__device__ __forceinline__ void cluster_reduce(float* buf, const float (&acc)[32], bf16* g, int m0, int n0, int lane, int tid) {
	namespace cg = cooperative_groups;
	cg::cluster_group cl = cg::this_cluster();
	const int gg = lane >> 2, t = lane & 3;
#pragma unroll
	for (int j = 0; j < 8; ++j)
#pragma unroll
		for (int h = 0; h < 2; ++h)
			*reinterpret_cast<float2*>(buf + (m0 + gg + 8 * h) * 128 + n0 + 8 * j + 2 * t) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
	cl.sync();
	const int r = (int)cl.block_rank(), r0 = 22 * r, r1 = r0 + 22 < 64 ? r0 + 22 : 64;
	const float4* b0 = reinterpret_cast<const float4*>(cl.map_shared_rank(buf, 0));
	const float4* b1 = reinterpret_cast<const float4*>(cl.map_shared_rank(buf, 1));
	const float4* b2 = reinterpret_cast<const float4*>(cl.map_shared_rank(buf, 2));
	for (int e = r0 * 32 + tid; e < r1 * 32; e += 256) {
		const float4 x = b0[e], y = b1[e], z = b2[e];
		const int row = e >> 5, col = (e & 31) * 4;
		__nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(g + (size_t)row * 128 + col);
		o[0] = __floats2bfloat162_rn(x.x + y.x + z.x, x.y + y.y + z.y);
		o[1] = __floats2bfloat162_rn(x.z + y.z + z.z, x.w + y.w + z.w);
	}
	cl.sync();
}

// Global layouts: q, k [NC][HQK][64][128]; dO, V', dV', v, dv [NC][HV][64][128]; D^T, H^T [NC][HV][128][128];
// beta, gcum [NC][HV][64]; dq, dk [NC][HQK][64][128].
struct Args {
	const bf16 *q, *k, *dout, *vnew, *dvnew, *v, *dt, *ht;
	const float *beta, *gcum;
	bf16 *dq, *dk, *dv;
	float* dg;
	void *dqp, *dkp;  // RED 2 / 3: a value head's dq, dk partials [NC][HV][64][128], bf16 or fp32
};

// store_part: acc (this warpgroup's n half) into a value head's [64][128] partial, bf16 (RED 2) or fp32.
template <int RED>
__device__ __forceinline__ void store_part(void* base, size_t off, const float (&acc)[32], int m0, int n0, int lane) {
	if constexpr (RED == 2) {
		store(reinterpret_cast<bf16*>(base) + off, D, acc, m0, n0, lane);
	} else {
		float* g = reinterpret_cast<float*>(base) + off;
		const int gg = lane >> 2, t = lane & 3;
#pragma unroll
		for (int j = 0; j < 8; ++j)
#pragma unroll
			for (int h = 0; h < 2; ++h)
				*reinterpret_cast<float2*>(g + (size_t)(m0 + gg + 8 * h) * D + n0 + 8 * j + 2 * t) =
				    make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
	}
}

// reduce_partials: a CTA (256 threads) a (chunk, QK head): dq and dk = the G value heads' partials summed in
// head order, then a stand-in for the l2norm backward (x - y (y . x) a row, y = q or k), bf16 out. Half a
// warp a row, 8 columns a thread.
template <int RED>
__global__ void __launch_bounds__(256) reduce_partials(Args p) {
	const int c = blockIdx.x / HQK, qh = blockIdx.x % HQK, tid = threadIdx.x;
	const size_t qk = ((size_t)c * HQK + qh) * C * D;
	for (int which = 0; which < 2; ++which) {
		const void* part = which ? p.dkp : p.dqp;
		const bf16* y = which ? p.k + qk : p.q + qk;
		bf16* out = which ? p.dk + qk : p.dq + qk;
		for (int r = tid >> 4; r < C; r += 16) {
			const int col = (tid & 15) * 8;
			float x[8] = {};
			for (int j = 0; j < G; ++j) {
				const size_t off = (((size_t)c * HV + qh * G + j) * C + r) * D + col;
				if constexpr (RED == 2) {
					const uint4 u = *reinterpret_cast<const uint4*>(reinterpret_cast<const bf16*>(part) + off);
					const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
					for (int e = 0; e < 4; ++e) {
						const float2 f = __bfloat1622float2(b[e]);
						x[2 * e] += f.x, x[2 * e + 1] += f.y;
					}
				} else {
					const float4* f = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(part) + off);
					const float4 a = f[0], b = f[1];
					x[0] += a.x, x[1] += a.y, x[2] += a.z, x[3] += a.w, x[4] += b.x, x[5] += b.y, x[6] += b.z, x[7] += b.w;
				}
			}
			const uint4 yu = *reinterpret_cast<const uint4*>(y + (size_t)r * D + col);
			const __nv_bfloat162* yb = reinterpret_cast<const __nv_bfloat162*>(&yu);
			float yv[8], dot = 0.f;
#pragma unroll
			for (int e = 0; e < 4; ++e) {
				const float2 f = __bfloat1622float2(yb[e]);
				yv[2 * e] = f.x, yv[2 * e + 1] = f.y;
				dot = fmaf(f.x, x[2 * e], fmaf(f.y, x[2 * e + 1], dot));
			}
#pragma unroll
			for (int o = 8; o >= 1; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
			uint4 ou;
			__nv_bfloat162* ob = reinterpret_cast<__nv_bfloat162*>(&ou);
#pragma unroll
			for (int e = 0; e < 4; ++e) ob[e] = __floats2bfloat162_rn(x[2 * e] - yv[2 * e] * dot, x[2 * e + 1] - yv[2 * e + 1] * dot);
			*reinterpret_cast<uint4*>(out + (size_t)r * D + col) = ou;
		}
	}
}

// HEADS 1: option B, a CTA a (chunk, value head), dq and dk stored by one CTA of G (standing for the
// cluster's rank 0). HEADS 3 (= G): option B', a CTA a (chunk, QK head) running its G value heads in turn as
// mma8 does, DQ and DK in registers across them (32 + 32 a thread), Q loaded again for each head (its slot
// is reused within a head), no cluster.
template <int MINB, int HEADS, int RED>
__global__ void __launch_bounds__(256, MINB) grads_v6_skel(Args p) {
	extern __shared__ __align__(1024) unsigned char sm[];
	const int tid = threadIdx.x, lane = tid & 31, w4 = (tid >> 5) & 3, wgi = tid >> 7;
	const int m0 = 16 * w4;
	const int c = HEADS == 1 ? blockIdx.x / HV : blockIdx.x / HQK;
	const int qh = HEADS == 1 ? (blockIdx.x % HV) / G : blockIdx.x % HQK;
	const size_t t64 = (size_t)C * D, t128 = (size_t)D * D;
	const size_t qk = ((size_t)c * HQK + qh) * t64;
	unsigned char *K = sm + oK, *Q = sm + oQ, *G1 = sm + oG1, *A16 = sm + oA, *DO = sm + oDO, *VV = sm + oV;
	unsigned char *DT = sm + oQ, *HT = sm + oQ, *VB = sm + oQ, *DA = sm + oS, *M16 = sm + oS + 8 * KB, *DW = sm + oDO;
	unsigned char* DKK = sm + oQ;
	float* scal = reinterpret_cast<float*>(sm + oScal);  // beta [64], gamma [64], then row scalars
	float* S = reinterpret_cast<float*>(sm + oS);
	float* AF = reinterpret_cast<float*>(sm + oQ);
	float* E2 = reinterpret_cast<float*>(sm + oV);
	float* KKf = reinterpret_cast<float*>(sm + oKK);
	const float* rs = scal + 2 * C;
	float dq[32], dk[32];  // this warpgroup's 64 columns of DQ (from S3) and DK (from 1b)

	load(K, p.k + qk, C, D, tid);  // K once a CTA
#pragma unroll 1
	for (int hj = 0; hj < HEADS; ++hj) {
		const int h = HEADS == 1 ? blockIdx.x % HV : qh * G + hj;
		const size_t vh = ((size_t)c * HV + h) * t64, sh = ((size_t)c * HV + h) * t128;
		const bool more = hj > 0;  // the head's first products add to DQ, DK
		// S0, S1: q (this head's slot), dO, V' and the scalars.
		load(Q, p.q + qk, C, D, tid);
		load(DO, p.dout + vh, C, D, tid);
		load(VV, p.vnew + vh, C, D, tid);
		tc::cp_async_commit();
		if (tid < C) {
			scal[tid] = p.beta[((size_t)c * HV + h) * C + tid];
			scal[C + tid] = p.gcum[((size_t)c * HV + h) * C + tid];
			scal[2 * C + tid] = expf(scal[C + tid]);
		}
		tc::cp_async_wait<0>();
		wg::fence_proxy_async();
		__syncthreads();  // 1
		{  // S = Q K^T, K K^T (n 32 a warpgroup, k 128; once a CTA in the real kernel, here every head)
			float s[16], kk[16];
			chain<32, 0, 0>(s, Q, C, K, C, 32 * wgi, 0, D, false);
			chain<32, 0, 0>(kk, K, C, K, C, 32 * wgi, 0, D, false);
			const int g = lane >> 2, t = lane & 3;
#pragma unroll
			for (int j = 0; j < 4; ++j)
#pragma unroll
				for (int e = 0; e < 4; ++e) {
					const int r = m0 + g + 8 * (e >> 1), col = 32 * wgi + 8 * j + 2 * t + (e & 1);
					S[r * 64 + col] = s[4 * j + e];
					KKf[(r * 64 + col) & 2047] = kk[4 * j + e];
				}
		}
		__syncthreads();  // 2
		{  // 1a: dP = dO V'^T (n 32, k 128); G1 = dP (.) scalars -> bf16 tile
			float dp[16];
			chain<32, 0, 0>(dp, DO, C, VV, C, 32 * wgi, 0, D, false);
			const int g = lane >> 2, t = lane & 3;
#pragma unroll
			for (int j = 0; j < 16; ++j) {  // the causal decay e^(g_r - g_c) below the diagonal, as the real 1a
				const int r = m0 + g + 8 * ((j >> 1) & 1), cc = 32 * wgi + 8 * (j >> 2) + 2 * t + (j & 1);
				dp[j] = cc <= r ? dp[j] * S[r * 64 + cc] * __expf(scal[C + r] - scal[C + cc]) : 0.f;
			}
			put(G1, dp, rs, m0, 32 * wgi, lane);
		}
		wg::fence_proxy_async();
		__syncthreads();  // 3
		chain<64, 1, 1>(dk, G1, C, Q, C, 64 * wgi, 0, C, more);  // 1b: DK += G1^T Q (k 64 tokens)
		__syncthreads();  // 4: Q dead
		// 1c: A = (I + L)^-1's blocks: a 64-step dependent chain a column (threads 0-63) over fp32 A in Q's slot.
		if (tid < C) {
			float x = 1.f;
			for (int i = 0; i < C; ++i) {
				x = fmaf(-KKf[(i * 64 + tid) & 2047], x, scal[i]);
				AF[i * 64 + tid] = x;
			}
		}
		__syncthreads();  // 5
		for (int e = tid; e < 64 * 32; e += 256) {  // A as bf16 pairs (64 rows x 32 pairs: 8 a thread)
			const int r = e >> 5, cc = 2 * (e & 31);
			*reinterpret_cast<__nv_bfloat162*>(A16 + sw(r, cc, 64)) = __floats2bfloat162_rn(AF[r * 64 + cc], AF[r * 64 + cc + 1]);
		}
		wg::fence_proxy_async();
		__syncthreads();  // 6: A fp32 dead
		load(DT, p.dt + sh, D, D, tid);  // S2's D^T over Q and S (keys x values, K-major for dKt's B)
		tc::cp_async_commit();
		tc::cp_async_wait<0>();
		wg::fence_proxy_async();
		__syncthreads();  // 7
		{  // S2: dKt = V' D^T (n 64 keys, k 128 values); DK += tail (.) dKt
			float t[32];
			chain<64, 0, 0>(t, VV, C, DT, D, 64 * wgi, 0, D, false);
#pragma unroll
			for (int j = 0; j < 32; ++j) dk[j] = fmaf(rs[m0 + (lane >> 2) + 8 * ((j >> 1) & 1)], t[j], dk[j]);
		}
		__syncthreads();  // 8: D^T and V' dead
		load(HT, p.ht + sh, D, D, tid);
		load(VV, p.dvnew + vh, C, D, tid);  // dV' over V'
		tc::cp_async_commit();
		tc::cp_async_wait<0>();
		wg::fence_proxy_async();
		__syncthreads();  // 9
		{  // S3: DQ (+)= G1 K + dO H^T (n 64, k 64 + 128); dW = dV' H^T -> bf16 over dO
			if constexpr (RED == 1) {  // both chains, then DQ's partial over H^T and the cluster's reduction of it
				float dw[32];
				chain<64, 0, 0>(dw, VV, C, HT, D, 64 * wgi, 0, D, false);
				chain<64, 0, 1>(dq, G1, C, K, C, 64 * wgi, 0, C, false);
				chain<64, 0, 0>(dq, DO, C, HT, D, 64 * wgi, 0, D, true);
				__syncthreads();  // 10: dO and H^T dead
				put(DW, dw, rs, m0, 64 * wgi, lane);
				cluster_reduce(reinterpret_cast<float*>(sm + oQ), dq, p.dq + qk, m0, 64 * wgi, lane, tid);
			} else {
				chain<64, 0, 1>(dq, G1, C, K, C, 64 * wgi, 0, C, more);
				chain<64, 0, 0>(dq, DO, C, HT, D, 64 * wgi, 0, D, true);
				if constexpr (RED >= 2) {
					store_part<RED>(p.dqp, vh, dq, m0, 64 * wgi, lane);
				} else if (HEADS == 1 && h % G == 0) {
					store(p.dq + qk, D, dq, m0, 64 * wgi, lane);
				}
				float dw[32];
				chain<64, 0, 0>(dw, VV, C, HT, D, 64 * wgi, 0, D, false);
				__syncthreads();  // 10: both warpgroups done with dO
				put(DW, dw, rs, m0, 64 * wgi, lane);
			}
		}
		wg::fence_proxy_async();
		__syncthreads();  // 11: H^T dead
		load(VB, p.v + vh, C, D, tid);  // v over H^T
		tc::cp_async_commit();
		tc::cp_async_wait<0>();
		wg::fence_proxy_async();
		__syncthreads();  // 12
		{  // S4: XU = A^T dV' -> dv; XW = A^T dW, DK += bg (.) XW (n 64, k 64); T1 = dV' v^T, T2 = dW K^T -> dA
			float x[32];
			chain<64, 1, 1>(x, A16, C, VV, C, 64 * wgi, 0, C, false);
			store(p.dv + vh, D, x, m0, 64 * wgi, lane);
			chain<64, 1, 1>(x, A16, C, DW, C, 64 * wgi, 0, C, false);
#pragma unroll
			for (int j = 0; j < 32; ++j) dk[j] = fmaf(scal[m0 + (lane >> 2) + 8 * ((j >> 1) & 1)], x[j], dk[j]);
			float t1[16], t2[16];
			chain<32, 0, 0>(t1, VV, C, VB, C, 32 * wgi, 0, D, false);
			chain<32, 0, 0>(t2, DW, C, K, C, 32 * wgi, 0, D, false);
#pragma unroll
			for (int j = 0; j < 16; ++j) {
				const int r = m0 + (lane >> 2) + 8 * ((j >> 1) & 1), cc = 32 * wgi + 8 * (j >> 2) + 2 * (lane & 3) + (j & 1);
				t1[j] = cc < r ? fmaf(t1[j], __expf(scal[C + r] - scal[C + cc]), t2[j]) : 0.f;
			}
			put(DA, t1, rs, m0, 32 * wgi, lane);
		}
		wg::fence_proxy_async();
		__syncthreads();  // 13
		{  // S5: M = A^T dA (n 32, k 64) -> bf16; dL = -M A^T (n 32, k 64); dKK -> bf16 over v, E2 fp32 over dV'
			float m[16];
			chain<32, 1, 1>(m, A16, C, DA, C, 32 * wgi, 0, C, false);
			put(M16, m, rs, m0, 32 * wgi, lane);
			wg::fence_proxy_async();
			__syncthreads();  // 14
			chain<32, 0, 0>(m, M16, C, A16, C, 32 * wgi, 0, C, false);
			put(DKK, m, rs, m0, 32 * wgi, lane);
			const int g = lane >> 2, t = lane & 3;
#pragma unroll
			for (int j = 0; j < 16; ++j) E2[(m0 + g + 8 * ((j >> 1) & 1)) * 64 + 32 * wgi + 8 * (j >> 2) + 2 * t + (j & 1)] = m[j];
		}
		wg::fence_proxy_async();
		__syncthreads();  // 15
		// S6: DK += dKK K + dKK^T K (n 64, k 64 each); the row sums; dg.
		{
			float u[32];
			chain<64, 0, 1>(u, DKK, C, K, C, 64 * wgi, 0, C, false);
			chain<64, 1, 1>(u, DKK, C, K, C, 64 * wgi, 0, C, true);
#pragma unroll
			for (int j = 0; j < 32; ++j) dk[j] += u[j];
		}
		if (tid < C) {
			float acc = 0.f;
			for (int j = 0; j < C; ++j) acc += E2[tid * 64 + j];
			p.dg[((size_t)c * HV + h) * C + tid] = acc;
		}
		__syncthreads();  // 16: the end of the head
	}
	if constexpr (RED >= 2) {
		store_part<RED>(p.dkp, ((size_t)c * HV + blockIdx.x % HV) * C * D, dk, m0, 64 * wgi, lane);
	} else if constexpr (RED == 1) {
		cluster_reduce(reinterpret_cast<float*>(sm + oQ), dk, p.dk + qk, m0, 64 * wgi, lane, tid);
	} else if (HEADS > 1 || (blockIdx.x % HV) % G == 0) {
		if (HEADS > 1) store(p.dq + qk, D, dq, m0, 64 * wgi, lane);
		store(p.dk + qk, D, dk, m0, 64 * wgi, lane);
	}
}

__global__ void fill(bf16* x, size_t n, unsigned seed) {
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		unsigned v = (unsigned)i * 2654435761u ^ seed;
		v ^= v >> 13;
		v *= 0x5bd1e995u;
		v ^= v >> 15;
		x[i] = __float2bfloat16(((v & 0xffff) / 32768.f - 1.f) * 0.25f);
	}
}

}  // namespace skel

template <int MINB, int HEADS, int RED>
static void run(const skel::Args& a, int ncta, const char* name, int reps) {
	auto k = skel::grads_v6_skel<MINB, HEADS, RED>;
	constexpr bool CL = RED == 1;
	CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, skel::kSmem));
	cudaFuncAttributes fa;
	CK(cudaFuncGetAttributes(&fa, k));
	cudaLaunchConfig_t cfg = {};
	cfg.gridDim = dim3(ncta);
	cfg.blockDim = dim3(256);
	cfg.dynamicSmemBytes = skel::kSmem;
	cudaLaunchAttribute at[1];
	at[0].id = cudaLaunchAttributeClusterDimension;
	at[0].val.clusterDim.x = CL ? skel::G : 1;
	at[0].val.clusterDim.y = 1;
	at[0].val.clusterDim.z = 1;
	cfg.attrs = at;
	cfg.numAttrs = 1;
	int per_sm = 0, clusters = 0;
	CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, 256, skel::kSmem));
	CK(cudaOccupancyMaxActiveClusters(&clusters, k, &cfg));
	float med, lo, hi;
	devtest::time_ms([&] { CK(cudaLaunchKernelEx(&cfg, k, a)); }, reps, med, lo, hi);
	printf("%-40s %5d CTAs %3d registers, %4zu bytes local (spills), %d CTA(s) an SM, %4d clusters of %d at once: %.3f ms (min %.3f, max %.3f)\n",
	       name, ncta, fa.numRegs, fa.localSizeBytes, per_sm, clusters, CL ? skel::G : 1, med, lo, hi);
	if constexpr (RED >= 2) {  // the second kernel, and both in sequence
		const int nr = ncta / skel::G;
		float m2, l2, h2;
		devtest::time_ms([&] { skel::reduce_partials<RED><<<nr, 256>>>(a); }, reps, m2, l2, h2);
		float m3, l3, h3;
		devtest::time_ms(
		    [&] {
			    CK(cudaLaunchKernelEx(&cfg, k, a));
			    skel::reduce_partials<RED><<<nr, 256>>>(a);
		    },
		    reps, m3, l3, h3);
		printf("%-40s %5d CTAs: %.3f ms; the two kernels in sequence: %.3f ms\n", "  + reduce_partials", nr, m2, m3);
	}
}

// main: every variant (no argument), or only variant N (0-7) with a few repetitions (for ncu).
int main(int argc, char** argv) {
	using namespace skel;
	const int NC = 512, ncta = NC * HV;  // 32,768 tokens
	const size_t nqk = (size_t)NC * HQK * C * D, nv = (size_t)NC * HV * C * D, ns = (size_t)NC * HV * D * D;
	auto alloc = [](size_t n, unsigned seed) {
		bf16* p;
		CK(cudaMalloc(&p, n * sizeof(bf16)));
		fill<<<1024, 256>>>(p, n, seed);
		return p;
	};
	Args a{};
	a.q = alloc(nqk, 1), a.k = alloc(nqk, 2), a.dout = alloc(nv, 3), a.vnew = alloc(nv, 4), a.dvnew = alloc(nv, 5);
	a.v = alloc(nv, 6), a.dt = alloc(ns, 7), a.ht = alloc(ns, 8);
	std::vector<float> sc((size_t)NC * HV * C, 0.5f), gc((size_t)NC * HV * C, -0.05f);
	a.beta = devtest::up(sc), a.gcum = devtest::up(gc);
	a.dq = alloc(nqk, 9), a.dk = alloc(nqk, 10), a.dv = alloc(nv, 11);
	CK(cudaMalloc(&a.dg, (size_t)NC * HV * C * sizeof(float)));
	CK(cudaMalloc(&a.dqp, nv * sizeof(float)));
	CK(cudaMalloc(&a.dkp, nv * sizeof(float)));
	CK(cudaMemset(a.dqp, 0, nv * sizeof(float)));
	CK(cudaMemset(a.dkp, 0, nv * sizeof(float)));
	CK(cudaDeviceSynchronize());
	printf("grads_v6_skel: 32,768 tokens, %d value heads, %d threads and %d KB of shared memory a CTA\n", HV, 256,
	       kSmem / 1024);
	const int only = argc > 1 ? atoi(argv[1]) : -1, reps = only >= 0 ? 3 : 20;
	if (only < 0 || only == 0) run<2, 1, 0>(a, ncta, "B  (a value head a CTA), bounds 2", reps);
	if (only < 0 || only == 1) run<1, 1, 0>(a, ncta, "B  (a value head a CTA), bounds 1", reps);
	if (only < 0 || only == 2) run<2, G, 0>(a, NC * HQK, "B' (a QK head a CTA), bounds 2", reps);
	if (only < 0 || only == 3) run<1, G, 0>(a, NC * HQK, "B' (a QK head a CTA), bounds 1", reps);
	if (only < 0 || only == 4) run<2, 1, 1>(a, ncta, "B  + 3-CTA cluster reduction, bounds 2", reps);
	if (only < 0 || only == 5) run<1, 1, 1>(a, ncta, "B  + 3-CTA cluster reduction, bounds 1", reps);
	if (only < 0 || only == 6) run<2, 1, 2>(a, ncta, "B  + bf16 partials in global, bounds 2", reps);
	if (only < 0 || only == 7) run<2, 1, 3>(a, ncta, "B  + fp32 partials in global, bounds 2", reps);
	CK(cudaDeviceSynchronize());
	printf("skeleton ok (compare: gdn_chunk_grads_mma8 4.02 ms at 32K, v5.30)\n");
	return 0;
}
