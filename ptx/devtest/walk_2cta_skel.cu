// walk_2cta_skel.cu: a timing and register skeleton of the vh 64 state walk (gdn_walk_planes.cu) with less
// shared memory, to answer docs/perf-notes.md's "What next (twenty-third session's view)", item 1, before
// anything is built: can two walk CTAs share an SM (each under ~113 KB of shared memory) and walk a chunk
// nearly as fast as one does today, so that multi-document packs (288 vh 64 CTAs at 120,908 tokens) stop
// queueing for the 132 SMs? Run by scripts/walk-skel.sh on the GPU machine (nvcc there, no Go). Not part of
// the blobs. Measured in the twenty-third session (docs/perf-notes.md, that item): with its naive output
// stores a second CTA an SM gains nothing (the stores bind it); without them (OUT 0) the skeleton runs at
// the real walk's pace at one CTA an SM (4.64 ms at 120,908 tokens against the walk's 4.50) and at 3.38 ms at
// two: staged output stores within ~113 KB are what a two-CTA walk needs.
//
// What it has, a CTA a (segment, value head, vh half) walking its segment's chunks in order: the state
// (64 values x 128 keys, fp32) in one warpgroup's m64n128 accumulators; per chunk its bf16 H^T stored to
// global memory, (1) V'^T = U^T + H^T (-W^T) as three m64n64k16 products a k step (hi hi, hi lo, lo hi) with
// the state's hi / lo fragments from registers and -W's two planes from shared memory, U^T added from shared
// memory, V'^T stored as bf16, scaled by the chunk's factors, split, and (2) the state = e^gl state + V'^T K
// as two m64n128k16 products a k step with k's rows MN-major from shared memory. A copier warp moves each
// chunk's -W planes (32 KB), k rows (16 KB), U^T (16 KB) and factors by cp.async into:
//   STAGES 2: two stages (130 KB: one CTA an SM, as today's walk without its output buffers);
//   STAGES 1: one stage (65 KB), the next chunk's copies issued after the chunk's products;
//   STAGES 3: -W and k double-buffered, U^T and the factors single (112 KB: two CTAs an SM).
// What it does not have: the output buffers (H^T and V'^T go straight from the registers as 4-byte stores, or
// not at all with OUT 0, or staged as the real walk stages them with OUT 2), the dispatch order (the CTAs
// run longest segment first), the real values (garbage, nothing checked). Compare its STAGES 2 lines with the real walk (`kcp bench`: 1.37 ms at 32K, 4.50
// at 120,908 tokens, v5.31) to see what the skeleton leaves out, and the other lines with them.
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

constexpr int C = 64, D = 128, VH = 64, HQK = 16, HV = 48, G = HV / HQK, NT = 160;
constexpr int KB = 1024;
constexpr int kW = 32 * KB, kK = 16 * KB, kU = 16 * KB, kE = 256;  // a chunk's bytes of each
constexpr int kStage = kW + kK + kU + KB;                          // 65 KB

template <int STAGES>
constexpr int smem_bytes() {
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
	const int *seg_c0, *seg_n;           // a segment's first chunk and its chunks
	int* smid;                           // null, or where each CTA writes the SM it ran on
};

// issue: the copier warp's cp.async of chunk c's parts (1: -W and k into stage x; 2: U^T and the factors).
template <int STAGES>
__device__ __forceinline__ void issue(const Args& p, unsigned char* sm, int c, int x, int h, int half, int parts, int lane) {
	if (parts & 1) {
		unsigned char* dw = wreg<STAGES>(sm, x);
		const unsigned char* sw = p.w + ((size_t)c * HV + h) * kW;
		const unsigned char* sk = p.k + ((size_t)c * HQK + h / G) * kK;
		for (int i = lane; i < kW / 16; i += 32) tc::cp_async16(dw + 16 * i, sw + 16 * i);
		for (int i = lane; i < kK / 16; i += 32) tc::cp_async16(dw + kW + 16 * i, sk + 16 * i);
	}
	if (parts & 2) {
		unsigned char* du = ureg<STAGES>(sm, x);
		const unsigned char* su = p.u + (((size_t)c * HV + h) * 2 + half) * kU;
		const unsigned char* se = p.e + ((size_t)c * HV + h) * kE;
		for (int i = lane; i < kU / 16; i += 32) tc::cp_async16(du + 16 * i, su + 16 * i);
		if (lane < kE / 16) tc::cp_async16(du + kU + 16 * lane, se + 16 * lane);
	}
}

