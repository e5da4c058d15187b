// wgmma_t_check.cu: does wgmma with a transposed B (imm-trans-b 1: B "MN-major" in shared memory, for each k
// its N values contiguous) read the layout the CPU emulator's emu::wgmma_rs_t reads (ptx/cpuemu/testdata/
// emu.cpp, wgmma_b_mn)? Run by scripts/wgmma-t-check.sh on the GPU machine (nvcc there; no Go needed).
//
// One warpgroup computes D = A B (A 64 x 128, B 128 x N bf16 random, N 64 and 128) twice: with B K-major
// (wgmma.cuh's mma_m64nNk16_rs, the layout every wgmma kernel here uses) and with B MN-major (the asm
// below, imm-trans-b 1): rows of 64 bf16 (128 bytes) a k, eight k rows an atom of 1024 bytes (stride byte
// offset 1024), 64-column blocks 16384 bytes apart (leading byte offset), the 128-byte swizzle (unit u of
// row k at u ^ (k % 8)). Prints "check ok" when both give the same bits and are within fp32 summation of
// a float64 reference; "check FAILED" otherwise. If it passes, the trans-B form can serve products whose
// B operand the prep already stores the other way round (the output's S = Q K^T from the K^T walk planes,
// the tape walk's D^T Kt^T from K^T): ptx/staging/parked/README.md (walk_output.patch).
#include "devtest.cuh"

#include <cuda_bf16.h>

#include "../src/wgmma.cuh"

#if defined(__CUDA_ARCH__) && !defined(GDNKCP_HAS_WGMMA)
#error "wgmma_t_check.cu needs the sm_90a target (-gencode=arch=compute_90a,code=sm_90a)"
#endif

using bf16 = __nv_bfloat16;
constexpr int kK = 128;

// desc_mn: an MN-major, 128-byte-swizzled descriptor at p: leading byte offset lbo, stride byte offset 1024.
__device__ unsigned long long desc_mn(const void* p, int lbo) {
	const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
	return static_cast<unsigned long long>((a & 0x3ffff) >> 4) | (static_cast<unsigned long long>(lbo >> 4) << 16) |
	       (static_cast<unsigned long long>(1024 >> 4) << 32) | (1ull << 62);
}

template <int N>
__device__ void mma_t(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long desc, int scale_d);

