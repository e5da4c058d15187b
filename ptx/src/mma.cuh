// mma.cuh: the tensor-core building blocks of the next kernel versions (the forward state walk,
// the backward tape walk, the chunk gradients) on the portable path of sm_80 and up: mma.sync
// m16n8k16 bf16 with fp32 accumulate, ldmatrix, cp.async. Each wrapper is one PTX instruction under
// nvcc; when GDNKCP_CPU_EMULATOR is defined (the stand-in cuda_runtime.h of ptx/cpuemu/testdata
// defines it) it calls the CPU emulator's warp-collective implementation instead, so that a kernel
// built on these wrappers is proven correct on the CPU (ptx/cpuemu) before it runs on a GPU.
//
// Not included by any kernel yet: no committed blob was built from it. ptxgen hashes every .cuh of
// ptx/src into the manifest, so the next blob build records it.
//
// ---- mma_bf16_16816(d, a, b, c): mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ---------------
// D (16x8, fp32) = A (16x16, bf16, row-major) * B (16x8, bf16, column-major) + C (16x8, fp32); d may
// be c (accumulate in place). All 32 lanes of the warp must execute it together. With
//   lane = 4 * g + t    (g = groupID = lane >> 2, t = threadID_in_group = lane % 4)
// each lane holds (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type", section
// 9.7.14.5.8 of the ISA 9.0 text; a register's lower-numbered element sits in its low 16 bits):
//   a[0] = A[g    ][2t], A[g    ][2t+1]        b[0] = B[2t    ][g], B[2t+1][g]
//   a[1] = A[g + 8][2t], A[g + 8][2t+1]        b[1] = B[2t + 8][g], B[2t+9][g]
//   a[2] = A[g    ][2t+8], A[g    ][2t+9]
//   a[3] = A[g + 8][2t+8], A[g + 8][2t+9]      c[0], c[1] = C[g][2t], C[g][2t+1]
//                                              c[2], c[3] = C[g+8][2t], C[g+8][2t+1]   (d alike)
// So a lane's a[0..3] are its (row g / g+8) x (k 0-7 / k 8-15) quarters in the order
// (g, lo k), (g+8, lo k), (g, hi k), (g+8, hi k), and b[0..1] column g at k 0-7 and k 8-15.
//
// ---- ldmatrix_x4(r, p), ldmatrix_x4_trans(r, p): ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16 ----
// Four 8x8 matrices of 16-bit elements from shared memory. Every lane passes the address of one
// 16-byte row (16-byte aligned): lanes 0-7 the rows 0-7 of matrix 0, lanes 8-15 those of matrix 1,
// 16-23 matrix 2, 24-31 matrix 3. Lane t receives in r[m] the elements (t/4, 2(t%4)) and
// (t/4, 2(t%4)+1) of matrix m (PTX ISA, "Warp-level matrix load instruction: ldmatrix": a group of
// four consecutive threads loads one row, thread 0 the first fragment; figure "ldmatrix fragment
// layout for one 8x8 Matrix with 16-bit elements"); with .trans, the elements (2(t%4), t/4) and
// (2(t%4)+1, t/4) of the stored matrix, i.e. of its transpose. Hence, for a row-major bf16 tile X
// with row stride ld (elements):
//   A fragment of X[r0.., k0..]:   lane l passes &X[(r0 + l%8 + 8((l/8)%2)) * ld + k0 + 8(l/16)]
//                                  and ldmatrix_x4 gives a[0..3];
//   B fragments of a row-major (k-major) X[k0.., n0..]: the same addresses with ldmatrix_x4_trans
//                                  give b[0..1] of the n-tile n0 in r[0..1], of n0+8 in r[2..3].
//
// ---- cp_async16(smem, gmem), cp_async_commit(), cp_async_wait<N>() ----------------------------------
// cp.async.cg.shared.global (16 bytes, both addresses 16-byte aligned, L2 only), cp.async.commit_group
// (the thread's copies since the last commit become one group) and cp.async.wait_group N (wait until
// at most the N most recent groups of this thread are pending). The data is visible to the issuing
// thread after the wait, to the others only after a __syncthreads() that follows the wait.
// In the emulator, by default the copy happens at once and the wait does nothing: a missing or too
// shallow wait cannot be found that way. The debug mode EMU_CP_ASYNC=deferred (environment of the
// emulated run) makes a copy fill its 16 destination bytes with the fresh-shared-memory NaN at issue
// and land only when a wait_group retires its group, so a read before the wait (or an overwrite of a
// stage still being read) computes NaN.
//
// ---- pack_bf16x2(lo, hi), split_bf16(x, hi, lo), split_bf16x2(x0, x1, hi, lo) -----------------------
// pack_bf16x2: two floats rounded to bf16 (nearest even) in one register, lo in the low 16 bits (the
// element order of the fragments above). split_bf16: x = hi + lo with hi = rn(x), lo = rn(x - hi)
// (x - hi is exact in fp32), about 16 significant bits in all: fp32 state enters the tensor cores as
// two operands, A B ~ Ahi B + Alo B (and Ahi Bhi + Ahi Blo + Alo Bhi when both are fp32).
//
// Precision of the emulation: each lane computes its own D elements from the whole A and B, products
// of bf16 values exact in fp32, accumulated in fp32 from C in k order (0..15). The tensor core's
// internal order, alignment and rounding of the sum differ, so GPU and emulator agree to a tolerance,
// not bit for bit (how close, only a GPU run can measure).
//
// The layouts above are checked lane by lane on the emulator (ptx/cpuemu, TestTensorCoreOnCPU)
// against the ISA's formulas written out again in Go; not yet against a GPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace gdnkcp {
namespace tc {

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ void mma_bf16_16816(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
#if defined(GDNKCP_CPU_EMULATOR)
	emu::mma_bf16_16816(d, a, b, c);
#else
	asm volatile(
	    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
	    "{%10, %11, %12, %13};\n"
	    : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
	      "f"(c[3]));
#endif
}

__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const void* smem_row_ptr) {
#if defined(GDNKCP_CPU_EMULATOR)
	emu::ldmatrix_x4(r, smem_row_ptr, false);
#else
	const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_row_ptr));
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(s));
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned r[4], const void* smem_row_ptr) {
#if defined(GDNKCP_CPU_EMULATOR)
	emu::ldmatrix_x4(r, smem_row_ptr, true);
#else
	const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_row_ptr));
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(s));
#endif
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(GDNKCP_CPU_EMULATOR)
	emu::cp_async16(smem, gmem);
