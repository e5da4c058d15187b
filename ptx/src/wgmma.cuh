// wgmma.cuh: the Hopper (sm_90a) warpgroup matrix-multiply building blocks of the wgmma walks
// (gdn_walk_wgmma.cu). Compiled only where the architecture has them: everything here sits behind
// GDNKCP_HAS_WGMMA, which only the sm_90a target defines (nvcc -gencode arch=compute_90a,code=sm_90a sets
// __CUDA_ARCH_FEAT_SM90_ALL). The other targets, the compute_80 PTX and the CPU emulator build the
// portable mma.sync path instead; -DGDNKCP_NO_WGMMA turns this path off on sm_90a too (A/B timing).
// The CPU emulator builds it where a runner defines GDNKCP_EMU_WGMMA: each wrapper then calls the
// emulator (ptx/cpuemu/testdata/emu.h), as mma.cuh's do.
//
// ---- wgmma.mma_async m64nNk16, A from registers, B from shared memory (PTX ISA 8.0+, sm_90a) --------
// A warpgroup (4 consecutive warps, the first one's index divisible by 4) computes D (64 x N, fp32)
// += A (64 x 16, bf16) B (16 x N, bf16). Warp w of the group owns rows 16w..16w+15 of A and D; within
// the warp the layouts are those of mma.sync m16n8k16 (mma.cuh), with lane = 4g + t:
//   A: a[0] = (row g, k 2t, 2t+1), a[1] = (row g+8, k 2t..), a[2] = (row g, k 2t+8..), a[3] = (row g+8, ..)
//   D: d[4j + 0..1] = (row g, columns 8j + 2t, 2t+1), d[4j + 2..3] = (row g + 8, the same columns)
// so the accumulators of columns 16s..16s+15 (d[8s .. 8s+7]) are, as packed bf16 pairs, the A
// fragment of k step s of a product that takes D as its A operand.
// B lies in shared memory "K-major" (for each of the N columns its 16 k values contiguous, i.e. as
// the rows of an N x K row-major array) in the 128-byte swizzle: rows of 64 bf16 (128 bytes), eight
// rows an atom of 1024 bytes (1024-aligned), the 16-byte unit u of row r stored at unit u ^ (r % 8).
// The descriptor (desc_sw128) holds the start address / 16, the leading byte offset (unused by the
// swizzled K-major layouts; 1), the stride byte offset 1024 (from one 8-row atom to the next along N)
// and the swizzle mode 1 (128 B). The k step s within a 64-wide K block starts 32 s bytes into the
// row: the swizzle is a function of the address bits, so the start moves and the XOR stays right.
//
// Ordering: wgmma reads shared memory through the async proxy, so every thread that wrote B with
// ordinary stores runs fence_proxy_async() before the barrier that publishes it. fence() (wgmma.fence)
// goes before the first wgmma that reads registers written since the last one; commit() closes a group,
// wait<N>() waits until at most N groups are pending; after the wait, fence_operand() on each
// accumulator keeps the compiler from moving its reads above the wait.
#pragma once

#if defined(GDNKCP_CPU_EMULATOR)
#if defined(GDNKCP_EMU_WGMMA)  // a CPU emulator runner that emulates wgmma (ptx/cpuemu/testdata/emu.h)
#define GDNKCP_HAS_WGMMA 1
#endif
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(GDNKCP_NO_WGMMA)
#define GDNKCP_HAS_WGMMA 1
#endif