template <>
__device__ void mma_t<64>(float (&d)[32], const unsigned (&a)[4], unsigned long long desc, int scale_d) {
	asm volatile(
	    "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
	    "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
	    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
	    "{%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

template <>
__device__ void mma_t<128>(float (&d)[64], const unsigned (&a)[4], unsigned long long desc, int scale_d) {
	asm volatile(
	    "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
	    "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
	    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
	    "{%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

template <int N>
__device__ void mma_k(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long desc, int scale_d) {
	if constexpr (N == 64)
		gdnkcp::wg::mma_m64n64k16_rs(d, a, desc, scale_d);
	else
		gdnkcp::wg::mma_m64n128k16_rs(d, a, desc, scale_d);
}

// gemm: one warpgroup; dk = A B with B K-major, dt = A B with B MN-major (both [64][N] fp32, row-major).
template <int N>
__global__ void gemm(const bf16* A, const bf16* B, float* dk, float* dt) {
	extern __shared__ unsigned char raw[];
	const unsigned s0 = static_cast<unsigned>(__cvta_generic_to_shared(raw));
	unsigned char* bk = raw + ((1024u - (s0 & 1023u)) & 1023u);  // K-major: 64-key blocks of N rows
	unsigned char* bt = bk + kK * N * 2;                          // MN-major: 64-column blocks of kK rows
	for (int e = threadIdx.x; e < kK * N; e += blockDim.x) {
		const int k = e / N, n = e % N;
		const bf16 v = B[k * N + n];
		*reinterpret_cast<bf16*>(bk + (k / 64) * N * 128 + n * 128 + ((((k % 64) / 8) ^ (n % 8)) << 4) + 2 * (k % 8)) = v;
		*reinterpret_cast<bf16*>(bt + (n / 64) * kK * 128 + k * 128 + ((((n % 64) / 8) ^ (k % 8)) << 4) + 2 * (n % 8)) = v;
	}
	gdnkcp::wg::fence_proxy_async();
	__syncthreads();
	const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, t = lane % 4;
	float d1[N / 2], d2[N / 2];
	unsigned a[8][4];
	for (int s = 0; s < 8; ++s)
		for (int r = 0; r < 4; ++r) {
			const int row = 16 * w + g + 8 * (r % 2), col = 16 * s + 2 * t + 8 * (r / 2);
			a[s][r] = static_cast<unsigned>(__bfloat16_as_ushort(A[row * kK + col])) |
			          (static_cast<unsigned>(__bfloat16_as_ushort(A[row * kK + col + 1])) << 16);
		}
	gdnkcp::wg::fence();
	for (int s = 0; s < 8; ++s) {
		mma_k<N>(d1, a[s], gdnkcp::wg::desc_sw128(bk + (s / 4) * N * 128 + (s % 4) * 32), s == 0 ? 0 : 1);
		mma_t<N>(d2, a[s], desc_mn(bt + 2048 * s, kK * 128), s == 0 ? 0 : 1);
	}
	gdnkcp::wg::commit();
	gdnkcp::wg::wait<0>();
	gdnkcp::wg::fence_operand(d1);
	gdnkcp::wg::fence_operand(d2);
	for (int i = 0; i < N / 2; ++i) {
		const int row = 16 * w + g + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * t + i % 2;
		dk[row * N + col] = d1[i];
		dt[row * N + col] = d2[i];
	}
}

template <int N>
static bool check(std::mt19937& rng) {
	std::vector<float> af(64 * kK), bfv(kK * N);
	devtest::fill_normal(af, rng, 1.f);
	devtest::fill_normal(bfv, rng, 1.f);
	std::vector<bf16> ah(af.size()), bh(bfv.size());
	for (size_t i = 0; i < af.size(); ++i) ah[i] = __float2bfloat16_rn(af[i]), af[i] = __bfloat162float(ah[i]);
	for (size_t i = 0; i < bfv.size(); ++i) bh[i] = __float2bfloat16_rn(bfv[i]), bfv[i] = __bfloat162float(bh[i]);
	bf16 *dA, *dB;
	float *dK, *dT;
	CK(cudaMalloc(&dA, ah.size() * 2));
	CK(cudaMalloc(&dB, bh.size() * 2));
	CK(cudaMalloc(&dK, 64 * N * 4));
	CK(cudaMalloc(&dT, 64 * N * 4));
	CK(cudaMemcpy(dA, ah.data(), ah.size() * 2, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dB, bh.data(), bh.size() * 2, cudaMemcpyHostToDevice));
	CK(cudaMemset(dK, 0xff, 64 * N * 4));  // NaN: every element must be written
	CK(cudaMemset(dT, 0xff, 64 * N * 4));
	const int smem = 2 * kK * N * 2 + 1024;
	CK(cudaFuncSetAttribute(gemm<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
	gemm<N><<<1, 128, smem>>>(dA, dB, dK, dT);
	CK(cudaGetLastError());
	CK(cudaDeviceSynchronize());
	std::vector<float> k(64 * N), t(64 * N);
	CK(cudaMemcpy(k.data(), dK, k.size() * 4, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(t.data(), dT, t.size() * 4, cudaMemcpyDeviceToHost));
	double num = 0, den = 0;
	size_t differ = 0;
	for (int i = 0; i < 64; ++i)
		for (int j = 0; j < N; ++j) {
			double ref = 0;
			for (int x = 0; x < kK; ++x) ref += (double)af[i * kK + x] * bfv[x * N + j];
			const double e = t[i * N + j] - ref;
			num += e * e, den += ref * ref;
			if (memcmp(&k[i * N + j], &t[i * N + j], 4) != 0) ++differ;
		}
	const double rel = std::sqrt(num / den);
	const bool ok = differ == 0 && rel < 1e-5;
	printf("N %3d: trans-B vs K-major: %zu of %d elements differ; trans-B vs float64: %.2e normwise: %s\n", N, differ,
	       64 * N, rel, ok ? "ok" : "FAILED");
	CK(cudaFree(dA));
	CK(cudaFree(dB));
	CK(cudaFree(dK));
	CK(cudaFree(dT));
	return ok;
}

int main() {
	std::mt19937 rng(7);
	const bool ok = check<64>(rng) & check<128>(rng);
	printf(ok ? "check ok\n" : "check FAILED\n");
	return ok ? 0 : 1;
}