// bk: a K-major B operand's descriptor at k step k0 (rows = n, 64 of them a 64-column block); bmn: an
// MN-major one (rows = k, R of them; lbo from one 64-column block of n to the next).
__device__ __forceinline__ unsigned long long bk(const unsigned char* t, int k0) {
	return wg::desc_sw128(t + (k0 >> 6) * 64 * 128 + ((k0 & 63) >> 3) * 16);
}
__device__ __forceinline__ unsigned long long bmn(const unsigned char* t, int R, int k0) {
	return wg::desc_sw128_mn(t + k0 * 128, R * 128);
}

// FR: (1)'s state fragments made FR k steps at a time (8: all 64 registers first, one commit; 4: two
// batches of 32, each committed and waited before the next is made: fewer registers, one more wait).
// OUT: 1, H^T and V'^T stored straight from the state warps' registers (4-byte stores); 0, not stored (what
// the chain and the copies cost without the outputs' traffic); 2 (STAGES 2 or 3), staged as the real walk
// stages them (stage_out) but over the chunk's -W planes, dead once (1) has read them and until the copies
// of the chunk after next: the state warps write H^T (16 KB) and V'^T (8 KB) there after (1), 16-byte units
// XOR-swizzled by the row (conflict-free 4-byte stores), arrive at named barrier 1, and the copier warp
// (bar.sync 1) stores them as whole rows of 16-byte units (512-byte runs a warp) while (2) runs.
template <int STAGES, int MINB, int FR, int OUT = 1>
__global__ void __launch_bounds__(NT, MINB) walk_skel(Args p) {
	static_assert(OUT != 2 || STAGES != 1, "staged outputs need the -W planes of a double-buffered stage");
	extern __shared__ __align__(1024) unsigned char sm[];
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int half = blockIdx.x & 1, h = (blockIdx.x >> 1) % HV, seg = (blockIdx.x >> 1) / HV;
	const int c0 = p.seg_c0[seg], n = p.seg_n[seg];
	const int m0 = 16 * warp, g = lane >> 2, t = lane & 3;
	if (tid == 0 && p.smid) {
		unsigned id;
		asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
		p.smid[blockIdx.x] = (int)id;
	}
	float st[64];  // the state: rows = this warp's 16 values, 128 keys (m64n128 accumulators)
#pragma unroll
	for (int i = 0; i < 64; ++i) st[i] = 0.01f * (i & 7);
	if (warp == 4) {
		issue<STAGES>(p, sm, c0, 0, h, half, 3, lane);
		tc::cp_async_commit();
	}
#pragma unroll 1
	for (int i = 0; i < n; ++i) {
		const int c = c0 + i, x = STAGES == 1 ? 0 : (i & 1);
		tc::cp_async_wait<0>();
		wg::fence_proxy_async();
		__syncthreads();  // A: chunk c's stage has landed; every product of chunk c - 1 waited
		if (warp == 4) {
			if (STAGES != 1 && i + 1 < n) {  // the next chunk's -W and k (and U^T) into the other stage
				issue<STAGES>(p, sm, c + 1, x ^ 1, h, half, STAGES == 2 ? 3 : 1, lane);
				tc::cp_async_commit();
			}
			if constexpr (OUT == 2) {  // this chunk's staged H^T and V'^T to global memory, 16-byte units, whole rows
				tc::bar_sync(1, NT);
				const unsigned char* stg = wreg<STAGES>(sm, x);
				const size_t o = ((size_t)c * HV + h) * 2 + half;
				uint4* ho = reinterpret_cast<uint4*>(p.hout + o * VH * D);
				uint4* vo = reinterpret_cast<uint4*>(p.vout + o * VH * C);
#pragma unroll 4
				for (int e = lane; e < VH * D / 8; e += 32) {  // H^T: 64 rows of 16 units
					const int r = e >> 4, u = e & 15;
					ho[e] = *reinterpret_cast<const uint4*>(stg + r * 256 + ((u ^ (r & 7)) << 4));
				}
#pragma unroll 4
				for (int e = lane; e < VH * C / 8; e += 32) {  // V'^T: 64 rows of 8 units
					const int r = e >> 3, u = e & 7;
					vo[e] = *reinterpret_cast<const uint4*>(stg + 16 * KB + r * 128 + ((u ^ (r & 7)) << 4));
				}
			}
		} else {
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
			// (1) V'^T = U^T + H^T (-W^T): k = keys (8 steps), n = tokens; the state's fragments all made first.
			float a1[32];
#pragma unroll
			for (int b = 0; b < 8; b += FR) {
				unsigned fh[FR][4], fl[FR][4];
#pragma unroll
				for (int s = 0; s < FR; ++s)
#pragma unroll
					for (int q = 0; q < 4; ++q)
						tc::split_bf16x2(st[8 * (b + s) + 2 * q], st[8 * (b + s) + 2 * q + 1], fh[s][q], fl[s][q]);
				wg::fence();
#pragma unroll
				for (int s = 0; s < FR; ++s) {
					const unsigned long long dh = bk(W, 16 * (b + s)), dl = bk(W + 16 * KB, 16 * (b + s));
					wg::mma_m64n64k16_rs(a1, fh[s], dh, b + s > 0 ? 1 : 0);
					wg::mma_m64n64k16_rs(a1, fh[s], dl);
					wg::mma_m64n64k16_rs(a1, fl[s], dh);
				}
				wg::commit();
				wg::wait<0>();
				wg::fence_operand(a1);
			}
			if constexpr (OUT == 2) {  // H^T (the state before (2)) over the -W planes, which every state warp is done with
				tc::bar_sync(2, 128);
				unsigned char* hs = W;
#pragma unroll
				for (int j = 0; j < 16; ++j)
#pragma unroll
					for (int hh = 0; hh < 2; ++hh) {
						const int r = m0 + g + 8 * hh;
						*reinterpret_cast<unsigned*>(hs + r * 256 + (((j ^ (r & 7))) << 4) + 4 * t) =
						    tc::pack_bf16x2(st[4 * j + 2 * hh], st[4 * j + 2 * hh + 1]);
					}
			}
			bf16* vo = p.vout + o * VH * C;
#pragma unroll
			for (int j = 0; j < 8; ++j)
#pragma unroll
				for (int hh = 0; hh < 2; ++hh) {
					const int r = m0 + g + 8 * hh, col = 8 * j + 2 * t;
					a1[4 * j + 2 * hh] += U[r * C + col];
					a1[4 * j + 2 * hh + 1] += U[r * C + col + 1];
					if (OUT == 1) *reinterpret_cast<unsigned*>(vo + r * C + col) = tc::pack_bf16x2(a1[4 * j + 2 * hh], a1[4 * j + 2 * hh + 1]);
					if (OUT == 2) *reinterpret_cast<unsigned*>(W + 16 * KB + r * 128 + ((((col >> 3) ^ (r & 7))) << 4) + (col & 7) * 2) =
					                  tc::pack_bf16x2(a1[4 * j + 2 * hh], a1[4 * j + 2 * hh + 1]);
					a1[4 * j + 2 * hh] *= E[col];
					a1[4 * j + 2 * hh + 1] *= E[col + 1];
				}
			if constexpr (OUT == 2) tc::bar_arrive(1, NT);  // the copier may store this chunk's H^T and V'^T
			// (2) the state = e^gl state + (V'^T diag(s)) K: k = tokens (4 steps), n = keys, two products a step.
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
		if (STAGES != 2) {
			__syncthreads();  // B: the chunk's single-buffered regions are read
			if (warp == 4 && i + 1 < n) {
				issue<STAGES>(p, sm, c + 1, STAGES == 1 ? 0 : x ^ 1, h, half, STAGES == 1 ? 3 : 2, lane);
				tc::cp_async_commit();
			}
		}
	}
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

__global__ void fill(unsigned* x, size_t n, unsigned seed) {
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		unsigned v = (unsigned)i * 2654435761u ^ seed;
		v ^= v >> 13;
		// two bf16 of magnitude 2^-7 .. 2^-6 with random signs and mantissas (read as fp32: ~±0.008): finite
		x[i] = 0x3c003c00u | (v & 0x807f807fu);
	}
}

}  // namespace wskel