#if defined(GDNKCP_HAS_WGMMA)
namespace gdnkcp {
namespace wg {

// desc_sw128: the descriptor of a K-major, 128-byte-swizzled bf16 operand starting at p (shared memory).
__device__ __forceinline__ unsigned long long desc_sw128(const void* p) {
	const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
	return static_cast<unsigned long long>((a & 0x3ffff) >> 4) | (1ull << 16) | (static_cast<unsigned long long>(1024 >> 4) << 32) |
	       (1ull << 62);
}

// desc_sw128_mn: the descriptor of an MN-major ("transposed"), 128-byte-swizzled bf16 B operand at p: for each
// k its N values contiguous, 64 of them (128 bytes) a row, eight k rows an atom of 1024 bytes (stride byte
// offset 1024 to the next eight k), lbo bytes from one 64-column block to the next (N > 64); read by the
// _t products (imm-trans-b 1). Checked on the H200 by ptx/devtest/wgmma_t_check.cu (scripts/wgmma-t-check.sh).
__device__ __forceinline__ unsigned long long desc_sw128_mn(const void* p, int lbo) {
	const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
	return static_cast<unsigned long long>((a & 0x3ffff) >> 4) | (static_cast<unsigned long long>(lbo >> 4) << 16) |
	       (static_cast<unsigned long long>(1024 >> 4) << 32) | (1ull << 62);
}

#if defined(GDNKCP_CPU_EMULATOR)
__device__ __forceinline__ void fence() { emu::wgmma_fence(); }
__device__ __forceinline__ void commit() { emu::wgmma_commit(); }
template <int N>
__device__ __forceinline__ void wait() {
	emu::wgmma_wait(N);
}
__device__ __forceinline__ void fence_proxy_async() {}
template <int N>
__device__ __forceinline__ void fence_operand(float (&)[N]) {}
__device__ __forceinline__ void mma_m64n64k16_rs(float (&d)[32], const unsigned (&a)[4], unsigned long long desc, int scale_d = 1) {
	emu::wgmma_rs(d, 64, a, desc, scale_d);
}
__device__ __forceinline__ void mma_m64n128k16_rs(float (&d)[64], const unsigned (&a)[4], unsigned long long desc, int scale_d = 1) {
	emu::wgmma_rs(d, 128, a, desc, scale_d);
}
// The _t products: B MN-major (desc_sw128_mn; lbo is in the descriptor and unused here).
__device__ __forceinline__ void mma_m64n64k16_rs_t(float (&d)[32], const unsigned (&a)[4], unsigned long long desc, int,
                                                   int scale_d = 1) {
	emu::wgmma_rs_t(d, 64, a, desc, scale_d);
}
__device__ __forceinline__ void mma_m64n128k16_rs_t(float (&d)[64], const unsigned (&a)[4], unsigned long long desc, int,
                                                    int scale_d = 1) {
	emu::wgmma_rs_t(d, 128, a, desc, scale_d);
}
#else
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
	asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void fence_operand(float (&r)[N]) {
#pragma unroll
	for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// mma_m64n64k16_rs: d (m64n64, fp32, this thread's 32 accumulators) += A (m64k16 bf16, this thread's
// four registers, the mma.sync m16n8k16 A layout within the warp's 16 rows) x B (k16 x n64 bf16, K-major
// in shared memory behind desc); scale_d 0: d = A B (d's old values ignored). Asynchronous: d and a stay
// untouched until wait().
__device__ __forceinline__ void mma_m64n64k16_rs(float (&d)[32], const unsigned (&a)[4], unsigned long long desc, int scale_d = 1) {
	asm volatile(
	    "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
	    "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
	    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
	    "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

// mma_m64n128k16_rs: d (m64n128, fp32, this thread's 64 accumulators) += A (m64k16 bf16, this thread's
// four registers, the mma.sync m16n8k16 A layout within the warp's 16 rows) x B (k16 x n128 bf16, K-major
// in shared memory behind desc); scale_d 0: d = A B (d's old values ignored). Asynchronous: d and a stay
// untouched until wait().
__device__ __forceinline__ void mma_m64n128k16_rs(float (&d)[64], const unsigned (&a)[4], unsigned long long desc, int scale_d = 1) {
	asm volatile(
	    "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
	    "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
	    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
	    "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

// mma_m64n64k16_rs_t, mma_m64n128k16_rs_t: mma_m64n64k16_rs, mma_m64n128k16_rs with B MN-major (imm-trans-b
// 1; desc_sw128_mn, whose descriptor holds lbo: the int argument is for the portable products).
__device__ __forceinline__ void mma_m64n64k16_rs_t(float (&d)[32], const unsigned (&a)[4], unsigned long long desc, int,
                                                   int scale_d = 1) {
	asm volatile(
	    "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
	    "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
	    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
	    "{%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}
__device__ __forceinline__ void mma_m64n128k16_rs_t(float (&d)[64], const unsigned (&a)[4], unsigned long long desc, int,
                                                    int scale_d = 1) {
	asm volatile(
	    "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
	    "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
	    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
	    "{%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}
#endif  // GDNKCP_CPU_EMULATOR

// stmatrix_x4: stmatrix.sync.aligned.m8n8.x4.shared.b16 (sm_90), four 8x8 matrices of 16-bit elements to
// shared memory, ldmatrix_x4's inverse (mma.cuh): every lane passes the address of one 16-byte row (16-byte
// aligned; lanes 0-7 the rows 0-7 of matrix 0, 8-15 those of matrix 1, 16-23 matrix 2, 24-31 matrix 3) and
// holds in r[m] the elements (lane / 4, 2 (lane % 4)) and (lane / 4, 2 (lane % 4) + 1) of matrix m, the lower
// one in the low 16 bits. So a warp's accumulators of rows g and g + 8 over an 8-column tile, packed as bf16
// pairs, are two of its matrices (PlaneWalker::stage_out). Warp-collective; ordinary shared-memory stores.
#if defined(GDNKCP_CPU_EMULATOR)
__device__ __forceinline__ void stmatrix_x4(void* p, const unsigned (&r)[4]) { emu::stmatrix_x4(p, r); }
#else
__device__ __forceinline__ void stmatrix_x4(void* p, const unsigned (&r)[4]) {
	asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(p))),
	             "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
	             : "memory");
}
#endif

}  // namespace wg
}  // namespace gdnkcp
#else  // !GDNKCP_HAS_WGMMA

#include "mma.cuh"

// ---- The portable warpgroup products (every target without wgmma, and the CPU emulator's default) ------
// The same calls and operand layouts on mma.sync m16n8k16, so that a walk written against wg:: (the plane
// walks, gdn_walk_planes.cu) runs on every target from one source. A "descriptor" here is the generic
// address of the K-major, 128-byte-swizzled operand (desc_sw128); each warp computes its own 16 rows of D
// at once (the products are synchronous, so fence, commit, wait and the fences do nothing): per n8 tile j,
// B's fragment by ldmatrix (not transposed) of the tile's 8 rows (N) at the k step's two 16-byte units,
// unit u of row r found at u ^ (r % 8) of the row (the swizzle is a function of the shared-memory
// address: the operand's rows are 128 bytes apart from a 1024-aligned atom, as wgmma requires). D's layout
// is wgmma's, which is mma.sync's C layout per n8 tile: d[4j .. 4j + 3].
namespace gdnkcp {
namespace wg {

__device__ __forceinline__ unsigned long long desc_sw128(const void* p) {
	return static_cast<unsigned long long>(reinterpret_cast<size_t>(p));
}
__device__ __forceinline__ void fence() {}
__device__ __forceinline__ void commit() {}
template <int N>
__device__ __forceinline__ void wait() {}
__device__ __forceinline__ void fence_proxy_async() {}
template <int N>
__device__ __forceinline__ void fence_operand(float (&)[N]) {}

// mma_rs_sync: d (16 x N of this warp, fp32) += A (this warp's 16 x 16 bf16 fragment) x B (16 x N, K-major
// at desc); scale_d 0 starts from zero. Two n8 tiles an ldmatrix.x4: matrices (rows 16 jj .. + 7, k 0-7),
// (the same rows, k 8-15), (rows 16 jj + 8 .., k 0-7), (k 8-15).
template <int N>
__device__ __forceinline__ void mma_rs_sync(float* d, const unsigned (&a)[4], unsigned long long desc, int scale_d) {
	const unsigned char* b = reinterpret_cast<const unsigned char*>(static_cast<size_t>(desc));
	const unsigned sh = static_cast<unsigned>(__cvta_generic_to_shared(b));
	const int lane = threadIdx.x % 32;
	const int rr = lane % 8 + 8 * (lane / 16), ku = ((sh & 127u) >> 4) + (lane / 8) % 2;
	const unsigned char* row0 = b - (sh & 127u);  // the operand's first row
	if (scale_d == 0) {
#pragma unroll
		for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
	}
#pragma unroll
	for (int jj = 0; jj < N / 16; ++jj) {
		const int r = 16 * jj + rr;
		const unsigned phase = ((sh >> 7) + static_cast<unsigned>(r)) & 7u;
		unsigned bf[4];
		tc::ldmatrix_x4(bf, row0 + r * 128 + ((static_cast<unsigned>(ku) ^ phase) << 4));
		tc::mma_bf16_16816(d + 8 * jj, a, bf, d + 8 * jj);
		tc::mma_bf16_16816(d + 8 * jj + 4, a, bf + 2, d + 8 * jj + 4);
	}
}

__device__ __forceinline__ void mma_m64n64k16_rs(float (&d)[32], const unsigned (&a)[4], unsigned long long desc, int scale_d = 1) {
	mma_rs_sync<64>(d, a, desc, scale_d);
}
__device__ __forceinline__ void mma_m64n128k16_rs(float (&d)[64], const unsigned (&a)[4], unsigned long long desc, int scale_d = 1) {
	mma_rs_sync<128>(d, a, desc, scale_d);
}

// desc_sw128_mn: here the generic address of the MN-major operand (the _t products take lbo themselves).
__device__ __forceinline__ unsigned long long desc_sw128_mn(const void* p, int) {
	return static_cast<unsigned long long>(reinterpret_cast<size_t>(p));
}

// mma_rs_sync_t: mma_rs_sync with B MN-major (k row r of a 64-column block at 128 r bytes from the block,
// blocks lbo bytes apart, unit u of a row at u ^ (the row's address bits 7-9)): per n16 pair jj one
// ldmatrix.x4.trans of matrices (k 0-7, columns 16 jj ..), (k 8-15, ..), (k 0-7, 16 jj + 8 ..), (k 8-15, ..).
template <int N>
__device__ __forceinline__ void mma_rs_sync_t(float* d, const unsigned (&a)[4], unsigned long long desc, int lbo, int scale_d) {
	const unsigned char* b = reinterpret_cast<const unsigned char*>(static_cast<size_t>(desc));
	const int lane = threadIdx.x % 32, mi = lane / 8, k = 8 * (mi % 2) + lane % 8;
	if (scale_d == 0) {
#pragma unroll
		for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
	}
#pragma unroll
	for (int jj = 0; jj < N / 16; ++jj) {
		const int n0 = 16 * jj + 8 * (mi / 2);
		const unsigned char* row = b + (n0 / 64) * lbo + k * 128;
		const unsigned sh = static_cast<unsigned>(__cvta_generic_to_shared(row));
		unsigned bf[4];
		tc::ldmatrix_x4_trans(bf, row + ((static_cast<unsigned>((n0 % 64) / 8) ^ ((sh >> 7) & 7u)) << 4));
		tc::mma_bf16_16816(d + 8 * jj, a, bf, d + 8 * jj);
		tc::mma_bf16_16816(d + 8 * jj + 4, a, bf + 2, d + 8 * jj + 4);
	}
}

__device__ __forceinline__ void mma_m64n64k16_rs_t(float (&d)[32], const unsigned (&a)[4], unsigned long long desc, int lbo,
                                                   int scale_d = 1) {
	mma_rs_sync_t<64>(d, a, desc, lbo, scale_d);
}
__device__ __forceinline__ void mma_m64n128k16_rs_t(float (&d)[64], const unsigned (&a)[4], unsigned long long desc, int lbo,
                                                    int scale_d = 1) {
	mma_rs_sync_t<128>(d, a, desc, lbo, scale_d);
}

}  // namespace wg
}  // namespace gdnkcp
#endif  // GDNKCP_HAS_WGMMA