#else
	const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
	const unsigned long long g = static_cast<unsigned long long>(__cvta_generic_to_global(gmem));
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g) : "memory");
#endif
}

// cp_async16_zfill: cp_async16 with cp.async's src-size operand: the 16 bytes at gmem where full, else 16 zero
// bytes and nothing read (gmem must still be a valid global address: callers pass a row that exists). One
// instruction where a branch between a copy and a zero store took ~20 (the zero store's hazard with a later
// cp.async to the same bytes costs ptxas three dummy shared loads each: ncu on v5.33's tape walk).
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool full) {
#if defined(GDNKCP_CPU_EMULATOR)
	emu::cp_async16_zfill(smem, gmem, full);
#else
	const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
	const unsigned long long g = static_cast<unsigned long long>(__cvta_generic_to_global(gmem));
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(full ? 16u : 0u) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(GDNKCP_CPU_EMULATOR)
	emu::cp_async_commit();
#else
	asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// cp_async_wait<N>: wait until at most the N most recent committed groups are pending. The "memory"
// clobber keeps the compiler from moving shared-memory loads above it.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
	static_assert(N >= 0, "cp.async.wait_group takes a non-negative count");
#if defined(GDNKCP_CPU_EMULATOR)
	emu::cp_async_wait(N);
#else
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// bar_sync: the named barrier id (1..15; 0 is __syncthreads') for count threads, whole warps (bar.sync id,
// count): a barrier between some warps of a block. Like __syncthreads it orders the shared-memory
// accesses of the threads that meet at it.
__device__ __forceinline__ void bar_sync(int id, int count) {
#if defined(GDNKCP_CPU_EMULATOR)
	emu::named_barrier(static_cast<unsigned>(id), static_cast<unsigned>(count));
#else
	asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
#endif
}

// bar_arrive: arrive at the named barrier id for count threads without waiting (bar.arrive id, count): the
// producer's half of a bar_sync another set of warps waits at. The arriving threads' earlier shared-memory
// writes are seen by the waiting ones after their bar_sync.
__device__ __forceinline__ void bar_arrive(int id, int count) {
#if defined(GDNKCP_CPU_EMULATOR)
	emu::named_arrive(static_cast<unsigned>(id), static_cast<unsigned>(count));
#else
	asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
#endif
}

// dispatch_cta: the block coordinates (x, y, z) a walk CTA works as: its own where order is null, else
// those of CTA order[its linear block index] of the launch order (x fastest, then y, then z): the walks'
// dispatch order (kcp, sched.DispatchOrder), which makes the GPU, handing CTAs out by linear index, run
// them in that order. A CTA's work does not depend on when it runs: no arithmetic changes.
__device__ __forceinline__ void dispatch_cta(const int* order, int& x, int& y, int& z) {
	x = static_cast<int>(blockIdx.x);
	y = static_cast<int>(blockIdx.y);
	z = static_cast<int>(blockIdx.z);
	if (order != nullptr) {
		const int gx = static_cast<int>(gridDim.x), gy = static_cast<int>(gridDim.y);
		const int j = order[x + gx * (y + gy * z)];
		x = j % gx;
		y = (j / gx) % gy;
		z = j / (gx * gy);
	}
}

// PairCTA: what a CTA of a walk with two column sets a listed segment runs (the summary walk's P and Q, the
// offset walk's P^T and R; grid (2 x 128/vh, |list|, HV), dispatch_cta's order): isP for blocks x >= 128/vh
// (the first set), its columns from c0, list entry li and its segment seg, value head h, and blk, the float
// offset of its 128 x 128 output slot (li HV + h).
struct PairCTA {
	bool isP;
	int c0, li, seg, h;
	long long blk;
};

__device__ __forceinline__ PairCTA pair_cta(const int* order, const int* list, int vh, int HV) {
	int x, li, h;
	dispatch_cta(order, x, li, h);
	const int tiles = 128 / vh;
	PairCTA p;
	p.isP = x >= tiles;
	p.c0 = (p.isP ? x - tiles : x) * vh;
	p.li = li;
	p.seg = list[li];
	p.h = h;
	p.blk = ((long long)li * HV + h) * 128 * 128;
	return p;
}

// pack_bf16x2: rn(lo) in the low 16 bits, rn(hi) in the high 16 bits.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
	return static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
	       (static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// quad_pair16 / quad_pair16_key: 8-byte stores of a bf16 row held in mma fragment order. In an
// accumulator-shaped fragment, lane t of a quad holds keys 8 nt + 2t, 2t + 1 of its row as one packed word
// per key tile nt. For a tile pair (w0: tile 2q, w1: tile 2q + 1) the quad swaps one word between lanes t
// and t ^ 1 (one shfl_xor, every lane of the warp taking part), after which lane t holds four consecutive
// keys: quad_pair16 returns them (low word first) and quad_pair16_key(t) is the first one's offset in the
// pair's 16 keys (t = 0, 1, 2, 3: keys 0, 8, 4, 12). The quad's four 8-byte stores then cover the pair's 32
// bytes of the row, where four-byte stores of each tile would cover two 16-byte halves.
__device__ __forceinline__ int quad_pair16_key(int t) { return 2 * (t & 2) + 8 * (t & 1); }
__device__ __forceinline__ uint2 quad_pair16(unsigned w0, unsigned w1, int t) {
	const bool odd = (t & 1) != 0;
	const unsigned r = __shfl_xor_sync(0xffffffffu, odd ? w0 : w1, 1);  // even lanes get w0 of t + 1, odd w1 of t - 1
	uint2 v;
	v.x = odd ? r : w0;
	v.y = odd ? w1 : r;
	return v;
}

// split_bf16: x = hi + lo (+ a remainder of about 2^-17 |x|), hi = rn(x), lo = rn(x - hi).
__device__ __forceinline__ void split_bf16(float x, bf16& hi, bf16& lo) {
	hi = __float2bfloat16_rn(x);
	lo = __float2bfloat16_rn(x - __bfloat162float(hi));
}

// split_bf16x2: the splits of x0 (low halves) and x1 (high halves) as packed registers. On the GPU
// each pair is one cvt.rn.bf16x2.f32 (hi, then lo), the hi parts widened back by a shift and a mask:
// six instructions for what four scalar conversions and two packs took, the same bits (the same
// round-to-nearest-even conversions of the same values).
__device__ __forceinline__ void split_bf16x2(float x0, float x1, unsigned& hi, unsigned& lo) {
#if defined(GDNKCP_CPU_EMULATOR)
	bf16 h0, l0, h1, l1;
	split_bf16(x0, h0, l0);
	split_bf16(x1, h1, l1);
	hi = static_cast<unsigned>(__bfloat16_as_ushort(h0)) | (static_cast<unsigned>(__bfloat16_as_ushort(h1)) << 16);
	lo = static_cast<unsigned>(__bfloat16_as_ushort(l0)) | (static_cast<unsigned>(__bfloat16_as_ushort(l1)) << 16);
#else
	asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(hi) : "f"(x1), "f"(x0));
	const float l0 = x0 - __uint_as_float(hi << 16), l1 = x1 - __uint_as_float(hi & 0xffff0000u);
	asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(lo) : "f"(l1), "f"(l0));
#endif
}

}  // namespace tc
}  // namespace gdnkcp
