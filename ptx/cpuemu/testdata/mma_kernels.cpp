// mma_kernels.cpp: test kernels for the tensor-core wrappers of ptx/src/mma.cuh on the emulator
// (mma_test.go). They are not kernels of the runtime: they show the wrappers, and the emulator's
// implementation of them, right before real kernels are built on them.
//
//   emu_mma_gemm    C = A B (64x64x128, bf16 in, fp32 out), one block per batch, 8 warps: the A and
//                   B tiles staged through shared memory by cp.async in two stages of k 32, the
//                   fragments loaded by ldmatrix_x4 (A) and ldmatrix_x4_trans (B, stored k-major).
//                   bug = 1 waits one cp.async group too few (a read before its wait); bug = 2
//                   leaves out the __syncthreads after a stage's compute (a warp refills the stage
//                   while others still read it).
//   emu_mma_split   fp32 A times bf16 B (64x64x128) from fragments built in registers by the
//                   documented layout: A as hi + lo (two mma) and as hi alone (plain bf16).
//   emu_mma_layout  the raw registers of ldmatrix (both ways), of fragments built by the layout,
//                   of mma results and of pack/split, for the test to check lane by lane.
//   emu_wgmma_gemm  D = C + A B (64 x N x 128) by the emulator's wgmma (emu.h) on one warpgroup, B
//                   staged in the 128-byte-swizzled K-major layout, with seeded bugs.
//   emu_cp_zfill    emu::cp_async16_zfill: 64 threads, thread i copies src's 16-byte unit i into shared
//                   memory where i < n, else zeros (row 0 of src as the source it does not read), and
//                   writes the unit back to out after its wait (bug = 1: before it).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "mma.cuh"
#include "registry.h"