template <int STAGES, int MINB, int FR = 8, int OUT = 1>
static void run(const wskel::Args& a, int ncta, int nlong, const char* pack, const char* name) {
	auto k = wskel::walk_skel<STAGES, MINB, FR, OUT>;
	constexpr int smem = wskel::smem_bytes<STAGES>();
	CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
	cudaFuncAttributes fa;
	CK(cudaFuncGetAttributes(&fa, k));
	int per_sm = 0;
	CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, wskel::NT, smem));
	float med, lo, hi;
	devtest::time_ms([&] { k<<<ncta, wskel::NT, smem>>>(a); }, 10, med, lo, hi);
	wskel::Args b = a;  // once more, recording where the CTAs ran
	CK(cudaMalloc(&b.smid, ncta * sizeof(int)));
	k<<<ncta, wskel::NT, smem>>>(b);
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
	struct Pack {
		const char* name;
		std::vector<int> segs;  // chunks, longest first
	} packs[] = {{"32K (1 x 512)", {512}}, {"120,908 (3 docs)", {704, 625, 562}}};
	for (auto& pk : packs) {
		std::vector<int> c0, nn;
		int total = 0;
		for (int s : pk.segs) c0.push_back(total), nn.push_back(s), total += s;
		const size_t nw = (size_t)total * HV * kW, nk = (size_t)total * HQK * kK, nu = (size_t)total * HV * 2 * kU,
		             ne = (size_t)total * HV * kE;
		auto alloc = [](size_t bytes, unsigned seed) {
			unsigned* p;
			CK(cudaMalloc(&p, bytes));
			fill<<<2048, 256>>>(p, bytes / 4, seed);
			return reinterpret_cast<unsigned char*>(p);
		};
		Args a{};
		a.w = alloc(nw, 1), a.k = alloc(nk, 2), a.u = alloc(nu, 3), a.e = alloc(ne, 4);
		CK(cudaMalloc(&a.hout, (size_t)total * HV * 2 * VH * D * sizeof(bf16)));
		CK(cudaMalloc(&a.vout, (size_t)total * HV * 2 * VH * C * sizeof(bf16)));
		a.seg_c0 = devtest::up(c0), a.seg_n = devtest::up(nn);
		CK(cudaDeviceSynchronize());
		const int ncta = (int)pk.segs.size() * HV * 2, nlong = pk.segs[0];
		run<2, 1>(a, ncta, nlong, pk.name, "two stages (today's structure), bounds 1");
		run<1, 2>(a, ncta, nlong, pk.name, "one stage, bounds 2");
		run<3, 2>(a, ncta, nlong, pk.name, "-W, k double, U^T single, bounds 2");
		run<1, 1>(a, ncta, nlong, pk.name, "one stage, bounds 1");
		run<2, 1, 4>(a, ncta, nlong, pk.name, "two stages, bounds 1, fragments by halves");
		run<1, 2, 4>(a, ncta, nlong, pk.name, "one stage, bounds 2, fragments by halves");
		run<3, 2, 4>(a, ncta, nlong, pk.name, "-W, k double, U^T single, bounds 2, halves");
		run<2, 1, 4, 0>(a, ncta, nlong, pk.name, "two stages, bounds 1, halves, no outputs");
		run<3, 2, 4, 0>(a, ncta, nlong, pk.name, "-W, k double, bounds 2, halves, no outputs");
		run<2, 1, 4, 2>(a, ncta, nlong, pk.name, "two stages, bounds 1, halves, staged outputs");
		run<3, 2, 4, 2>(a, ncta, nlong, pk.name, "-W, k double, bounds 2, halves, staged outputs");
		CK(cudaDeviceSynchronize());
		CK(cudaFree((void*)a.w));
		CK(cudaFree((void*)a.k));
		CK(cudaFree((void*)a.u));
		CK(cudaFree((void*)a.e));
		CK(cudaFree(a.hout));
		CK(cudaFree(a.vout));
	}
	printf("skeleton ok (compare: gdn_state_walk_planes at vh 64, 1.37 ms at 32K and 4.50 ms at 120,908 tokens, v5.31)\n");
	return 0;
}
