// Stand-in for mma.h (nvcuda::wmma) used only by TestDevtestSyntax and TestKernelSyntax (see cuda_runtime.h
// beside it): the fragment types and calls the tc kernels use, declared.
#pragma once
#include "cuda_bf16.h"
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
namespace precision {
struct tf32 {};
}
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
	enum { num_elements = 8 };
	T x[8];
};
template <class F, class T>
void fill_fragment(F&, T);
template <class F, class T>
void load_matrix_sync(F&, const T*, unsigned);
template <class F, class T>
void load_matrix_sync(F&, const T*, unsigned, layout_t);
template <class D, class A, class B, class C>
void mma_sync(D&, const A&, const B&, const C&);
template <class T, class F>
void store_matrix_sync(T*, const F&, unsigned, layout_t);
}  // namespace wmma
}  // namespace nvcuda