namespace emu_mma {

using namespace gdnkcp::tc;

EMU_DYNAMIC_SMEM(smem);

constexpr int kM = 64, kN = 64, kK = 128, kKS = 32, kStages = kK / kKS;
constexpr int kLA = kKS + 8;  // padded bf16 row of an A stage [64][kLA]
constexpr int kLB = kN + 8;   // padded bf16 row of a B stage [kKS][kLB]
constexpr int kGemmSmem = 2 * (kM * kLA + kKS * kLB) * 2;

// load_stage: A[0..64)[s*32..+32) and B[s*32..+32)[0..64), one 16-byte chunk of each per thread.
__device__ void load_stage(const bf16* A, const bf16* B, bf16* As, bf16* Bs, int s) {
	const int i = threadIdx.x;
	cp_async16(As + (i / 4) * kLA + 8 * (i % 4), A + (i / 4) * kK + s * kKS + 8 * (i % 4));
	cp_async16(Bs + (i / 8) * kLB + 8 * (i % 8), B + (s * kKS + i / 8) * kN + 8 * (i % 8));
}

extern "C" __global__ void emu_mma_gemm(const bf16* A, const bf16* B, float* C, int bug) {
	extern __shared__ float smem[];
	bf16* As = reinterpret_cast<bf16*>(smem);  // [2][64][kLA]
	bf16* Bs = As + 2 * kM * kLA;              // [2][32][kLB]
	A += blockIdx.x * kM * kK;
	B += blockIdx.x * kK * kN;
	C += blockIdx.x * kM * kN;
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	const int wm = warp / 2, wn = warp % 2;  // rows 16 wm.., columns 32 wn..
	float acc[4][4] = {};

	load_stage(A, B, As, Bs, 0);
	cp_async_commit();
	for (int s = 0; s < kStages; ++s) {
		if (s + 1 < kStages) {
			load_stage(A, B, As + ((s + 1) % 2) * kM * kLA, Bs + ((s + 1) % 2) * kKS * kLB, s + 1);
			cp_async_commit();
			if (bug == 1)
				cp_async_wait<2>();
			else
				cp_async_wait<1>();
		} else if (bug == 1) {
			cp_async_wait<1>();
		} else {
			cp_async_wait<0>();
		}
		__syncthreads();
		const bf16* as = As + (s % 2) * kM * kLA;
		const bf16* bs = Bs + (s % 2) * kKS * kLB;
		for (int kk = 0; kk < kKS; kk += 16) {
			const int r8 = lane % 8 + 8 * ((lane / 8) % 2), c8 = 8 * (lane / 16);
			unsigned a[4];
			ldmatrix_x4(a, as + (16 * wm + r8) * kLA + kk + c8);
			for (int j = 0; j < 2; ++j) {
				unsigned b[4];
				ldmatrix_x4_trans(b, bs + (kk + r8) * kLB + 32 * wn + 16 * j + c8);
				mma_bf16_16816(acc[2 * j], a, b, acc[2 * j]);
				mma_bf16_16816(acc[2 * j + 1], a, b + 2, acc[2 * j + 1]);
			}
		}
		if (bug != 2) __syncthreads();  // every warp is done with this stage before it is refilled
	}
	const int g = lane / 4, t = lane % 4;
	for (int nt = 0; nt < 4; ++nt)
		for (int i = 0; i < 4; ++i) C[(16 * wm + g + 8 * (i / 2)) * kN + 32 * wn + 8 * nt + 2 * t + i % 2] = acc[nt][i];
}

extern "C" __global__ void emu_mma_split(const float* A, const bf16* B, float* Csplit, float* Cplain) {
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	const int wm = warp / 2, wn = warp % 2, g = lane / 4, t = lane % 4;
	float acc[4][4] = {}, accp[4][4] = {};
	for (int kk = 0; kk < kK; kk += 16) {
		unsigned ah[4], al[4];
		for (int r = 0; r < 4; ++r) {  // (g, k lo), (g+8, k lo), (g, k hi), (g+8, k hi)
			const float* p = A + (16 * wm + g + 8 * (r % 2)) * kK + kk + 2 * t + 8 * (r / 2);
			split_bf16x2(p[0], p[1], ah[r], al[r]);
		}
		for (int nt = 0; nt < 4; ++nt) {
			const int n = 32 * wn + 8 * nt + g;
			unsigned b[2];
			for (int r = 0; r < 2; ++r) {
				const int k = kk + 2 * t + 8 * r;
				b[r] = static_cast<unsigned>(__bfloat16_as_ushort(B[k * kN + n])) |
				       (static_cast<unsigned>(__bfloat16_as_ushort(B[(k + 1) * kN + n])) << 16);
			}
			mma_bf16_16816(acc[nt], al, b, acc[nt]);
			mma_bf16_16816(acc[nt], ah, b, acc[nt]);
			mma_bf16_16816(accp[nt], ah, b, accp[nt]);
		}
	}
	for (int nt = 0; nt < 4; ++nt)
		for (int i = 0; i < 4; ++i) {
			const int at = (16 * wm + g + 8 * (i / 2)) * kN + 32 * wn + 8 * nt + 2 * t + i % 2;
			Csplit[at] = acc[nt][i];
			Cplain[at] = accp[nt][i];
		}
}

// The layout kernel's values (all exact in bf16 and in the fp32 sums):
//   M[32][8] in shared memory (rows 16-byte aligned), M[r][c] = 8 r + c; lane l's ldmatrix row
//   address is row (13 l + 5) % 32.
//   Av[r][k] = 16 r + k + 1, Bv[k][n] = 8 k + n + 1, Cv[r][n] = 512 (8 r + n + 1).
//   D1 = Av S0 + Cv (S0[k][n] = k == n), D2 = Av S1 + Cv (S1[k][n] = k == n + 8), D3 = I Bv.
// Per thread, 32 words: ld[4], ldt[4], a[4] (Av), b[2] (Bv), c[4], d1[4], d2[4], d3[4],
// split hi | lo << 16 of x = (lane + 1) / 3 + 1e-3 lane, pack_bf16x2(lane + 0.5, -lane - 1/3).
constexpr int kLayoutWords = 32;

extern "C" __global__ void emu_mma_layout(unsigned* out) {
	extern __shared__ float smem[];
	unsigned short* M = reinterpret_cast<unsigned short*>(smem) + (threadIdx.x / 32) * 256;  // a warp's own
	const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
	for (int c = 0; c < 8; ++c) M[lane * 8 + c] = __bfloat16_as_ushort(__float2bfloat16_rn(static_cast<float>(8 * lane + c)));
	__syncwarp();
	unsigned* o = out + (blockIdx.x * blockDim.x + threadIdx.x) * kLayoutWords;
	const unsigned short* row = M + ((13 * lane + 5) % 32) * 8;
	ldmatrix_x4(o, row);
	ldmatrix_x4_trans(o + 4, row);

	auto av = [](int r, int k) { return static_cast<float>(16 * r + k + 1); };
	unsigned a[4], b[2], s0[2], s1[2], id[4];
	float c[4], zero[4] = {};
	for (int r = 0; r < 4; ++r) {
		const int rr = g + 8 * (r % 2), k = 2 * t + 8 * (r / 2);
		a[r] = pack_bf16x2(av(rr, k), av(rr, k + 1));
		id[r] = pack_bf16x2(rr == k ? 1.f : 0.f, rr == k + 1 ? 1.f : 0.f);
	}
	for (int r = 0; r < 2; ++r) {
		const int k = 2 * t + 8 * r;
		b[r] = pack_bf16x2(static_cast<float>(8 * k + g + 1), static_cast<float>(8 * (k + 1) + g + 1));
		s0[r] = pack_bf16x2(k == g ? 1.f : 0.f, k + 1 == g ? 1.f : 0.f);
		s1[r] = pack_bf16x2(k == g + 8 ? 1.f : 0.f, k + 1 == g + 8 ? 1.f : 0.f);
	}
	for (int i = 0; i < 4; ++i) c[i] = 512.f * static_cast<float>(8 * (g + 8 * (i / 2)) + 2 * t + i % 2 + 1);
	float d1[4], d2[4], d3[4];
	mma_bf16_16816(d1, a, s0, c);
	mma_bf16_16816(d2, a, s1, c);
	mma_bf16_16816(d3, id, b, zero);
	for (int i = 0; i < 4; ++i) o[8 + i] = a[i];
	for (int i = 0; i < 2; ++i) o[12 + i] = b[i];
	for (int i = 0; i < 4; ++i) {
		o[14 + i] = __float_as_uint(c[i]);
		o[18 + i] = __float_as_uint(d1[i]);
		o[22 + i] = __float_as_uint(d2[i]);
		o[26 + i] = __float_as_uint(d3[i]);
	}
	bf16 hi, lo;
	split_bf16(static_cast<float>(lane + 1) / 3.f + 1e-3f * static_cast<float>(lane), hi, lo);
	o[30] = static_cast<unsigned>(__bfloat16_as_ushort(hi)) | (static_cast<unsigned>(__bfloat16_as_ushort(lo)) << 16);
	o[31] = pack_bf16x2(static_cast<float>(lane) + 0.5f, -static_cast<float>(lane) - 1.f / 3.f);
}

// divergent: lanes 0-15 at an mma, lanes 16-31 at a shuffle (a bug the emulator must report).
extern "C" __global__ void emu_mma_divergent(float* out) {
	const unsigned z[4] = {};
	float d[4] = {}, c[4] = {};
	if (threadIdx.x % 32 < 16)
		mma_bf16_16816(d, z, z, c);
	else
		d[0] = __shfl_xor_sync(0xffffffffu, 1.f, 1);
	out[threadIdx.x] = d[0];
}

// ---- wgmma (emu.h: wgmma_rs and its descriptor), called directly: these kernels test the emulator's
// model of the PTX instruction, independently of ptx/src/wgmma.cuh ----------------------------------

// sw128_desc: a K-major, 128-byte-swizzled operand descriptor at p (stride byte offset 1024), with the
// given swizzle mode bits (1 = 128 B).
__device__ unsigned long long sw128_desc(const void* p, unsigned long long mode = 1) {
	const unsigned long long a = __cvta_generic_to_shared(p);
	return ((a & 0x3ffff) >> 4) | (1ull << 16) | (static_cast<unsigned long long>(1024 >> 4) << 32) | (mode << 62);
}

// sw128_desc_mn: an MN-major, 128-byte-swizzled operand descriptor at p: leading byte offset lbo (from one
// 64-column block to the next), stride byte offset 1024 (the next 8 k rows).
__device__ unsigned long long sw128_desc_mn(const void* p, int lbo, unsigned long long mode = 1) {
	const unsigned long long a = __cvta_generic_to_shared(p);
	return ((a & 0x3ffff) >> 4) | (static_cast<unsigned long long>(lbo >> 4) << 16) |
	       (static_cast<unsigned long long>(1024 >> 4) << 32) | (mode << 62);
}

// stage_b writes B (K 128 x N, row-major bf16 in global memory) into shared memory K-major in the 128-byte
// swizzle: 64-key blocks of N rows of 128 bytes, the 16-byte unit u of row n at u ^ (n % 8).
__device__ void stage_b(const bf16* B, unsigned char* bs, int N) {
	for (int e = threadIdx.x; e < N * kK; e += blockDim.x) {
		const int n = e / kK, k = e % kK;
		const int off = (k / 64) * N * 128 + n * 128 + ((((k % 64) / 8) ^ (n % 8)) << 4) + 2 * (k % 8);
		memcpy(bs + off, &B[k * N + n], 2);
	}
}

// stage_b_mn writes B (K 128 x N, row-major bf16 in global memory) into shared memory MN-major in the
// 128-byte swizzle, as emu::wgmma_rs_t reads it: 64-column blocks of K rows of 128 bytes (the block nb at
// nb 16384: the leading byte offset), the 16-byte unit u of row k at u ^ (k % 8).
__device__ void stage_b_mn(const bf16* B, unsigned char* bs, int N) {
	for (int e = threadIdx.x; e < N * kK; e += blockDim.x) {
		const int n = e % N, k = e / N;
		const int off = (n / 64) * kK * 128 + k * 128 + ((((n % 64) / 8) ^ (k % 8)) << 4) + 2 * (n % 8);
		memcpy(bs + off, &B[k * N + n], 2);
	}
}

// a_frag: lane (g, t)'s m16k16 A fragment of rows 16 w.. and k step s of the row-major A [64][128].
__device__ void a_frag(const bf16* A, int w, int s, unsigned a[4]) {
	const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
	for (int r = 0; r < 4; ++r) {
		const int row = 16 * w + g + 8 * (r % 2), col = 16 * s + 2 * t + 8 * (r / 2);
		a[r] = static_cast<unsigned>(__bfloat16_as_ushort(A[row * kK + col])) |
		       (static_cast<unsigned>(__bfloat16_as_ushort(A[row * kK + col + 1])) << 16);
	}
}

// emu_wgmma_gemm: one warpgroup (128 threads) computes D (64 x N) = C + A B with wgmma m64nNk16, A from
// registers, B staged as above, k steps ascending, one commit and one wait. mode: 0 starts from zero
// (scale-d 0 on k step 0 over NaN accumulators: the old values must be ignored), 1 adds to C [64][N];
// mode + 2: B staged MN-major (stage_b_mn) and read by emu::wgmma_rs_t (imm-trans-b 1).
// bug: 1 reads D before the wait, 2 rewrites B before the wait, 3 exits without waiting, 4 passes a
// descriptor of swizzle mode 0, 5 lanes pass different descriptors; 6 (not a bug) issues one more wgmma
// into other accumulators as a second, newer commit group, then wait_group 1 (which must retire D's group)
// before D is read, 7 the same with wait_group 2 (D still in flight: NaN when deferred).
extern "C" __global__ void emu_wgmma_gemm(const bf16* A, const bf16* B, const float* C, float* D, int N, int mode,
                                          int bug) {
	extern __shared__ float smem[];
	unsigned char* bs = reinterpret_cast<unsigned char*>(smem);
	const bool trans = mode >= 2;
	mode %= 2;
	if (trans)
		stage_b_mn(B, bs, N);
	else
		stage_b(B, bs, N);
	__syncthreads();
	const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, t = lane % 4;
	float d[64];
	for (int i = 0; i < N / 2; ++i) {
		const int row = 16 * w + g + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * t + i % 2;
		d[i] = mode == 1 ? C[row * N + col] : __uint_as_float(0x7fc00000u);
	}
	emu::wgmma_fence();
	for (int s = 0; s < kK / 16; ++s) {
		unsigned a[4];
		a_frag(A, w, s, a);
		// MN-major: k step s is the 16 rows from 16 s (2048 bytes a step), the next 64 columns kK 128 bytes on.
		unsigned long long desc = trans ? sw128_desc_mn(bs + 2048 * s, kK * 128, bug == 4 ? 0 : 1)
		                                : sw128_desc(bs + (s / 4) * N * 128 + (s % 4) * 32, bug == 4 ? 0 : 1);
		if (bug == 5 && lane == 7) desc += 2;
		if (trans)
			emu::wgmma_rs_t(d, N, a, desc, mode == 0 && s == 0 ? 0 : 1);
		else
			emu::wgmma_rs(d, N, a, desc, mode == 0 && s == 0 ? 0 : 1);
	}
	emu::wgmma_commit();
	if (bug == 6 || bug == 7) {
		float d2[64];
		unsigned a[4];
		a_frag(A, w, 0, a);
		const unsigned long long desc = trans ? sw128_desc_mn(bs, kK * 128, 1) : sw128_desc(bs, 1);
		if (trans)
			emu::wgmma_rs_t(d2, N, a, desc, 0);
		else
			emu::wgmma_rs(d2, N, a, desc, 0);
		emu::wgmma_commit();
		emu::wgmma_wait(bug == 6 ? 1 : 2);
		for (int i = 0; i < N / 2; ++i) {
			const int row = 16 * w + g + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * t + i % 2;
			D[row * N + col] = d[i];
		}
		emu::wgmma_wait(0);
		return;
	}
	if (bug == 1) D[threadIdx.x] = d[0];
	if (bug == 2) bs[threadIdx.x] ^= 0x40;
	if (bug == 3) return;
	emu::wgmma_wait(0);
	if (bug == 1) return;
	for (int i = 0; i < N / 2; ++i) {
		const int row = 16 * w + g + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * t + i % 2;
		D[row * N + col] = d[i];
	}
}

extern "C" __global__ void emu_cp_zfill(const float* src, float* out, int n, int bug) {
	extern __shared__ float smem[];
	const int i = threadIdx.x;
	const bool full = i < n;
	emu::cp_async16_zfill(smem + 4 * i, full ? src + 4 * i : src, full);  // tc::cp_async16_zfill once staged code lands
	cp_async_commit();
	if (bug != 1) cp_async_wait<0>();
	for (int k = 0; k < 4; ++k) out[4 * i + k] = smem[4 * i + k];  // the thread's own unit: no barrier needed
	if (bug == 1) cp_async_wait<0>();
}

}  // namespace emu_mma

namespace {
emu::Registrar mma_kernels(
    {
        EMU_KERNEL(emu_mma, emu_mma_gemm),
        EMU_KERNEL(emu_mma, emu_mma_split),
        EMU_KERNEL(emu_mma, emu_mma_layout),
        EMU_KERNEL(emu_mma, emu_mma_divergent),
        EMU_KERNEL(emu_mma, emu_wgmma_gemm),
        EMU_KERNEL(emu_mma, emu_cp_zfill),
    },
    {
        {"kGemmSmem", emu_mma::kGemmSmem},
        {"kWgmmaSmem", 2 * 128 * 128},
    });
}  // namespace
